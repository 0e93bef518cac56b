"""The bounded history: fixed memory per series, series dropped with their pods."""

from __future__ import annotations

import sys
import tracemalloc

import pytest

from koordnode.qos.history import History, Ring


def test_ring_keeps_the_newest_samples_in_order():
    ring = Ring(3)
    assert ring.last() is None and ring.items() == [] and ring.summary() == {"samples": 0}
    for i in range(5):
        ring.append(float(i), i * 10.0)
    assert len(ring) == 3
    assert ring.items() == [(2.0, 20.0), (3.0, 30.0), (4.0, 40.0)]
    assert ring.last() == (4.0, 40.0)
    assert ring.values_since(3.0) == [30.0, 40.0]
    assert ring.summary() == {"samples": 3, "last": 40.0, "min": 20.0, "max": 40.0, "avg": 30.0}
    with pytest.raises(ValueError):
        Ring(0)


def test_ring_memory_does_not_grow_with_samples():
    ring = Ring(100)
    size = sys.getsizeof(ring._times) + sys.getsizeof(ring._values)
    for i in range(100_000):
        ring.append(float(i), float(i))
    assert sys.getsizeof(ring._times) + sys.getsizeof(ring._values) == size


def test_history_memory_is_flat_over_an_hour_of_ticks():
    history = History(300)
    names = [f"pod/{p}/cpu" for p in range(200)] + ["node/cpu_used_cpus", "node/memory_used_percent"]

    def run(ticks: int, start: int) -> None:
        for t in range(start, start + ticks):
            for name in names:
                history.append(name, float(t), 1.0)

    run(300, 0)  # fill every ring once
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    run(3600, 300)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 16 * 1024, f"history grew by {grown} bytes over 3600 ticks"


def test_series_are_dropped_with_their_pods():
    history = History(10)
    for sid in ("a", "b", "c"):
        history.append(f"pod/{sid}/cpu", 1.0, 1.0)
        history.append(f"pod/{sid}/memory", 1.0, 1.0)
    history.append("node/cpu_used_cpus", 1.0, 1.0)
    assert history.keep_only("pod/", {"b"}) == 4
    assert history.names() == ["node/cpu_used_cpus", "pod/b/cpu", "pod/b/memory"]
    assert history.drop_prefix("pod/b/") == 2
    history.drop(["node/cpu_used_cpus"])
    assert len(history) == 0


def test_resize_keeps_the_newest():
    history = History(5)
    for i in range(5):
        history.append("x", float(i), float(i))
    history.resize(2)
    assert history.get("x").items() == [(3.0, 3.0), (4.0, 4.0)]
    assert history.capacity == 2
    history.append("y", 0.0, 0.0)
    assert history.get("y").capacity == 2
    assert history.summaries(["x", "nope"]) == {"x": {"samples": 2, "last": 4.0, "min": 3.0, "max": 4.0, "avg": 3.5}}
