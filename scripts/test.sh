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
# The real-node test bed (kubelet, kube-apiserver, etcd, containerd 2.x, critest) from Go modules;
# cached in /var/cache/koordnode-testbed by version, so only the first run on a machine builds.
bash scripts/k8s-bed.sh

# -p no:cacheprovider: CI runs from a clean clone; nothing to cache between runs.
# --durations: the slowest tests in every CI log, to keep the 90-minute budget in sight.
exec python3 -m pytest -p no:cacheprovider -ra --durations=30 "$@"
