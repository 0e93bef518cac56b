"""Where a waking LS task runs when BE sits beside it in different kinds of cgroup, and what that
costs at the tail: the request/response and sleep/work probes of bench/ls_latency.py, without
containerd or koordnode, on plain cgroup v1 cpu groups shaped like kubelet's.

    python3 -m bench.wake_placement [--modes tier,lowgroup,idle] [--variants rr,probe]
                                    [--quota-cpus 1.7] [--rounds 8000] [--repeat 2] [--trace]

Layout (under /sys/fs/cgroup/cpu/koordnode-wake-bench): `kubepods` (shares 2048) holds
`burstable` (2048) with the server's and the client's pods (1024 each) and, by mode, BE's pod with
3 busy loops:
  tier      in a `besteffort` tier with cpu.shares 2 (kubelet's values)
  lowgroup  in a sibling group of the tiers with cpu.shares 2, not idle
  idle      in a sibling group of the tiers with cpu.idle = 1 (koordnode's idle BE group)
`--quota-cpus` puts a CFS quota on the group BE's pod is in (what cpu_suppress writes).

`--trace` records the scheduler's wake-ups (tracefs: sched_wakeup, sched_switch, the reschedule
IPI) during each rr run and reports, for the server's wake-ups, how many were placed on the
waker's own CPU ("local") or sent to the other CPU ("remote"), each kind's wait until it ran,
and how late the remote CPU took the reschedule IPI in the slowest wake-ups.
Needs root and cgroup v1's cpu controller (this project's host); holds /dev/cpu_dma_latency at 0
as bench/ls_latency.py does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.ls_latency import IdleLatencyHold, build_probe, parse_line

CPU_V1 = Path("/sys/fs/cgroup/cpu")
BENCH_ROOT = CPU_V1 / "koordnode-wake-bench"
TRACEFS = Path("/sys/kernel/tracing")
TRACE_EVENTS = ("sched/sched_switch", "sched/sched_wakeup", "irq_vectors/reschedule_entry")
MODES = ("tier", "lowgroup", "idle")
PORT = 7787
BE_LOOPS = 3

_EVENT = re.compile(r"^\s*.+?-\d+\s+\[(\d+)\]\s+\S+\s+([\d.]+):\s+(\w+):\s*(.*)$")


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for child in path.iterdir():
        if child.is_dir():
            _remove_tree(child)
    with contextlib.suppress(OSError):
        path.rmdir()


def make_layout(root: Path, mode: str, quota_us: int | None) -> dict[str, Path]:
    """The cgroups of one run: {"server", "client", "be"} -> directory."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    kubepods = root / "kubepods"
    groups = {"server": kubepods / "burstable" / "pod-server", "client": kubepods / "burstable" / "pod-client"}
    be_group = kubepods / ("besteffort" if mode == "tier" else "be-group")
    groups["be"] = be_group / "pod-be"
    for path, shares in ((root, None), (kubepods, "2048"), (kubepods / "burstable", "2048"),
                         (groups["server"], "1024"), (groups["client"], "1024"), (be_group, None), (groups["be"], None)):
        path.mkdir(exist_ok=True)
        if shares:
            _write(path / "cpu.shares", shares)
    if mode == "idle":
        _write(be_group / "cpu.idle", "1")
    else:
        _write(be_group / "cpu.shares", "2")
        _write(groups["be"] / "cpu.shares", "2")
    if quota_us:
        _write(be_group / "cpu.cfs_period_us", "100000")
        _write(be_group / "cpu.cfs_quota_us", str(quota_us))
    return groups


def _in(cgroup: Path):
    def enter() -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    return enter


@contextlib.contextmanager
def tracing(out: Path) -> Iterator[None]:
    """Scheduler events into ``out`` for the duration (tracefs, mounted if it is not)."""
    if not (TRACEFS / "trace").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
    _write(TRACEFS / "tracing_on", "0")
    _write(TRACEFS / "trace", "")
    _write(TRACEFS / "buffer_size_kb", "65536")
    for event in TRACE_EVENTS:
        _write(TRACEFS / "events" / event / "enable", "1")
    _write(TRACEFS / "tracing_on", "1")
    try:
        yield
    finally:
        _write(TRACEFS / "tracing_on", "0")
        out.write_text((TRACEFS / "trace").read_text())
        for event in TRACE_EVENTS:
            _write(TRACEFS / "events" / event / "enable", "0")


def wakeups(trace_text: str, pid: int) -> dict:
    """The wake-ups of ``pid`` in a tracefs text trace: per kind ("local": placed on the waker's
    CPU, "remote": on another one) the waits until it ran (µs), and for the remote ones the delay
    until the target CPU took the reschedule IPI (µs; None when it took none before the switch)."""
    waits: dict[str, list[float]] = {"local": [], "remote": []}
    ipi_delays: list[tuple[float, float | None]] = []
    pending: tuple[float, int, str] | None = None
    ipi_at: float | None = None
    for line in trace_text.splitlines():
        match = _EVENT.match(line)
        if not match:
            continue
        cpu, at, event, rest = int(match.group(1)), float(match.group(2)), match.group(3), match.group(4)
        if event == "sched_wakeup" and re.search(rf"\bpid={pid}\b", rest):
            target = int(re.search(r"target_cpu=(\d+)", rest).group(1))  # type: ignore[union-attr]
            pending = (at, target, "local" if target == cpu else "remote")
            ipi_at = None
        elif pending and event == "reschedule_entry" and cpu == pending[1] and ipi_at is None:
            ipi_at = at
        elif pending and event == "sched_switch" and re.search(rf"next_pid={pid}\b", rest):
            waited = (at - pending[0]) * 1e6
            waits[pending[2]].append(waited)
            if pending[2] == "remote":
                ipi_delays.append((waited, None if ipi_at is None else (ipi_at - pending[0]) * 1e6))
            pending = None
    return {"waits": waits, "ipi": ipi_delays}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def summarize_wakeups(found: dict) -> dict:
    out: dict[str, object] = {}
    for kind, waits in found["waits"].items():
        out[kind] = {"n": len(waits), "p99_us": _pct(waits, 0.99), "p999_us": _pct(waits, 0.999),
                     "max_us": max(waits) if waits else None}
    slowest = sorted(found["ipi"], key=lambda pair: pair[0], reverse=True)[:5]
    out["slowest_remote"] = [{"waited_us": round(w), "ipi_after_us": None if d is None else round(d)} for w, d in slowest]
    return out


def run_once(probe: Path, mode: str, variant: str, rounds: int, quota_us: int | None,
             trace_to: Path | None) -> dict:
    _remove_tree(BENCH_ROOT)
    BENCH_ROOT.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        groups = make_layout(BENCH_ROOT, mode, quota_us)
        server = None
        if variant == "rr":
            server = subprocess.Popen([str(probe), "server", str(PORT), "50"], preexec_fn=_in(groups["server"]))
            procs.append(server)
            time.sleep(0.3)
        for _ in range(BE_LOOPS):
            procs.append(subprocess.Popen([str(probe), "spin"], preexec_fn=_in(groups["be"])))
        time.sleep(1.0)
        if variant == "rr":
            argv, where = [str(probe), "client", "127.0.0.1", str(PORT), str(rounds), "1000"], groups["client"]
        else:
            argv, where = [str(probe), "probe", str(rounds), "1000", "100"], groups["server"]
        with tracing(trace_to) if trace_to and server else contextlib.nullcontext():
            done = subprocess.run(argv, preexec_fn=_in(where), capture_output=True, text=True, check=True)
        result = parse_line(done.stdout)
        if trace_to and server:
            result["wakeups"] = summarize_wakeups(wakeups(trace_to.read_text(), server.pid))
        return result
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        time.sleep(0.2)
        _remove_tree(BENCH_ROOT)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} µs"


def table(rows: list[dict]) -> str:
    lines = ["| mode | variant | BE quota | p99 | p99.9 | server wake-ups local / remote | local wait p99.9 / max | remote wait p99.9 / max | slowest remote: waited (IPI taken after) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        w = row.get("wakeups")
        if w:
            placed = f"{w['local']['n']} / {w['remote']['n']}"
            local = f"{_fmt(w['local']['p999_us'])} / {_fmt(w['local']['max_us'])}"
            remote = f"{_fmt(w['remote']['p999_us'])} / {_fmt(w['remote']['max_us'])}"
            slow = ", ".join(f"{s['waited_us']:,} ({'-' if s['ipi_after_us'] is None else format(s['ipi_after_us'], ',')})"
                             for s in w["slowest_remote"][:3]) or "-"
        else:
            placed = local = remote = slow = "-"
        quota = "-" if not row["quota_cpus"] else f"{row['quota_cpus']} CPUs"
        lines.append(f"| {row['mode']} | {row['variant']} | {quota} | {_fmt(row['p99_us'])} | {_fmt(row['p999_us'])} "
                     f"| {placed} | {local} | {remote} | {slow} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--variants", default="rr,probe")
    parser.add_argument("--quota-cpus", type=float, default=0.0, help="CFS quota on BE's group, in CPUs (0: none)")
    parser.add_argument("--rounds", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--trace", action="store_true", help="trace the rr server's wake-ups (tracefs)")
    args = parser.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [m for m in args.modes if m not in MODES] + [v for v in args.variants if v not in ("rr", "probe")]
    if bad:
        parser.error(f"unknown mode or variant: {', '.join(bad)}")
    if args.quota_cpus < 0:
        parser.error("--quota-cpus must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0 or not (CPU_V1 / "cpu.shares").exists():
        sys.exit("bench.wake_placement needs root and cgroup v1's cpu controller at /sys/fs/cgroup/cpu")
    quota_us = int(args.quota_cpus * 100_000) or None
    rows = []
    with tempfile.TemporaryDirectory() as tmp, IdleLatencyHold():
        probe = build_probe(Path(tmp))
        load = os.getloadavg()[0]
        for _ in range(args.repeat):
            for variant in args.variants:
                for mode in args.modes:
                    trace_to = Path(tmp) / "trace.txt" if args.trace and variant == "rr" else None
                    result = run_once(probe, mode, variant, args.rounds, quota_us, trace_to)
                    rows.append({"mode": mode, "variant": variant, "quota_cpus": args.quota_cpus, **result})
                    print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"{os.cpu_count()} CPUs, kernel {os.uname().release}, {args.rounds} rounds, BE = {BE_LOOPS} busy loops; "
          f"load average before {load:.2f}, after {os.getloadavg()[0]:.2f}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
