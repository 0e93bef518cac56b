"""The .deb and .rpm built by packaging/build.sh, the systemd unit, and the maintainer scripts.

The packages are built once per module (about 30 s each: the pinned wheels come from the
package index). The .deb is really installed on this machine, upgraded, removed and purged
(root only; the machine is left as it was); the .rpm goes into a scratch root. Maintainer
scripts are also run one by one in a private mount namespace with fake systemctl and
deb-systemd-helper, to check what they ask systemd for when it runs (it does not here).
"""

from __future__ import annotations

import ast
import gzip
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from koordnode import __version__
from koordnode.cli import build_parser
from koordnode.config import describe_settings
from testbed.fixtures import skip_or_fail_in_ci
from vm.lane import cache_root
from vm.packages import stage_wheelhouse

REPO = Path(__file__).resolve().parents[1]
BUILD_SH = REPO / "packaging" / "build.sh"
UNIT = REPO / "systemd" / "koordnode.service"
DEB_SCRIPTS = REPO / "packaging" / "deb"
UPGRADE_VERSION = f"{__version__}+upgradetest"
CONF = "/etc/koordnode/koordnode.toml"
WANTS_LINK = Path("/etc/systemd/system/multi-user.target.wants/koordnode.service")
DSH_STATE = Path("/var/lib/systemd/deb-systemd-helper-enabled/koordnode.service.dsh-also")
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _unavailable(reason: str) -> None:
    skip_or_fail_in_ci(reason)


def _require_tools(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        _unavailable(f"missing {', '.join(missing)} (scripts/install-deps.sh installs them)")


def _require_root() -> None:
    if os.geteuid() != 0:
        _unavailable("needs root")


def run(cmd: Sequence[str | os.PathLike[str]], *, check: bool = True, timeout: float = 120,
        **kwargs) -> subprocess.CompletedProcess[str]:
    if "input" not in kwargs:
        kwargs["stdin"] = subprocess.DEVNULL  # dpkg must never wait for an answer
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                            timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {result.returncode}\n"
                             f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


# ---------------------------------------------------------------------------------------------
# Building


@dataclass(frozen=True)
class Built:
    version: str
    deb: Path
    rpm: Path


@dataclass(frozen=True)
class Packages:
    current: Built
    upgrade: Built


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Packages:
    _require_tools("dpkg-deb", "rpmbuild", "rpm")
    built = []
    for version in (__version__, UPGRADE_VERSION):
        out = tmp_path_factory.mktemp("dist")
        started = time.monotonic()
        result = run(["bash", BUILD_SH, "--version", version, "--out", out], timeout=600)
        print(f"build.sh --version {version}: {time.monotonic() - started:.1f} s")
        deb = out / f"koordnode_{version}_amd64.deb"
        rpm = out / f"koordnode-{version}.x86_64.rpm"
        assert result.stdout.split() == [str(deb), str(rpm)]  # build.sh prints what it made
        assert deb.is_file() and rpm.is_file()
        built.append(Built(version, deb, rpm))
    return Packages(*built)


def test_build_rejects_bad_arguments(tmp_path: Path) -> None:
    for args, message in (
        (["--formats", "zip"], "unknown format 'zip'"),
        (["--version", "1.0-1"], "version '1.0-1' is not of the form"),
        (["--frobnicate"], "unknown argument: --frobnicate"),
    ):
        result = run(["bash", BUILD_SH, *args, "--out", tmp_path], check=False)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
    assert not list(tmp_path.iterdir())


def test_build_offline_from_the_staged_wheelhouse(tmp_path: Path) -> None:
    """build.sh without an index, from only what tests/vm/packages.py stages for the VM lane's
    guest: a requirement the wheelhouse lacks (a source archive's build requirement, say)
    fails here in seconds, not after the guest has booted under TCG."""
    _require_tools("dpkg-deb")
    wheels = tmp_path / "wheelhouse"
    stage_wheelhouse(wheels, cache_root())
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_CACHE_DIR": "1",
           "PIP_CONFIG_FILE": os.devnull, "HOME": str(tmp_path)}
    result = subprocess.run(["bash", BUILD_SH, "--formats", "deb", "--out", tmp_path / "out"],
                            capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert Path(result.stdout.split()[-1]).is_file()


# ---------------------------------------------------------------------------------------------
# The unit


def _unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    _require_tools("systemd-analyze")
    # verify insists that ExecStart= exists; point it at a stub, leave the rest as shipped.
    stub = tmp_path / "koordnode"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = tmp_path / "koordnode.service"
    text = UNIT.read_text()
    assert "ExecStart=/usr/bin/koordnode " in text
    unit.write_text(text.replace("ExecStart=/usr/bin/koordnode ", f"ExecStart={stub} "))
    # --man=no: koordnode(8) is only there once the package is installed (checked below).
    result = run(["systemd-analyze", "verify", "--man=no", unit], check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_unit_contract() -> None:
    unit = _unit_settings()
    expected = {
        "Type": ["notify"], "NotifyAccess": ["main"], "Restart": ["always"],
        "ExecStart": ["/usr/bin/koordnode run --config /etc/koordnode/koordnode.toml"],
        "ExecReload": ["/bin/kill -HUP $MAINPID"], "RuntimeDirectory": ["koordnode"],
        "Wants": ["containerd.service"], "Before": ["kubelet.service"],
        "ProtectSystem": ["strict"], "NoNewPrivileges": ["yes"], "ProtectHome": ["yes"],
        "PrivateTmp": ["yes"], "WantedBy": ["multi-user.target"],
        # [daemon] state_dir's default: writable for the originals under ProtectSystem=strict.
        "StateDirectory": ["koordnode"], "StateDirectoryMode": ["0700"],
    }
    for key, value in expected.items():
        assert unit.get(key) == value, key
    assert "containerd.service" in unit["After"][0].split()
    from koordnode.config import DaemonConfig  # the unit makes writable what the daemon writes

    assert DaemonConfig().state_dir == "/var/lib/" + unit["StateDirectory"][0]
    assert re.fullmatch(r"\d+s", unit["WatchdogSec"][0])
    # Nothing that would stop cgroup, resctrl or sysctl writes, /proc/<pid> reads or netlink.
    for blocking in ("ProtectKernelTunables", "ProtectControlGroups", "PrivateDevices",
                     "PrivateNetwork", "ProtectProc", "ProcSubset", "MemoryDenyWriteExecute",
                     "ReadOnlyPaths", "InaccessiblePaths", "PrivateUsers", "DynamicUser", "User"):
        assert blocking not in unit, blocking
    capabilities = unit["CapabilityBoundingSet"][0].split()
    assert {"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE"} <= set(capabilities)
    assert {"AF_UNIX", "AF_NETLINK", "AF_INET"} <= set(unit["RestrictAddressFamilies"][0].split())
    assert "@mount" not in unit["SystemCallFilter"][0]


# ---------------------------------------------------------------------------------------------
# Package contents


def _deb_files(deb: Path) -> dict[str, str]:
    """{path: 'mode owner'} of the data archive, symlinks as 'link -> target'."""
    files = {}
    for line in run(["dpkg-deb", "-c", deb]).stdout.splitlines():
        mode, owner, _size, _date, _time, path, *rest = line.split()
        path = path.removeprefix(".")
        files[path.rstrip("/") or "/"] = f"{mode} {owner}" + (f" {' '.join(rest)}" if rest else "")
    return files


def test_deb_contents(packages: Packages, tmp_path: Path) -> None:
    deb = packages.current.deb
    files = _deb_files(deb)
    assert files["/usr/bin/koordnode"].endswith("-> /opt/koordnode/bin/koordnode")
    for path, mode in {
        "/opt/koordnode/bin/koordnode": "-rwxr-xr-x",
        "/opt/koordnode/bin/koordnode-bytecode": "-rwxr-xr-x",
        "/lib/systemd/system/koordnode.service": "-rw-r--r--",
        CONF: "-rw-r--r--",
        "/usr/share/man/man8/koordnode.8.gz": "-rw-r--r--",
        "/usr/share/doc/koordnode/copyright": "-rw-r--r--",
        "/usr/share/doc/koordnode/koordnode-rbac.yaml": "-rw-r--r--",
    }.items():
        assert files[path].startswith(mode), path
    assert all(" root/root" in entry for entry in files.values())
    site = "/opt/koordnode/lib"
    for module in ("koordnode/cli.py", "koordnode/daemon.py", "koordnode/sdnotify.py",
                   "koordnode/metrics/recorder.py", "google/protobuf/__init__.py", "h2/__init__.py",
                   "psutil/__init__.py", "pyroute2/__init__.py", "structlog/__init__.py"):
        assert f"{site}/{module}" in files, module
    assert not [p for p in files if p.startswith(f"{site}/prometheus_client")]  # koordnode writes its own exposition
    sources = [p for p in files if p.startswith(site) and p.endswith(".py")]
    # One library directory for every CPython >= 3.11: no grpcio (the daemon does not use it),
    # extension modules only abi3, no byte code (it is per interpreter: made at install time).
    assert not [p for p in files if p.startswith(f"{site}/grpc")]
    assert f"{site}/koordnode/cri/api_pb2.py" in files
    assert not [p for p in files if p.endswith("_grpc.py")]  # the tests' gRPC client stays theirs
    extensions = [p for p in files if p.endswith(".so")]
    assert extensions and all(p.endswith(".abi3.so") for p in extensions), extensions
    assert not [p for p in files if p.endswith(".pyc") or "__pycache__" in p]
    # Not shipped: pip, the dependencies' console scripts, a virtualenv.
    assert not [p for p in files if "/pip/" in p or "/venv" in p or p.startswith(f"{site}/bin")]
    assert sorted(p for p in files if p.startswith("/opt/koordnode/bin/")) == [
        "/opt/koordnode/bin/koordnode", "/opt/koordnode/bin/koordnode-bytecode"]

    control = run(["dpkg-deb", "-f", deb]).stdout
    assert f"Version: {__version__}\n" in control
    assert "Architecture: amd64\n" in control
    assert "Depends: python3 (>= 3.11~) | python3.11 | python3.12 | python3.13 | python3.14\n" \
        in control
    run(["dpkg-deb", "-e", deb, tmp_path / "DEBIAN"])
    assert (tmp_path / "DEBIAN" / "conffiles").read_text() == f"{CONF}\n"
    for script in ("postinst", "prerm", "postrm"):
        shipped = tmp_path / "DEBIAN" / script
        assert shipped.read_bytes() == (DEB_SCRIPTS / script).read_bytes()
        assert os.access(shipped, os.X_OK)
        run(["sh", "-n", shipped])
    assert (tmp_path / "DEBIAN" / "md5sums").read_text().count("\n") > len(sources)


def _modules_importing_grpc(package_root: Path) -> list[str]:
    """koordnode's modules under `package_root` that import grpc, or are generated gRPC stubs."""
    offenders = []
    for path in sorted(package_root.rglob("*.py")):
        if path.name.endswith("_grpc.py"):
            offenders.append(str(path.relative_to(package_root)))
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name == "grpc" or name.startswith("grpc.") for name in names):
                offenders.append(str(path.relative_to(package_root)))
    return offenders


def test_wheel_ships_no_grpc_client_stub(tmp_path: Path) -> None:
    """The generated gRPC client (tests/support/api_pb2_grpc.py) is the tests' own: grpcio is not
    bundled, so a product module that imported it could not be imported where koordnode runs.
    Checked on the wheel packaging/build.sh installs (built from a copy of the tree, as it does)."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "koordnode", src / "koordnode", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src)
    (src / "README.md").write_text("")
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", tmp_path / "wheels", src], timeout=300)
    [wheel] = (tmp_path / "wheels").glob("koordnode-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "installed")
    assert "koordnode/cri/api_pb2.py" in names  # the messages ship: the proxy decodes them
    assert not [n for n in names if n.startswith("tests/") or n.endswith("_grpc.py")]
    assert _modules_importing_grpc(tmp_path / "installed" / "koordnode") == []


def test_rpm_contents(packages: Packages) -> None:
    rpm = packages.current.rpm
    query = ["rpm", "-qp", rpm]
    assert run([*query, "--qf", "%{NAME} %{VERSION} %{ARCH}"]).stdout == \
        f"koordnode {__version__} x86_64"
    files = set(run([*query, "-l"]).stdout.split())
    assert {"/usr/bin/koordnode", "/usr/lib/systemd/system/koordnode.service", CONF,
            "/opt/koordnode/bin/koordnode", "/opt/koordnode/lib/koordnode/cli.py",
            "/usr/share/man/man8/koordnode.8.gz"} <= files
    assert "/lib/systemd/system/koordnode.service" not in files
    assert run([*query, "-c"]).stdout.split() == [CONF]
    flags = run([*query, "--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]"]).stdout
    assert f"cn {CONF}\n" in flags  # %config(noreplace)
    requires = run([*query, "--requires"]).stdout.splitlines()
    assert "python(abi) >= 3.11" in requires
    assert not [r for r in requires if r.startswith("lib")]  # bundled .so files stay private
    scripts = run([*query, "--scripts"]).stdout
    for scriptlet in ("postinstall", "preuninstall", "postuninstall"):
        assert f"{scriptlet} scriptlet" in scripts


def test_manpage_documents_every_command_and_key(packages: Packages, tmp_path: Path) -> None:
    run(["dpkg-deb", "-x", packages.current.deb, tmp_path])
    source = gzip.decompress((tmp_path / "usr/share/man/man8/koordnode.8.gz").read_bytes()).decode()
    assert source.startswith(".TH KOORDNODE 8 ")
    if shutil.which("groff"):
        result = run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=source, check=False)
        assert (result.returncode, result.stderr) == (0, "")
    plain = re.sub(r"\\f[BIRP]", "", source).replace("\\-", "-").replace("\\e", "\\")
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command, parser in commands.items():
        assert f".SS koordnode {command}" in plain
        for action in parser._actions:
            for option in action.option_strings:
                assert option in plain, (command, option)
    for setting in describe_settings():
        assert f"\n{setting.key} = " in plain, setting.key


# ---------------------------------------------------------------------------------------------
# Installing the .deb on this machine


def _dpkg_status() -> str:
    result = run(["dpkg-query", "-W", "-f=${Status}", "koordnode"], check=False)
    # dpkg may keep a record of a purged package ("unknown ok not-installed"): that is absent.
    if result.returncode != 0 or result.stdout.endswith(" not-installed"):
        return ""
    return result.stdout


def _koordnode(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(["/usr/bin/koordnode", *args], env=CLEAN_ENV, cwd="/", check=check)


def _daemon_smoke_test(tmp_path: Path) -> None:
    """The installed venv really runs the daemon: it serves, then stops on SIGTERM."""
    listen, admin = tmp_path / "cri.sock", tmp_path / "admin.sock"
    config = tmp_path / "smoke.toml"
    config.write_text(f'[proxy]\nlisten = "{listen}"\nbackend = "{tmp_path / "none.sock"}"\n'
                      f'[admin]\nsocket = "{admin}"\n')
    if "[metrics]" in _koordnode("check-config", "--config", str(config)).stdout:
        config.write_text(config.read_text() + '[metrics]\nlisten = ""\n')
    proc = subprocess.Popen(["/usr/bin/koordnode", "run", "--config", str(config)],
                            env=CLEAN_ENV, cwd="/", stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not listen.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not listen.exists():
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"the daemon did not listen (exit {proc.returncode}): {err}")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _edit_config(text: str) -> str:
    edited, count = re.subn(r"(?m)^hook_timeout_ms = \d+$", "hook_timeout_ms = 350", text)
    assert count == 1, "expected one hook_timeout_ms line in the shipped config"
    return edited + "\n# edited by the operator\n"


def _files_not_in_package() -> list[str]:
    listed = set(run(["dpkg", "-L", "koordnode"]).stdout.split())
    on_disk = {str(p) for p in Path("/opt/koordnode").rglob("*")}
    return sorted(on_disk - listed)


@pytest.fixture
def machine_without_koordnode() -> Iterator[None]:
    """Installs happen on the real machine: refuse to touch an existing install; purge after."""
    _require_root()
    _require_tools("dpkg", "dpkg-deb", "deb-systemd-helper")
    if _dpkg_status() or Path("/etc/koordnode").exists() or Path("/opt/koordnode").exists():
        pytest.skip("koordnode is (or was) installed on this machine; not touching it")
    try:
        yield
    finally:
        if _dpkg_status():
            run(["dpkg", "--purge", "koordnode"], check=False, timeout=300)
        for leftover in (Path("/etc/koordnode"), Path("/opt/koordnode")):
            if leftover.exists():
                shutil.rmtree(leftover)


@pytest.mark.usefixtures("machine_without_koordnode")
def test_deb_install_upgrade_remove_purge(packages: Packages, tmp_path: Path) -> None:
    # Install: the command works with the system python and the shipped config, the unit is
    # enabled (symlink made even though systemd is not running here), nothing started.
    run(["dpkg", "--install", packages.current.deb], timeout=300)
    assert _dpkg_status() == "install ok installed"
    version = _koordnode("version").stdout.splitlines()
    assert version[0] == f"koordnode {__version__}"
    system_python = run(["/usr/bin/python3", "-c", "import platform; print(platform.python_version())"])
    assert version[1].startswith(f"python {system_python.stdout.strip()} ")
    # postinst compiled the library for the system interpreter (hash-checked byte code).
    tag = run(["/usr/bin/python3", "-c", "import sys; print(sys.implementation.cache_tag)"])
    assert Path(f"/opt/koordnode/lib/koordnode/__pycache__/cli.{tag.stdout.strip()}.pyc").is_file()
    check = _koordnode("check-config", "--config", CONF)
    assert check.stdout.startswith(f"config OK: {CONF}\n")
    assert "hook_timeout_ms = 200" in check.stdout
    assert "--config PATH" in _koordnode("run", "--help").stdout
    assert WANTS_LINK.resolve() == Path("/lib/systemd/system/koordnode.service").resolve()
    if shutil.which("systemd-analyze"):
        result = run(["systemd-analyze", "verify", "/lib/systemd/system/koordnode.service"],
                     check=False)  # the real binary and man page this time
        assert (result.returncode, result.stdout + result.stderr) == (0, "")
    if shutil.which("man"):
        assert run(["man", "-w", "koordnode"]).stdout.strip() == "/usr/share/man/man8/koordnode.8.gz"
    compiled = _files_not_in_package()
    assert compiled and all("/__pycache__" in p for p in compiled)  # only postinst's byte code
    _daemon_smoke_test(tmp_path)
    assert _files_not_in_package() == compiled  # running it wrote nothing under /opt
    assert run(["dpkg", "--verify", "koordnode"]).stdout == ""

    # Upgrade with an edited config: the edit survives, silently (the shipped file did not
    # change), and the new code runs.
    conf = Path(CONF)
    edited = _edit_config(conf.read_text())
    conf.write_text(edited)
    run(["dpkg", "--install", packages.upgrade.deb], timeout=300)
    assert _koordnode("version").stdout.splitlines()[0] == f"koordnode {UPGRADE_VERSION}"
    assert conf.read_text() == edited
    assert sorted(p.name for p in conf.parent.iterdir()) == ["koordnode.toml"]
    assert "hook_timeout_ms = 350" in _koordnode("check-config", "--config", CONF).stdout
    assert WANTS_LINK.is_symlink()

    # Remove: program, unit and enablement gone, config kept.
    run(["dpkg", "--remove", "koordnode"], timeout=300)
    assert _dpkg_status() == "deinstall ok config-files"
    assert conf.read_text() == edited
    for gone in (Path("/opt/koordnode"), Path("/usr/bin/koordnode"),
                 Path("/lib/systemd/system/koordnode.service")):
        assert not gone.exists() and not gone.is_symlink(), gone
    assert not WANTS_LINK.is_symlink()

    # Purge: the config and every trace of the enablement gone.
    run(["dpkg", "--purge", "koordnode"], timeout=300)
    assert _dpkg_status() == ""
    assert not Path("/etc/koordnode").exists()
    assert not DSH_STATE.exists()


# ---------------------------------------------------------------------------------------------
# Maintainer scripts when systemd runs, in a private mount namespace with fake tools

_FAKE_TOOL = """#!/bin/sh
echo "$(basename "$0") $*" >> "$FAKE_LOG"
if [ "$(basename "$0")" = deb-systemd-helper ] && [ "$2" = was-enabled ]; then
    exit "${FAKE_WAS_ENABLED:-0}"
fi
exit 0
"""

# Inside `unshare --mount`: fresh tmpfs on /run, /opt and /etc (so nothing real is touched),
# an installed-looking koordnode, then one maintainer script, then what is left.
_DRIVER = """
set -e
mount -t tmpfs tmpfs /run
[ "$SYSTEMD_RUNNING" = yes ] && mkdir -p /run/systemd/system
mount -t tmpfs tmpfs /opt
mkdir -p /opt/koordnode/venv /opt/koordnode/bin
cp "$FAKE_KOORDNODE" /opt/koordnode/bin/koordnode
mount -t tmpfs tmpfs /etc
mkdir -p /etc/koordnode
echo 'x = 1' > /etc/koordnode/koordnode.toml
echo 'x = 0' > /etc/koordnode/koordnode.toml.dpkg-old
echo 'mine' > /etc/koordnode/notes.txt
set +e
"$@"
echo "exit=$?"
echo "etc=$(ls -A /etc/koordnode 2>/dev/null | tr '\\n' ' ')"
[ -e /opt/koordnode ] && echo "opt=present" || echo "opt=absent"
"""


@dataclass
class ScriptRun:
    calls: list[str]
    output: str

    def _field(self, name: str) -> str:
        match = re.search(rf"(?m)^{name}=(.*)$", self.output)
        assert match, self.output
        return match.group(1)

    @property
    def exit_code(self) -> int:
        return int(self._field("exit"))

    @property
    def etc_files(self) -> list[str]:
        """What is left in /etc/koordnode after the script."""
        return sorted(self._field("etc").split())

    @property
    def opt_present(self) -> bool:
        return self._field("opt") == "present"


@pytest.fixture
def run_script(tmp_path: Path):
    _require_root()
    _require_tools("unshare", "mount")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for tool in ("systemctl", "deb-systemd-helper", "deb-systemd-invoke"):
        (fake_bin / tool).write_text(_FAKE_TOOL)
        (fake_bin / tool).chmod(0o755)
    log = tmp_path / "calls.log"
    # The installed launcher, as the scripts see it: logs `koordnode restore` like the tools.
    fake_koordnode = tmp_path / "koordnode"
    fake_koordnode.write_text(_FAKE_TOOL)
    fake_koordnode.chmod(0o755)

    def run_one(script: Sequence[str], *, systemd: bool = True,
                was_enabled: bool = True, restore_exit: int = 0) -> ScriptRun:
        log.write_text("")
        fake_koordnode.write_text(_FAKE_TOOL.replace("exit 0\n", f"exit {restore_exit}\n"))
        env = {**CLEAN_ENV, "PATH": f"{fake_bin}:{CLEAN_ENV['PATH']}", "FAKE_LOG": str(log),
               "FAKE_KOORDNODE": str(fake_koordnode),
               "SYSTEMD_RUNNING": "yes" if systemd else "no",
               "FAKE_WAS_ENABLED": "0" if was_enabled else "1"}
        result = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _DRIVER,
                      "driver", *script], env=env, timeout=60)
        return ScriptRun(log.read_text().splitlines(), result.stdout)

    return run_one


def _deb(script: str, *args: str) -> list[str]:
    return ["sh", str(DEB_SCRIPTS / script), *args]


def test_deb_scripts_enable_but_do_not_start_on_install(run_script) -> None:
    fresh = run_script(_deb("postinst", "configure", ""))
    assert fresh.exit_code == 0
    assert fresh.calls == ["deb-systemd-helper --quiet was-enabled koordnode.service",
                           "deb-systemd-helper enable koordnode.service",
                           "systemctl --system daemon-reload"]
    # Without systemd: enabled for the next boot all the same, no systemctl call at all.
    offline = run_script(_deb("postinst", "configure", ""), systemd=False)
    assert offline.calls == ["deb-systemd-helper --quiet was-enabled koordnode.service",
                             "deb-systemd-helper enable koordnode.service"]


def test_deb_scripts_restart_on_upgrade_only_if_running(run_script) -> None:
    upgrade = run_script(_deb("postinst", "configure", "0.0.9"))
    assert upgrade.calls[-2:] == ["systemctl --system daemon-reload",
                                  "deb-systemd-invoke try-restart koordnode.service"]
    assert run_script(_deb("prerm", "upgrade", "0.2.0")).calls == []  # no stop (nor restore) before unpacking
    assert run_script(_deb("postrm", "upgrade", "0.2.0")).calls == []
    # The admin disabled it: the upgrade keeps it disabled.
    disabled = run_script(_deb("postinst", "configure", "0.0.9"), was_enabled=False)
    assert "deb-systemd-helper update-state koordnode.service" in disabled.calls
    assert "deb-systemd-helper enable koordnode.service" not in disabled.calls
    offline = run_script(_deb("postinst", "configure", "0.0.9"), systemd=False)
    assert not [c for c in offline.calls if not c.startswith("deb-systemd-helper ")]


def test_deb_scripts_stop_and_disable_on_remove_keep_config(run_script) -> None:
    # Stopped first (the restore refuses while koordnode runs), then the node put back.
    assert run_script(_deb("prerm", "remove")).calls == ["deb-systemd-invoke stop koordnode.service",
                                                         "koordnode restore"]
    assert run_script(_deb("prerm", "remove"), systemd=False).calls == ["koordnode restore"]
    assert run_script(_deb("prerm", "deconfigure")).calls == []
    # A restore that leaves something behind (exit 1) does not block the removal.
    failed = run_script(_deb("prerm", "remove"), restore_exit=1)
    assert failed.exit_code == 0 and failed.calls[-1] == "koordnode restore"
    assert run_script(_deb("prerm", "failed-upgrade", "0.2.0")).calls == []
    removed = run_script(_deb("postrm", "remove"))
    assert removed.calls == ["deb-systemd-helper purge koordnode.service",
                             "systemctl --system daemon-reload"]
    assert removed.exit_code == 0
    assert "koordnode.toml" in removed.etc_files
    assert not removed.opt_present


def test_deb_scripts_delete_config_on_purge(run_script) -> None:
    purged = run_script(_deb("postrm", "purge"), systemd=False)
    assert purged.exit_code == 0
    assert purged.calls == ["deb-systemd-helper purge koordnode.service"]
    # The conffile and its dpkg backups are gone; what the admin put there stays.
    assert purged.etc_files == ["notes.txt"]
    assert not purged.opt_present


def _rpm_scriptlet(rpm: Path, tag: str, tmp_path: Path) -> Path:
    body = run(["rpm", "-qp", "--qf", f"%{{{tag}}}", rpm]).stdout
    path = tmp_path / tag.lower()
    path.write_text(body + "\n")
    return path


def test_rpm_scriptlets(packages: Packages, run_script, tmp_path: Path) -> None:
    rpm = packages.current.rpm
    post, preun, postun = (_rpm_scriptlet(rpm, tag, tmp_path)
                           for tag in ("POSTIN", "PREUN", "POSTUN"))
    enable = "systemctl --no-reload enable koordnode.service"
    assert run_script(["sh", str(post), "1"]).calls == [enable, "systemctl daemon-reload"]
    assert run_script(["sh", str(post), "1"], systemd=False).calls == [enable]
    assert run_script(["sh", str(post), "2"]).calls == ["systemctl daemon-reload"]
    assert run_script(["sh", str(preun), "0"]).calls == [
        "systemctl stop koordnode.service", "koordnode restore", "systemctl --no-reload disable koordnode.service"]
    assert run_script(["sh", str(preun), "1"]).calls == []
    upgraded = run_script(["sh", str(postun), "1"])
    assert upgraded.calls == ["systemctl daemon-reload", "systemctl try-restart koordnode.service"]
    assert upgraded.opt_present
    erased = run_script(["sh", str(postun), "0"], systemd=False)
    assert erased.calls == [] and not erased.opt_present
    assert "koordnode.toml" in erased.etc_files  # rpm itself decides about %config files


# ---------------------------------------------------------------------------------------------
# The .rpm in a scratch root


def _interpreter_matrix() -> dict[str, tuple[dict[str, str], bool]]:
    """Distributions by the interpreter packages they have: {name: ({package: version}, ok)}."""
    return {
        "debian-12": ({"python3": "3.11.2-1+b1", "python3.11": "3.11.2-6"}, True),
        "debian-13": ({"python3": "3.13.5-1", "python3.13": "3.13.5-2"}, True),
        "ubuntu-24.04": ({"python3": "3.12.3-0ubuntu2", "python3.12": "3.12.3-1"}, True),
        "ubuntu-22.04 + python3.11": ({"python3": "3.10.6-1~22.04", "python3.11": "3.11.0-1"},
                                      True),
        "ubuntu-22.04": ({"python3": "3.10.6-1~22.04", "python3.10": "3.10.12-1"}, False),
        "debian-11": ({"python3": "3.9.2-3", "python3.9": "3.9.2-1"}, False),
    }


def test_deb_dependencies_resolve_against_supported_interpreters(
    packages: Packages, tmp_path: Path
) -> None:
    """The .deb's Depends, checked by dpkg itself against the interpreter packages of each
    distribution (a dpkg database with only those packages installed)."""
    _require_tools("dpkg-checkbuilddeps")
    depends = run(["dpkg-deb", "-f", packages.current.deb, "Depends"]).stdout.strip()
    control = tmp_path / "control"
    control.write_text("Source: probe\n\nPackage: probe\nArchitecture: any\n")
    for distribution, (installed, expected) in _interpreter_matrix().items():
        admin = tmp_path / distribution.replace(" ", "_")
        (admin / "info").mkdir(parents=True)
        (admin / "updates").mkdir()
        (admin / "status").write_text("".join(
            f"Package: {name}\nStatus: install ok installed\nVersion: {version}\n"
            f"Architecture: amd64\nMaintainer: x <x@x.invalid>\nDescription: fake\n\n"
            for name, version in installed.items()))
        result = run(["dpkg-checkbuilddeps", f"--admindir={admin}", "-d", depends, control],
                     check=False)
        assert (result.returncode == 0) == expected, (distribution, result.stderr)


def _fake_rpm(name: str, version: str, provides: Sequence[str], out: Path, work: Path) -> Path:
    spec = work / f"{name}.spec"
    spec.write_text(f"Name: {name}\nVersion: {version}\nRelease: 1\nSummary: fake\n"
                    f"License: none\nBuildArch: noarch\n"
                    + "".join(f"Provides: {p}\n" for p in provides)
                    + "%description\nfake\n%files\n")
    run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {work / 'top'}",
         "--define", f"_rpmdir {out}", "--define", "_rpmfilename %{NAME}.rpm", spec])
    return out / f"{name}.rpm"


def test_rpm_dependencies_resolve_against_supported_interpreters(
    packages: Packages, tmp_path: Path
) -> None:
    """rpm resolves the .rpm's requirements (no --nodeps) in scratch roots holding only the
    interpreter packages (as rpm provides) of RHEL 9, RHEL 10 and Fedora, and refuses a root
    whose only Python is 3.9."""
    out, work = tmp_path / "rpms", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    base = _fake_rpm("base", "1", ["/bin/sh"], out, work)  # what the scriptlets run with
    interpreters = {
        "python3-3.9": _fake_rpm("python3", "3.9.21", ["python(abi) = 3.9"], out, work),
        "python3.11": _fake_rpm("python3.11", "3.11.11", ["python(abi) = 3.11"], out, work),
        "python3.12": _fake_rpm("python3.12", "3.12.9", ["python(abi) = 3.12"], out, work),
    }
    (out / "f").mkdir()
    interpreters["python3-3.13"] = _fake_rpm("python3", "3.13.2", ["python(abi) = 3.13"],
                                             out / "f", work)
    for label, roots_packages, expected in (
        ("rhel-9", ["python3-3.9"], False),
        ("rhel-9 + python3.11", ["python3-3.9", "python3.11"], True),
        ("rhel-9 + python3.12", ["python3-3.9", "python3.12"], True),
        ("rhel-10 / fedora", ["python3-3.13"], True),
    ):
        root = tmp_path / label.replace(" ", "_").replace("/", "_")
        root.mkdir()
        rpm = ["rpm", "--root", str(root), "--dbpath", "/var/lib/rpm"]
        run([*rpm, "--initdb"])
        run([*rpm, "-i", "--justdb", base, *(interpreters[p] for p in roots_packages)])
        result = run([*rpm, "-i", "--test", packages.current.rpm], check=False)
        assert (result.returncode == 0) == expected, (label, result.stderr)
        if not expected:
            assert "python(abi) >= 3.11 is needed by koordnode" in result.stderr


def test_rpm_installs_upgrades_and_erases_in_a_scratch_root(
    packages: Packages, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    rpm = ["rpm", "--root", str(root), "--dbpath", "/var/lib/rpm"]
    run([*rpm, "--initdb"])
    run([*rpm, "-i", "--nodeps", "--noscripts", packages.current.rpm])
    assert run([*rpm, "-q", "koordnode"]).stdout.strip() == f"koordnode-{__version__}-1.x86_64"
    for path in ("usr/lib/systemd/system/koordnode.service", "etc/koordnode/koordnode.toml",
                 "usr/share/man/man8/koordnode.8.gz", "opt/koordnode/lib/koordnode/cli.py"):
        assert (root / path).is_file(), path
    assert os.readlink(root / "usr/bin/koordnode") == "/opt/koordnode/bin/koordnode"
    assert (root / "etc/koordnode/koordnode.toml").read_bytes() == \
        (REPO / "packaging/koordnode.toml").read_bytes()
    # The launcher finds its library from wherever it is: it runs from the scratch root.
    version = run([root / "opt/koordnode/bin/koordnode", "version"], env=CLEAN_ENV, cwd="/")
    assert version.stdout.splitlines()[0] == f"koordnode {__version__}"
    assert run([*rpm, "-V", "--nodeps", "koordnode"], check=False).stdout == ""  # all intact

    conf = root / "etc/koordnode/koordnode.toml"
    edited = _edit_config(conf.read_text())
    conf.write_text(edited)
    run([*rpm, "-U", "--nodeps", "--noscripts", packages.upgrade.rpm])
    assert run([*rpm, "-q", "koordnode"]).stdout.strip() == f"koordnode-{UPGRADE_VERSION}-1.x86_64"
    assert conf.read_text() == edited
    assert sorted(p.name for p in conf.parent.iterdir()) == ["koordnode.toml"]  # no .rpmnew

    run([*rpm, "-e", "--nodeps", "--noscripts", "koordnode"])
    # rpm has no purge: an edited config is kept aside as .rpmsave.
    assert sorted(p.name for p in conf.parent.iterdir()) == ["koordnode.toml.rpmsave"]
    assert not (root / "opt/koordnode").exists()
    assert not (root / "usr/bin/koordnode").is_symlink()


# ---------------------------------------------------------------------------------------------
# One library directory, every CPython >= 3.11

PYENV = Path("/root/.pyenv/versions")


def _other_pythons(minor_versions: Sequence[int]) -> dict[int, Path]:
    """CPython interpreters of other minor versions on this machine (pyenv builds)."""
    found = {}
    for minor in minor_versions:
        for candidate in sorted(PYENV.glob(f"3.{minor}.*/bin/python3.{minor}")):
            found[minor] = candidate
    return found


@pytest.fixture(scope="module")
def unpacked_deb(packages: Packages, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unpacked")
    run(["dpkg-deb", "-x", packages.current.deb, root])
    return root


def test_installed_tree_has_no_module_importing_grpc(unpacked_deb: Path) -> None:
    installed = unpacked_deb / "opt/koordnode/lib/koordnode"
    assert (installed / "cri" / "api_pb2.py").is_file()
    assert _modules_importing_grpc(installed) == []


def test_bundled_yaml_is_pure_python_and_parses_a_kubeconfig(unpacked_deb: Path) -> None:
    """PyYAML, built from source without its C loader: the library stays one for every CPython."""
    lib = unpacked_deb / "opt/koordnode/lib"
    assert (lib / "yaml" / "__init__.py").is_file()
    assert not [*lib.glob("yaml/**/*.so"), *lib.glob("_yaml/**/*.so")]  # _yaml/ is PyYAML's pure shim
    probe = (f"import site; site.addsitedir({str(lib)!r}); import yaml; "
             "from koordnode.kube.credentials import parse_kubeconfig_text as parse; "
             "print(yaml.__with_libyaml__, parse('users: [{name: a, user: {token: t}}]')['users'][0]['user']['token'])")
    loaded = run(["python3", "-I", "-S", "-c", probe], env=CLEAN_ENV, cwd="/")
    assert loaded.stdout.split() == ["False", "t"]


def test_library_runs_on_every_supported_cpython(unpacked_deb: Path, tmp_path: Path) -> None:
    """The same /opt/koordnode/lib runs koordnode (daemon modules, abi3 psutil and protobuf
    included) on CPython 3.11, 3.12 and 3.13; the launcher refuses 3.10."""
    pythons = _other_pythons([10, 11, 12, 13])
    if not {10, 12, 13} <= set(pythons):
        # Debian 12 has no CPython 3.12/3.13 package; the VM lane runs the .deb on 3.13.
        pytest.skip(f"needs builds of CPython 3.10, 3.12 and 3.13 under {PYENV}")
    launcher = unpacked_deb / "opt/koordnode/bin/koordnode"
    probe = ("import psutil, google.protobuf.internal.api_implementation as impl, koordnode.daemon;"
             "print(impl.Type(), psutil.cpu_count() > 0)")
    for minor, python in sorted(pythons.items()):
        env = {**CLEAN_ENV, "KOORDNODE_PYTHON": str(python)}
        result = run([launcher, "version"], env=env, cwd="/", check=False)
        if minor < 11:
            assert result.returncode == 1
            assert "is not a Python >= 3.11" in result.stderr
            continue
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[1].startswith(f"python 3.{minor}.")
        # The C (upb) protobuf backend and psutil's extension load on this interpreter.
        loaded = run([python, "-I", "-S", "-c",
                      f"import site; site.addsitedir({str(launcher.parents[1] / 'lib')!r});"
                      + probe], env=CLEAN_ENV, cwd="/")
        assert loaded.stdout.split() == ["upb", "True"], minor
        check = run([launcher, "check-config", "--config",
                     str(unpacked_deb / "etc/koordnode/koordnode.toml")], env=env, cwd="/")
        assert check.stdout.startswith("config OK: ")


def test_launcher_picks_a_supported_system_interpreter(unpacked_deb: Path, tmp_path: Path) -> None:
    """A RHEL 9-like /usr/bin (python3 is 3.9, python3.12 installed beside it) in a private
    mount namespace: the launcher takes python3.12; with only 3.9 it says what to install."""
    _require_root()
    _require_tools("unshare", "mount")
    pythons = _other_pythons([9, 12])
    if set(pythons) != {9, 12}:
        pytest.skip(f"needs builds of CPython 3.9 and 3.12 under {PYENV}")
    fake_bin = tmp_path / "usrbin"
    fake_bin.mkdir()
    for tool in ("dash", "dirname", "readlink", "basename"):
        shutil.copy2(shutil.which(tool) or f"/usr/bin/{tool}", fake_bin / tool)
    (fake_bin / "sh").symlink_to("dash")
    (fake_bin / "python3").symlink_to(pythons[9])
    (fake_bin / "python3.9").symlink_to(pythons[9])
    launcher = unpacked_deb / "opt/koordnode/bin/koordnode"
    mount = f"mount --bind {fake_bin} /usr/bin && exec /usr/bin/sh {launcher} version"
    only_old = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount],
                   env=CLEAN_ENV, cwd="/", check=False)
    assert only_old.returncode == 1
    assert "no Python >= 3.11 found" in only_old.stderr
    (fake_bin / "python3.12").symlink_to(pythons[12])
    picked = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount],
                 env=CLEAN_ENV, cwd="/")
    assert picked.stdout.splitlines()[1].startswith("python 3.12.")
