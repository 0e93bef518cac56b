"""Counters, gauges and histograms with labels, and the registry a scrape collects.

Thread-safe: the event loop, hook threads and the QoS tick's thread record while the metrics
server's threads collect. Each metric has one lock for its series (a child per label set);
a counter's or histogram's update is a read-modify-write, so it takes that lock, and a
collection copies the values under it. A gauge's ``set`` is one attribute store (atomic).
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

__all__ = ["Collector", "Counter", "Family", "Gauge", "Histogram", "LabelPairs", "Registry", "Sample"]

LabelPairs = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: LabelPairs
    value: float


@dataclass(slots=True)
class Family:
    """One metric as exposed: ``name`` is what its HELP and TYPE lines say (a counter's ends
    in ``_total``); its samples may carry suffixes (``_bucket``, ``_sum``, ``_count``)."""

    name: str
    type: str  # counter, gauge, histogram
    help: str
    samples: list[Sample] = field(default_factory=list)

    def add(self, labels: LabelPairs, value: float, name: str | None = None) -> None:
        self.samples.append(Sample(self.name if name is None else name, labels, float(value)))


class Collector(Protocol):
    def collect(self) -> Iterable[Family]: ...


class Registry:
    """The collectors one exposition shows, in the order they were registered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._collectors: list[Collector] = []

    def register(self, collector: Collector) -> None:
        with self._lock:
            if collector not in self._collectors:
                self._collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        with self._lock:
            if collector in self._collectors:
                self._collectors.remove(collector)

    def collect(self) -> Iterator[Family]:
        with self._lock:  # a snapshot: collecting may be slow, registering must not wait for it
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()


# --- series (one per label set) --------------------------------------------------------------


class _CounterSeries:
    __slots__ = ("_lock", "created", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter cannot go down")
        with self._lock:
            self.value += amount


class _GaugeSeries:
    __slots__ = ("function", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.function: Callable[[], float] | None = None

    def set(self, value: float) -> None:
        self.value = float(value)

    def get(self) -> float:
        return float(self.function()) if self.function is not None else self.value


class _HistogramSeries:
    __slots__ = ("_bounds", "_lock", "counts", "created", "sum")

    def __init__(self, lock: threading.Lock, bounds: tuple[float, ...]) -> None:
        self._lock = lock
        self._bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self._bounds, value)  # the first bucket with value <= le
        with self._lock:
            self.counts[index] += 1
            self.sum += value


S = TypeVar("S")


class _Metric(Generic[S]):
    """A metric's series by label values; without label names it has exactly one."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: Registry | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._series: dict[tuple[str, ...], S] = {}
        if not self.labelnames:
            self._series[()] = self._new_series()
        if registry is not None:
            registry.register(self)

    def _new_series(self) -> S:
        raise NotImplementedError

    def collect(self) -> Iterator[Family]:
        raise NotImplementedError

    def labels(self, *values: str) -> S:
        """The series of these label values (in label-name order), made at first use."""
        try:
            series = self._series.get(values)  # the common case: strings of a known series, no lock
        except TypeError:  # an unhashable value: its str() is the label
            series = None
        if series is not None:
            return series
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {len(values)}")
        key = tuple(str(v) for v in values)
        series = self._series.get(key)  # a dict read is atomic
        if series is None:
            with self._lock:
                series = self._series.setdefault(key, self._new_series())
        return series

    def remove(self, *values: str) -> None:
        """Drop the series of these label values (nothing if there is none)."""
        with self._lock:
            self._series.pop(tuple(str(v) for v in values), None)

    def _snapshot(self) -> list[tuple[LabelPairs, S]]:
        with self._lock:  # another thread may add a series meanwhile
            return [(tuple(zip(self.labelnames, key, strict=True)), series) for key, series in self._series.items()]


class Counter(_Metric[_CounterSeries]):
    """A value that only goes up. ``name`` may end in ``_total`` (the exposition adds it);
    each series also shows its creation time as ``<name>_created``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: Registry | None = None) -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry=registry)

    def _new_series(self) -> _CounterSeries:
        return _CounterSeries(self._lock)

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def values(self) -> dict[tuple[str, ...], float]:
        """{label values: count} now."""
        with self._lock:
            return {key: series.value for key, series in self._series.items()}

    def collect(self) -> Iterator[Family]:
        total = Family(self.name + "_total", "counter", self.documentation)
        created = Family(self.name + "_created", "gauge", self.documentation)
        with self._lock:
            rows = [(tuple(zip(self.labelnames, key, strict=True)), s.value, s.created) for key, s in self._series.items()]
        for labels, value, when in rows:
            total.add(labels, value)
            created.add(labels, when)
        yield total
        if created.samples:
            yield created


class Gauge(_Metric[_GaugeSeries]):
    """A value that is set (or read from a function at each collection)."""

    def _new_series(self) -> _GaugeSeries:
        return _GaugeSeries()

    def set(self, value: float) -> None:
        self.labels().set(value)

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value from ``function`` at each collection (an unlabelled gauge)."""
        self.labels().function = function

    def collect(self) -> Iterator[Family]:
        family = Family(self.name, "gauge", self.documentation)
        for labels, series in self._snapshot():
            family.add(labels, series.get())
        yield family


class Histogram(_Metric[_HistogramSeries]):
    """Observations counted into cumulative buckets (``le``), with their sum and count."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float], registry: Registry | None = None) -> None:
        bounds = sorted(float(b) for b in buckets)
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._bounds = tuple(bounds)
        self._le = tuple(_le(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new_series(self) -> _HistogramSeries:
        return _HistogramSeries(self._lock, self._bounds)

    def collect(self) -> Iterator[Family]:
        family = Family(self.name, "histogram", self.documentation)
        created = Family(self.name + "_created", "gauge", self.documentation)
        with self._lock:
            rows = [(tuple(zip(self.labelnames, key, strict=True)), list(s.counts), s.sum, s.created)
                    for key, s in self._series.items()]
        for labels, counts, total, when in rows:
            cumulative = 0
            for le, count in zip(self._le, counts, strict=True):
                cumulative += count
                family.add((*labels, ("le", le)), cumulative, self.name + "_bucket")
            family.add(labels, cumulative, self.name + "_count")
            family.add(labels, total, self.name + "_sum")
            created.add(labels, when)
        yield family
        if created.samples:
            yield created


def _le(bound: float) -> str:
    return "+Inf" if bound == math.inf else repr(bound)
