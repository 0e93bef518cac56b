#!/usr/bin/env bash
# Installs everything koordnode's tests and demo need on a fresh Debian 12 machine. Idempotent.
# Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

APT_PACKAGES=(
    containerd runc containernetworking-plugins busybox-static  # the real runtime of the test bed
    iproute2 iptables nftables                                  # network namespaces, tc, masquerade, classification
    rpm python3-pip dpkg-dev                                    # packaging/build.sh and its tests (dpkg-checkbuilddeps)
    systemd                                                     # systemd-analyze verify of the unit
    qemu-system-x86 debootstrap e2fsprogs                       # the VM lane (tests/vm): Debian 13 guest
    gcc libc6-dev                                               # bench/ls_latency.py builds its static probe
    make flex bison bc xz-utils libelf-dev                      # scripts/core-sched-kernel.sh: the CONFIG_SCHED_CORE test kernel
    openssl                                                     # the real-node bed: the API server's service-account key
    tmux                                                        # tests/test_top.py drives `koordnode top` in a real terminal
    prometheus                                                  # promtool: tests/test_monitoring.py checks the rules and /metrics
)
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    APT_PACKAGES+=(nodejs npm)                                  # the foreign (grpc-js) CRI client
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    # Keep maintainer scripts from starting services (the packaged containerd) while installing:
    # exit code 101 from policy-rc.d tells invoke-rc.d "action forbidden". Only our own guard is removed.
    guard=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        guard=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\n# temporary guard from koordnode scripts/install-deps.sh\nexit 101\n' >"$guard"
        chmod 0755 "$guard"
        trap 'rm -f "$guard"' EXIT
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
    if [ -n "$guard" ]; then rm -f "$guard"; trap - EXIT; fi
fi

# Tests start private containerd instances; the packaged system service must not run beside them.
# (Harmless no-op when systemd is not PID 1.)
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now containerd.service >/dev/null 2>&1 || true
    # Only promtool is wanted from the prometheus package, not a Prometheus server.
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi

# A Debian-managed python3 refuses pip installs without this; other Pythons ignore it.
PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --disable-pip-version-check -e '.[test]'

npm ci --prefix tests/js_client --ignore-scripts --no-audit --no-fund --loglevel=error
