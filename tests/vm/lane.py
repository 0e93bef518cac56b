"""The VM lane: a Debian 13 guest (systemd, cgroup v2 only, containerd 1.7) running tests/vm_guest/.

Three cached pieces, each rebuilt only when missing or when what it is made from changed:

* the image (``image_dir()``): ``debootstrap`` of trixie from the mirror in the system's
  apt sources, its kernel and initrd copied out, the root filesystem packed into a raw
  ext4 file by ``mke2fs -d`` (no loop mounts);
* the guest's Python dependencies (``deps_dir()``): the versions installed on the host,
  as the guest's CPython wheels, by ``pip install --target --platform``;
* nothing else: the project itself is shared read-only over 9p, so a code change needs
  no rebuild.

``run_lane()`` boots the image (root disk as a throw-away snapshot, a second virtio disk
for io.max, 9p shares for the project, the dependencies, the containerd cache and the
results), the guest's ``koordnode-vm-lane.service`` runs ``tests/vm/guest/run.sh`` which
runs pytest on ``tests/vm_guest/`` and powers off; the host reads exit code, junit XML
and log from the results share. Every step has a time bound.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
for _path in (REPO, TESTS):  # run as a script: make tests/ (and koordnode, which testbed imports) importable
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from testbed.background_build import BackgroundBuildError, require  # noqa: E402
from testbed.containerd_dist import DistError, containerd_bin_dir, debian_mirror  # noqa: E402
from vm import reboot  # noqa: E402
from vm.packages import stage_for_guest  # noqa: E402

SUITE = "trixie"
GUEST_PYTHON = "3.13"  # trixie's python3
IMAGE_SIZE = "3G"
SCRATCH_DISK_SIZE = 256 * 1024 * 1024
GUEST_PACKAGES = (
    "linux-image-amd64", "initramfs-tools", "systemd-sysv", "udev", "kmod", "dbus",
    "containerd", "runc", "containernetworking-plugins", "busybox-static",
    "python3", "iproute2", "procps", "util-linux", "e2fsprogs",
    # What packaging/build.sh needs on Debian 13 (tests/vm_guest/test_package_build.py).
    "python3-pip", "rpm",
)
# What the guest's Python needs: the project's runtime dependencies and the test runner.
GUEST_PY_DISTS = (
    "grpcio", "protobuf", "hpack", "hyperframe", "h2", "psutil", "pyroute2", "structlog",
    "pytest", "pytest-timeout",
    "PyYAML",  # tests/k8s_support.py reads the example pods (tests/vm_guest/test_real_kubelet_v2.py)
)
GUEST_DIR = Path(__file__).resolve().parent / "guest"
GUEST_CONTAINERD_SUITES = ("forky",)  # containerd 2.1 for the guest, beside its own 1.7
# 9p tag of the real-node bed's binaries (scripts/k8s-bed.sh), mounted by tests/vm/guest/run.py
# at /var/cache/koordnode-testbed (where tests/testbed/k8s_dist.py looks for them).
TESTBED_CACHE_TAG = "testbedcache"
IMAGE_RECIPE_VERSION = "3"  # bump when the image recipe below changes

DEBOOTSTRAP_TIMEOUT_S = 900
PACK_TIMEOUT_S = 300
PIP_TIMEOUT_S = 600
KVM_PROBE_TIMEOUT_S = 20


class LaneError(RuntimeError):
    """The VM lane could not build its image or run the guest."""


def cache_root() -> Path:
    return Path(os.environ.get("KOORDNODE_VM_CACHE") or "/var/cache/koordnode-vm")


def _log(message: str) -> None:
    print(f"[vm-lane {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(cmd: list[str], what: str, timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError as err:
        raise LaneError(f"{what}: {err.filename} not found (scripts/install-deps.sh installs it)") from err
    except subprocess.TimeoutExpired as err:
        raise LaneError(f"{what}: not done after {timeout:.0f} s") from err
    if result.returncode != 0:
        tail = "\n".join((result.stderr + result.stdout).strip().splitlines()[-15:])
        raise LaneError(f"{what} failed ({result.returncode}):\n{tail}")
    return result


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def missing_tools() -> list[str]:
    needed = ("qemu-system-x86_64", "debootstrap", "mke2fs", "truncate")
    return [tool for tool in needed if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None]


# --------------------------------------------------------------------------
# Image
# --------------------------------------------------------------------------

def _image_key() -> str:
    recipe = [IMAGE_RECIPE_VERSION, SUITE, *GUEST_PACKAGES, (GUEST_DIR / "koordnode-vm-lane.service").read_text()]
    return hashlib.sha256("\n".join(recipe).encode()).hexdigest()[:12]


def image_dir() -> Path:
    return cache_root() / f"{SUITE}-{_image_key()}"


@dataclass(frozen=True)
class Image:
    root_disk: Path
    kernel: Path
    initrd: Path
    info: dict


def cached_image() -> Image | None:
    directory = image_dir()
    stamp = directory / "image.json"
    parts = [directory / name for name in ("rootfs.img", "vmlinuz", "initrd.img")]
    if stamp.is_file() and all(p.is_file() for p in parts):
        return Image(*parts, info=json.loads(stamp.read_text()))
    return None


def _write_guest_config(rootfs: Path) -> None:
    """Files the guest needs, written into the unpacked root filesystem."""
    etc = rootfs / "etc"
    (etc / "hostname").write_text("koordnode-vm\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n127.0.1.1 koordnode-vm\n")
    (etc / "fstab").write_text(
        "/dev/vda / ext4 rw,errors=remount-ro 0 1\n"
        "project /project 9p trans=virtio,version=9p2000.L,msize=262144,ro,nofail 0 0\n"
        "pydeps /opt/pydeps 9p trans=virtio,version=9p2000.L,msize=262144,ro,nofail 0 0\n"
        "results /results 9p trans=virtio,version=9p2000.L,msize=262144,rw,nofail 0 0\n"
        "distcache /var/cache/koordnode-test 9p trans=virtio,version=9p2000.L,msize=262144,ro,nofail 0 0\n"
    )
    for mount_point in ("project", "opt/pydeps", "results", "var/cache/koordnode-test"):
        (rootfs / mount_point).mkdir(parents=True, exist_ok=True)
    # 9p and virtio modules in the initrd and loaded at boot.
    modules = "9p\n9pnet\n9pnet_virtio\nvirtio_blk\nvirtio_pci\next4\n"
    (etc / "initramfs-tools" / "modules").write_text(modules)
    (etc / "modules-load.d").mkdir(exist_ok=True)
    (etc / "modules-load.d" / "koordnode-vm.conf").write_text(modules)
    # Root login on the serial console without a password (debugging by hand only).
    subprocess.run(["chroot", str(rootfs), "passwd", "-d", "root"], capture_output=True, timeout=60)
    # The packaged containerd must not start: tests run private instances.
    systemd = etc / "systemd" / "system"
    (systemd / "containerd.service").unlink(missing_ok=True)
    (systemd / "containerd.service").symlink_to("/dev/null")
    shutil.copy(GUEST_DIR / "koordnode-vm-lane.service", systemd / "koordnode-vm-lane.service")
    wants = systemd / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "koordnode-vm-lane.service").unlink(missing_ok=True)
    (wants / "koordnode-vm-lane.service").symlink_to("/etc/systemd/system/koordnode-vm-lane.service")
    # Nothing else slow at boot: no network waits, no timers.
    for unit in ("systemd-networkd-wait-online.service", "apt-daily.timer", "apt-daily-upgrade.timer",
                 "e2scrub_all.timer", "fstrim.timer", "systemd-timesyncd.service"):
        (systemd / unit).unlink(missing_ok=True)
        (systemd / unit).symlink_to("/dev/null")


def build_image(force: bool = False) -> Image:
    """The cached guest image, built when missing (``force``: rebuilt)."""
    if not force and (image := cached_image()) is not None:
        return image
    if os.geteuid() != 0:
        raise LaneError("building the VM image needs root (debootstrap)")
    directory = image_dir()
    with _locked(cache_root() / "image.lock"):
        if not force and (image := cached_image()) is not None:
            return image
        try:
            mirror = debian_mirror().uri
        except DistError as err:
            raise LaneError(str(err)) from err
        began = time.monotonic()
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="build-", dir=cache_root()) as scratch:
            rootfs = Path(scratch) / "rootfs"
            _log(f"debootstrap {SUITE} from the configured mirror (once; cached in {directory})")
            _run(["debootstrap", "--variant=minbase", f"--include={','.join(GUEST_PACKAGES)}", SUITE, str(rootfs),
                  mirror], "debootstrap", DEBOOTSTRAP_TIMEOUT_S)
            _write_guest_config(rootfs)
            _run(["chroot", str(rootfs), "update-initramfs", "-u", "-k", "all"], "update-initramfs", PACK_TIMEOUT_S)
            kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
            initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
            if not kernels or not initrds:
                raise LaneError("debootstrap produced no kernel/initrd in /boot")
            info = {
                "suite": SUITE,
                "kernel": kernels[-1].name.removeprefix("vmlinuz-"),
                "packages": _package_versions(rootfs, ("containerd", "runc", "systemd", "python3", "linux-image-amd64")),
                "built_s": 0.0,
            }
            shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            tmp_disk = Path(scratch) / "rootfs.img"
            _run(["truncate", "-s", IMAGE_SIZE, str(tmp_disk)], "truncate", 30)
            _run(["mke2fs", "-q", "-t", "ext4", "-F", "-L", "koordnode-vm", "-d", str(rootfs), str(tmp_disk)],
                 "mke2fs -d", PACK_TIMEOUT_S)
            shutil.copy(kernels[-1], Path(scratch) / "vmlinuz")
            shutil.copy(initrds[-1], Path(scratch) / "initrd.img")
            for name in ("rootfs.img", "vmlinuz", "initrd.img"):
                os.replace(Path(scratch) / name, directory / name)
            info["built_s"] = round(time.monotonic() - began, 1)
            (directory / "image.json").write_text(json.dumps(info, indent=2))
            _log(f"image built in {info['built_s']} s: kernel {info['kernel']}, {info['packages']}")
    image = cached_image()
    assert image is not None
    return image


def _package_versions(rootfs: Path, names: tuple[str, ...]) -> dict[str, str]:
    result = subprocess.run(["chroot", str(rootfs), "dpkg-query", "-W", "-f=${Package} ${Version}\n", *names],
                            capture_output=True, text=True, timeout=60)
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


# --------------------------------------------------------------------------
# The guest's Python dependencies
# --------------------------------------------------------------------------

def _host_requirements() -> list[str]:
    pins = []
    for dist in GUEST_PY_DISTS:
        try:
            pins.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pins.append(dist)
    return pins


def deps_dir() -> Path:
    key = hashlib.sha256(("\n".join([GUEST_PYTHON, *_host_requirements()])).encode()).hexdigest()[:12]
    return cache_root() / f"pydeps-{key}"


def build_deps() -> Path:
    """Wheels of the host's dependency versions for the guest's CPython, unpacked (pip --target)."""
    target = deps_dir()
    if (target / ".complete").is_file():
        return target
    with _locked(cache_root() / "pydeps.lock"):
        if (target / ".complete").is_file():
            return target
        abi = "cp" + GUEST_PYTHON.replace(".", "")
        with tempfile.TemporaryDirectory(prefix="pydeps-", dir=cache_root()) as scratch:
            staging = Path(scratch) / "site"
            _log(f"guest Python {GUEST_PYTHON} dependencies (once; cached in {target})")
            _run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
                  "--target", str(staging), "--python-version", GUEST_PYTHON, "--implementation", "cp",
                  "--abi", abi, "--abi", "abi3", "--abi", "none",
                  "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                  "--platform", "manylinux2014_x86_64", "--platform", "any",
                  "--only-binary=:all:", *_host_requirements()], "pip install (guest dependencies)", PIP_TIMEOUT_S)
            (staging / ".complete").write_text("\n".join(_host_requirements()) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
    return target


def deps_disk() -> Path:
    """The dependencies as an ext4 image, attached read-only as the guest's third disk.

    Importing from a block device is much faster under TCG than over 9p (every lookup is a
    round trip) or than copying the many small files first.
    """
    site = build_deps()
    disk = site.with_name(site.name + ".img")
    if disk.is_file():
        return disk
    with _locked(cache_root() / "pydeps.lock"):
        if disk.is_file():
            return disk
        tmp = disk.with_name(disk.name + ".tmp")
        size_mb = 64 + sum(f.stat().st_size for f in site.rglob("*") if f.is_file()) * 2 // (1 << 20)
        _run(["truncate", "-s", f"{size_mb}M", str(tmp)], "truncate", 30)
        _run(["mke2fs", "-q", "-t", "ext4", "-F", "-L", "kn-pydeps", "-d", str(site), str(tmp)],
             "mke2fs -d (dependencies)", PACK_TIMEOUT_S)
        os.replace(tmp, disk)
    return disk


# --------------------------------------------------------------------------
# Boot and run
# --------------------------------------------------------------------------

@dataclass
class LaneResult:
    accel: str
    exit_code: int | None
    junit: Path | None
    guest_log: str
    console_log: Path
    results_dir: Path
    image: Image
    seconds: float
    facts: dict = field(default_factory=dict)
    files: tuple[str, ...] = ()  # the guest test files this VM ran; () for all of them
    crashes: list[str] = field(default_factory=list)  # earlier boots' kernel crashes (tests/vm/reboot.py)

    def ran(self, file_name: str) -> bool:
        return not self.files or file_name in self.files

    @property
    def kernel_panic(self) -> str:
        """The guest kernel's Oops/panic lines from the serial console, '' when none."""
        return reboot.kernel_panic(self.console_log)

    @property
    def summary(self) -> str:
        panic = f", GUEST KERNEL CRASHED: {self.kernel_panic.splitlines()[0]}" if self.kernel_panic else ""
        return (f"VM lane: {self.accel.upper()}, kernel {self.image.info.get('kernel')}, "
                f"{self.image.info.get('packages')}, guest pytest exit {self.exit_code}, {self.seconds:.0f} s{panic}")


def _kvm_usable(kernel: Path, workdir: Path) -> tuple[bool, str]:
    """Boot the guest kernel under KVM without a root disk: it must reach its 'no root' panic.

    On machines where nested KVM cannot run Linux the guest dies with "emulation failure"
    long before that; then TCG is used.
    """
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False, "/dev/kvm not usable"
    console = workdir / "kvm-probe.log"
    cmd = ["qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-m", "512", "-smp", "1", "-nodefaults",
           "-display", "none", "-no-reboot", "-serial", f"file:{console}", "-kernel", str(kernel),
           "-append", "console=ttyS0 panic=-1 root=/dev/koordnode-none"]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=KVM_PROBE_TIMEOUT_S)
        stderr = result.stderr
    except subprocess.TimeoutExpired as err:
        stderr = (err.stderr or b"").decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
    text = console.read_text(errors="replace") if console.exists() else ""
    if "Kernel panic" in text and "emulation failure" not in stderr.lower():
        return True, "KVM boots the guest kernel"
    reason = next((line for line in stderr.splitlines() if "KVM" in line or "emulation" in line), "")
    return False, f"KVM probe failed ({reason or 'no panic banner within the bound'})"


def _qemu_command(image: Image, accel: str, workdir: Path, shares: dict[str, tuple[Path, bool]],
                  memory_mb: int, smp: str = "2") -> list[str]:
    # TCG with one thread per vCPU (thread=multi) crashed the guest kernel here ("Oops: int3"
    # in the scheduler) when cgroup writes flip static keys: the kernel patches its own code
    # with int3 breakpoints, and another vCPU thread still ran the stale translation. One TCG
    # thread for both vCPUs has no such race; on 2 shared host cores it costs little.
    tcg = os.environ.get("KOORDNODE_VM_TCG_THREAD", "single")
    cpu = ["-accel", "kvm", "-cpu", "host"] if accel == "kvm" else ["-accel", f"tcg,thread={tcg}", "-cpu", "max"]
    cmd = [
        "qemu-system-x86_64", *cpu, "-smp", smp, "-m", str(memory_mb), "-nodefaults", "-display", "none",
        "-no-reboot", "-serial", f"file:{workdir / 'console.log'}",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd),
        "-append", "root=/dev/vda rw console=ttyS0 panic=-1 cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 "
                   "systemd.show_status=0 quiet loglevel=4",
        # Root disk as a throw-away snapshot: the cached image stays pristine.
        "-drive", f"file={image.root_disk},if=virtio,format=raw,snapshot=on",
        # The second disk: a real virtio block device for io.weight / io.max.
        "-drive", f"file={workdir / 'scratch.img'},if=virtio,format=raw",
        "-device", "virtio-rng-pci",
    ]
    for tag, (path, read_only) in shares.items():
        cmd += ["-virtfs", f"local,path={path},mount_tag={tag},security_model=none"
                + (",readonly=on" if read_only else "")]
    return cmd


# The guest tests in two VMs side by side. TCG runs each guest on one host thread, and the lane
# runs last in the test command, when nothing else does: two guests use both cores of the 2-core
# CI machine and halve the lane (one guest took 2846-3480 s; CI's whole bound is 90 min). The
# first shard names its files; the second runs every other file in tests/vm_guest/, so a new
# file always runs somewhere. The tests on the session bed (a containerd and a koordnode per
# release, tests/vm_guest/conftest.py) stay together in the second shard.
FIRST_SHARD = ("test_package_systemd.py", "test_real_kubelet_v2.py", "test_real_kubelet_api_v2.py",
               "test_platform.py", "test_restore_v2.py", "test_memory_qos_v2.py")


def guest_shards(guest_tests: Path = TESTS / "vm_guest") -> list[tuple[str, ...]]:
    """The guest test files of each VM: FIRST_SHARD (those that exist), then all the others."""
    files = sorted(path.name for path in guest_tests.glob("test_*.py"))
    first = tuple(name for name in FIRST_SHARD if name in files)
    rest = tuple(name for name in files if name not in first)
    return [shard for shard in (first, rest) if shard]


def run_lane(workdir: Path, *, pytest_args: list[str] | None = None, timeout_s: float = 3000,
             accel: str | None = None, memory_mb: int = 2048, smp: str | None = None,
             shards: list[tuple[str, ...]] | None = None) -> list[LaneResult]:
    """Build/reuse the image, boot it, run tests/vm_guest/ in it, collect the results: one VM per
    entry of `shards` (guest test file names), all at once; without shards one VM runs everything.
    `smp`: qemu's -smp (default 2 vCPUs, `$KOORDNODE_VM_SMP`); `4,cores=2,threads=2` gives the
    guest SMT siblings (tests/vm_guest/test_core_sched.py; the other guest tests expect 2 CPUs)."""
    smp = smp or os.environ.get("KOORDNODE_VM_SMP") or "2"
    problems = missing_tools()
    if problems:
        raise LaneError("missing: " + ", ".join(problems))
    began = time.monotonic()
    image = build_image()
    pydeps = build_deps()
    pydeps_disk = deps_disk()
    workdir.mkdir(parents=True, exist_ok=True)
    staged = workdir / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    stage_for_guest(staged / "packages", cache_root(), _log)
    dist_cache = Path(os.environ.get("KOORDNODE_TEST_CACHE") or "/var/cache/koordnode-test")
    dist_cache.mkdir(parents=True, exist_ok=True)
    for suite in GUEST_CONTAINERD_SUITES:  # the guest has no network: fetch on the host
        try:
            containerd_bin_dir(suite)
        except DistError as err:
            _log(f"containerd of {suite} unavailable for the guest: {err}")
    shares = {"project": (REPO, True), "pydeps": (pydeps, True), "distcache": (dist_cache, True)}
    # The real-node bed's static binaries (kubelet, containerd 2.x, etcd, kube-apiserver; built on
    # the host by scripts/k8s-bed.sh), read-only; the guest mounts them at the same path
    # (tests/vm/guest/run.py, so the image recipe does not change).
    testbed_cache = Path(os.environ.get("KOORDNODE_TESTBED_CACHE") or "/var/cache/koordnode-testbed")
    try:
        require("k8s", "vm-lane")  # scripts/test.sh builds them in the background
    except BackgroundBuildError as err:
        _log(f"{err}\nthe guest's real-kubelet tests will fail")
    if testbed_cache.is_dir():
        shares[TESTBED_CACHE_TAG] = (testbed_cache, True)
    else:
        _log(f"{testbed_cache} missing (scripts/k8s-bed.sh builds it): the guest's real-kubelet tests will fail")

    if accel is None:
        accel = os.environ.get("KOORDNODE_VM_ACCEL") or ""
    if not accel:
        usable, why = _kvm_usable(image.kernel, workdir)
        accel = "kvm" if usable else "tcg"
        _log(f"accelerator: {accel.upper()} ({why})")
    # One budget for the whole lane: what the image, dependency and package builds used is not
    # left to the guests.
    timeout_s = max(300.0, timeout_s - (time.monotonic() - began))
    plan = [(workdir / f"shard-{n}", files) for n, files in enumerate(shards)] if shards else [(workdir, ())]
    # Every guest runs to its end; the first one that raised raises here, after all are done.
    with concurrent.futures.ThreadPoolExecutor(len(plan), thread_name_prefix="vm-lane") as pool:
        guests = [pool.submit(_boot_guest, directory, files, pytest_args, image, accel, staged, shares, pydeps_disk,
                              memory_mb, smp, timeout_s, began) for directory, files in plan]
    return [guest.result() for guest in guests]


def _boot_guest(directory: Path, files: tuple[str, ...], pytest_args: list[str] | None, image: Image, accel: str,
                staged: Path, common_shares: dict[str, tuple[Path, bool]], pydeps_disk: Path, memory_mb: int,
                smp: str, timeout_s: float, began: float) -> LaneResult:
    """One VM running `files` (all when empty); booted once more on the tests that had not
    finished when its kernel crashed and time is left (tests/vm/reboot.py)."""
    boot_began = time.monotonic()
    args = (pytest_args, image, accel, staged, common_shares, pydeps_disk, memory_mb, smp)
    first = _boot_once(directory, files, None, *args, timeout_s, began)
    left_s = timeout_s - (time.monotonic() - boot_began)
    panic = first.kernel_panic
    if not panic or first.exit_code is not None or left_s < reboot.MIN_REBOOT_S:
        return first
    nodeids = reboot.unfinished(first.results_dir)
    if nodeids == []:
        return first
    crash = reboot.crash_report(first.console_log)
    kept = reboot.set_aside(directory)
    _log(f"guest {directory.name}: kernel crashed ({panic.splitlines()[0]}); booting it again on "
         f"{'every' if nodeids is None else len(nodeids)} unfinished test(s); first boot kept in {kept}")
    second = _boot_once(directory, files, nodeids, *args, left_s, began)
    second.crashes = [crash]
    second.junit = reboot.merge(kept / "results", second.results_dir)
    return second


def _boot_once(directory: Path, files: tuple[str, ...], nodeids: list[str] | None, pytest_args: list[str] | None,
               image: Image, accel: str, staged: Path, common_shares: dict[str, tuple[Path, bool]],
               pydeps_disk: Path, memory_mb: int, smp: str, timeout_s: float, began: float) -> LaneResult:
    """One boot: its own results share, scratch disk and console; the guest runs `nodeids` when
    given (guest pytest node ids), else `files` (all when empty)."""
    name = f"guest {directory.name} ({len(files)} files)" if files else "guest"
    directory.mkdir(parents=True, exist_ok=True)
    results = directory / "results"
    shutil.rmtree(results, ignore_errors=True)
    shutil.copytree(staged, results)
    (results / "request.json").write_text(json.dumps({
        "files": list(files),
        "nodeids": nodeids,
        "pytest_args": pytest_args or [],
        "timeout_s": max(60, int(timeout_s) - 120),  # leave the guest time to power off
    }))
    with open(directory / "scratch.img", "wb") as disk:
        disk.truncate(SCRATCH_DISK_SIZE)
    shares = {**common_shares, "results": (results, False)}
    cmd = _qemu_command(image, accel, directory, shares, memory_mb, smp)
    # Third disk (/dev/vdc): the dependencies, read-only; the guest mounts it (tests/vm/guest/run.py).
    cmd += ["-drive", f"file={pydeps_disk},if=virtio,format=raw,readonly=on"]
    (directory / "qemu-cmd.txt").write_text(" ".join(cmd) + "\n")
    _log(f"booting the {SUITE} {name} under {accel.upper()} (bound {timeout_s:.0f} s); "
         f"console: {directory / 'console.log'}")
    with open(directory / "qemu.stderr", "w") as stderr:
        qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stderr, stderr=subprocess.STDOUT)
        try:
            qemu.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            qemu.kill()
            qemu.wait(timeout=30)
            _log(f"{name} still running after {timeout_s:.0f} s: killed")
    qemu_err = (directory / "qemu.stderr").read_text(errors="replace")
    if accel == "kvm" and ("emulation failure" in qemu_err.lower() or "KVM internal error" in qemu_err):
        _log(f"KVM failed inside the {name} (emulation failure): running it again under TCG")
        return _boot_once(directory, files, nodeids, pytest_args, image, "tcg", staged, common_shares, pydeps_disk,
                          memory_mb, smp, timeout_s, began)
    exit_file = results / "exit_code"
    exit_code = int(exit_file.read_text().strip()) if exit_file.is_file() else None
    junit = results / "junit.xml"
    facts_file = results / "facts.json"
    result = LaneResult(
        accel=accel,
        exit_code=exit_code,
        junit=junit if junit.is_file() else None,
        guest_log=(results / "guest.log").read_text(errors="replace") if (results / "guest.log").is_file() else "",
        console_log=directory / "console.log",
        results_dir=results,
        image=image,
        seconds=time.monotonic() - began,
        facts=json.loads(facts_file.read_text()) if facts_file.is_file() else {},
        files=files,
    )
    _log(f"{name}: {result.summary}")
    return result


def main(argv: list[str] | None = None) -> int:
    """``python3 tests/vm/lane.py [--rebuild] [--workdir DIR] [-- pytest args]``: run the lane alone."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cached image first")
    parser.add_argument("--prepare", action="store_true",
                        help="only build what the lane caches (image, guest dependencies), then exit: "
                             "scripts/test.sh runs this in the background while the other tests run")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=3000)
    parser.add_argument("--accel", choices=("kvm", "tcg"), default=None)
    parser.add_argument("--smp", default=None, help="qemu -smp (default 2; 4,cores=2,threads=2: SMT siblings)")
    parser.add_argument("--shards", action="store_true", help="as CI runs it: the guest tests split over two VMs")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    if args.rebuild:
        build_image(force=True)
    if args.prepare:
        if problems := missing_tools():
            print(f"VM lane: missing {', '.join(problems)}", file=sys.stderr)
            return 2
        build_image()
        deps_disk()
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="koordnode-vm-"))
    try:
        lanes = run_lane(workdir, pytest_args=args.pytest_args, timeout_s=args.timeout, accel=args.accel,
                         smp=args.smp, shards=guest_shards() if args.shards else None)
    except LaneError as err:
        print(f"VM lane error: {err}", file=sys.stderr)
        return 2
    for result in lanes:
        print(result.guest_log)
        print(result.summary)
        print(f"results: {result.results_dir}")
    codes = [1 if result.exit_code is None else result.exit_code for result in lanes]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
