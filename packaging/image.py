#!/usr/bin/env python3
"""Build koordnode's container image (for the DaemonSet of packaging/helm/koordnode) from this
checkout and Debian's packages: no registry, no container tool, no Dockerfile.

    python3 packaging/image.py [--tag koordnode/koordnode:VERSION] [--out dist/]

writes ``koordnode-image-<version>.oci.tar`` (an OCI image layout; ``ctr -n k8s.io images import``
or ``podman load`` take it), prints its path, and its sizes on stderr.

The root file system is Debian's python3 (the release of the machine that builds, through its
apt sources) and what it needs to run, unpacked from the .deb files without running their
maintainer scripts, and without what a daemon that only runs Python never uses: no shell, no
package manager, no perl, no documentation but the copyright files. Into it goes the .deb that
packaging/build.sh makes (/opt/koordnode), its byte code compiled by the image's own Python,
and /usr/bin/koordnode as a Python entry point (the package's launcher is a shell script). The
image then runs ``koordnode version`` in a chroot before it is written: an image that cannot
start is never produced.

Needs root (chroot), apt-get and dpkg-deb (Debian or Ubuntu), and what packaging/build.sh needs.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import oci_archive as oci

REPO = Path(__file__).resolve().parents[1]
APP = "/opt/koordnode"
# In the closure of python3's dependencies but never used by a Python daemon (maintainer
# tooling, perl for mime-support's scripts, the shell utilities dpkg needs).
LEFT_OUT = frozenset({
    "dpkg", "install-info", "tar", "perl", "perl-base", "perl-modules-5.36", "perl-modules-5.40", "libperl5.36",
    "libperl5.40", "mailcap", "mime-support", "libgdbm-compat4", "debconf", "readline-common",
})
DROPPED_DIRS = ("usr/share/man", "usr/share/info", "usr/share/lintian", "usr/share/locale", "usr/share/pixmaps",
                "usr/share/applications", "lib/systemd", "usr/lib/systemd", "etc/systemd", "etc/cron.d",
                "etc/cron.daily", "etc/logrotate.d", "etc/init.d")
ENTRY_POINT = f"""#!/usr/bin/python3 -IS
# koordnode in its container image: the package's library directory, the image's Python.
import site
import sys

site.addsitedir("{APP}/lib")
sys.argv[0] = "koordnode"
from koordnode.cli import main

sys.exit(main())
"""
ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
EMPTY_DIRS = {"dev": 0o755, "proc": 0o555, "sys": 0o555, "tmp": 0o1777, "run": 0o755, "root": 0o700,
              "var/lib/koordnode": 0o700, "var/run": 0o755, "etc/koordnode": 0o755}


def log(message: str) -> None:
    print(f"image.py: {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def python_closure() -> list[str]:
    """python3 and every package it depends on (no recommends), less LEFT_OUT. Without package
    lists (a machine image that cleared them) apt's lists are fetched first."""
    if subprocess.run(["apt-cache", "show", "python3"], capture_output=True).returncode != 0:
        log("apt has no package lists: apt-get update")
        run(["apt-get", "update", "-qq"], stdout=subprocess.DEVNULL)
    out = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
               "--no-breaks", "--no-replaces", "--no-enhances", "python3"], capture_output=True).stdout
    names = {line.strip() for line in out.splitlines() if line and not line.startswith((" ", "<"))}
    return sorted(names - LEFT_OUT)


def unpack_debian(root: Path, work: Path) -> None:
    debs = work / "debs"
    debs.mkdir()
    packages = python_closure()
    log(f"downloading {len(packages)} Debian packages: {' '.join(packages)}")
    run(["apt-get", "download", "-q", *packages], cwd=debs, stdout=subprocess.DEVNULL)
    for deb in sorted(debs.glob("*.deb")):
        run(["dpkg-deb", "-x", str(deb), str(root)])


def trim(root: Path) -> None:
    for relative in DROPPED_DIRS:
        shutil.rmtree(root / relative, ignore_errors=True)
    docs = root / "usr/share/doc"
    for entry in docs.glob("*/*") if docs.is_dir() else []:
        if entry.name != "copyright":  # the licences stay
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for cache in root.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)


def add_koordnode(root: Path, deb: Path) -> None:
    run(["dpkg-deb", "-x", str(deb), str(root)])
    entry = root / "usr/bin/koordnode"
    entry.unlink(missing_ok=True)  # the package's link to its shell launcher
    entry.write_text(ENTRY_POINT)
    entry.chmod(0o755)
    for name, text in ETC_FILES.items():
        (root / name).write_text(text)
    for name, mode in EMPTY_DIRS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name).chmod(mode)


def compile_and_check(root: Path) -> str:
    """Byte code by the image's interpreter (hash-checked: file times do not matter), then
    ``koordnode version`` in the image: its answer."""
    trees = [APP + "/lib", *("/" + str(d.relative_to(root)) for d in sorted((root / "usr/lib").glob("python3*")))]
    # One process (-j 1): the chroot has no /dev/shm for multiprocessing's workers. A file that
    # does not compile (a test module for another version) fails nothing: it is only slower.
    done = subprocess.run(["chroot", str(root), "/usr/bin/python3", "-I", "-m", "compileall", "-q", "-j", "1",
                           "--invalidation-mode", "checked-hash", *trees], capture_output=True, text=True)
    if done.returncode != 0:
        log(f"compileall left some files without byte code: {done.stdout.strip()[-500:]}")
    return run(["chroot", str(root), "/usr/bin/koordnode", "version"], capture_output=True).stdout.strip()


def layer_of(root: Path) -> tuple[oci.Layer, int]:
    """The whole tree as one gzip layer, members sorted, owned by root, at the fixed time."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*"), key=lambda p: str(p.relative_to(root))):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = oci.FIXED_MTIME, 0, 0, "root", "root"
            if info.isreg():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    tar_bytes = raw.getvalue()
    blob = gzip.compress(tar_bytes, compresslevel=9, mtime=0)
    return oci.Layer(blob, oci.sha256(tar_bytes), oci.MEDIA_TYPE_LAYER_GZIP), len(tar_bytes)


def build(tag: str, out: Path, version: str) -> Path:
    with tempfile.TemporaryDirectory(prefix="koordnode-image-") as scratch:
        work = Path(scratch)
        root = work / "rootfs"
        root.mkdir()
        log("packaging/build.sh --formats deb")
        built = run(["bash", str(REPO / "packaging" / "build.sh"), "--formats", "deb", "--version", version,
                     "--out", str(work / "dist")], capture_output=True).stdout.split()[-1]
        unpack_debian(root, work)
        add_koordnode(root, Path(built))
        trim(root)
        answered = compile_and_check(root)
        log(f"in the image: koordnode version -> {answered}")
        layer, unpacked = layer_of(root)
        archive = oci.write_archive(
            out / f"koordnode-image-{version}.oci.tar", tag, [layer],
            {"Env": [oci.PATH_ENV, "PYTHONDONTWRITEBYTECODE=1"], "Entrypoint": ["/usr/bin/koordnode"],
             "Cmd": ["run", "--config", "/etc/koordnode/koordnode.toml"], "WorkingDir": "/",
             "Labels": {"org.opencontainers.image.title": "koordnode",
                        "org.opencontainers.image.version": version}},
            "packaging/image.py")
        log(f"{tag}: {len(layer.blob) / 2**20:.1f} MiB compressed, {unpacked / 2**20:.1f} MiB unpacked; "
            f"image id {archive.config_digest}")
        return archive.path


def package_version() -> str:
    for line in (REPO / "koordnode" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__ = "):
            return line.split('"')[1]
    raise SystemExit("no __version__ in koordnode/__init__.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=package_version(), help="package version (default koordnode's)")
    parser.add_argument("--tag", help="image reference (default docker.io/koordnode/koordnode:VERSION)")
    parser.add_argument("--out", default="dist", help="directory for the archive (dist)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root (the image's own Python compiles its byte code in a chroot)")
    for tool in ("apt-get", "apt-cache", "dpkg-deb", "chroot"):
        if shutil.which(tool) is None:
            parser.error(f"needs {tool} (a Debian or Ubuntu machine)")
    tag = args.tag or f"docker.io/koordnode/koordnode:{args.version}"
    path = build(tag, Path(args.out).resolve(), args.version)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
