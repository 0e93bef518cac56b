"""The koordnode command line, and the logging it sets up."""

from __future__ import annotations

import importlib
import io
import json
import logging
import os
import pkgutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import pytest
import structlog

import koordnode
from koordnode import __version__
from koordnode import cli
from koordnode.config import loader as config_module
from koordnode import logsetup
from koordnode.config import Config

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "packaging" / "koordnode.toml"


@pytest.fixture(autouse=True)
def absent_default_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine may have a real /etc/koordnode/koordnode.toml; tests must not read it."""
    path = tmp_path / "etc" / "koordnode.toml"
    monkeypatch.setattr(config_module, "DEFAULT_CONFIG_PATH", str(path))
    return path


@pytest.fixture
def bad_config(tmp_path: Path) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text('[proxy]\nlistn = "/x"\nhook_timeout_ms = "fast"\n[log]\nformat = "xml"\n')
    return path


@pytest.fixture
def fake_daemon(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """Stand in for koordnode.daemon (and logging setup); records the config it is given."""
    calls: list[Config] = []
    module = types.ModuleType("koordnode.daemon")
    module.run = lambda config: calls.append(config) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "koordnode.daemon", module)
    monkeypatch.setattr(logsetup, "configure_logging", lambda level, fmt: None)
    return calls


# ---------------------------------------------------------------------------------------------
# version and help


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"koordnode {__version__}"
    assert lines[1].startswith(f"python {sys.version_info.major}.{sys.version_info.minor}.")
    assert any(line.startswith("h2 ") for line in lines)
    assert any(line.startswith("protobuf ") for line in lines)


def test_python_dash_m_koordnode_works() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "koordnode", "version"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"koordnode {__version__}\n")


def test_help_describes_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("run", "check-config", "status", "top", "version"):
        assert f"    {command}" in out
    assert "/etc/koordnode/koordnode.toml" in out
    assert "exit codes" in out


def test_run_help_lists_flags_with_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for flag in ("--config PATH", "--listen PATH", "--backend PATH", "--log-level",
                 "--log-format"):
        assert flag in out
    assert "(default: /var/run/koordnode/koordnode.sock)" in out
    assert "(default: /run/containerd/containerd.sock)" in out


def test_no_command_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: koordnode" in capsys.readouterr().err


def test_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bogus"]) == 2
    assert "invalid choice" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# check-config


def test_check_config_good_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text('[proxy]\nbackend = "unix:///run/other.sock"\n')
    assert cli.main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"config OK: {path}"
    assert 'backend = "/run/other.sock"' in out  # effective, normalised values
    assert "hook_timeout_ms = 200" in out  # defaults filled in


def test_check_config_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config", "--config", str(EXAMPLE), "--json"]) == 0
    out = capsys.readouterr().out
    body = json.loads(out.split("\n", 1)[1])
    assert body["proxy"]["hook_timeout_ms"] == 200
    assert body["log"] == {"level": "info", "format": "json"}


def test_check_config_without_file_uses_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("config OK: <defaults>")
    assert "built-in defaults" in first


def test_check_config_bad_file_prints_every_error(
    capsys: pytest.CaptureFixture[str], bad_config: Path
) -> None:
    assert cli.main(["check-config", "--config", str(bad_config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(bad_config) in captured.err
    assert 'proxy.listn: unknown key (did you mean "listen"?)' in captured.err
    assert 'proxy.hook_timeout_ms: expected an integer in [1, 60000], got "fast"' in captured.err
    assert 'log.format: expected one of "json", "console", got "xml"' in captured.err


def test_check_config_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert cli.main(["check-config", "--config", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "config file not found" in err


def test_check_config_malformed_toml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[proxy\n")
    assert cli.main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "invalid TOML" in err and "line 1" in err


def test_check_config_as_a_subprocess(bad_config: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "koordnode.cli", "check-config", "--config", str(bad_config)],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "proxy.listn: unknown key" in result.stderr


# ---------------------------------------------------------------------------------------------
# run and status (their back ends are stood in for)


def test_run_passes_config_with_flag_overrides(
    fake_daemon: list[Config], tmp_path: Path
) -> None:
    path = tmp_path / "k.toml"
    path.write_text('[proxy]\nlisten = "/file.sock"\nhook_timeout_ms = 30\n')
    code = cli.main(["run", "--config", str(path), "--backend", "unix:///run/b.sock",
                     "--log-level", "debug"])
    assert code == 7  # the daemon's exit code
    [config] = fake_daemon
    assert config.proxy.listen == "/file.sock"
    assert config.proxy.backend == "/run/b.sock"
    assert config.proxy.hook_timeout_ms == 30
    assert config.log.level == "debug"
    assert config.source == str(path)


def test_run_with_bad_config_exits_2_before_starting(
    fake_daemon: list[Config], bad_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "--config", str(bad_config)]) == 2
    assert fake_daemon == []
    assert "proxy.listn: unknown key" in capsys.readouterr().err


def test_run_with_bad_flag_value_exits_2(
    fake_daemon: list[Config], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["run", "--listen", "tcp://0.0.0.0:1"]) == 2
    assert fake_daemon == []
    assert 'proxy.listen: only unix sockets are supported, got "tcp://0.0.0.0:1"' in (
        capsys.readouterr().err
    )


def test_status_not_available(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "koordnode.admin.client", None)  # import fails
    assert cli.main(["status"]) == 1
    assert "not available" in capsys.readouterr().err


def test_status_calls_the_admin_client(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Config, bool]] = []
    module = types.ModuleType("koordnode.admin.client")

    def status_command(config: Config, as_json: bool, ready: bool = False) -> int:
        calls.append((config, as_json))
        return 0

    module.status_command = status_command  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "koordnode.admin.client", module)
    assert cli.main(["status", "--json"]) == 0
    assert calls == [(Config(), True)]


def test_output_cut_short_by_its_reader_is_no_traceback() -> None:
    """`koordnode check-config | head -1`: the reader goes away after a line."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "koordnode", "check-config", "--config", str(repo / "packaging" / "koordnode.toml")]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write meets EPIPE
    try:
        done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, cwd=repo, timeout=30)
    finally:
        os.close(write_end)
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr.decode()


def test_status_ready_answers_a_readiness_probe_from_the_daemons_own_state(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from koordnode.admin import client

    nri = {"socket": "/var/run/nri/nri.sock", "connected": False, "synchronizations": 0,
           "last_error": "connection refused"}
    states: list[tuple[dict[str, Any], int, str]] = [
        ({"mode": "nri", "nri": nri}, 1, "not connected to the runtime's NRI socket /var/run/nri/nri.sock: "
                                         "connection refused"),
        ({"mode": "nri", "nri": {**nri, "connected": True}}, 1, "connected to the runtime, not synchronized yet"),
        ({"mode": "nri", "nri": {**nri, "connected": True, "synchronizations": 1}}, 0, "ready"),
        ({"mode": "proxy", "backend": "/run/containerd/containerd.sock",
          "backend_health": "ok (answering; state not rebuilt yet: in progress)"}, 1, "state not rebuilt yet"),
        ({"mode": "proxy", "backend": "/run/containerd/containerd.sock", "backend_health": "ok"}, 0, "ready"),
    ]
    for status, code, said in states:
        monkeypatch.setattr(client, "fetch_status", lambda path, status=status: status)
        assert cli.main(["status", "--ready", "--socket", "/run/x.sock"]) == code
        out = capsys.readouterr()
        assert said in (out.out if code == 0 else out.err)


def test_top_hands_the_configured_socket_and_roots_to_the_view(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from koordnode.admin import top

    calls: list[dict[str, Any]] = []

    def top_command(admin_socket: str, cgroup_root: str, procfs_root: str, **kwargs: Any) -> int:
        calls.append(dict(admin_socket=admin_socket, cgroup_root=cgroup_root, procfs_root=procfs_root, **kwargs))
        return 0

    monkeypatch.setattr(top, "top_command", top_command)
    config = tmp_path / "koordnode.toml"
    config.write_text(f'[admin]\nsocket = "{tmp_path}/a.sock"\n[cgroup]\nroot = "{tmp_path}"\n')
    assert cli.main(["top", "--config", str(config), "--once", "--sort", "memory", "--class", "BE"]) == 0
    (call,) = calls
    assert (call["admin_socket"], call["cgroup_root"], call["procfs_root"]) == (f"{tmp_path}/a.sock", str(tmp_path), "/proc")
    assert call["once"] is True and call["interval_s"] == 1.0
    assert (call["view"].sort, call["view"].qos_class) == ("memory", "BE")
    assert cli.main(["top", "--config", str(config), "--socket", "/run/x.sock"]) == 0
    assert calls[-1]["admin_socket"] == "/run/x.sock"


def test_top_refuses_a_bad_interval_and_a_bad_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["top", "--interval", "0"]) == 2
    assert "--interval: expected seconds in [0.1, 60]" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[proxy]\nlistn = 1\n")
    assert cli.main(["top", "--config", str(bad)]) == 2
    assert "proxy.listn: unknown key" in capsys.readouterr().err


def test_an_import_error_inside_an_existing_module_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(name: str) -> Any:
        raise ModuleNotFoundError("No module named 'nonexistent_dep'", name="nonexistent_dep")

    monkeypatch.setattr(cli.importlib, "import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["status"])


# ---------------------------------------------------------------------------------------------
# logging setup


@pytest.fixture
def log_stream() -> Any:
    stream = io.StringIO()
    yield stream
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logsetup._OurHandler)]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.captureWarnings(False)
    structlog.reset_defaults()


def test_json_logs_from_structlog_and_stdlib(log_stream: io.StringIO) -> None:
    log = logsetup.get_logger("koordnode.test")  # obtained before configuring, on purpose
    logsetup.configure_logging("info", "json", stream=log_stream)
    log.info("call done", method="/runtime.v1.RuntimeService/Version", ms=0.2)
    log.debug("not shown")
    logging.getLogger("grpc.test").warning("stdlib says %s", "hi")
    records = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    assert len(records) == 2
    ours, theirs = records
    assert ours["event"] == "call done" and ours["level"] == "info"
    assert ours["logger"] == "koordnode.test" and ours["ms"] == 0.2
    assert ours["timestamp"].endswith("Z") and "T" in ours["timestamp"]
    assert theirs["event"] == "stdlib says hi" and theirs["level"] == "warning"
    assert theirs["logger"] == "grpc.test"


def test_module_loggers_name_their_component(log_stream: io.StringIO) -> None:
    # Modules log through structlog.get_logger("koordnode.x"); every line must say which one.
    module_logs = []
    for info in pkgutil.walk_packages(koordnode.__path__, "koordnode."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        log = getattr(module, "log", None)
        if isinstance(log, structlog._config.BoundLoggerLazyProxy):
            module_logs.append(log)
    assert len(module_logs) >= 5
    for fmt in ("json", "console"):
        logsetup.configure_logging("info", fmt, stream=log_stream)
        for log in module_logs:
            log.info("probe_event")
            log.bind(pod="p1").info("probe_event")
    lines = log_stream.getvalue().splitlines()
    assert len(lines) == 4 * len(module_logs)
    names = [log._logger_factory_args[0] for log in module_logs]
    json_lines, console_lines = lines[: 2 * len(names)], lines[2 * len(names) :]
    assert [json.loads(line)["logger"] for line in json_lines] == [n for n in names for _ in (0, 1)]
    for line, name in zip(console_lines, [n for n in names for _ in (0, 1)], strict=True):
        assert f"[{name}]" in line


def test_reconfiguring_changes_level_and_format(log_stream: io.StringIO) -> None:
    log = logsetup.get_logger("koordnode.test")
    logsetup.configure_logging("warning", "json", stream=log_stream)
    log.info("dropped")
    logsetup.configure_logging("debug", "console", stream=log_stream)
    log.debug("kept", pod="p1")
    out = log_stream.getvalue()
    assert "dropped" not in out
    assert "kept" in out and "pod=p1" in out and not out.lstrip().startswith("{")
    assert sum(isinstance(h, logsetup._OurHandler) for h in logging.getLogger().handlers) == 1


def test_exceptions_are_rendered_in_json(log_stream: io.StringIO) -> None:
    logsetup.configure_logging("info", "json", stream=log_stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logsetup.get_logger("koordnode.test").exception("hook_failed")
    record = json.loads(log_stream.getvalue())
    assert "RuntimeError: boom" in record["exception"]


def test_bad_level_or_format_is_rejected() -> None:
    with pytest.raises(ValueError):
        logsetup.configure_logging("verbose", "json")
    with pytest.raises(ValueError):
        logsetup.configure_logging("info", "xml")


def test_run_dry_run_flag_sets_daemon_dry_run(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import koordnode.daemon

    seen = {}
    monkeypatch.setattr(koordnode.daemon, "run", lambda config: seen.setdefault("config", config) and 0)
    config = tmp_path / "k.toml"
    config.write_text("[daemon]\ndry_run = false\n")
    assert cli.main(["run", "--config", str(config), "--dry-run"]) == 0
    assert seen["config"].daemon.dry_run is True
    seen.clear()
    assert cli.main(["run", "--config", str(config)]) == 0
    assert seen["config"].daemon.dry_run is False


def test_status_text_shows_each_pods_weight_and_be_memory_bound() -> None:
    from koordnode.admin.client import render_status

    pod = {"namespace": "default", "state": "ready", "containers": []}
    text = render_status({"pods": [
        {**pod, "name": "lsr", "sandbox_id": "a" * 64, "qos_class": "LSR",
         "cpu_weight": {"cpu.shares": 65536, "cpu.weight": 2500}},
        {**pod, "name": "starting", "sandbox_id": "b" * 64, "qos_class": "LS", "cpu_weight": None},
        {**pod, "name": "batch", "sandbox_id": "c" * 64, "qos_class": "BE", "cpu_weight": {"cpu.shares": 2},
         "be_memory_bound": {"memory.high": 140 << 20, "budget_bytes": 200 << 20}},
        {**pod, "name": "limited", "sandbox_id": "d" * 64, "qos_class": "BE", "be_memory_bound": None},
    ]})
    assert "    weight: cpu.shares 65536, cpu.weight 2500" in text
    assert "    weight: kubelet's ([cgroup] pod_class_weight off, no running container yet, or an idle BE pod)" in text
    assert "    BE memory bound: memory.high / soft limit 140 MiB of the BE budget 200 MiB" in text
    assert "    BE memory bound: none from the budget" in text


def test_status_text_shows_core_scheduling_node_wide_and_per_pod() -> None:
    from koordnode.admin.client import render_status

    pod = {"namespace": "default", "state": "ready", "containers": []}
    text = render_status({
        "qos": {"core_sched": {"classes": ["LSE"], "expellers": ["LS"], "state": "on"}},
        "pods": [{**pod, "name": "batch", "sandbox_id": "c" * 64, "qos_class": "BE",
                  "core_sched": "on: 2 process(es) share BE's cookie, kept off the cores of LS",
                  "sched_slice": "100 us for 3 thread(s)"}],
    })
    assert "core sched  LSE a cookie per pod; BE kept off the cores of LS: on" in text
    assert "    sched slice: 100 us for 3 thread(s)" in text
    assert "    core sched: on: 2 process(es) share BE's cookie, kept off the cores of LS" in text
    assert "core sched" not in render_status({"qos": {"core_sched": {"classes": [], "expellers": [], "state": "off"}}})


def test_status_text_shows_what_koordnode_keeps_on_kubelets_tiers_and_why() -> None:
    from koordnode.admin.client import render_status

    why = "memory.min 402653184 = Σ of 3 pods' protection (kubelet's own: 0)"
    text = render_status({"qos": {"memory_tiers": {"/kubepods": {"memory.min": {
        "value": 402653184, "needed": 402653184, "pods": 3, "from_files": 0, "kubelet": 0,
        "kept_by": "koordnode", "why": why}}}}})
    assert "memory tiers  (kubelet's cgroups above the pods: a pod's protection counts only up to theirs)" in text
    assert f"  /kubepods  [koordnode] {why}" in text
    assert "memory tiers" not in render_status({"qos": {"memory_tiers": {}}})


def test_koordnode_run_imports_leave_what_the_default_config_never_uses_unloaded() -> None:
    """Each module costs the daemon resident memory for as long as it runs: the Kubernetes
    client, the NRI plugin and the config's spelling suggestions load only when used."""
    code = ("import json, sys, koordnode.cli, koordnode.logsetup, koordnode.daemon; "
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.check_output([sys.executable, "-c", code], cwd=REPO, text=True)
    loaded = set(json.loads(out))
    assert "koordnode.daemon" in loaded
    unused = {m for m in loaded if m.startswith(("koordnode.kube", "koordnode.nri", "koordnode.doctor",
                                                 "koordnode.admin.top", "difflib"))}
    assert not unused


@pytest.mark.parametrize("kubernetes", [False, True])
def test_koordnode_run_keeps_tls_out_unless_kubernetes_needs_it(tmp_path, kubernetes: bool) -> None:
    """Without [kubernetes], `koordnode run` keeps ssl and OpenSSL's hashes out (4.4 MiB), and
    what it hashes still hashes the same (CPython's own sha2 and blake2)."""
    import hashlib

    config = tmp_path / "koordnode.toml"
    config.write_text("[kubernetes]\nenable = true\n" if kubernetes else "")
    code = ("import json, sys; from koordnode import tls_modules; from koordnode.config import load_config; "
            f"c = load_config({str(config)!r}); "
            "tls_modules.leave_tls_out() if not c.kubernetes.enable else None; "
            "import asyncio, hashlib, koordnode.daemon, koordnode.policy.net, koordnode.model.annotations; "
            "print(json.dumps([sys.modules.get('ssl') is not None, sys.modules.get('_hashlib') is not None, "
            "hashlib.sha256(b'x').hexdigest(), hashlib.blake2b(b'x', digest_size=8).hexdigest()]))")
    # -S: no site hooks (a .pth file may import ssl first, as the packaged launcher does not).
    path = os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    out = subprocess.check_output([sys.executable, "-S", "-c", code], cwd=REPO, text=True,
                                  env={**os.environ, "PYTHONPATH": path})
    ssl_loaded, openssl_hashes, sha, blake = json.loads(out.splitlines()[-1])
    assert (ssl_loaded, openssl_hashes) == ((True, True) if kubernetes else (False, False))
    assert sha == hashlib.sha256(b"x").hexdigest() and blake == hashlib.blake2b(b"x", digest_size=8).hexdigest()
