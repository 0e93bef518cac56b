#!/usr/bin/env bash
# Builds the small kernel tests/test_core_sched_kernel.py boots: Debian's linux-source-6.12
# (fetched with `apt-get download`, the version apt's sources offer), `make allnoconfig` with
# the options of tests/vm/core-sched-kernel.config (CONFIG_SCHED_CORE, SMT, virtio, ext4, 9p,
# cgroup v2; everything built in, no modules, no initrd), each option checked in the result.
# Debian's own kernels are built without CONFIG_SCHED_CORE (docs/architecture.md).
# The bzImage lands in $KOORDNODE_TESTBED_CACHE (default /var/cache/koordnode-testbed)/
# kernel-<source version>-<hash of the options and this recipe>/, built in a scratch directory
# and moved into place only when complete (.complete), so a second run costs nothing.
#   ./scripts/core-sched-kernel.sh            build when missing; print the bzImage's path last
#   ./scripts/core-sched-kernel.sh --print    print the directory (it may not exist yet)
# Needs apt-get/dpkg-deb, gcc, make, flex, bison, bc, libelf-dev (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

RECIPE=1  # bump when the build below changes
SOURCE_PACKAGE=${KOORDNODE_KERNEL_SOURCE:-linux-source-6.12}
FRAGMENT=$(pwd)/tests/vm/core-sched-kernel.config
CACHE=${KOORDNODE_TESTBED_CACHE:-/var/cache/koordnode-testbed}

version=$(apt-cache policy "$SOURCE_PACKAGE" 2>/dev/null | sed -n 's/^  Candidate: //p')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    echo "core-sched-kernel: apt offers no $SOURCE_PACKAGE (apt-get update; bookworm has it in" \
         "bookworm-security, trixie in main)" >&2
    exit 2
fi
key=$( (echo "$RECIPE"; grep -v '^#' "$FRAGMENT") | sha256sum | cut -c1-12)
dest="$CACHE/kernel-${version}-${key}"

if [ "${1:-}" = "--print" ]; then
    echo "$dest"
    exit 0
fi
if [ -f "$dest/.complete" ]; then
    echo "$dest/bzImage"
    exit 0
fi

missing=""
for tool in apt-get dpkg-deb gcc make flex bison bc xz tar; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
[ -f /usr/include/libelf.h ] || missing="$missing libelf-dev"
if [ -n "$missing" ]; then
    echo "core-sched-kernel: missing:$missing (scripts/install-deps.sh)" >&2
    exit 2
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9   # one build at a time (parallel test runs, and scripts/k8s-bed.sh)
if [ -f "$dest/.complete" ]; then
    echo "$dest/bzImage"
    exit 0
fi

work=$(mktemp -d "$CACHE/.build-kernel-XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
echo "core-sched-kernel: building $SOURCE_PACKAGE $version (cached in $dest)" >&2
build() {
    set -euo pipefail
    cd "$work"
    # As root apt warns that its _apt user cannot write here; the download works regardless.
    apt-get download -q "$SOURCE_PACKAGE=$version"
    dpkg-deb --fsys-tarfile ./*.deb | tar -xO --wildcards './usr/src/linux-source-*.tar.xz' \
        | nice -n 19 tar -xJ
    rm -f ./*.deb
    cd linux-source-*/
    make -s ARCH=x86_64 allnoconfig KCONFIG_ALLCONFIG="$FRAGMENT"
    local option dropped=""
    while read -r option; do
        grep -qx "$option" .config || dropped="$dropped $option"
    done < <(grep '^CONFIG_' "$FRAGMENT")
    if [ -n "$dropped" ]; then
        echo "options missing from the resulting .config (a dependency not enabled?):$dropped"
        return 1
    fi
    nice -n 19 make -s ARCH=x86_64 -j"$(nproc)" bzImage
    mkdir -p "$work/out"
    cp arch/x86/boot/bzImage .config "$work/out/"
    make -s ARCH=x86_64 kernelrelease >"$work/out/kernelrelease"
}
# Not `if ! (build)`: errexit is off inside a condition, so a failed step would not stop it.
set +e
(build) >"$work/build.log" 2>&1
status=$?
set -e
if [ "$status" -ne 0 ]; then
    cp "$work/build.log" "$CACHE/kernel-build-failed.log"
    echo "core-sched-kernel: building the kernel failed; the end of its log ($CACHE/kernel-build-failed.log):" >&2
    tail -n 40 "$work/build.log" >&2
    exit 1
fi
seconds=$(( $(date +%s) - started ))
printf '{"source": "%s", "version": "%s", "release": "%s", "build_s": %d}\n' \
    "$SOURCE_PACKAGE" "$version" "$(cat "$work/out/kernelrelease")" "$seconds" >"$work/out/build.json"
rm -rf "$dest"
touch "$work/out/.complete"
mv "$work/out" "$dest"
echo "core-sched-kernel: $SOURCE_PACKAGE $version built in $seconds s" >&2
echo "$dest/bzImage"
