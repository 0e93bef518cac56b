from __future__ import annotations

from pathlib import Path

import pytest

from testbed.background_build import await_outside_tests
from testbed.fixtures import containerd_bed  # noqa: F401  (the shared real containerd)

from support.cri import Cri
from support.koordnode_runner import KoordnodeProcess


@pytest.fixture
def koordnode(containerd_bed, tmp_path):  # noqa: F811
    """A real `koordnode run` process in front of the test bed's containerd."""
    proc = KoordnodeProcess(tmp_path / "koordnode", str(containerd_bed.socket),
                            kubepods=containerd_bed.kubepods_cgroup).start()
    yield proc
    proc.stop()


@pytest.fixture
def cri_direct(containerd_bed):  # noqa: F811
    cri = Cri(containerd_bed.address)
    yield cri
    cri.close()


@pytest.fixture
def cri_proxy(koordnode):
    cri = Cri(koordnode.listen)
    yield cri
    cri.close()



@pytest.fixture(autouse=True)
def _originals_kept_in_the_test(monkeypatch, tmp_path_factory):
    """Daemons built in-process keep the originals of node-level values (executor/originals.py)
    in a directory of the test, never in the host's /var/lib/koordnode (the built-in
    [daemon] state_dir): their cgroup and procfs roots are the test's own."""
    from koordnode.executor import originals

    real_init = originals.OriginalsJournal.__init__
    default = Path("/var/lib/koordnode")

    def init(self, state_dir):
        if Path(state_dir) == default:
            state_dir = tmp_path_factory.mktemp("state")
        real_init(self, state_dir)

    monkeypatch.setattr(originals.OriginalsJournal, "__init__", init)


# Modules that need the real-node bed's builds (scripts/test.sh runs them in the background) run
# last, in this order, so a fresh machine builds while the others run (testbed/background_build.py),
# each with the build steps it waits for.
_NEEDS_THE_BUILDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("test_k8s_", ("k8s",)),
    ("test_kube_", ("k8s",)),
    ("test_helm_", ("k8s", "helm")),
    ("test_helm_node", ("k8s", "helm", "koord")),  # Koordinator's CRDs for the pod's cluster mode
    ("test_koord_", ("koord",)),
    ("test_koordlet_", ("k8s", "koord")),  # koordlet itself is built only for its benchmark
    ("test_core_sched_kernel", ("kernel",)),
    # koord-manager's batch allocatable is what the node's use leaves: not beside the kernel's
    # build, which takes every idle CPU (it gave 0 batch CPU in a cold run's timing)
    ("test_koord_batch_node", ("koord", "kernel")),
    ("test_vm_lane", ("k8s", "vmimage")),
)


def _build_rank(item: pytest.Item) -> int:
    """1 + the index of the longest prefix the module's name starts with; 0: needs no build."""
    name = Path(str(item.fspath)).name
    found = [(len(prefix), i) for i, (prefix, _) in enumerate(_NEEDS_THE_BUILDS) if name.startswith(prefix)]
    return max(found)[1] + 1 if found else 0


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_build_rank)  # stable: the files' own order within each rank


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """The wait for a background build happens here, outside the test: this wrapper is entered
    before pytest-timeout's, so no test's timeout counts a cold machine's build."""
    rank = _build_rank(item)
    if rank:
        await_outside_tests(_NEEDS_THE_BUILDS[rank - 1][1], item.nodeid)
    yield
