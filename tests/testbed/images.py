"""Build tiny local OCI image archives from the host's static busybox.

The test bed has no registry access, so the pause and workload images are
assembled here in pure Python: one uncompressed layer holding /bin/busybox
plus its applet symlinks, an image config, a manifest and an OCI layout
index, all packed into a tar that ``ctr images import`` accepts.

Output is byte-for-byte deterministic for a given busybox binary (fixed
mtimes, owners and entry order), so the image digests are stable too.
"""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path


def _load_oci_archive():  # packaging/ is a directory of scripts, not a package (and "packaging" is PyPI's)
    path = Path(__file__).resolve().parents[2] / "packaging" / "oci_archive.py"
    if "oci_archive" not in sys.modules:
        spec = importlib.util.spec_from_file_location("oci_archive", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["oci_archive"] = module
        spec.loader.exec_module(module)
    return sys.modules["oci_archive"]


oci = _load_oci_archive()

DEFAULT_BUSYBOX = Path("/bin/busybox")

PAUSE_IMAGE_REF = "docker.io/koordnode/pause:test"
BUSYBOX_IMAGE_REF = "docker.io/koordnode/busybox:test"

# Pause must run forever but stop at once on SIGTERM. As PID 1 of its PID
# namespace it gets no default signal actions, hence the explicit trap; the
# `sleep & wait` keeps the shell interruptible while it idles, and the trap
# kills that sleep so nothing is orphaned even outside a PID namespace.
PAUSE_CMD = [
    "/bin/sh",
    "-c",
    "trap 'kill $! 2>/dev/null; exit 0' TERM INT HUP; while :; do sleep 2147483647 & wait $!; done",
]
BUSYBOX_CMD = ["/bin/sh"]


# Used when the busybox binary cannot list its own applets.
_FALLBACK_APPLETS = (
    "bin/sh", "bin/ash", "bin/cat", "bin/chmod", "bin/cp", "bin/date", "bin/dd",
    "bin/df", "bin/echo", "bin/false", "bin/grep", "bin/hostname", "bin/kill",
    "bin/ln", "bin/ls", "bin/mkdir", "bin/mount", "bin/mv", "bin/ps", "bin/pwd",
    "bin/rm", "bin/rmdir", "bin/sed", "bin/sleep", "bin/touch", "bin/true",
    "bin/uname", "usr/bin/awk", "usr/bin/cut", "usr/bin/du", "usr/bin/env",
    "usr/bin/find", "usr/bin/free", "usr/bin/head", "usr/bin/id", "usr/bin/nproc",
    "usr/bin/printf", "usr/bin/seq", "usr/bin/sort", "usr/bin/tail", "usr/bin/tee",
    "usr/bin/test", "usr/bin/top", "usr/bin/tr", "usr/bin/uniq", "usr/bin/wc",
    "usr/bin/xargs", "usr/bin/yes", "usr/bin/[",
)

_DIRECTORIES = {
    "bin": 0o755, "dev": 0o755, "etc": 0o755, "proc": 0o555, "root": 0o700,
    "run": 0o755, "sbin": 0o755, "sys": 0o555, "tmp": 0o1777, "usr": 0o755,
    "usr/bin": 0o755, "usr/sbin": 0o755, "var": 0o755, "var/tmp": 0o1777,
}

_ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}


class ImageBuildError(RuntimeError):
    """The image could not be built (missing or unusable busybox binary)."""


@dataclass(frozen=True)
class BuiltImage:
    """An OCI archive on disk and the identity containerd will give it."""

    ref: str
    archive: Path
    manifest_digest: str
    config_digest: str  # containerd/CRI call this the image id


def list_applets(busybox: Path = DEFAULT_BUSYBOX) -> list[str]:
    """Install paths (relative, e.g. ``bin/sh``) of every applet busybox offers."""
    try:
        out = subprocess.run(
            [str(busybox), "--list-full"], check=True, capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return sorted(_FALLBACK_APPLETS)
    applets = {
        line.strip().lstrip("/")
        for line in out.splitlines()
        if line.strip() and "/" in line.strip() and line.strip() != "bin/busybox"
    }
    return sorted(applets) or sorted(_FALLBACK_APPLETS)


def build_rootfs_layer(busybox: Path = DEFAULT_BUSYBOX) -> bytes:
    """An uncompressed layer tar: busybox, its applet symlinks, minimal /etc."""
    if not busybox.is_file():
        raise ImageBuildError(f"busybox binary not found at {busybox} (install busybox-static)")
    binary = busybox.read_bytes()
    applets = list_applets(busybox)
    # The layer must create every parent directory the applets live in.
    dirs = dict(_DIRECTORIES)
    for applet in applets:
        parent = applet.rsplit("/", 1)[0] if "/" in applet else ""
        if parent:
            dirs.setdefault(parent, 0o755)

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(dirs):
            tar.addfile(oci.tar_info(name + "/", tarfile.DIRTYPE, dirs[name]))
        tar.addfile(oci.tar_info("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)), io.BytesIO(binary))
        for name in sorted(_ETC_FILES):
            data = _ETC_FILES[name].encode()
            tar.addfile(oci.tar_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        for applet in applets:
            tar.addfile(oci.tar_info(applet, tarfile.SYMTYPE, 0o777, linkname="/bin/busybox"))
    return buf.getvalue()


def build_image_archive(
    dest: Path,
    ref: str,
    cmd: list[str],
    busybox: Path = DEFAULT_BUSYBOX,
    layer: bytes | None = None,
) -> BuiltImage:
    """Write an OCI image-layout tar for ``ref`` to ``dest``.

    ``layer`` may be passed to share one prebuilt rootfs layer between images.
    """
    layer_bytes = layer if layer is not None else build_rootfs_layer(busybox)
    archive = oci.write_archive(dest, ref, [oci.plain_layer(layer_bytes)],
                                {"Env": [oci.PATH_ENV], "Cmd": list(cmd), "WorkingDir": "/"},
                                "koordnode test bed image builder")
    return BuiltImage(ref=ref, archive=dest, manifest_digest=archive.manifest_digest,
                      config_digest=archive.config_digest)


def build_test_images(out_dir: Path, busybox: Path = DEFAULT_BUSYBOX) -> tuple[BuiltImage, BuiltImage]:
    """Build (pause, busybox) archives in ``out_dir`` sharing one rootfs layer."""
    layer = build_rootfs_layer(busybox)
    pause = build_image_archive(out_dir / "pause.oci.tar", PAUSE_IMAGE_REF, PAUSE_CMD, layer=layer)
    workload = build_image_archive(out_dir / "busybox.oci.tar", BUSYBOX_IMAGE_REF, BUSYBOX_CMD, layer=layer)
    return pause, workload
