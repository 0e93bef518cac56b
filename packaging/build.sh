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
# Needs: /usr/bin/python3 (>= 3.11) with venv, dpkg-deb, and rpmbuild for the rpm (Debian:
# apt-get install python3-venv rpm). Downloads the pinned dependencies of
# packaging/requirements.txt with pip at build time; the packages install offline.
#
# Layout: /opt/koordnode/venv (a virtualenv on the system's /usr/bin/python3.X holding
# koordnode and its dependencies), /usr/bin/koordnode -> /opt/koordnode/venv/bin/koordnode,
# the systemd unit, /etc/koordnode/koordnode.toml (conffile), the koordnode(8) man page.
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=/usr/bin/python3
APP=/opt/koordnode
VENV=$APP/venv

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
        -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is Python $pyver; koordnode needs >= 3.11"
# The venv points at the versioned interpreter: binary wheels are built for exactly this
# minor version, so the package depends on it rather than on whatever python3 becomes.
target_python=/usr/bin/python$pyver
[ -x "$target_python" ] || die "$target_python not found"
"$target_python" -c 'import venv, ensurepip' 2>/dev/null \
    || die "the venv module is missing (apt-get install python3-venv)"
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

# --- the virtualenv, staged where it will live -----------------------------------------------

step "virtualenv on $target_python with the pinned dependencies"
venv=$stage$VENV
"$target_python" -m venv --without-pip "$venv"
# The system pip installs into the staged venv (--python); nothing is compiled here, byte
# code is made below with the final paths.
pip_install=("$PYTHON" -m pip --python "$venv/bin/python" install --quiet --no-compile
             --disable-pip-version-check --no-warn-script-location)
"${pip_install[@]}" --no-deps --only-binary=:all: -r "$SRC/packaging/requirements.txt" >&2
"${pip_install[@]}" --no-deps "$work"/wheels/koordnode-*.whl >&2
"$PYTHON" -m pip --python "$venv/bin/python" check >&2 \
    || die "packaging/requirements.txt does not satisfy koordnode's dependencies"

# Only the koordnode command is meant to run from bin/: activation scripts are for humans in
# a shell, the dependencies' own tools (pyroute2's ss2, ...) are not what we ship. Then rewrite
# what names the staging directory; the install record of our wheel names the build dir.
find "$venv/bin" -maxdepth 1 -type f ! -name koordnode -delete
rm -f "$venv"/lib/python"$pyver"/site-packages/koordnode-*.dist-info/direct_url.json
sed -i "s|^command = .*|command = $target_python -m venv $VENV|" "$venv/pyvenv.cfg"
# -I: ignore PYTHON* variables and the user's site directory; the daemon runs only its own code.
shebang="#!$VENV/bin/python$pyver -I"
sed -i "1s|^#!$stage$VENV/bin/python[0-9.]*\$|$shebang|" "$venv/bin/koordnode"
[ "$(head -n 1 "$venv/bin/koordnode")" = "$shebang" ] || die "unexpected $venv/bin/koordnode"

# Byte code with the final paths in it; hash-checked, so it stays valid whatever the file
# times after installation, and Python never needs to write to /opt (read-only under systemd).
"$venv/bin/python" -m compileall -q -j 0 --invalidation-mode checked-hash \
    -s "$stage" -p / "$venv/lib" >&2

if leaks=$(grep -rlF "$stage" "$stage"); then
    die "staged files still name the staging directory: $leaks"
fi

# --- the rest of the file system -------------------------------------------------------------

step "config, command, man page"
install -d "$stage/usr/bin" "$stage/etc/koordnode" "$stage/usr/share/man/man8" \
    "$stage/usr/share/doc/koordnode"
ln -s "$VENV/bin/koordnode" "$stage/usr/bin/koordnode"
install -m 0644 "$SRC/packaging/koordnode.toml" "$stage/etc/koordnode/koordnode.toml"
install -m 0644 "$SRC/packaging/deb/copyright" "$stage/usr/share/doc/koordnode/copyright"
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(stat -c %Y "$SRC/koordnode/__init__.py")}
"$venv/bin/python" -I "$SRC/packaging/man/gen-manpage.py" "$work/koordnode.8"
gzip -9n < "$work/koordnode.8" > "$stage/usr/share/man/man8/koordnode.8.gz"
chmod 0644 "$stage/usr/share/man/man8/koordnode.8.gz"
# A quick smoke test of the staged venv before packaging it.
"$venv/bin/python" -I -c 'import grpc, google.protobuf, psutil, pyroute2, structlog, prometheus_client
import koordnode.cli, koordnode.daemon' \
    || die "the staged virtualenv cannot import koordnode's dependencies"

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
        -e "s/@PYVER@/$pyver/g" "$SRC/packaging/deb/control.in" > "$deb_root/DEBIAN/control"
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
        --define "koordnode_python $target_python" \
        --define "_binary_payload w2.xzdio" \
        "$SRC/packaging/rpm/koordnode.spec" >&2
    rpm=$out/koordnode-${version}.${rpm_arch}.rpm
    mv "$rpm_top/RPMS/koordnode-${version}.${rpm_arch}.rpm" "$rpm"
    echo "$rpm"
fi
