"""Build tiny local OCI image archives from the host's static busybox.

The test bed has no registry access, so the pause and workload images are
assembled here in pure Python: one uncompressed layer holding /bin/busybox
plus its applet symlinks, an image config, a manifest and an OCI layout
index, all packed into a tar that ``ctr images import`` accepts.

Output is byte-for-byte deterministic for a given busybox binary (fixed
mtimes, owners and entry order), so the image digests are stable too.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

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

MEDIA_TYPE_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_TYPE_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_TYPE_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_TYPE_LAYER = "application/vnd.oci.image.layer.v1.tar"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
# containerd prefers this annotation for the full image name on import.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"

_FIXED_MTIME = 1704067200  # 2024-01-01T00:00:00Z, keeps archives reproducible
_FIXED_CREATED = "2024-01-01T00:00:00Z"
_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _tar_info(name: str, kind: bytes, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = _FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


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
            tar.addfile(_tar_info(name + "/", tarfile.DIRTYPE, dirs[name]))
        tar.addfile(_tar_info("bin/busybox", tarfile.REGTYPE, 0o755, len(binary)), io.BytesIO(binary))
        for name in sorted(_ETC_FILES):
            data = _ETC_FILES[name].encode()
            tar.addfile(_tar_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        for applet in applets:
            tar.addfile(_tar_info(applet, tarfile.SYMTYPE, 0o777, linkname="/bin/busybox"))
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
    if ":" not in ref.rsplit("/", 1)[-1]:
        raise ValueError(f"image ref must carry a tag, got {ref!r}")
    layer_bytes = layer if layer is not None else build_rootfs_layer(busybox)
    layer_digest = _sha256(layer_bytes)

    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": _FIXED_CREATED,
        "config": {"Env": [_PATH_ENV], "Cmd": list(cmd), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": _FIXED_CREATED, "created_by": "koordnode test bed image builder"}],
    }
    config_bytes = _canonical_json(config)
    config_digest = _sha256(config_bytes)

    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "config": {"mediaType": MEDIA_TYPE_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_TYPE_LAYER, "digest": layer_digest, "size": len(layer_bytes)}],
    }
    manifest_bytes = _canonical_json(manifest)
    manifest_digest = _sha256(manifest_bytes)

    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_INDEX,
        "manifests": [
            {
                "mediaType": MEDIA_TYPE_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {ANNOTATION_CONTAINERD_NAME: ref, ANNOTATION_REF_NAME: ref},
            }
        ],
    }
    blobs = {
        d.split(":", 1)[1]: data
        for d, data in (
            (layer_digest, layer_bytes),
            (config_digest, config_bytes),
            (manifest_digest, manifest_bytes),
        )
    }
    files = {
        "oci-layout": _canonical_json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _canonical_json(index),
    }

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("blobs/", "blobs/sha256/"):
            tar.addfile(_tar_info(name, tarfile.DIRTYPE, 0o755))
        for hexdigest in sorted(blobs):
            data = blobs[hexdigest]
            tar.addfile(
                _tar_info(f"blobs/sha256/{hexdigest}", tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data)
            )
        for name in sorted(files):
            data = files[name]
            tar.addfile(_tar_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    tmp.replace(dest)
    return BuiltImage(ref=ref, archive=dest, manifest_digest=manifest_digest, config_digest=config_digest)


def build_test_images(out_dir: Path, busybox: Path = DEFAULT_BUSYBOX) -> tuple[BuiltImage, BuiltImage]:
    """Build (pause, busybox) archives in ``out_dir`` sharing one rootfs layer."""
    layer = build_rootfs_layer(busybox)
    pause = build_image_archive(out_dir / "pause.oci.tar", PAUSE_IMAGE_REF, PAUSE_CMD, layer=layer)
    workload = build_image_archive(out_dir / "busybox.oci.tar", BUSYBOX_IMAGE_REF, BUSYBOX_CMD, layer=layer)
    return pause, workload
