"""Statistics files in the kernel's exact formats, for tests and benchmarks.

`make_procfs(root)` lays out what the collectors read from procfs (stat, meminfo,
pressure/*) plus the vm sysctls; the format_* functions render file contents as the kernel
prints them, so the parsers are exercised on the real spelling.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# user nice system idle iowait irq softirq steal guest guest_nice
CpuLine = Sequence[int]


def format_proc_stat(per_cpu: Sequence[CpuLine]) -> str:
    rows = [list(line) + [0] * (10 - len(line)) for line in per_cpu]
    total = [sum(column) for column in zip(*rows, strict=True)] if rows else [0] * 10
    lines = ["cpu  " + " ".join(str(v) for v in total)]
    lines += [f"cpu{i} " + " ".join(str(v) for v in row) for i, row in enumerate(rows)]
    lines += [
        "intr 1234567 0 9 0 0 0 0 0 0 0 0 0 0 0 0 0 0",
        "ctxt 7654321",
        "btime 1700000000",
        "processes 4242",
        "procs_running 2",
        "procs_blocked 0",
        "softirq 99999 0 1 2 3 4 5 6 7 8 9",
    ]
    return "\n".join(lines) + "\n"


def format_meminfo(total_kb: int, available_kb: int, free_kb: int | None = None) -> str:
    free_kb = available_kb // 2 if free_kb is None else free_kb
    rows = [
        ("MemTotal", total_kb), ("MemFree", free_kb), ("MemAvailable", available_kb),
        ("Buffers", 1024), ("Cached", 204800), ("SwapCached", 0), ("Active", 409600),
        ("Inactive", 307200), ("SwapTotal", 0), ("SwapFree", 0), ("Dirty", 12),
        ("AnonPages", 102400), ("Shmem", 2048), ("Slab", 40960),
    ]
    text = "".join(f"{name + ':':<16}{value:>8} kB\n" for name, value in rows)
    return text + "HugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n"


def format_pressure(some_total_us: int = 0, full_total_us: int | None = 0,
                    some_avg: tuple[float, float, float] = (0.0, 0.0, 0.0),
                    full_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    """A pressure file; full_total_us=None leaves out the `full` line (cpu before 5.13)."""
    text = "some avg10={:.2f} avg60={:.2f} avg300={:.2f} total={}\n".format(*some_avg, some_total_us)
    if full_total_us is not None:
        text += "full avg10={:.2f} avg60={:.2f} avg300={:.2f} total={}\n".format(*full_avg, full_total_us)
    return text


def make_procfs(tmp_path: Path | str, *, cpus: int = 4, total_kb: int = 16 * 1024 * 1024,
                available_kb: int = 12 * 1024 * 1024) -> Path:
    root = Path(tmp_path) / "proc"
    (root / "pressure").mkdir(parents=True, exist_ok=True)
    (root / "sys" / "vm").mkdir(parents=True, exist_ok=True)
    write_proc_stat(root, [[0, 0, 0, 0, 0]] * cpus)
    write_meminfo(root, total_kb, available_kb)
    for resource in ("cpu", "memory", "io"):
        write_node_pressure(root, resource, 0)
    (root / "sys" / "vm" / "min_free_kbytes").write_text("67584\n")
    (root / "sys" / "vm" / "watermark_scale_factor").write_text("10\n")
    return root


def write_proc_stat(root: Path, per_cpu: Sequence[CpuLine]) -> None:
    (Path(root) / "stat").write_text(format_proc_stat(per_cpu))


def write_meminfo(root: Path, total_kb: int, available_kb: int) -> None:
    (Path(root) / "meminfo").write_text(format_meminfo(total_kb, available_kb))


def write_node_pressure(root: Path, resource: str, some_total_us: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
    (Path(root) / "pressure" / resource).write_text(format_pressure(some_total_us, **kwargs))
