"""kubelet's pod-stats source, read from the CRI calls the proxy relayed (koordnode/cri/kubelet_calls.py)."""

from koordnode.cri.kubelet_calls import STATS_GATE, kubelet_view, pod_stats_source


def test_pod_sandbox_stats_calls_mean_kubelet_reads_pod_stats_from_cri():
    assert pod_stats_source({"ListPodSandboxStats": 3, "ListContainerStats": 3}) == "cri"


def test_container_stats_alone_mean_cadvisor_and_no_call_means_unknown():
    assert pod_stats_source({"ListContainerStats": 1, "Version": 9}) == "cadvisor"
    assert pod_stats_source({"Version": 9}) == "unknown"


def test_a_note_names_the_gate_only_when_cadvisor_meets_the_be_group():
    note = kubelet_view({"ListContainerStats": 2}, be_group_in_use=True)["note"]
    assert STATS_GATE in note and "be_idle_group" in note
    assert "note" not in kubelet_view({"ListContainerStats": 2}, be_group_in_use=False)
    assert "note" not in kubelet_view({"ListPodSandboxStats": 1, "ListContainerStats": 2}, be_group_in_use=True)
