#!/usr/bin/env bash
# The koordnode demo on a fresh Debian 12 machine: installs what it needs, runs a private
# containerd with koordnode in front of it, an LS and a BE pod competing for CPU, prints a live
# view, and removes everything it created. Run as root:  sudo ./scripts/demo.sh [--seconds N]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/demo.sh must run as root (it starts containerd and writes cgroups)" >&2
    exit 2
fi
bash scripts/install-deps.sh >/dev/null
exec python3 -m scripts.demo "$@"
