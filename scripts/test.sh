#!/usr/bin/env bash
# Everything needed to run koordnode's test suite on a fresh Debian 12 machine, then the suite.
# Run as root: the end-to-end tests start a private containerd and touch real cgroups.
#   ./scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh must run as root (end-to-end tests start containerd and write cgroups)" >&2
    exit 2
fi

bash scripts/install-deps.sh
# The real-node test bed (kubelet, kube-apiserver, etcd, containerd 2.x, critest) from Go modules,
# then helm (the chart's tests), Koordinator's koord-manager, then the core-scheduling test kernel; cached in /var/cache/koordnode-testbed by version, so only
# a machine's first run builds (~17 min on a quiet 2-core machine). Built in the background (nice)
# while the tests that need neither run; those that need them run last and wait for it
# (tests/testbed/background_build.py, tests/conftest.py).
KOORDNODE_BED_BUILD_DIR=$(mktemp -d /tmp/koordnode-bed-build-XXXXXX)
export KOORDNODE_BED_BUILD_DIR
# build_step NAME COMMAND...: runs COMMAND, then writes its exit code to $KOORDNODE_BED_BUILD_DIR/NAME.rc
# (renamed into place, so a reader never sees half a file).
build_step() {
    local rc=0 name=$1
    shift
    nice -n 10 "$@" || rc=$?
    echo "$rc" > "$KOORDNODE_BED_BUILD_DIR/$name.rc.tmp" && mv "$KOORDNODE_BED_BUILD_DIR/$name.rc.tmp" "$KOORDNODE_BED_BUILD_DIR/$name.rc"
}
(
    build_step k8s bash scripts/k8s-bed.sh
    build_step helm bash scripts/k8s-bed.sh helm
    build_step koord bash scripts/k8s-bed.sh koordinator
    build_step kernel bash scripts/core-sched-kernel.sh
) > "$KOORDNODE_BED_BUILD_DIR/build.log" 2>&1 < /dev/null &
# The VM lane's image (debootstrap: mostly the network and the disk) beside the Go builds; the lane
# runs last and would otherwise build it then, on the run's critical path.
build_step vmimage python3 tests/vm/lane.py --prepare > "$KOORDNODE_BED_BUILD_DIR/vmimage.log" 2>&1 < /dev/null &

# -p no:cacheprovider: CI runs from a clean clone; nothing to cache between runs.
# --durations: the slowest tests in every CI log, to keep the 90-minute budget in sight.
exec python3 -m pytest -p no:cacheprovider -ra --durations=30 "$@"
