"""Other containerd releases for the test bed, fetched from Debian with apt.

``containerd_bin_dir("forky")`` (containerd 2.1) or ``containerd_bin_dir("trixie")``
(containerd 1.7) returns a directory holding ``containerd``, ``ctr`` and
``containerd-shim-runc-v2`` of that Debian suite's ``containerd`` package, ready to
hand to ``ContainerdBed(bin_dir=...)``. These binaries are statically built Go and
run on Debian 12 as they are; they use the host's runc.

How, and what it never touches:

* the mirror is read from the system's apt sources (the URI serving the Debian
  archive), so the repository names no host;
* apt runs with a private sources list naming only the wanted suite, a private
  state/cache dir and an empty dpkg status: the system's apt lists, sources and
  installed packages stay as they are, and nothing is installed;
* ``apt-get download`` fetches the .deb, ``dpkg-deb -x`` unpacks it into the
  cache (``/var/cache/koordnode-test/containerd-<suite>/``, or
  ``$KOORDNODE_TEST_CACHE/containerd-<suite>/``), which later calls reuse.

A file lock serialises concurrent fetches (parallel test runs); the unpacked tree
is moved into place only when complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

SUITES = {"forky": "2.1", "trixie": "1.7"}  # suite -> containerd minor release it ships
BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2")
DEFAULT_CACHE_ROOT = Path("/var/cache/koordnode-test")
APT_SOURCE_FILES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
DEFAULT_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
_COMPLETE_MARKER = ".koordnode-complete"
_STEP_TIMEOUT_S = 300  # every apt / dpkg step is bounded


class DistError(RuntimeError):
    """A Debian suite's containerd could not be fetched or is unusable here."""


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str


def cache_root() -> Path:
    return Path(os.environ.get("KOORDNODE_TEST_CACHE") or DEFAULT_CACHE_ROOT)


# --------------------------------------------------------------------------
# The system's apt sources (one-line and deb822 formats)
# --------------------------------------------------------------------------

def _parse_one_line(text: str) -> Iterator[AptSource]:
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        options = ""
        rest = line[4:].strip()
        if rest.startswith("["):
            options, _, rest = rest[1:].partition("]")
        words = rest.split()
        if len(words) < 2:
            continue
        signed = re.search(r"signed-by=(\S+)", options)
        yield AptSource(words[0], (words[1],), tuple(words[2:]), signed.group(1) if signed else "")


def _parse_deb822(text: str) -> Iterator[AptSource]:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = ""
        for raw in stanza.splitlines():
            if raw.startswith("#"):
                continue
            if raw[:1].isspace() and key:
                fields[key] += " " + raw.strip()
                continue
            key, sep, value = raw.partition(":")
            if not sep:
                key = ""
                continue
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield AptSource(
                uri, tuple(fields.get("suites", "").split()), tuple(fields.get("components", "").split()),
                fields.get("signed-by", "").strip(),
            )


def system_apt_sources(paths: tuple[Path, ...] = APT_SOURCE_FILES) -> list[AptSource]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix in (".list", ".sources")))
        elif path.is_file():
            files.append(path)
    sources: list[AptSource] = []
    for file in files:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = file.read_text()
            sources.extend(_parse_deb822(text) if file.suffix == ".sources" else _parse_one_line(text))
    return sources


def debian_mirror(paths: tuple[Path, ...] = APT_SOURCE_FILES) -> AptSource:
    """The configured source of the Debian archive itself (not -security, not third parties)."""
    for source in system_apt_sources(paths):
        is_archive = any(s and "-" not in s for s in source.suites) and "main" in source.components
        if is_archive and source.uri.rstrip("/").endswith("/debian"):
            return source
    raise DistError(
        "no Debian archive mirror in the system's apt sources "
        f"({', '.join(str(p) for p in paths)}): need a 'deb <uri>/debian <suite> main' entry"
    )


# --------------------------------------------------------------------------
# Fetch
# --------------------------------------------------------------------------

def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=_STEP_TIMEOUT_S, cwd=cwd)
    except FileNotFoundError as err:
        raise DistError(f"{what}: {err.filename} not found") from err
    except subprocess.TimeoutExpired as err:
        raise DistError(f"{what}: no answer within {_STEP_TIMEOUT_S} s") from err
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise DistError(f"{what} failed ({result.returncode}):\n{tail}")
    return result.stdout


class PrivateApt:
    """apt-get/apt-cache with their own sources, state and cache under ``home``."""

    def __init__(self, home: Path, suite: str, mirror: AptSource) -> None:
        self.home = home
        self.suite = suite
        keyring = mirror.signed_by if mirror.signed_by.startswith("/") else str(DEFAULT_KEYRING)
        etc = home / "etc"
        for d in (etc / "sources.list.d", etc / "preferences.d", home / "state" / "lists" / "partial",
                  home / "cache" / "archives" / "partial"):
            d.mkdir(parents=True, exist_ok=True)
        (etc / "sources.list").write_text(f"deb [signed-by={keyring}] {mirror.uri} {suite} main\n")
        (home / "state" / "status").touch()
        self.options = [
            "-o", f"Dir::Etc::SourceList={etc / 'sources.list'}",
            "-o", f"Dir::Etc::SourceParts={etc / 'sources.list.d'}",
            "-o", f"Dir::Etc::Preferences={etc / 'preferences'}",
            "-o", f"Dir::Etc::PreferencesParts={etc / 'preferences.d'}",
            "-o", f"Dir::State={home / 'state'}",
            "-o", f"Dir::State::status={home / 'state' / 'status'}",
            "-o", f"Dir::Cache={home / 'cache'}",
            "-o", "Debug::NoLocking=1",
            "-o", "APT::Sandbox::User=root",  # private dirs belong to root; _apt could not write them
            "-o", "Acquire::Languages=none",
            "-o", "APT::Get::List-Cleanup=0",
        ]

    def update(self) -> None:
        _run(["apt-get", *self.options, "-q", "update"], f"apt-get update ({self.suite})")

    def version(self, package: str) -> str:
        out = _run(["apt-cache", *self.options, "show", "--no-all-versions", package],
                   f"apt-cache show {package} ({self.suite})")
        match = re.search(r"^Version: (\S+)", out, re.M)
        if not match:
            raise DistError(f"{package} not found in {self.suite}")
        return match.group(1)

    def download(self, package: str, into: Path) -> Path:
        before = set(into.glob("*.deb"))
        # apt-get download writes into the current directory
        _run(["apt-get", *self.options, "-q", "download", package], f"apt-get download {package} ({self.suite})",
             cwd=into)
        fetched = sorted(set(into.glob(f"{package}_*.deb")) - before)
        if not fetched:
            raise DistError(f"apt-get download {package} ({self.suite}) produced no .deb")
        return fetched[-1]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _bin_dir_of(target: Path) -> Path:
    return target / "usr" / "bin"


def cached_bin_dir(suite: str) -> Path | None:
    """The unpacked binaries of ``suite`` when already in the cache, else None."""
    target = cache_root() / f"containerd-{suite}"
    if (target / _COMPLETE_MARKER).is_file() and all((_bin_dir_of(target) / b).is_file() for b in BINARIES):
        return _bin_dir_of(target)
    return None


def containerd_bin_dir(suite: str) -> Path:
    """Directory with ``suite``'s containerd binaries; fetched once, then cached.

    Raises ``DistError`` with the reason when the suite is unknown, the mirror is
    not configured or not reachable, or the binaries do not run here.
    """
    if suite not in SUITES:
        raise DistError(f"unknown suite {suite!r}; known: {', '.join(sorted(SUITES))}")
    if os.geteuid() != 0:
        raise DistError("fetching a Debian containerd needs root (apt state and cache dirs)")
    ready = cached_bin_dir(suite)
    if ready is not None:
        return ready
    root = cache_root()
    target = root / f"containerd-{suite}"
    with _locked(root / f"containerd-{suite}.lock"):
        ready = cached_bin_dir(suite)  # another process may have finished meanwhile
        if ready is not None:
            return ready
        mirror = debian_mirror()
        with tempfile.TemporaryDirectory(prefix=f"containerd-{suite}-", dir=root) as scratch:
            work = Path(scratch)
            apt = PrivateApt(work / "apt", suite, mirror)
            apt.update()
            version = apt.version("containerd")
            debs = work / "debs"
            debs.mkdir()
            deb = apt.download("containerd", debs)
            unpacked = work / "tree"
            _run(["dpkg-deb", "-x", str(deb), str(unpacked)], f"dpkg-deb -x {deb.name}")
            missing = [b for b in BINARIES if not (_bin_dir_of(unpacked) / b).is_file()]
            if missing:
                raise DistError(f"{deb.name} lacks {', '.join(missing)}")
            (unpacked / _COMPLETE_MARKER).write_text(f"containerd {version} from {suite}\n")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(unpacked, target)
    bin_dir = _bin_dir_of(target)
    containerd_version(bin_dir)  # a binary that cannot run here is an error now, not at bed start
    return bin_dir


def containerd_version(bin_dir: Path) -> str:
    """``2.1.9`` from ``containerd --version`` of the binary in ``bin_dir``."""
    out = _run([str(Path(bin_dir) / "containerd"), "--version"], f"{bin_dir}/containerd --version")
    match = re.search(r"\bv?(\d+\.\d+\.\d+)", out)
    if not match:
        raise DistError(f"cannot read a version from {out.strip()!r}")
    return match.group(1)


def suite_unavailable_reason(suite: str) -> str:
    """'' when ``containerd_bin_dir(suite)`` works here, else why not (for skip messages)."""
    try:
        containerd_bin_dir(suite)
    except DistError as err:
        return str(err)
    return ""
