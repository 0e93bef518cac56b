"""`koordnode top`: one node live, refreshed about once a second.

What koordnode knows comes from its admin socket (the same answer as `koordnode status`): the
pods, their class and the cgroup koordnode keeps them in, the QoS manager's node figures and the
CPUs each pod used over its last tick, every strategy's decision with its inputs and reason, the
BE group, overwrites restored and hook failures. What only the kernel counts between two
refreshes (throttled time, CPU pressure stall time, memory use and memory.min/low/high) is read
from those same cgroups, where koordnode says the pods are, never from paths worked out anew.

The screen is drawn with curses from the standard library: no dependency to bundle into the
packages (`packaging/build.sh` takes only pure-Python or abi3 wheels, and rich or textual would
add four to six of them for one screen), present in every CPython koordnode runs on, and the
terminal handling (resize, raw keys, restoring the terminal on exit) is curses' own. `--once`
prints the same screen as plain text, for scripts and bug reports.
"""

from __future__ import annotations

import collections
import curses
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from koordnode import __version__
from koordnode.admin.client import fetch_status
from koordnode.model.kernel import is_lowest_cpu_weight
from koordnode.qos.collect import Collector

SORT_KEYS = ("cpu", "memory", "throttled", "pressure", "name", "class")
CLASSES = ("all", "SYSTEM", "LSE", "LSR", "LS", "BE")
RECENT_DECISIONS = 8
HELP = "keys: s sort, c class, / filter, r refresh, q quit"
_MIB = 1024 * 1024
_UNLIMITED_V1 = 1 << 62


@dataclasses.dataclass
class PodRow:
    key: str  # namespace/name
    qos_class: str
    cgroup: str | None
    cpu: float | None = None  # CPUs
    throttled: float | None = None  # seconds throttled per second
    pressure: float | None = None  # % of time some task waited for a CPU
    memory: int | None = None  # bytes
    memory_min: str = "-"
    memory_low: str = "-"
    memory_high: str = "-"
    memory_limit: str = "-"


@dataclasses.dataclass
class Counters:
    """One cgroup's running counters, kept from one refresh to the next for rates."""

    at: float
    usage_ns: int | None
    throttled_ns: int | None
    stall_us: int | None


@dataclasses.dataclass
class View:
    """What the keys change: sort order and filters."""

    sort: str = "cpu"
    qos_class: str = "all"
    text: str = ""

    def next_sort(self) -> None:
        self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]

    def next_class(self) -> None:
        self.qos_class = CLASSES[(CLASSES.index(self.qos_class) + 1) % len(CLASSES)]


@dataclasses.dataclass
class Screen:
    """One refresh: the status as the admin socket gave it and the pods' measured rows."""

    status: dict[str, Any]
    pods: list[PodRow]
    be_group: dict[str, Any]
    decisions: list[str]
    taken_at: float


class Sampler:
    """Asks koordnode, reads the counters of the cgroups it names, keeps the last decisions."""

    def __init__(self, admin_socket: str, collector: Collector,
                 fetch: Callable[[str], dict[str, Any]] = fetch_status,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.admin_socket = admin_socket
        self.collector = collector
        self._fetch = fetch
        self._clock = clock
        self._counters: dict[str, Counters] = {}
        self._seen: dict[str, tuple[Any, ...]] = {}
        self.decisions: collections.deque[str] = collections.deque(maxlen=RECENT_DECISIONS)

    def sample(self) -> Screen:
        status = self._fetch(self.admin_socket)
        manager = status.get("qos_manager") or {}
        daemon_cpu: Mapping[str, Any] = manager.get("pod_cpu") or {}
        rows = []
        live: set[str] = set()
        for pod in status.get("pods", []):
            cgroup = pod.get("cgroup")
            row = PodRow(key=f"{pod.get('namespace')}/{pod.get('name')}", qos_class=pod.get("qos_class") or "-",
                         cgroup=cgroup)
            if cgroup:
                live.add(cgroup)
                self._measure(row, cgroup)
            if row.cpu is None and daemon_cpu.get(pod.get("sandbox_id")) is not None:
                # Not measured yet (first refresh): what the QoS manager saw at its last tick.
                row.cpu = float(daemon_cpu[pod["sandbox_id"]])
            rows.append(row)
        be_tier = manager.get("be_tier") or ""
        be_group = self._be_group(be_tier) if be_tier else {}
        if be_tier:
            live.add(be_tier)
        for gone in set(self._counters) - live:
            del self._counters[gone]
        self._note_decisions(manager.get("strategies") or {})
        self.collector.sweep()  # every file still wanted was read just now: release the others
        return Screen(status, rows, be_group, list(self.decisions), time.time())

    def _rates(self, cgroup: str) -> tuple[float | None, float | None, float | None]:
        """CPUs used, throttled seconds per second and % stalled since the last refresh."""
        stat = self.collector.cpu_stat(cgroup)
        pressure = self.collector.pressure(cgroup, "cpu")
        now = Counters(self._clock(), self.collector.cpu_usage_ns(cgroup),
                       stat.throttled_ns if stat is not None else None,
                       pressure.some.total_us if pressure is not None else None)
        before = self._counters.get(cgroup)
        self._counters[cgroup] = now
        if before is None or now.at - before.at < 0.05:
            return None, None, None
        span = now.at - before.at

        def per_second(after: int | None, prior: int | None, unit: float) -> float | None:
            if after is None or prior is None or after < prior:
                return None
            return (after - prior) / unit / span

        stalled = per_second(now.stall_us, before.stall_us, 1e6)
        return (per_second(now.usage_ns, before.usage_ns, 1e9), per_second(now.throttled_ns, before.throttled_ns, 1e9),
                None if stalled is None else min(100.0, 100.0 * stalled))

    def _measure(self, row: PodRow, cgroup: str) -> None:
        row.cpu, row.throttled, row.pressure = self._rates(cgroup)
        row.memory = self.collector.memory_usage(cgroup)
        for name in ("min", "low", "high"):
            text = self.collector.cgroup_file_text("memory", cgroup, f"memory.{name}")
            setattr(row, f"memory_{name}", _bytes_text(text))
        limit = "memory.max" if self.collector.is_v2 else "memory.limit_in_bytes"
        row.memory_limit = _bytes_text(self.collector.cgroup_file_text("memory", cgroup, limit))

    def _be_group(self, cgroup: str) -> dict[str, Any]:
        c = self.collector
        idle = c.cgroup_file_text("cpu", cgroup, "cpu.idle")
        weight = c.cgroup_file_text("cpu", cgroup, "cpu.weight" if c.is_v2 else "cpu.shares")
        quota = c.cfs_quota(cgroup)
        cpu, throttled, _ = self._rates(cgroup)
        return {
            "cgroup": cgroup,
            "idle": None if idle is None else idle.strip() == "1",
            "lowest_weight": is_lowest_cpu_weight(weight, c.is_v2),
            "weight": None if weight is None else weight.strip(),
            "quota_us": quota[0] if quota is not None else None,
            "period_us": quota[1] if quota is not None else None,
            "cpu": cpu,
            "throttled": throttled,
        }

    def _note_decisions(self, strategies: Mapping[str, Any]) -> None:
        """A strategy's decision is kept when it changes (the same one comes every tick), and
        each value it writes."""
        fresh: list[tuple[float, str]] = []
        for name, strategy in sorted(strategies.items()):
            explanation = strategy.get("decision") or {}
            if isinstance(explanation, dict) and explanation.get("decision"):
                decision, reason = explanation.get("decision"), explanation.get("reason")
                if self._seen.get(name) != (decision, reason):
                    self._seen[name] = (decision, reason)
                    fresh.append((_at(explanation), f"{_clock_text(explanation.get('at'))} {name}: {decision}"
                                  + (f" ({reason})" if reason else "")))
            write = strategy.get("last_write") or {}
            if write:
                key = f"{name}/write"
                written = (write.get("at"), write.get("resource"), write.get("value"))
                if self._seen.get(key) != written:
                    self._seen[key] = written
                    where = write.get("cgroup") or write.get("sysctl") or ""
                    fresh.append((_at(write), f"{_clock_text(write.get('at'))} {name}: wrote {write.get('resource', '')}"
                                  f"={write.get('value')} (was {write.get('old')}) on {where} [{write.get('status')}]"))
        for _, text in sorted(fresh, key=lambda item: item[0]):
            self.decisions.appendleft(text)


# ------------------------------------------------------------------ the screen as text


def render(screen: Screen, view: View, width: int = 132) -> list[str]:
    """The whole screen as lines (at most `width` characters each), for curses and --once."""
    st = screen.status
    manager = st.get("qos_manager") or {}
    node = manager.get("node") or {}
    lines = [
        f"koordnode {st.get('version', __version__)} top  up {st.get('uptime_s', '?')} s  "
        f"mode {st.get('mode', '?')}  backend {st.get('backend_health', '?')}  "
        f"{time.strftime('%H:%M:%S', time.localtime(screen.taken_at))}",
    ]
    if (st.get("dry_run") or {}).get("enabled"):
        lines.append("DRY RUN: koordnode decides and reports, writes nothing")

    def last(name: str) -> float | None:
        value = (node.get(name) or {}).get("last")
        return float(value) if isinstance(value, (int, float)) else None

    strategies = manager.get("strategies") or {}
    suppress = strategies.get("cpu_suppress") or {}
    inputs = ((suppress.get("decision") or {}).get("inputs") or {})
    ncpu = inputs.get("node_cpus", os.cpu_count())
    lines.append(
        f"node      last tick: CPUs used {_num(last('node/cpu_used_cpus'))} of {ncpu}: LS {_num(last('node/ls_used_cpus'))}  "
        f"BE {_num(last('node/be_used_cpus'))}  system {_num(last('node/system_used_cpus'))}   "
        f"PSI cpu some {_pct(last('node/cpu_some_avg10'))}  LS CPU pressure {_pct(last('node/ls_cpu_pressure_percent'))}  "
        f"memory used {_pct(last('node/memory_used_percent'))}")
    lines.extend(_budget_lines(suppress, inputs))
    lines.append(_be_group_line(screen.be_group, screen.pods))
    lines.append("")
    lines.append(f"{'CLASS':<8}{'PODS':>5}{'CPU':>8}{'THROTTLED':>11}{'PRESSURE':>10}{'MEMORY':>11}")
    for qos_class in CLASSES[1:]:
        members = [p for p in screen.pods if p.qos_class == qos_class]
        if members:
            lines.append(
                f"{qos_class:<8}{len(members):>5}{_num(_sum(p.cpu for p in members)):>8}"
                f"{_num(_sum(p.throttled for p in members)):>11}{_pct(_max(p.pressure for p in members)):>10}"
                f"{_mib(_sum(p.memory for p in members)):>11}")
    lines.append("")
    shown = select_pods(screen.pods, view)
    lines.append(f"PODS {len(shown)} of {len(screen.pods)}   sort: {view.sort}   class: {view.qos_class}   "
                 f"filter: {view.text or '-'}   ({HELP})")
    lines.append(f"{'NAMESPACE/POD':<40}{'CLASS':<7}{'CPU':>7}{'THR s/s':>9}{'PSI %':>8}{'MEMORY':>10}"
                 f"{'MIN':>10}{'LOW':>10}{'HIGH':>10}{'LIMIT':>10}")
    for p in shown:
        lines.append(f"{p.key[:39]:<40}{p.qos_class:<7}{_num(p.cpu):>7}{_num(p.throttled):>9}"
                     f"{_pct(p.pressure):>8}{_mib(p.memory):>10}{p.memory_min:>10}{p.memory_low:>10}"
                     f"{p.memory_high:>10}{p.memory_limit:>10}")
    lines.append("")
    lines.append("recent decisions (newest first)")
    lines.extend(f"  {d}" for d in screen.decisions or ["(none yet)"])
    lines.append("")
    lines.extend(_events_lines(st, strategies))
    return [line[:width] for line in lines]


def select_pods(pods: Iterable[PodRow], view: View) -> list[PodRow]:
    chosen = [p for p in pods if (view.qos_class == "all" or p.qos_class == view.qos_class)
              and view.text.lower() in p.key.lower()]
    if view.sort == "name":
        return sorted(chosen, key=lambda p: p.key)
    if view.sort == "class":
        return sorted(chosen, key=lambda p: (CLASSES.index(p.qos_class) if p.qos_class in CLASSES else 99, p.key))
    attribute = {"cpu": "cpu", "memory": "memory", "throttled": "throttled", "pressure": "pressure"}[view.sort]
    return sorted(chosen, key=lambda p: (-(getattr(p, attribute) or 0), p.key))


def _budget_lines(suppress: Mapping[str, Any], inputs: Mapping[str, Any]) -> list[str]:
    explanation = suppress.get("decision") or {}
    if not explanation:
        state = "off" if suppress and not suppress.get("enabled", True) else "no decision yet"
        return [f"BE budget {state} (cpu_suppress)"]
    lines = [f"BE budget {_num(inputs.get('be_budget_cpus'))} CPUs  decision: {explanation.get('decision', '?')}",
             f"          why: {explanation.get('reason', '')}"]
    terms = ("node_cpus", "threshold_percent", "ls_used_cpus", "system_used_cpus", "reserved_cpus",
             "be_used_cpus", "ls_pressure_percent", "pressure_ratio", "current_quota_us", "target_quota_us")
    lines.append("          inputs: " + "  ".join(f"{t}={_short(inputs[t])}" for t in terms if t in inputs))
    return lines


def _be_group_line(group: Mapping[str, Any], pods: list[PodRow]) -> str:
    if not group:
        return "BE group  (no QoS manager: not known)"
    states = []
    if group.get("idle"):
        states.append("idle")
    if group.get("lowest_weight"):
        states.append("lowest weight")
    quota, period = group.get("quota_us"), group.get("period_us")
    if quota is not None and quota >= 0 and period:
        states.append(f"quota {quota}/{period} us = {quota / period:.2f} CPUs")
    else:
        states.append("no quota")
    members = sum(1 for p in pods if p.cgroup and p.cgroup.startswith(group["cgroup"].rstrip("/") + "/"))
    return (f"BE group  {group['cgroup']}: {', '.join(states)}; {members} pod(s) in it, "
            f"using {_num(group.get('cpu'))} CPUs, throttled {_num(group.get('throttled'))} s/s")


def _events_lines(st: Mapping[str, Any], strategies: Mapping[str, Any]) -> list[str]:
    overwrites = (st.get("qos") or {}).get("overwrites") or {}
    last = overwrites.get("last") or {}
    restored = ", ".join(
        f"{resource} {n}" + (f" (last: {last[resource].get('path')} found {last[resource].get('found')!r})"
                             if isinstance(last.get(resource), dict) else "")
        for resource, n in sorted((overwrites.get("counts") or {}).items())) or "none"
    failures = (st.get("proxy") or {}).get("hook_failures") or {}
    timeouts = {k: n for k, n in failures.items() if k.endswith(".timeout")}
    errors = {k: n for k, n in failures.items() if not k.endswith(".timeout")}
    evictions = ((strategies.get("be_evict") or {}).get("evictions") or {}).get("total", 0)
    return [
        f"overwrites restored: {restored}",
        "hook timeouts: " + (", ".join(f"{k} {n}" for k, n in sorted(timeouts.items())) or "none")
        + "   hook errors: " + (", ".join(f"{k} {n}" for k, n in sorted(errors.items())) or "none")
        + f"   evictions: {evictions}",
    ]


def _sum(values: Iterable[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _max(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _num(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "-"


def _pct(value: Any) -> str:
    return f"{value:.1f}%" if isinstance(value, (int, float)) else "-"


def _mib(value: Any) -> str:
    return f"{value / _MIB:.1f}Mi" if isinstance(value, (int, float)) else "-"


def _short(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _bytes_text(text: str | None) -> str:
    if text is None:
        return "-"
    text = text.strip()
    if text.isdigit() and int(text) >= _UNLIMITED_V1:
        return "max"  # cgroup v1 writes "no limit" as the largest page-aligned number
    return _mib(int(text)) if text.isdigit() else text


def _at(entry: Mapping[str, Any]) -> float:
    at = entry.get("at")
    return float(at) if isinstance(at, (int, float)) else 0.0


def _clock_text(at: Any) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if isinstance(at, (int, float)) else "--:--:--"


# ------------------------------------------------------------------ the command


def top_command(admin_socket: str, cgroup_root: str, procfs_root: str, *, once: bool,
                interval_s: float = 1.0, view: View | None = None) -> int:
    view = view or View()
    sampler = Sampler(admin_socket, Collector(procfs_root, cgroup_root))
    try:
        if once:
            sampler.sample()  # the first sample only starts the counters
            time.sleep(interval_s)
            print("\n".join(render(sampler.sample(), view, width=10_000)))
            return 0
        return curses.wrapper(_live, sampler, view, interval_s)
    except FileNotFoundError:
        print(f"koordnode is not running (no admin socket at {admin_socket})", file=sys.stderr)
    except PermissionError:
        print(f"permission denied on {admin_socket}: `koordnode top` must run as root", file=sys.stderr)
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"cannot get status from {admin_socket}: {exc}", file=sys.stderr)
    finally:
        sampler.collector.close()
    return 1


def _live(window: Any, sampler: Sampler, view: View, interval_s: float) -> int:
    curses.curs_set(0)
    window.timeout(100)  # getch waits at most 0.1 s: keys are handled at once, refreshes keep time
    screen = sampler.sample()
    next_refresh = time.monotonic() + interval_s
    typing: str | None = None  # the filter being typed after '/'
    problem: str | None = None  # why the last refresh failed (the daemon restarting, ...)
    while True:
        _draw(window, screen, view, typing, problem)
        key = window.getch()
        if typing is not None:
            if key in (10, 13, curses.KEY_ENTER):
                view.text, typing = typing, None
            elif key == 27:  # Esc: leave the filter as it was
                typing = None
            elif key in (curses.KEY_BACKSPACE, 127, 8):
                typing = typing[:-1]
            elif 32 <= key < 127:
                typing += chr(key)
        elif key in (ord("q"), ord("Q")):
            return 0
        elif key == ord("s"):
            view.next_sort()
        elif key == ord("c"):
            view.next_class()
        elif key == ord("/"):
            typing = ""
        elif key == ord("r"):
            next_refresh = 0.0
        if time.monotonic() >= next_refresh:
            try:
                screen, problem = sampler.sample(), None
            except (OSError, ValueError, RuntimeError) as exc:
                # Keep the last screen and say why it is old; the next refresh tries again.
                problem = f"cannot refresh from {sampler.admin_socket}: {exc!r}; showing {_clock_text(screen.taken_at)}"
            next_refresh = time.monotonic() + interval_s


def _draw(window: Any, screen: Screen, view: View, typing: str | None, problem: str | None = None) -> None:
    height, width = window.getmaxyx()
    lines = render(screen, view, width=max(width - 1, 1))
    if problem:
        lines.insert(1, problem[: max(width - 1, 1)])
    window.erase()
    for y, line in enumerate(lines[: max(height - 1, 0)]):
        bold = y == 0 or line.startswith(("CLASS", "NAMESPACE/POD", "PODS ", "recent decisions"))
        attribute = curses.A_REVERSE if problem and y == 1 else curses.A_BOLD if bold else curses.A_NORMAL
        window.addstr(y, 0, line, attribute)
    if typing is not None and height > 0:
        window.addstr(height - 1, 0, f"filter pods: {typing}"[: max(width - 1, 1)], curses.A_REVERSE)
    window.refresh()
