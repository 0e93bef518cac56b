#!/usr/bin/env python3
"""How much of NRI mode's pod start is containerd's own NRI path: kubelet -> containerd with NRI
off ("direct"), with a plugin that changes nothing ("noop", bench/nri_noop: containerd's Go stub
subscribed to koordnode's events, answering at once), and with koordnode as the plugin ("nri").

The three nodes run side by side and their pods start in turns (the first mode of each turn
rotating), so the machine's drift meets every mode alike. Needs Go to build the no-op plugin
(cached under the test bed's cache, keyed by its sources and the Go version).

    python3 -m bench.nri_floor [--pods 40] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.k8s_node import interleaved_start_latencies, nri_answer_ms

NOOP_SOURCE = Path(__file__).with_name("nri_noop")
MODES = ("direct", "noop", "nri")


def build_noop_plugin() -> Path:
    """The no-op plugin's binary, built once per source and Go version."""
    go = shutil.which("go")
    if go is None:
        raise SystemExit("bench.nri_floor needs Go to build bench/nri_noop")
    go_version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    digest = hashlib.sha256(go_version.encode())
    for name in ("main.go", "go.mod", "go.sum"):
        digest.update((NOOP_SOURCE / name).read_bytes())
    cache = Path(os.environ.get("KOORDNODE_TESTBED_CACHE") or "/var/cache/koordnode-testbed")
    binary = cache / f"nri-noop-{digest.hexdigest()[:12]}" / "nri-noop"
    if not binary.is_file():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        subprocess.run([go, "build", "-o", str(partial), "."], cwd=NOOP_SOURCE, check=True)
        partial.rename(binary)
    return binary


def summary(latencies: dict[str, list[float]]) -> dict[str, Any]:
    """p50 of each mode, its ratio to direct's p50, and the median of the per-turn ratios."""
    base = latencies["direct"]
    out = {}
    for mode, values in latencies.items():
        out[mode] = {"p50_s": round(statistics.median(values), 4),
                     "p50_vs_direct": round(statistics.median(values) / statistics.median(base), 3),
                     "median_turn_ratio": round(statistics.median(a / b for a, b in zip(values, base, strict=True)), 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=40, help="pods started per mode (40)")
    parser.add_argument("--json", help="also write the results there")
    args = parser.parse_args(argv)

    from tests.testbed.kube_bed import ControlPlane
    from tests.testbed.real_node import NODE_NAMES, real_node

    plugin = [str(build_noop_plugin()), "-socket"]
    workdir = Path(tempfile.mkdtemp(prefix="bench-nri-floor-"))
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "pods": args.pods}
    with ControlPlane(workdir / "control-plane", node_names=NODE_NAMES) as plane:
        with contextlib.ExitStack() as stack:
            nodes = {mode: stack.enter_context(real_node(
                workdir / mode, mode="direct" if mode == "direct" else "nri", control_plane=plane,
                node_name=NODE_NAMES[i], namespace=f"bench-floor-{mode}",
                feature_gates={"PodAndContainerStatsFromCRI": True},
                nri_plugin=plugin if mode == "noop" else None)) for i, mode in enumerate(MODES)}
            latencies = interleaved_start_latencies(nodes, args.pods)
            results["start"] = summary(latencies)
            results["koordnode_nri_answer_ms"] = nri_answer_ms(nodes["nri"])
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
