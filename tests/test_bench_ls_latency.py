"""bench/ls_latency.py: the idle-latency hold (the PM QoS request it keeps during a run), and the
request/response variant (where its client runs, where the tail of the round trips went)."""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench import ls_latency
from bench.ls_latency import (
    CPU_DMA_LATENCY,
    IdleLatencyHold,
    build_probe,
    cpuidle_description,
    describe_idle,
    parse_line,
    table,
    variants_of,
    where_table,
)

CPUS = Path("/sys/devices/system/cpu")


def _current_request_us() -> int:
    # Reading the device gives the effective CPU latency constraint, a binary s32 in us.
    with open(CPU_DMA_LATENCY, "rb") as f:
        return struct.unpack("=i", f.read(4))[0]


def _deep_state_entries() -> int:
    """Entries into idle states with a non-zero exit latency, all CPUs together."""
    total = 0
    for state in CPUS.glob("cpu[0-9]*/cpuidle/state[0-9]*"):
        if int((state / "latency").read_text()) > 0:
            total += int((state / "usage").read_text())
    return total


def test_a_hold_that_cannot_be_taken_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr(ls_latency, "CPU_DMA_LATENCY", tmp_path / "missing")
    with pytest.raises(SystemExit) as info:
        with IdleLatencyHold():
            pass
    assert "--no-idle-latency-hold" in str(info.value)
    assert "cannot hold" in str(info.value)


def test_the_header_names_the_hold_and_the_idle_states():
    idle = {"driver": "haltpoll", "governor": "haltpoll", "guest_halt_poll_ns": "0",
            "states": [{"name": "POLL", "exit_latency_us": 0, "disabled": False},
                       {"name": "haltpoll idle", "exit_latency_us": 1, "disabled": False}]}
    held = describe_idle(idle, True)
    assert "driver haltpoll" in held and "POLL (exit 0 us), haltpoll idle (exit 1 us)" in held
    assert f"held {CPU_DMA_LATENCY} = 0 us" in held
    assert "NOT held" in describe_idle(idle, False)


@pytest.mark.skipif(os.geteuid() != 0 or not CPU_DMA_LATENCY.exists(), reason="needs root and PM QoS")
def test_while_held_idle_cpus_stay_out_of_states_with_exit_latency():
    """Real kernel: with the request at 0 us the cpuidle governor may only pick 0-latency
    states (POLL), so no CPU enters a state with an exit latency while the hold lasts."""
    if not any(s["exit_latency_us"] for s in cpuidle_description()["states"]):
        pytest.skip("no idle state with an exit latency on this machine")
    with IdleLatencyHold():
        assert _current_request_us() == 0
        # A CPU that halted before the hold counts that entry only when it wakes (the kernel
        # bumps a state's usage on exit); the hold wakes every idle CPU, so let those land first.
        time.sleep(0.05)
        before = _deep_state_entries()
        time.sleep(0.3)  # the test's CPUs idle meanwhile
        assert _deep_state_entries() == before


# ---- the request/response variant: where the client runs, and where the tail went --------------

def _run_main(monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["ls_latency", *argv])
    return ls_latency.main()


@pytest.mark.parametrize("argv, message", [
    (["--rr-client", "remote"], "--rr-client: remote given; choose one or more of host, pod, host-rt"),
    (["--rr-client", "pod,pod"], "each once"),
    (["--rr-client", ","], "--rr-client: nothing given"),
    (["--variants", "probe,latency"], "variants: probe, latency given; choose one or more of probe, rr"),
])
def test_bad_rr_arguments_are_refused_before_anything_runs(monkeypatch, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        _run_main(monkeypatch, *argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_rows_keep_the_old_name_for_the_host_client_and_follow_the_order_given():
    assert variants_of(["probe", "rr"], ["host"]) == ["probe", "rr"]
    assert variants_of(["rr"], ["host-rt", "pod"]) == ["rr-host-rt", "rr-pod"]
    assert variants_of(["probe"], ["pod"]) == ["probe"]


def test_the_client_line_says_where_the_slowest_round_trips_went():
    line = ("150.0 300.5 900.0 1200.0 8000 rtt_all=160.0 client_wait_all=3.0 server_wait_all=4.0 rtt_p99=500.0 "
            "client_wait_p99=250.0 server_wait_p99=-1.0 rtt_p999=1000.0 client_wait_p999=700.0 server_wait_p999=-1.0\n")
    got = parse_line(line)
    assert (got["p99_us"], got["p999_us"], got["n"]) == (300.5, 900.0, 8000)
    assert got["where"]["p99"] == {"rtt_us": 500.0, "client_wait_us": 250.0, "server_wait_us": None}
    assert got["where"]["p999"]["client_wait_us"] == 700.0
    # The probe's line (and an old client's) has no such fields.
    assert "where" not in parse_line("120.0 140.0 300.0 400.0 8000\n")


def _measured(p99: float, waits: tuple[float, float], be: bool) -> dict:
    where = {rounds: {"rtt_us": p99 * k, "client_wait_us": waits[0] * k, "server_wait_us": waits[1] * k}
             for rounds, k in (("p99", 2), ("p999", 4))}
    out = {"p50_us": p99 / 2, "p99_us": p99, "p999_us": p99 * 3, "max_us": p99 * 5, "n": 8000, "where": where,
           "other_cpus": 0.25 if be else 0.1}
    return {**out, "be_cpus": 1.8, "be_share_of_idle": 0.95} if be else out


def test_the_tables_have_a_row_per_client_placement_and_say_where_the_tail_went():
    alone = {"probe": _measured(140, (0, 0), False), "rr": _measured(160, (10, 20), False),
             "rr-pod": _measured(170, (30, 40), False)}
    with_be = {"probe": _measured(150, (0, 0), True), "rr": _measured(320, (100, 5), True),
               "rr-pod": _measured(200, (50, 60), True)}
    results = [{"kubelet": {"LS": {"alone": alone, "with_be": with_be}}}]
    main_table = table(results, ["LS"], ["kubelet"]).splitlines()
    # The columns runs before --rr-client printed, so old figures stay comparable.
    assert main_table[0] == ("| LS pod class | variant | setup | alone p99 | alone p99.9 | with BE p99 | with BE p99.9 "
                             "| p99 with/alone | p99.9 with/alone | BE CPUs (of what LS left idle) |")
    assert [row.split(" | ")[1] for row in main_table[2:]] == ["probe", "rr", "rr-pod"]
    assert main_table[3] == "| LS | rr | kubelet | 160 µs | 480 µs | 320 µs | 960 µs | 2.0× | 2.0× | 1.80 (95%) |"

    where = where_table(results, ["LS"], ["kubelet"]).splitlines()
    assert where[0] == ("| LS pod class | variant | setup | alone ≥p99: RTT | client waited | server waited "
                        "| with BE ≥p99: RTT | client waited | server waited "
                        "| with BE ≥p99.9: RTT | client waited | server waited | other CPUs alone / with BE |")
    assert len(where) == 4  # header, rule, rr and rr-pod: the probe has no round trips
    assert where[2] == ("| LS | rr | kubelet | 320 µs | 20 µs | 40 µs | 640 µs | 200 µs | 10 µs "
                        "| 1,280 µs | 400 µs | 20 µs | 0.10 / 0.25 |")
    assert where_table([{"kubelet": {"LS": {"alone": {"probe": alone["probe"]},
                                            "with_be": {"probe": with_be["probe"]}}}}], ["LS"], ["kubelet"]) == ""


needs_root_gcc_two_cpus = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("gcc") is None or len(os.sched_getaffinity(0)) < 2,
    reason="needs root, gcc and two CPUs")


def _round_trips(probe: Path, *, server_cpu: int, client_cpu: int, hog_cpu: int, realtime: str) -> dict:
    """Server and client on CPUs of their own; a nice -10 busy loop on hog_cpu; `realtime` (the
    server or the client) SCHED_FIFO, so only the other one can wait for its CPU."""
    def placed(cpu: int, *, nice: int = 0, fifo: bool = False):
        def setup() -> None:
            os.sched_setaffinity(0, {cpu})
            if nice:
                os.nice(nice)
            if fifo:
                os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        return setup

    port = 7400 + os.getpid() % 50
    cpus = sorted(os.sched_getaffinity(0))
    hog = subprocess.Popen([str(probe), "spin"], preexec_fn=placed(cpus[hog_cpu], nice=-10))
    server = subprocess.Popen([str(probe), "server", str(port), "50"],
                              preexec_fn=placed(cpus[server_cpu], fifo=realtime == "server"))
    try:
        done = subprocess.run([str(probe), "client", "127.0.0.1", str(port), "1000", "1000"],
                              capture_output=True, text=True, timeout=60, check=True,
                              preexec_fn=placed(cpus[client_cpu], fifo=realtime == "client"))
    finally:
        for proc in (hog, server):
            proc.kill()
            proc.wait()
    return parse_line(done.stdout)["where"]


@needs_root_gcc_two_cpus
def test_the_round_trip_tail_is_charged_to_the_side_that_waited_for_a_cpu(tmp_path):
    """Real scheduler: the end that shares its CPU with a busy loop waits for it (schedstat
    run_delay), the SCHED_FIFO end hardly does; swapping the two swaps the figures. (Not zero:
    with this kernel's preempt=none even a real-time task waits for another task's kernel code
    to finish, which on a shared machine is up to hundreds of us.)"""
    probe = build_probe(tmp_path)
    server_starved = _round_trips(probe, server_cpu=0, client_cpu=1, hog_cpu=0, realtime="client")
    client_starved = _round_trips(probe, server_cpu=0, client_cpu=1, hog_cpu=1, realtime="server")
    assert server_starved["all"]["server_wait_us"] > 10 * max(1.0, server_starved["all"]["client_wait_us"])
    assert server_starved["p99"]["server_wait_us"] > 100
    assert client_starved["all"]["client_wait_us"] > 10 * max(1.0, client_starved["all"]["server_wait_us"])
    assert client_starved["p99"]["client_wait_us"] > 100
    for where in (server_starved, client_starved):
        # what each waited is part of the round trips it was measured in
        assert where["all"]["client_wait_us"] + where["all"]["server_wait_us"] <= where["all"]["rtt_us"]

def _bench(bed, tmp_path: Path, **given) -> ls_latency.Bench:
    args = argparse.Namespace(rounds=1500, variants=["rr"], rr_clients=["pod"], classes=["LS"], be_loops=1,
                              koordnode_toml="", ls_busy=[0])
    vars(args).update(given)
    return ls_latency.Bench(bed, build_probe(tmp_path), args, tmp_path)


def _container_cgroup_procs(cri, cid: str) -> list[int]:
    cgroup = ls_latency.cgroup_of(ls_latency.Bench.pid_of(cri, cid), "cpu")
    return [int(p) for p in (ls_latency.CG / "cpu" / cgroup.lstrip("/") / "cgroup.procs").read_text().split()]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


@pytest.mark.e2e
@needs_root_gcc_two_cpus
def test_the_pod_client_is_an_ls_pod_of_its_own_and_the_client_runs_in_it(containerd_bed, cri_direct, tmp_path):
    """Real containerd: the client pod is made like any LS pod (kubelet's pod cgroup in the
    burstable tier, 1 CPU of shares, the LS label), and each run's client process is exec'd
    into it -- it is in that pod's cgroup while it runs, not on the host."""
    from koordnode.cri import api_pb2 as pb

    bench = _bench(containerd_bed, tmp_path)
    server_sid, _ = bench.pod(cri_direct, "ls-server", "LS", [ls_latency.PROBE_IN_CONTAINER, "server",
                                                               str(ls_latency.PORT), "50"])
    client_sid, client_cid = bench.pod(cri_direct, "rr-client", "LS", ls_latency.CLIENT_POD_COMMAND)
    try:
        status = cri_direct.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=client_sid)).status
        assert status.labels["koordinator.sh/qosClass"] == "LS"
        client_cgroup = ls_latency.cgroup_of(ls_latency.Bench.pid_of(cri_direct, client_cid), "cpu")
        pod_cgroup = client_cgroup.rsplit("/", 1)[0]
        assert pod_cgroup.startswith(f"{containerd_bed.kubepods_cgroup}/burstable/pod")
        assert (ls_latency.CG / "cpu" / pod_cgroup.lstrip("/") / "cpu.shares").read_text().strip() == "1024"
        ip = cri_direct.rt.PodSandboxStatus(pb.PodSandboxStatusRequest(pod_sandbox_id=server_sid)).status.network.ip

        seen_in_pod = False
        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(bench.rr_run, cri_direct, "rr-pod", ip, client_cid)
            while not run.done():
                seen_in_pod = seen_in_pod or any(
                    "client" in _cmdline(pid)[1:2] for pid in _container_cgroup_procs(cri_direct, client_cid))
                time.sleep(0.05)
            result = run.result()
        assert seen_in_pod
        assert result["n"] == 1500 and result["p99_us"] > 0
        assert result["where"]["p99"]["client_wait_us"] is not None
        assert result["where"]["p99"]["server_wait_us"] is not None
    finally:
        bench.remove(cri_direct, client_sid)
        bench.remove(cri_direct, server_sid)


@pytest.mark.e2e
@needs_root_gcc_two_cpus
def test_a_setup_measures_every_client_placement_alone_and_with_be(containerd_bed, tmp_path):
    """Real containerd, kubelet's values: one LS class through run_setup with the three clients,
    each measured alone and beside BE, with the BE CPU and where-the-tail-went for each."""
    bench = _bench(containerd_bed, tmp_path, rounds=500, rr_clients=["host", "pod", "host-rt"])
    out = bench.run_setup("kubelet")
    for phase in ("alone", "with_be"):
        assert list(out["LS"][phase]) == ["rr", "rr-pod", "rr-host-rt"]
        for measured in out["LS"][phase].values():
            assert measured["n"] == 500
            assert set(measured["where"]) == {"all", "p99", "p999"}
            assert measured["other_cpus"] >= 0
    assert all(m["be_cpus"] > 0 for m in out["LS"]["with_be"].values())
    rows = table([{"kubelet": out}], ["LS"], ["kubelet"]).splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == ["rr", "rr-pod", "rr-host-rt"]


def test_the_machine_busy_time_counts_everything_but_idle_and_iowait(tmp_path):
    stat = tmp_path / "stat"
    #                 user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 5000 70 4 6 10 0 0\ncpu0 50 10 15 2500 35 2 3 5 0 0\n")
    assert ls_latency.busy_ns(stat) == 170 * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def test_each_class_gets_a_row_per_ls_load():
    assert ls_latency.ls_rows(["LS", "LSR"], [0, 60]) == [
        ("LS", "LS", 0), ("LS busy 60%", "LS", 60), ("LSR", "LSR", 0), ("LSR busy 60%", "LSR", 60)]


@needs_root_gcc_two_cpus
def test_the_duty_load_works_part_of_each_period_and_sleeps_the_rest(tmp_path):
    """`ls_probe duty 30` (the LS-busy load) uses CPU, but never all of it: it sleeps out each
    period once it has had its share (checked as CPU time over its life, not as a timing)."""
    probe = build_probe(tmp_path)
    proc = subprocess.Popen([str(probe), "duty", "30"])
    started = time.monotonic()
    try:
        time.sleep(1.0)
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        wall_s = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    assert 0 < cpu_s < 0.6 * wall_s, (cpu_s, wall_s)
