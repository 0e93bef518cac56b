#!/usr/bin/env python3
"""How much memory `koordnode run` holds, where it comes from, and whether it grows.

Starts a private containerd (the test bed) with a few LS and BE pods created through
koordnode, and `koordnode run` as its own process with the QoS manager ticking every
--tick-ms (50 ms: 3600 ticks, an hour of the default 1 s ticks, take 3 minutes) and its
metrics endpoint on a free port, scraped every 5 s. Prints the daemon's RSS (and USS/PSS)
at start, every --every seconds and after --ticks ticks, then the import breakdown: the RSS
each module adds while what `koordnode run` imports is imported in a fresh interpreter
(self = the module's own share, without the modules it imports).

    sudo python3 -m bench.daemon_memory [--ticks 3600] [--tick-ms 50] [--json out.json]
    python3 -m bench.daemon_memory --imports-only      # no root, no containerd needed
    sudo python3 -m bench.daemon_memory --no-bed       # backend missing: no ticks, start-up only

Without the bed (--no-bed, or not root) the backend is a socket nobody serves: the daemon
serves and retries the rebuild, but the QoS manager waits for the rebuild and never ticks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

MIB = 2**20

# Run in a fresh interpreter by --imports-child: wraps every loader so that each module's
# create+exec is timed in RSS; a module's self share excludes the modules imported under it.
# Heap growth lands on whichever module's allocation made malloc take new pages, so single
# small modules are noisy; the per-package totals are the reliable part.
_IMPORT_PROBE = r"""
import importlib, importlib.abc, json, os, sys
PAGE = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE
stack, records, parents = [], {}, {}
class Timed(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name
    def create_module(self, spec):
        parents[self.name] = stack[-1][0] if stack else None
        stack.append([self.name, rss(), 0])
        return self.inner.create_module(spec)
    def exec_module(self, module):
        try:
            self.inner.exec_module(module)
        finally:
            name, start, children = stack.pop()
            total = rss() - start
            records[name] = (total, total - children)
            if stack:
                stack[-1][2] += total
    def __getattr__(self, attr):
        return getattr(self.inner, attr)
class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = Timed(spec.loader, name)
                return spec
        return None
sys.meta_path.insert(0, Finder())
before = rss()
for name in sys.argv[1].split(","):
    importlib.import_module(name)
json.dump({"before": before, "after": rss(), "modules": len(sys.modules),
           "records": records, "parents": parents}, sys.stdout)
"""


def rss_of_fresh_interpreter(flags: list[str]) -> float:
    code = "print(open('/proc/self/statm').read().split()[1])"
    pages = int(subprocess.check_output([sys.executable, *flags, "-c", code], text=True))
    return pages * os.sysconf("SC_PAGE_SIZE") / MIB


# What `python -m koordnode run` imports: the CLI first, then the daemon it loads for `run`.
DAEMON_IMPORTS = "koordnode.cli,koordnode.logsetup,koordnode.daemon"


def import_breakdown(module: str = DAEMON_IMPORTS, top: int = 25) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.check_output([sys.executable, "-c", _IMPORT_PROBE, module], text=True,
                                  env=env, cwd=str(REPO))
    data = json.loads(out)
    records = {name: (total, own) for name, (total, own) in data["records"].items()}
    by_package: dict[str, int] = {}
    for name, (_total, own) in records.items():
        package = name.split(".")[0]
        by_package[package] = by_package.get(package, 0) + own
    # Who pulled each package in first: the nearest importer outside the package.
    first_importer: dict[str, str] = {}
    for name in records:
        package = name.split(".")[0]
        if package in first_importer:
            continue
        parent = data["parents"].get(name)
        while parent is not None and parent.split(".")[0] == package:
            parent = data["parents"].get(parent)
        first_importer[package] = parent or "-"
    return {
        "module": module,
        "interpreter_mb": data["before"] / MIB,
        "after_import_mb": data["after"] / MIB,
        "modules_loaded": data["modules"],
        "packages": sorted(((p, size / MIB, first_importer[p]) for p, size in by_package.items()),
                           key=lambda row: -row[1])[:top],
        "modules": sorted(((n, own / MIB, total / MIB) for n, (total, own) in records.items()),
                          key=lambda row: -row[1])[:top],
    }


def print_import_breakdown(report: dict) -> None:
    bare = rss_of_fresh_interpreter(["-I"])
    no_site = rss_of_fresh_interpreter(["-I", "-S"])
    print(f"\nimports of {report['module'].replace(',', ', ')} (RSS added in a fresh interpreter)")
    print(f"  bare interpreter: {bare:.1f} MiB ({no_site:.1f} MiB without site/.pth imports)")
    print(f"  after import: {report['after_import_mb']:.1f} MiB, "
          f"+{report['after_import_mb'] - report['interpreter_mb']:.1f} MiB, "
          f"{report['modules_loaded']} modules")
    print("  by top-level package (self MiB, first imported by):")
    for package, size, importer in report["packages"]:
        print(f"    {size:6.2f}  {package:28s} <- {importer}")
    print("  biggest single modules (self MiB / with what they import):")
    for name, own, total in report["modules"]:
        print(f"    {own:6.2f} / {total:6.2f}  {name}")


# ---------------------------------------------------------------------------------------------
# The running daemon


def memory_of(pid: int) -> dict[str, float]:
    import psutil

    proc = psutil.Process(pid)
    full = proc.memory_full_info()
    return {"rss_mb": full.rss / MIB, "uss_mb": full.uss / MIB, "pss_mb": full.pss / MIB,
            "threads": proc.num_threads()}


def ticks_of(status: dict) -> int:
    manager = status.get("qos_manager") or {}
    return int((manager.get("ticks") or {}).get("count") or 0)


def make_pods(bed, cri, n_ls: int, n_be: int) -> list[str]:
    from tests.support.cri import container_config, run_pod, sandbox_config, start_container

    pods = []
    for i in range(n_ls):
        sb = sandbox_config(bed, f"ls-{i}", qos="burstable", labels={"koordinator.sh/qosClass": "LS"})
        pods.append(run_pod(cri, sb))
        start_container(cri, pods[-1], sb, container_config(bed, "app", ["sleep", "3600"],
                                                            resources={"cpu_shares": 1024}))
    for i in range(n_be):
        sb = sandbox_config(bed, f"be-{i}", qos="besteffort")
        pods.append(run_pod(cri, sb))
        # A light load (a short burst every second) so BE usage and suppression change.
        load = "while :; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 1; done"
        start_container(cri, pods[-1], sb, container_config(bed, "batch", ["sh", "-c", load]))
    return pods


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scraper:
    """Fetches /metrics every `every_s` (as Prometheus would, only more often)."""

    def __init__(self, listen: str, every_s: float = 5.0) -> None:
        self.url = f"http://{listen}/metrics" if listen else ""
        self.every_s = every_s
        self.next_at = 0.0
        self.scrapes = 0

    def maybe_scrape(self) -> None:
        import urllib.request

        if not self.url or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        with urllib.request.urlopen(self.url, timeout=5) as resp:
            resp.read()
        self.scrapes += 1


def watch(kn, ticks: int, tick_ms: int, every_s: float, samples: list[dict], scraper: Scraper) -> None:
    """Sample memory every `every_s` until the QoS manager counted `ticks` ticks."""
    started = time.monotonic()
    # Ticks can run late; give up at three times the nominal duration.
    deadline = started + 3 * ticks * tick_ms / 1000.0 + 30
    next_sample = started + every_s
    while True:
        if kn.proc.poll() is not None:
            raise RuntimeError(f"koordnode exited with {kn.proc.returncode}; see {kn.log_path}")
        now = time.monotonic()
        scraper.maybe_scrape()
        status = kn.status()
        count = ticks_of(status)
        if count >= ticks or now > deadline:
            samples.append({"t_s": now - started, "ticks": count, "when": "end", **memory_of(kn.proc.pid)})
            return
        if now >= next_sample:
            samples.append({"t_s": now - started, "ticks": count, "when": "sample",
                            **memory_of(kn.proc.pid)})
            print(_row(samples[-1]), flush=True)
            next_sample += every_s
        time.sleep(0.5)


def _row(s: dict) -> str:
    return (f"  {s['when']:6s} t={s['t_s']:6.1f}s ticks={s['ticks']:5d}  RSS {s['rss_mb']:6.1f} MiB  "
            f"USS {s['uss_mb']:6.1f}  PSS {s['pss_mb']:6.1f}  threads {s['threads']}")


def run_with_bed(args: argparse.Namespace, work: Path) -> dict:
    from tests.support.cri import Cri, remove_pod
    from tests.support.koordnode_runner import KoordnodeProcess
    from tests.support.kubelet_tiers import prepare_qos_tiers
    from tests.testbed.containerd_bed import ContainerdBed

    samples: list[dict] = []
    with ContainerdBed(work / "bed") as bed:
        prepare_qos_tiers(bed.kubepods_cgroup)
        metrics = f"127.0.0.1:{free_port()}" if args.metrics else ""
        scraper = Scraper(metrics)
        kn = KoordnodeProcess(work / "kn", str(bed.socket), metrics_listen=metrics,
                              extra_toml=_extra_toml(args, bed.kubepods_cgroup)).start()
        cri = Cri(kn.listen)
        pods: list[str] = []
        try:
            kn.wait_rebuilt()
            samples.append({"t_s": 0.0, "ticks": ticks_of(kn.status()), "when": "start",
                            **memory_of(kn.proc.pid)})
            print(_row(samples[-1]), flush=True)
            pods = make_pods(bed, cri, args.ls_pods, args.be_pods)
            samples.append({"t_s": 0.0, "ticks": ticks_of(kn.status()), "when": "pods",
                            **memory_of(kn.proc.pid)})
            print(_row(samples[-1]) + f"  (after creating {len(pods)} pods)", flush=True)
            first = ticks_of(kn.status())
            watch(kn, first + args.ticks, args.tick_ms, args.every, samples, scraper)
            print(_row(samples[-1]), flush=True)
            status = kn.status()
            manager = status.get("qos_manager") or {}
            extra = {"tick_errors": (manager.get("ticks") or {}).get("errors"),
                     "avg_tick_ms": (manager.get("ticks") or {}).get("avg_duration_ms"),
                     "pods_known": len(status.get("pods") or []), "metrics_scrapes": scraper.scrapes}
        finally:
            for sid in pods:
                try:
                    remove_pod(cri, sid)
                except Exception as exc:  # noqa: BLE001 - keep cleaning up
                    print(f"  could not remove pod {sid}: {exc}", file=sys.stderr)
            cri.close()
            code = kn.stop()
    return {"samples": samples, "exit_code": code, **extra}


def run_without_bed(args: argparse.Namespace, work: Path) -> dict:
    from tests.support.koordnode_runner import KoordnodeProcess

    samples: list[dict] = []
    metrics = f"127.0.0.1:{free_port()}" if args.metrics else ""
    kn = KoordnodeProcess(work / "kn", str(work / "no-backend.sock"), metrics_listen=metrics,
                          extra_toml=_extra_toml(args)).start()
    try:
        started = time.monotonic()
        samples.append({"t_s": 0.0, "ticks": 0, "when": "start", **memory_of(kn.proc.pid)})
        print(_row(samples[-1]), flush=True)
        end = started + args.ticks * args.tick_ms / 1000.0
        next_sample = started + args.every
        while time.monotonic() < end:
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))
            if time.monotonic() >= next_sample:
                samples.append({"t_s": time.monotonic() - started, "ticks": 0, "when": "sample",
                                **memory_of(kn.proc.pid)})
                print(_row(samples[-1]), flush=True)
                next_sample += args.every
        samples.append({"t_s": time.monotonic() - started, "ticks": 0, "when": "end", **memory_of(kn.proc.pid)})
        print(_row(samples[-1]), flush=True)
    finally:
        code = kn.stop()
    return {"samples": samples, "exit_code": code}


def _extra_toml(args: argparse.Namespace, kubepods: str = "") -> str:
    manager = f"[qos_manager]\ntick_ms = {args.tick_ms}\n"
    if kubepods:
        manager += f'kubepods_cgroup = "{kubepods}"\n'
    return manager + args.extra_toml.replace("\\n", "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=3600, help="QoS manager ticks to run (default 3600)")
    ap.add_argument("--tick-ms", type=int, default=50, help="[qos_manager] tick_ms (default 50)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between samples (default 30)")
    ap.add_argument("--ls-pods", type=int, default=2)
    ap.add_argument("--be-pods", type=int, default=2)
    ap.add_argument("--no-metrics", dest="metrics", action="store_false",
                    help='[metrics] listen = "" (default: a free port, scraped every 5 s)')
    ap.add_argument("--no-bed", action="store_true", help="backend missing: start-up memory only")
    ap.add_argument("--imports-only", action="store_true", help="only the import breakdown")
    ap.add_argument("--extra-toml", default="", help="appended to koordnode's config ([qos_manager] must not repeat)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    result: dict = {"python": sys.version.split()[0]}
    if not args.imports_only:
        use_bed = not args.no_bed
        if use_bed:
            from tests.testbed.containerd_bed import missing_prerequisites

            problems = missing_prerequisites()
            if problems:
                print(f"test bed unavailable ({'; '.join(problems)}): running without a backend")
                use_bed = False
        work = Path(tempfile.mkdtemp(prefix="kn-mem-"))
        mode = "test bed" if use_bed else "missing backend"
        print(f"koordnode run, {mode}, tick_ms={args.tick_ms}, {args.ticks} ticks, "
              f"sampling every {args.every:.0f} s, metrics endpoint {'on' if args.metrics else 'off'}")
        result.update(run_with_bed(args, work) if use_bed else run_without_bed(args, work))
        result["mode"] = mode
        samples = result["samples"]
        first, last = samples[0], samples[-1]
        after_pods = next((s for s in samples if s["when"] == "pods"), None)
        settled = after_pods or first
        print(f"\nRSS start {first['rss_mb']:.1f} MiB"
              + (f", with pods {after_pods['rss_mb']:.1f} MiB" if after_pods else "")
              + f", end {last['rss_mb']:.1f} MiB after {last['ticks']} ticks and {last['t_s']:.0f} s "
              f"({last['rss_mb'] - settled['rss_mb']:+.1f} MiB since "
              f"{'the pods were created' if after_pods else 'the start'})")
        for key in ("tick_errors", "avg_tick_ms", "pods_known", "metrics_scrapes"):
            if key in result:
                print(f"  {key}: {result[key]}")
    breakdown = import_breakdown()
    print_import_breakdown(breakdown)
    result["imports"] = breakdown
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
