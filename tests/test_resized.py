"""The file keeping kubelet's resized container resources across a koordnode restart."""

from __future__ import annotations

import json
from pathlib import Path

from koordnode.policy.class_inputs import ContainerResources
from koordnode.hooks.resized import ResizedResources


def test_round_trip_drop_and_prune(tmp_path: Path) -> None:
    path = tmp_path / "run" / "kubelet-resized.json"
    store = ResizedResources(path)
    resized = ContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                 unified={"memory.low": "1048576"})
    store.put("c1", resized)
    store.put("c2", ContainerResources(cpu_shares=512))
    again = ResizedResources(path)  # a restarted koordnode
    assert again.get("c1") == resized and again.get("c2") == ContainerResources(cpu_shares=512)
    again.drop("c2")
    again.keep_only({"c2", "c3"})  # c1 is gone too
    assert json.loads(path.read_text()) == {}
    assert ResizedResources(path).get("c1") is None


def test_hostile_or_broken_files_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "kubelet-resized.json"
    for text in ("not json", "[1, 2]", json.dumps({"c1": {"cpu_shares": "many"}}),
                 json.dumps({"c1": {"unified": {"memory.min": 5}}}), json.dumps({"c1": {"cpu_shares": True}})):
        path.write_text(text)
        assert ResizedResources(path).get("c1") is None
    path.write_text(json.dumps({"ok": {"cpu_shares": 3}, "bad": {"cpuset_cpus": 7}}))
    store = ResizedResources(path)
    assert store.get("ok") == ContainerResources(cpu_shares=3) and store.get("bad") is None


def test_unwritable_location_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = ResizedResources(blocker / "sub" / "kubelet-resized.json")  # parent is a file
    store.put("c1", ContainerResources(cpu_shares=2))
    assert store.get("c1") == ContainerResources(cpu_shares=2)  # still known in memory
