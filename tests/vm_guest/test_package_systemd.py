"""The .deb from packaging/build.sh under real systemd (Debian 13 guest, Python 3.13).

The host builds two packages (this version and ``<version>+upgradetest``) before the guest
boots, with tests/vm/packages.py, into the results share: /results/packages (or
$KOORDNODE_VM_PACKAGES). This test installs the first with dpkg, starts the unit and waits for
READY, reloads a config, stops the daemon with SIGSTOP and waits for the watchdog to restart it,
upgrades to the second with an edited config, removes and purges, checking systemd's view and
the files at each step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

PACKAGES = Path(os.environ.get("KOORDNODE_VM_PACKAGES", "/results/packages"))
UNIT = "koordnode.service"
CONF = Path("/etc/koordnode/koordnode.toml")
LISTEN = Path("/run/koordnode/koordnode.sock")
ADMIN = Path("/run/koordnode/admin.sock")
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def sh(*cmd: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV,
                            stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def show(*props: str) -> dict[str, str]:
    out = sh("systemctl", "show", UNIT, *(f"--property={p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal() -> str:
    return sh("journalctl", "-u", UNIT, "--no-pager", "-o", "cat", check=False).stdout


def wait_for(predicate, timeout_s: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}\njournal:\n{journal()[-4000:]}")


def status() -> dict:
    return json.loads(sh("koordnode", "status", "--json").stdout)


def packages() -> tuple[Path, Path, str, str]:
    debs = sorted(PACKAGES.glob("koordnode_*_amd64.deb"))
    upgrade = [d for d in debs if "+upgradetest" in d.name]
    current = [d for d in debs if "+upgradetest" not in d.name]
    error = PACKAGES / "ERROR.txt"
    if error.is_file():
        pytest.fail(f"the host could not build the packages: {error.read_text()}", pytrace=False)
    if len(upgrade) != 1 or len(current) != 1:
        pytest.fail(f"expected koordnode_<v>_amd64.deb and koordnode_<v>+upgradetest_amd64.deb in "
                    f"{PACKAGES} (the host's tests/vm/packages.py puts them there), found "
                    f"{[d.name for d in debs]}", pytrace=False)
    version = re.match(r"koordnode_(.+)_amd64\.deb", current[0].name).group(1)
    return current[0], upgrade[0], version, f"{version}+upgradetest"


CONTAINERD_UNIT = "koordnode-test-containerd.service"


@pytest.fixture
def clean_machine():
    # containerd where the shipped config expects it (/run/containerd/containerd.sock), with
    # Debian's defaults; as a transient unit because the image masks containerd.service (the
    # other guest tests run private containerds).
    sh("systemd-run", f"--unit={CONTAINERD_UNIT}", "--property=Type=notify",
       "--property=Delegate=yes", "--property=KillMode=process", "/usr/bin/containerd", timeout=180)
    try:
        wait_for(lambda: Path("/run/containerd/containerd.sock").exists(), 60, "containerd's socket")
        yield
    finally:
        sh("systemctl", "stop", UNIT, check=False)
        sh("dpkg", "--purge", "koordnode", check=False, timeout=300)
        sh("systemctl", "stop", CONTAINERD_UNIT, check=False)


# Eight dpkg runs (byte-compiling for 3.13 twice) and a 30 s watchdog: 3 min under multi-threaded
# TCG, about 6 min under single-threaded TCG; above the lane's default per-test bound.
@pytest.mark.timeout(700)
def test_deb_under_systemd_install_reload_watchdog_upgrade_remove_purge(clean_machine) -> None:
    current, upgrade, version, upgrade_version = packages()

    # --- install on Debian 13's Python 3.13: enabled, not started --------------------------
    sh("dpkg", "--install", str(current), timeout=300)
    lines = sh("koordnode", "version").stdout.splitlines()
    assert lines[0] == f"koordnode {version}"
    assert lines[1].startswith("python 3.13."), lines
    assert list(Path("/opt/koordnode/lib/koordnode/__pycache__").glob("cli.cpython-313.pyc"))
    assert sh("systemctl", "is-enabled", UNIT).stdout.strip() == "enabled"
    assert show("ActiveState")["ActiveState"] == "inactive"

    # --- start: Type=notify, so systemctl returns once READY=1 arrived ---------------------
    began = time.monotonic()
    sh("systemctl", "start", UNIT, timeout=180)
    started_s = time.monotonic() - began
    state = show("ActiveState", "SubState", "StatusText", "MainPID", "NRestarts")
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state
    # The shipped [proxy] listen: /var/run/koordnode/koordnode.sock (/var/run -> /run).
    assert state["StatusText"].startswith("serving CRI on /var/run/koordnode/koordnode.sock"), state
    assert oct(LISTEN.stat().st_mode & 0o777) == "0o660"
    assert oct(ADMIN.stat().st_mode & 0o777) == "0o600"
    first_pid = int(state["MainPID"])
    print(f"systemctl start returned after {started_s:.1f} s (READY)")
    running = status()
    assert running["version"] == version
    assert running["backend_health"] == "ok"  # it rebuilt its state from containerd

    # --- reload applies an edited config ----------------------------------------------------
    shipped = CONF.read_text()
    edited, count = re.subn(r"(?m)^hook_timeout_ms = \d+$", "hook_timeout_ms = 350", shipped)
    assert count == 1
    edited += "\n# edited by the operator\n"
    CONF.write_text(edited)
    sh("systemctl", "reload", UNIT, timeout=60)
    reload = wait_for(lambda: (r := status()["config"]["last_reload"]).get("result") == "applied" and r,
                      30, "the reload applied")
    assert reload["source"] == str(CONF)
    assert show("MainPID")["MainPID"] == str(first_pid)  # reloaded, not restarted
    assert "config_reloaded" in journal()

    # --- a stuck daemon: SIGSTOP, the watchdog (WatchdogSec=30s) restarts it -----------------
    restarts = int(show("NRestarts")["NRestarts"])
    os.kill(first_pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    new_pid = wait_for(lambda: (p := show("MainPID")["MainPID"]) not in ("0", str(first_pid)) and p,
                       120, "the watchdog restarted the stuck daemon")
    wait_for(lambda: show("ActiveState")["ActiveState"] == "active", 120, "active again")
    print(f"watchdog restart after {time.monotonic() - stopped_at:.1f} s")
    assert int(show("NRestarts")["NRestarts"]) == restarts + 1
    assert "Watchdog timeout" in sh("journalctl", "-u", UNIT, "--no-pager", check=False).stdout

    # --- upgrade: the edited config stays, the running daemon is restarted -----------------
    sh("dpkg", "--install", str(upgrade), timeout=300)
    assert CONF.read_text() == edited
    assert sorted(p.name for p in CONF.parent.iterdir()) == ["koordnode.toml"]
    wait_for(lambda: show("MainPID")["MainPID"] not in ("0", new_pid), 60, "restarted by the upgrade")
    wait_for(lambda: show("ActiveState")["ActiveState"] == "active", 120, "active after the upgrade")
    assert wait_for(lambda: status()["version"] == upgrade_version, 60, "the new version serves")
    assert list(Path("/opt/koordnode/lib/koordnode/__pycache__").glob("cli.cpython-313.pyc"))

    # --- remove: stopped, unit gone, config kept ----------------------------------------------
    sh("dpkg", "--remove", "koordnode", timeout=300)
    assert show("ActiveState")["ActiveState"] == "inactive"
    assert not LISTEN.exists()
    assert not Path("/lib/systemd/system/koordnode.service").exists()
    assert not Path("/opt/koordnode").exists()
    assert CONF.read_text() == edited

    # --- purge: the config goes -------------------------------------------------------------
    sh("dpkg", "--purge", "koordnode", timeout=300)
    assert not Path("/etc/koordnode").exists()
    assert not Path("/run/koordnode").exists()  # kept across restarts, not past a purge
    assert sh("dpkg-query", "-W", "koordnode", check=False).returncode != 0
