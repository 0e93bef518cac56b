#!/usr/bin/env bash
# Build the koordnode packages: dist/koordnode_<version>_amd64.deb and
# dist/koordnode-<version>.x86_64.rpm, from this source tree.
#
#   packaging/build.sh [--version V] [--out DIR] [--formats deb,rpm]
#
#   --version V    package (and koordnode.__version__) version; default: koordnode/__init__.py
#   --out DIR      where the packages go; default: dist/ in the source tree
#   --formats F    deb, rpm or deb,rpm (default)
#
# Needs (Debian 12 or 13): /usr/bin/python3 (>= 3.11) with pip, dpkg-deb, and rpmbuild for the
# rpm (apt-get install python3-pip rpm). Downloads the pinned dependencies of
# packaging/requirements.txt with pip at build time; the packages install offline.
# KOORDNODE_BUILD_PYTHON=/path/to/python3.X builds with another CPython >= 3.11 (same packages).
#
# One package for every distribution with a CPython >= 3.11: /opt/koordnode/lib holds koordnode
# and its dependencies, all pure Python or abi3 extension modules (checked here), so any
# CPython >= 3.11 runs them; /opt/koordnode/bin/koordnode (a shell launcher, /usr/bin/koordnode
# links to it) picks the system interpreter. Byte code is compiled at install time for each
# interpreter present (/opt/koordnode/bin/koordnode-bytecode). Plus the systemd unit,
# /etc/koordnode/koordnode.toml (conffile) and the koordnode(8) man page.
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The build's interpreter (any CPython >= 3.11 with pip; the packages do not depend on which).
PYTHON=${KOORDNODE_BUILD_PYTHON:-/usr/bin/python3}
APP=/opt/koordnode
LIB=$APP/lib
# The oldest CPython the package runs on: the abi3 extension modules must be built for it or
# older, and the packages depend on an interpreter at least this new.
MIN_PY=3.11

version=""
out="$SRC/dist"
formats="deb,rpm"

die() { echo "build.sh: $*" >&2; exit 2; }
step() { echo "build.sh: [${SECONDS}s] $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --version) [ $# -ge 2 ] || die "--version needs a value"; version=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
        --formats) [ $# -ge 2 ] || die "--formats needs a value"; formats=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' \
                       | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

build_deb=false
build_rpm=false
IFS=, read -r -a wanted <<< "$formats"
for f in "${wanted[@]}"; do
    case "$f" in
        deb) build_deb=true ;;
        rpm) build_rpm=true ;;
        *) die "unknown format '$f' (expected deb, rpm or deb,rpm)" ;;
    esac
done

# --- checks ----------------------------------------------------------------------------------

[ -x "$PYTHON" ] || die "$PYTHON not found (apt-get install python3)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is Python $("$PYTHON" -V 2>&1); koordnode needs >= 3.11"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "pip is missing (apt-get install python3-pip)"
$build_deb && { command -v dpkg-deb >/dev/null || die "dpkg-deb not found (apt-get install dpkg)"; }
$build_rpm && { command -v rpmbuild >/dev/null || die "rpmbuild not found (apt-get install rpm)"; }

if [ -z "$version" ]; then
    version=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$SRC/koordnode/__init__.py")
    [ -n "$version" ] || die "no __version__ = \"...\" line in koordnode/__init__.py"
fi
# Valid and ordered alike for dpkg, rpm and PEP 440: 1.2.3 or 1.2.3+local.1 (which sorts
# after 1.2.3 everywhere). Pre-releases (1.2.3rc1) would sort after 1.2.3 in dpkg: refused.
[[ "$version" =~ ^[0-9]+(\.[0-9]+)*(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?$ ]] \
    || die "version '$version' is not of the form 1.2.3 or 1.2.3+local"

deb_arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
case "$deb_arch" in
    amd64) rpm_arch=x86_64 ;;
    arm64) rpm_arch=aarch64 ;;
    *) die "unsupported architecture $deb_arch" ;;
esac

umask 022
work=$(mktemp -d "${TMPDIR:-/tmp}/koordnode-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/stage   # the installed file system, shared by both packages
mkdir -p "$stage" "$out"
out=$(cd "$out" && pwd)

# --- koordnode wheel, from a copy of the tree (the source tree is not written to) ------------

step "koordnode $version: building the wheel"
src_copy=$work/src
mkdir -p "$src_copy"
cp "$SRC/pyproject.toml" "$src_copy/"
if [ -f "$SRC/README.md" ]; then cp "$SRC/README.md" "$src_copy/"; else : > "$src_copy/README.md"; fi
tar -C "$SRC" --exclude=__pycache__ --exclude='*.pyc' -cf - koordnode | tar -C "$src_copy" -xf -
sed -i "s/^__version__ = .*/__version__ = \"$version\"/" "$src_copy/koordnode/__init__.py"
"$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheels" "$src_copy" >&2

# --- the private library directory, staged where it will live -----------------------------

step "library directory: the pinned dependencies for CPython >= $MIN_PY ($rpm_arch)"
lib=$stage$LIB
# Wheels for the oldest supported CPython and manylinux2014 (glibc >= 2.17): pure Python or
# abi3, which every later CPython loads too. Nothing is compiled here.
pip_install=("$PYTHON" -m pip install --quiet --no-compile --disable-pip-version-check
             --no-warn-script-location --no-deps --target "$lib")
"${pip_install[@]}" --only-binary=:all: --implementation cp --python-version "$MIN_PY" \
    --abi abi3 --abi none --platform "manylinux2014_$rpm_arch" \
    -r "$SRC/packaging/requirements.txt" >&2
rm -rf "$lib/bin"   # the dependencies' console scripts: not what we ship
# PyYAML has no pure-Python or abi3 wheel on PyPI: its pure-Python build, from its pinned source
# (PYYAML_FORCE_LIBYAML=0 leaves the C loader out; koordnode uses the pure-Python safe loader).
pure=$(sed -n 's/^# pure-python-from-source: //p' "$SRC/packaging/requirements.txt")
for requirement in $pure; do
    PYYAML_FORCE_LIBYAML=0 "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps \
        --no-binary "${requirement%%==*}" --wheel-dir "$work/pure" "$requirement" >&2
done
if [ -n "$pure" ]; then "${pip_install[@]}" "$work"/pure/*.whl >&2; fi
"${pip_install[@]}" "$work"/wheels/koordnode-*.whl >&2
rm -rf "$lib/bin"   # koordnode's console script: the launcher replaces it
rm -f "$lib"/koordnode-*.dist-info/direct_url.json   # names the build directory

# Every wheel must run on every CPython >= MIN_PY: py3-none-any, or cp3X-abi3 with X <= 11.
min_minor=${MIN_PY#3.}
while read -r wheel_file; do
    while read -r tag; do
        case "$tag" in
            py3-none-any) ;;
            cp3*-abi3-*)
                minor=${tag#cp3}; minor=${minor%%-*}
                [ "$minor" -le "$min_minor" ] || die "$wheel_file: $tag needs CPython > $MIN_PY" ;;
            *) die "$(dirname "$wheel_file"): wheel tag $tag is tied to one interpreter (need abi3 or pure Python)" ;;
        esac
    done < <(sed -n 's/^Tag: //p' "$wheel_file")
done < <(find "$lib" -maxdepth 2 -path '*.dist-info/WHEEL')
if versioned=$(find "$lib" -name '*.so' ! -name '*.abi3.so' | grep .); then
    die "extension modules built for one CPython version: $versioned"
fi
# koordnode's own dependencies are all there (the --no-deps install above skips resolution).
"$PYTHON" -I - "$lib" "$MIN_PY" <<'PY' || die "packaging/requirements.txt does not satisfy koordnode's dependencies"
import sys
from importlib.metadata import distributions
try:
    from packaging.requirements import Requirement
except ImportError:  # pip's own copy (always there: pip runs this build)
    from pip._vendor.packaging.requirements import Requirement

lib, min_py = sys.argv[1:]
found = {d.metadata["Name"].lower().replace("_", "-"): d for d in distributions(path=[lib])}
env = {"python_version": min_py, "python_full_version": min_py + ".0", "extra": ""}
bad = []
for name, dist in found.items():
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        have = found.get(req.name.lower().replace("_", "-"))
        if have is None or not req.specifier.contains(have.version, prereleases=True):
            bad.append(f"{name} needs {req}, bundled: {have.version if have else 'nothing'}")
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY

step "launcher"
install -D -m 0755 "$SRC/packaging/bin/koordnode" "$stage$APP/bin/koordnode"
install -m 0755 "$SRC/packaging/bin/koordnode-bytecode" "$stage$APP/bin/koordnode-bytecode"

if leaks=$(grep -rlF "$stage" "$stage"); then
    die "staged files still name the staging directory: $leaks"
fi

# --- the rest of the file system -------------------------------------------------------------

step "config, command, man page"
install -d "$stage/usr/bin" "$stage/etc/koordnode" "$stage/usr/share/man/man8" \
    "$stage/usr/share/doc/koordnode"
ln -s "$APP/bin/koordnode" "$stage/usr/bin/koordnode"
install -m 0644 "$SRC/packaging/koordnode.toml" "$stage/etc/koordnode/koordnode.toml"
install -m 0644 "$SRC/packaging/deb/copyright" "$stage/usr/share/doc/koordnode/copyright"
install -m 0644 "$SRC/packaging/helm/koordnode/files/koordnode-rbac.yaml" "$stage/usr/share/doc/koordnode/koordnode-rbac.yaml"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(stat -c %Y "$SRC/koordnode/__init__.py")}
with_lib=("$PYTHON" -I -S -B -c 'import runpy, site, sys
site.addsitedir(sys.argv.pop(1)); sys.argv.pop(0)
runpy.run_path(sys.argv[0], run_name="__main__")' "$lib")
"${with_lib[@]}" "$SRC/packaging/man/gen-manpage.py" "$work/koordnode.8"
gzip -9n < "$work/koordnode.8" > "$stage/usr/share/man/man8/koordnode.8.gz"
chmod 0644 "$stage/usr/share/man/man8/koordnode.8.gz"
# A quick smoke test of the staged tree, through the launcher, before packaging it.
KOORDNODE_PYTHON=$PYTHON "$stage$APP/bin/koordnode" version >/dev/null \
    || die "the staged launcher cannot run koordnode"
printf 'import google.protobuf, psutil, pyroute2, structlog, h2\nimport koordnode.cli, koordnode.daemon\n' \
    > "$work/smoke.py"
"${with_lib[@]}" "$work/smoke.py" || die "the staged library cannot import koordnode's dependencies"
find "$lib" -name __pycache__ -prune -exec rm -rf {} +   # byte code is made at install time

# --- .deb ------------------------------------------------------------------------------------

if $build_deb; then
    step "dpkg-deb"
    deb_root=$work/deb
    cp -a "$stage" "$deb_root"
    install -D -m 0644 "$SRC/systemd/koordnode.service" \
        "$deb_root/lib/systemd/system/koordnode.service"
    install -d -m 0755 "$deb_root/DEBIAN"
    for script in postinst prerm postrm; do
        install -m 0755 "$SRC/packaging/deb/$script" "$deb_root/DEBIAN/$script"
    done
    install -m 0644 "$SRC/packaging/deb/conffiles" "$deb_root/DEBIAN/conffiles"
    size=$(du -sk --exclude=DEBIAN "$deb_root" | cut -f1)
    sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$deb_arch/" -e "s/@INSTALLED_SIZE@/$size/" \
        "$SRC/packaging/deb/control.in" > "$deb_root/DEBIAN/control"
    (cd "$deb_root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z \
        | xargs -0 md5sum) > "$deb_root/DEBIAN/md5sums"
    chmod 0644 "$deb_root/DEBIAN/md5sums"
    deb=$out/koordnode_${version}_${deb_arch}.deb
    # xz -1: a third of the time of the default level for a few percent more bytes.
    dpkg-deb --root-owner-group -Zxz -z1 --build "$deb_root" "$deb" >/dev/null
    echo "$deb"
fi

# --- .rpm ------------------------------------------------------------------------------------

if $build_rpm; then
    step "rpmbuild"
    rpm_top=$work/rpm
    mkdir -p "$rpm_top"/{BUILD,BUILDROOT,RPMS,SOURCES,SPECS,SRPMS} "$work/tmp"
    # The rpm database is not touched; --nodeps: Debian's rpm knows no installed packages.
    rpmbuild -bb --quiet --nodeps --target "$rpm_arch-linux" \
        --define "_topdir $rpm_top" \
        --define "_tmppath $work/tmp" \
        --define "koordnode_version $version" \
        --define "koordnode_stage $stage" \
        --define "koordnode_unit $SRC/systemd/koordnode.service" \
        --define "koordnode_min_python $MIN_PY" \
        --define "_binary_payload w2.xzdio" \
        "$SRC/packaging/rpm/koordnode.spec" >&2
    rpm=$out/koordnode-${version}.${rpm_arch}.rpm
    mv "$rpm_top/RPMS/koordnode-${version}.${rpm_arch}.rpm" "$rpm"
    echo "$rpm"
fi
