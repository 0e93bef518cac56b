"""OCI image-layout archives, written without a registry or a container tool.

``write_archive`` packs one image (its layers, an image config, a manifest and the layout's
index) into a tar that ``ctr images import`` and ``podman load`` accept. Everything is written
with fixed times and owners, so the same layers give the same digests. Used by
packaging/image.py (koordnode's image) and by the test bed's busybox images.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

MEDIA_TYPE_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_TYPE_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_TYPE_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_TYPE_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_TYPE_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
# containerd takes the image's full name from this annotation on import.
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"

FIXED_MTIME = 1704067200  # 2024-01-01T00:00:00Z
FIXED_CREATED = "2024-01-01T00:00:00Z"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Layer:
    """A layer's blob as stored, and the digest of its uncompressed tar (the config's diff_id)."""

    blob: bytes
    diff_id: str
    media_type: str = MEDIA_TYPE_LAYER


@dataclass(frozen=True)
class Archive:
    ref: str
    path: Path
    manifest_digest: str
    config_digest: str  # what containerd and CRI call the image id


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def tar_info(name: str, kind: bytes, mode: int, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    """A tar member owned by root with the fixed time."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def plain_layer(tar_bytes: bytes) -> Layer:
    return Layer(tar_bytes, sha256(tar_bytes))


def write_archive(dest: Path, ref: str, layers: list[Layer], config: dict[str, object],
                  created_by: str) -> Archive:
    """Write the image ``ref`` (it must carry a tag) to ``dest``; ``config`` is the image
    config's ``config`` object (Env, Entrypoint, Cmd, Labels...)."""
    if ":" not in ref.rsplit("/", 1)[-1]:
        raise ValueError(f"image ref must carry a tag, got {ref!r}")
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": FIXED_CREATED,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": FIXED_CREATED, "created_by": created_by} for _ in layers],
    }
    config_bytes = canonical_json(image_config)
    config_digest = sha256(config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "config": {"mediaType": MEDIA_TYPE_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": layer.media_type, "digest": sha256(layer.blob), "size": len(layer.blob)}
                   for layer in layers],
    }
    manifest_bytes = canonical_json(manifest)
    manifest_digest = sha256(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_INDEX,
        "manifests": [{
            "mediaType": MEDIA_TYPE_MANIFEST,
            "digest": manifest_digest,
            "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {ANNOTATION_CONTAINERD_NAME: ref, ANNOTATION_REF_NAME: ref},
        }],
    }
    blobs = {digest.split(":", 1)[1]: data for digest, data in (
        *((sha256(layer.blob), layer.blob) for layer in layers),
        (config_digest, config_bytes), (manifest_digest, manifest_bytes))}
    files = {"oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}), "index.json": canonical_json(index)}

    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".tmp")
    with tarfile.open(partial, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in ("blobs/", "blobs/sha256/"):
            tar.addfile(tar_info(name, tarfile.DIRTYPE, 0o755))
        for hexdigest in sorted(blobs):
            data = blobs[hexdigest]
            tar.addfile(tar_info(f"blobs/sha256/{hexdigest}", tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        for name in sorted(files):
            data = files[name]
            tar.addfile(tar_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    partial.replace(dest)
    return Archive(ref=ref, path=dest, manifest_digest=manifest_digest, config_digest=config_digest)
