from __future__ import annotations

import pytest

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

