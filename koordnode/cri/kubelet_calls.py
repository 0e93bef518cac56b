"""What the CRI calls a proxy relays say about how kubelet is set up.

kubelet takes pod-level CPU and memory figures (its summary API, so its eviction ranking and
metrics-server) either from CRI (``ListPodSandboxStats``; feature gate
``PodAndContainerStatsFromCRI``, beta and off by default in 1.37) or from cadvisor, which finds a
pod's cgroup by its last path part, ``pod<uid>``. A BE pod koordnode moved into its BE group has
two such cgroups: the real one in the group and the empty one kubelet keeps making in its
besteffort tier, and cadvisor hands kubelet whichever it listed last — often the empty one
(found with a real kubelet 1.37: pod-level memory 0 for a busy BE pod). Container-level figures
come from CRI either way and are right.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATS_GATE = "PodAndContainerStatsFromCRI"


def pod_stats_source(calls_by_method: Mapping[str, int]) -> str:
    """``"cri"``, ``"cadvisor"`` or ``"unknown"`` (no stats call seen yet)."""
    if calls_by_method.get("ListPodSandboxStats", 0) > 0:
        return "cri"
    if calls_by_method.get("ListContainerStats", 0) > 0:
        return "cadvisor"
    return "unknown"


def kubelet_view(calls_by_method: Mapping[str, int], be_group_in_use: bool) -> dict[str, Any]:
    """For ``koordnode status``: where kubelet's pod stats come from, and a note when that
    makes its figures for BE pods in koordnode's group wrong."""
    source = pod_stats_source(calls_by_method)
    view: dict[str, Any] = {"pod_stats_from": source}
    if source == "cadvisor" and be_group_in_use:
        view["note"] = (f"kubelet reads pod-level stats from cadvisor, which may report 0 CPU and memory for "
                        f"BE pods in koordnode's BE group (their kubelet-made pod cgroup is empty): its "
                        f"eviction ranking and metrics-server see them as idle; enable kubelet's feature gate "
                        f"{STATS_GATE} (or set [cgroup] be_idle_group = false)")
    return view
