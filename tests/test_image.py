"""koordnode's container image (packaging/image.py), built here from this checkout and Debian's
packages: what it holds and leaves out, its size, and that containerd imports and runs it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.containerd_bed import ContainerdBed
from testbed.fixtures import skip_or_fail_in_ci

from koordnode import __version__

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
REF = "docker.io/koordnode/koordnode:test"
# The image as measured when it was made (2026-12-02: 24.5 MiB compressed, 72.3 MiB unpacked) with
# room; a dependency that drags half a distribution in fails here.
MAX_COMPRESSED_MIB = 32
MAX_UNPACKED_MIB = 96


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        skip_or_fail_in_ci("packaging/image.py needs root")
    out = tmp_path_factory.mktemp("image")
    done = subprocess.run([sys.executable, str(REPO / "packaging" / "image.py"), "--tag", REF, "--out", str(out)],
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    print(done.stderr[-2000:])
    assert done.returncode == 0, done.stderr[-4000:]
    return Path(done.stdout.split()[-1])


def _blobs(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_image_holds_koordnode_and_python_and_leaves_the_rest_out(image: Path) -> None:
    files = _blobs(image)
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == REF
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].split(':')[1]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert config["config"]["Entrypoint"] == ["/usr/bin/koordnode"]
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == __version__
    [layer] = manifest["layers"]
    blob = files[f"blobs/sha256/{layer['digest'].split(':')[1]}"]
    unpacked = gzip.decompress(blob)
    with tarfile.open(fileobj=io.BytesIO(unpacked)) as tar:
        names = {m.name for m in tar.getmembers()}
    for wanted in ("usr/bin/koordnode", "usr/bin/python3", "opt/koordnode/lib/koordnode/cli.py",
                   "opt/koordnode/lib/yaml/__init__.py", "etc/koordnode/koordnode.toml", "var/lib/koordnode"):
        assert wanted in names, f"{wanted} missing from the image"
    assert any(n.startswith("opt/koordnode/lib/koordnode/__pycache__/cli.cpython-") for n in names)
    for unwanted in ("bin/sh", "usr/bin/dpkg", "usr/bin/perl", "usr/bin/apt", "usr/share/man", "lib/systemd"):
        assert unwanted not in names, f"{unwanted} is in the image"
    print(f"image: {len(blob) / 2**20:.1f} MiB compressed, {len(unpacked) / 2**20:.1f} MiB unpacked, "
          f"{len(names)} files")
    assert len(blob) < MAX_COMPRESSED_MIB * 2**20 and len(unpacked) < MAX_UNPACKED_MIB * 2**20


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[ContainerdBed]:
    containerd = ContainerdBed(tmp_path / "containerd")
    containerd.start()
    try:
        yield containerd
    finally:
        containerd.stop()


def test_containerd_imports_the_image_and_runs_koordnode_from_it(image: Path, bed: ContainerdBed) -> None:
    bed.ctr("images", "import", "--snapshotter", bed.snapshotter, str(image))
    version = bed.ctr("run", "--rm", "--snapshotter", bed.snapshotter, REF, "kn-image-version",
                      "/usr/bin/koordnode", "version", timeout=120)
    assert __version__ in version
    checked = bed.ctr("run", "--rm", "--snapshotter", bed.snapshotter, REF, "kn-image-check",
                      "/usr/bin/koordnode", "check-config", "--config", "/etc/koordnode/koordnode.toml", timeout=120)
    assert checked.lower().startswith("config ok: /etc/koordnode/koordnode.toml"), checked
