"""packaging/build.sh on Debian 13, and its .deb under real systemd (Debian 13 guest, Python 3.13).

The guest builds the .deb and the .rpm itself with packaging/build.sh (no network: the host
stages what build.sh downloads as a wheelhouse in /results/wheelhouse) as ``<version>+debian13``.
The host builds ``<version>+upgradetest`` with the same script on Debian 12, before the guest
boots, with tests/vm/packages.py, into the results share: /results/packages (or
$KOORDNODE_VM_PACKAGES). The lifecycle test installs the Debian 13 build with dpkg, starts the
unit and waits for READY, reloads a config, stops the daemon with SIGSTOP and waits for the
watchdog to restart it, upgrades to the Debian 12 build with an edited config, removes and
purges, checking systemd's view and the files at each step.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGES = Path(os.environ.get("KOORDNODE_VM_PACKAGES", "/results/packages"))
WHEELHOUSE = PACKAGES.parent / "wheelhouse"
PROJECT = Path(__file__).resolve().parents[2]
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


def upgrade_package() -> Path:
    """The host's (Debian 12) build of ``<version>+upgradetest``."""
    error = PACKAGES / "ERROR.txt"
    if error.is_file():
        pytest.fail(f"the host could not build the packages: {error.read_text()}", pytrace=False)
    debs = sorted(PACKAGES.glob("koordnode_*+upgradetest_amd64.deb"))
    if len(debs) != 1:
        pytest.fail(f"expected one koordnode_<v>+upgradetest_amd64.deb in {PACKAGES} (the host's "
                    f"tests/vm/packages.py puts it there), found {[d.name for d in PACKAGES.glob('*')]}",
                    pytrace=False)
    return debs[0]


CONTAINERD_UNIT = "koordnode-test-containerd.service"


@pytest.fixture
def clean_machine():
    # containerd where the shipped config expects it (/run/containerd/containerd.sock), with
    # Debian's defaults; as a transient unit because the image masks containerd.service (the
    # other guest tests run private containerds).
    sh("systemd-run", f"--unit={CONTAINERD_UNIT}", "--collect", "--property=Type=notify",
       "--property=Delegate=yes", "--property=KillMode=process", "/usr/bin/containerd", timeout=180)
    try:
        wait_for(lambda: Path("/run/containerd/containerd.sock").exists(), 60, "containerd's socket")
        yield
    finally:
        sh("systemctl", "stop", UNIT, check=False)
        sh("dpkg", "--purge", "koordnode", check=False, timeout=300)
        sh("systemctl", "stop", CONTAINERD_UNIT, check=False)


def source_version() -> str:
    text = (PROJECT / "koordnode" / "__init__.py").read_text()
    return re.search(r'(?m)^__version__ = "([^"]+)"$', text).group(1)


@dataclass(frozen=True)
class Debian13Build:
    deb: Path
    rpm: Path
    version: str
    seconds: float


@pytest.fixture(scope="module")
def debian13_build(tmp_path_factory: pytest.TempPathFactory) -> Debian13Build:
    """packaging/build.sh run here, once, for both formats (the .deb is the lifecycle test's)."""
    error = WHEELHOUSE / "ERROR.txt"
    if error.is_file():
        pytest.fail(f"the host could not stage the wheelhouse: {error.read_text()}", pytrace=False)
    if not list(WHEELHOUSE.glob("*.whl")):
        pytest.fail(f"no wheels in {WHEELHOUSE} (the host's tests/vm/packages.py puts them there)", pytrace=False)
    work = tmp_path_factory.mktemp("build")
    version = f"{source_version()}+debian13"  # sorts before the host's +upgradetest
    out = work / "out"
    # No network in the guest: pip takes everything from the staged wheelhouse, as on a node
    # without access to PyPI (a mirror or a directory of wheels).
    env = {**ENV, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE), "PIP_NO_CACHE_DIR": "1",
           "HOME": str(work), "TMPDIR": str(work)}
    began = time.monotonic()
    built = subprocess.run(["bash", str(PROJECT / "packaging" / "build.sh"), "--version", version,
                            "--formats", "deb,rpm", "--out", str(out)],
                           capture_output=True, text=True, timeout=800, env=env, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - began
    if built.returncode != 0:
        pytest.fail(f"packaging/build.sh on Debian 13 exited {built.returncode}:\n{built.stderr[-4000:]}",
                    pytrace=False)
    build = Debian13Build(out / f"koordnode_{version}_amd64.deb", out / f"koordnode-{version}.x86_64.rpm",
                          version, seconds)
    assert built.stdout.split() == [str(build.deb), str(build.rpm)], built.stdout
    return build


# Under single-threaded TCG: pip's isolated wheel build, the library's checks and smoke
# imports, dpkg-deb and rpmbuild (~5 min on a loaded host).
@pytest.mark.timeout(900)
def test_build_sh_on_debian_13_offline_makes_a_deb_and_an_rpm(debian13_build: Debian13Build) -> None:
    # The operator's prerequisites on Debian 13, as build.sh's header lists them.
    assert sh("/usr/bin/python3", "-m", "pip", "--version").stdout.rstrip().endswith("(python 3.13)")
    assert sh("rpmbuild", "--version").stdout.startswith("RPM version")
    deb, rpm, version = debian13_build.deb, debian13_build.rpm, debian13_build.version
    print(f"packaging/build.sh (deb,rpm) on Debian 13 took {debian13_build.seconds:.0f} s under the VM's emulation")
    # What the packages declare: any CPython >= 3.11, nothing tied to the build's 3.13.
    assert sh("dpkg-deb", "--field", str(deb), "Version").stdout.strip() == version
    assert sh("dpkg-deb", "--field", str(deb), "Depends").stdout.startswith("python3 (>= 3.11~) |")
    contents = sh("dpkg-deb", "--contents", str(deb)).stdout
    assert "cpython-313" not in contents and ".pyc" not in contents, "byte code belongs to the install"
    requires = sh("rpm", "-qp", "--requires", str(rpm)).stdout.splitlines()
    assert "python(abi) >= 3.11" in requires, requires
    assert sh("rpm", "-qp", "--queryformat", "%{VERSION}", str(rpm)).stdout == version
    rpm_files = set(sh("rpm", "-qpl", str(rpm)).stdout.split())
    # "-rw-r--r-- root/root 1234 2026-11-22 23:59 ./opt/...", links with " -> target".
    deb_files = {line.split(None, 5)[5].partition(" -> ")[0].lstrip(".") for line in contents.splitlines()
                 if not line.startswith("d")}
    assert {"/opt/koordnode/bin/koordnode", "/etc/koordnode/koordnode.toml",
            "/usr/lib/systemd/system/koordnode.service"} <= rpm_files
    assert "/lib/systemd/system/koordnode.service" in deb_files
    only_deb = {f for f in deb_files - rpm_files if f.startswith("/opt/")}
    assert not only_deb, f"the .rpm lacks library files the .deb has: {sorted(only_deb)[:10]}"


# Eight dpkg runs (byte-compiling for 3.13 twice) and a 30 s watchdog: about 6 min under
# single-threaded TCG, above the lane's default per-test bound; plus the Debian 13 build when
# this test runs alone (-k).
@pytest.mark.timeout(1300)
def test_deb_under_systemd_install_reload_watchdog_upgrade_remove_purge(clean_machine, debian13_build) -> None:
    # Built here (Debian 13, above) and upgraded to the host's build (Debian 12, Python 3.11).
    current, version = debian13_build.deb, debian13_build.version
    upgrade = upgrade_package()
    upgrade_version = re.match(r"koordnode_(.+)_amd64\.deb", upgrade.name).group(1)

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
