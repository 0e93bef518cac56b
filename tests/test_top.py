"""`koordnode top` against a real koordnode in front of the real containerd: the plain snapshot
(`--once`), and the live screen in a real terminal (tmux): started, driven with keys, read back.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from faketree import make_cgroup_tree, write_cgroup_file
from koordnode.admin import top
from koordnode.qos.collect import Collector
from support.cri import container_config, remove_pod, run_pod, sandbox_config, start_container
from support.koordnode_runner import KoordnodeProcess
from support.kubelet_tiers import prepare_qos_tiers
from testbed.fixtures import running_in_ci

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def two_pods(containerd_bed, koordnode, cri_proxy):
    """An idle LS pod 'web' and a busy BE pod 'batch', created through koordnode."""
    prepare_qos_tiers(containerd_bed.kubepods_cgroup)
    pods = []
    try:
        ls = sandbox_config(containerd_bed, "web", qos="burstable", labels={"koordinator.sh/qosClass": "LS"})
        pods.append(run_pod(cri_proxy, ls))
        start_container(cri_proxy, pods[-1], ls, container_config(containerd_bed, "web", ["sleep", "3600"],
                                                                  resources={"cpu_shares": 1024}))
        be = sandbox_config(containerd_bed, "batch", qos="besteffort", labels={"koordinator.sh/qosClass": "BE"})
        pods.append(run_pod(cri_proxy, be))
        start_container(cri_proxy, pods[-1], be, container_config(containerd_bed, "batch",
                                                                  ["sh", "-c", "while :; do :; done"]))
        wait_for(lambda: (koordnode.status().get("qos_manager") or {}).get("be_tier", "").endswith("/koordnode_be"),
                 "the BE budget on koordnode's BE group")
        yield koordnode
    finally:
        for sid in pods:
            remove_pod(cri_proxy, sid)


def wait_for(condition, what: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def pod_line(screen: str, name: str) -> list[str] | None:
    for line in screen.splitlines():
        if line.startswith(f"default/{name} "):
            return line.split()
    return None


@pytest.mark.e2e
def test_once_prints_the_node_the_pods_and_where_they_are(two_pods):
    kn = two_pods
    run = subprocess.run([sys.executable, "-m", "koordnode", "top", "--once", "--config", str(kn.config_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    screen = run.stdout
    print(screen)
    assert screen.startswith("koordnode ")
    assert re.search(r"^node +last tick: CPUs used [\d.]+ of \d+", screen, re.M)
    assert "BE budget" in screen and "inputs: node_cpus=" in screen
    # The BE group koordnode keeps, in a state it gives it (never "no state at all").
    group = re.search(r"^BE group  (\S+): (.*)$", screen, re.M)
    assert group and group[1].endswith("/koordnode_be"), screen
    assert re.match(r"(idle|lowest weight)", group[2]) and "1 pod(s) in it" in group[2]
    web, batch = pod_line(screen, "web"), pod_line(screen, "batch")
    assert web and web[1] == "LS" and batch and batch[1] == "BE"
    # CPU, throttling and memory are measured values (a pod not found would show "-").
    assert re.fullmatch(r"\d+\.\d\d", batch[2]) and re.fullmatch(r"[\d.]+Mi", batch[5]), batch
    assert "recent decisions (newest first)" in screen and "cpu_suppress:" in screen
    assert "overwrites restored:" in screen and "hook timeouts: none" in screen


def test_once_without_a_daemon_says_so(tmp_path):
    config = tmp_path / "koordnode.toml"
    config.write_text(f'[admin]\nsocket = "{tmp_path}/admin.sock"\n')
    run = subprocess.run([sys.executable, "-m", "koordnode", "top", "--once", "--config", str(config)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert f"koordnode is not running (no admin socket at {tmp_path}/admin.sock)" in run.stderr


def test_sort_and_filters_choose_the_rows():
    rows = [top.PodRow("ns/a", "BE", None, cpu=1.5, memory=10), top.PodRow("ns/b", "LS", None, cpu=0.2, memory=99),
            top.PodRow("other/c", "LS", None, cpu=None, memory=None)]
    assert [p.key for p in top.select_pods(rows, top.View())] == ["ns/a", "ns/b", "other/c"]
    assert [p.key for p in top.select_pods(rows, top.View(sort="memory"))] == ["ns/b", "ns/a", "other/c"]
    assert [p.key for p in top.select_pods(rows, top.View(qos_class="LS"))] == ["ns/b", "other/c"]
    assert [p.key for p in top.select_pods(rows, top.View(text="NS/"))] == ["ns/a", "ns/b"]
    view = top.View()
    for _ in top.SORT_KEYS:
        view.next_sort()
    assert view.sort == "cpu"  # the key cycles through every order and back


def test_a_cgroup_v2_node_as_top_shows_it(tmp_path):
    """Rates over the refresh, memory against min/low/high/limit, the BE group's state and the
    decisions, from a status like the daemon's and a cgroup v2 tree (the e2e tests run on v1)."""
    ls, be, group = "/kubepods/burstable/podls", "/kubepods/koordnode_be/podbe", "/kubepods/koordnode_be"
    root = make_cgroup_tree(tmp_path, "v2", cgroups=[ls, be])
    for name, value in (("memory.min", str(64 << 20)), ("memory.low", str(96 << 20)), ("memory.high", str(230 << 20)),
                        ("memory.max", str(256 << 20)), ("memory.current", str(100 << 20))):
        write_cgroup_file(root, ls, name, value)
    write_cgroup_file(root, group, "cpu.idle", "1")
    write_cgroup_file(root, group, "cpu.max", "2000 100000")
    status = {
        "version": "0.1.0", "uptime_s": 5.0, "mode": "proxy", "backend_health": "ok",
        "qos": {"overwrites": {"counts": {"cpu.shares": 3}, "last": {"cpu.shares": {"path": "/x/cpu.weight", "found": "100"}}}},
        "proxy": {"hook_failures": {"qos.pre.timeout": 2}},
        "qos_manager": {"be_tier": group, "pod_cpu": {"s-ls": 0.7}, "node": {"node/ls_used_cpus": {"last": 1.5}},
                        "strategies": {"cpu_suppress": {"decision": {
                            "at": 1.0, "decision": "quota -1 -> 2000", "reason": "BE budget 0.00 CPUs = ...",
                            "inputs": {"node_cpus": 2, "be_budget_cpus": 0.0, "system_used_cpus": 0.4}}}}},
        "pods": [{"sandbox_id": "s-ls", "namespace": "default", "name": "web", "qos_class": "LS", "cgroup": ls},
                 {"sandbox_id": "s-be", "namespace": "default", "name": "batch", "qos_class": "BE", "cgroup": be}],
    }
    now = [100.0]
    sampler = top.Sampler("unused", Collector(tmp_path / "proc", root), fetch=lambda _: status, clock=lambda: now[0])
    first = sampler.sample()
    assert next(p for p in first.pods if p.key == "default/web").cpu == 0.7  # the manager's, until measured
    write_cgroup_file(root, ls, "cpu.stat", "usage_usec 1500000\nnr_periods 10\nnr_throttled 2\nthrottled_usec 200000")
    write_cgroup_file(root, ls, "cpu.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=250000\n"
                                                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0")
    now[0] += 2.0
    lines = top.render(sampler.sample(), top.View(), width=300)
    screen = "\n".join(lines)
    print(screen)
    web = pod_line(screen, "web")
    # 1.5 CPU-seconds, 0.2 s throttled and 0.25 s stalled over 2 s.
    assert web[1:] == ["LS", "0.75", "0.10", "12.5%", "100.0Mi", "64.0Mi", "96.0Mi", "230.0Mi", "256.0Mi"]
    assert pod_line(screen, "batch")[4:] == ["0.0%", "0.0Mi", "0.0Mi", "0.0Mi", "max", "max"]
    assert f"BE group  {group}: idle, quota 2000/100000 us = 0.02 CPUs; 1 pod(s) in it" in screen
    assert "BE budget 0.00 CPUs  decision: quota -1 -> 2000" in screen and "system_used_cpus=0.40" in screen
    assert "cpu_suppress: quota -1 -> 2000 (BE budget 0.00 CPUs = ...)" in screen
    assert "overwrites restored: cpu.shares 3 (last: /x/cpu.weight found '100')" in screen
    assert "hook timeouts: qos.pre.timeout 2" in screen
    assert [line.split()[:2] for line in lines if re.match(r"(LS|BE) +\d", line)] == [["LS", "1"], ["BE", "1"]]


class Tmux:
    """One detached tmux session of a fixed size, on its own server socket."""

    def __init__(self, command: str, width: int = 160, height: int = 50) -> None:
        self.socket = f"kn-top-{uuid.uuid4().hex[:8]}"
        self.session = "top"
        self._tmux("new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height), command)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True, timeout=10).stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.session, *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.session)

    def wait_screen(self, condition, what: str, timeout_s: float = 15.0) -> str:
        deadline = time.monotonic() + timeout_s
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if condition(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; the screen:\n{screen}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.mark.e2e
def test_live_screen_in_a_real_terminal_sorts_filters_and_quits(two_pods, tmp_path):
    if shutil.which("tmux") is None:
        if running_in_ci():
            pytest.fail("tmux is missing (scripts/install-deps.sh installs it)")
        pytest.skip("tmux is not installed")
    kn = two_pods
    exited = tmp_path / "exit-code"
    command = (f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} -m koordnode top "
               f"--config {shlex.quote(str(kn.config_path))}; echo $? > {shlex.quote(str(exited))}; sleep 60")
    term = Tmux(f"env TERM=xterm-256color PYTHONPATH={shlex.quote(str(REPO))} sh -c {shlex.quote(command)}")
    try:
        screen = term.wait_screen(lambda s: pod_line(s, "web") and pod_line(s, "batch"), "both pods on screen")
        assert "BE group" in screen and "/koordnode_be:" in screen
        # It refreshes by itself: the clock in the first line moves.
        first = screen.splitlines()[0]
        term.wait_screen(lambda s: s.splitlines()[0] != first, "a refresh")

        term.keys("c", "c", "c", "c")  # all -> SYSTEM -> LSE -> LSR -> LS
        screen = term.wait_screen(lambda s: "class: LS " in s, "the LS class filter")
        assert pod_line(screen, "web") and not pod_line(screen, "batch")
        term.keys("c")
        screen = term.wait_screen(lambda s: "class: BE " in s, "the BE class filter")
        assert pod_line(screen, "batch") and not pod_line(screen, "web")
        term.keys("c")  # back to all

        term.keys("/")
        term.wait_screen(lambda s: "filter pods:" in s, "the filter prompt")
        term.keys("w", "e", "b", "Enter")
        screen = term.wait_screen(lambda s: "filter: web " in s, "the text filter")
        assert "class: all " in screen and pod_line(screen, "web") and not pod_line(screen, "batch")

        term.keys("s")
        screen = term.wait_screen(lambda s: "sort: memory " in s, "the next sort order")

        term.keys("q")
        wait_for(exited.exists, "top to exit on q")
        assert exited.read_text().strip() == "0"
    finally:
        term.close()


@pytest.mark.e2e
def test_live_screen_outlives_a_daemon_restart(containerd_bed, tmp_path):
    if shutil.which("tmux") is None:
        if running_in_ci():
            pytest.fail("tmux is missing (scripts/install-deps.sh installs it)")
        pytest.skip("tmux is not installed")
    kn = KoordnodeProcess(tmp_path / "kn", str(containerd_bed.socket), kubepods=containerd_bed.kubepods_cgroup).start()
    command = (f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} -m koordnode top "
               f"--config {shlex.quote(str(kn.config_path))}; sleep 60")
    term = Tmux(f"env TERM=xterm-256color sh -c {shlex.quote(command)}")
    try:
        term.wait_screen(lambda s: "BE group" in s, "the first screen")
        kn.stop()
        screen = term.wait_screen(lambda s: "cannot refresh from" in s, "the refresh problem on screen")
        assert "PODS " in screen  # the last screen stays
        kn.start()
        term.wait_screen(lambda s: "cannot refresh from" not in s and "up " in s.splitlines()[0],
                         "the screen after koordnode is back")
    finally:
        term.close()
        kn.stop()
