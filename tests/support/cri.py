"""Building CRI requests for the test bed's images, and a pod lifecycle in a few calls."""

from __future__ import annotations

import time
import uuid

import grpc

from koordnode.cri import api_pb2 as pb
from . import api_pb2_grpc as pb_grpc  # relative: bench/ imports this as tests.support.cri


class Cri:
    """Runtime + image service stubs on one channel."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address if address.startswith("unix:") else f"unix://{address}")
        self.rt = pb_grpc.RuntimeServiceStub(self.channel)
        self.img = pb_grpc.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def sandbox_config(bed, name: str, *, qos: str = "burstable", labels=None, annotations=None,
                   log_dir: str | None = None, uid: str | None = None) -> pb.PodSandboxConfig:
    uid = uid or uuid.uuid4().hex
    cfg = pb.PodSandboxConfig()
    cfg.metadata.name = name
    cfg.metadata.namespace = "default"
    cfg.metadata.uid = uid
    cfg.metadata.attempt = 0
    cfg.hostname = name
    if log_dir:
        cfg.log_directory = log_dir
    cfg.labels.update({"io.kubernetes.pod.name": name, **(labels or {})})
    cfg.annotations.update(annotations or {})
    cfg.linux.cgroup_parent = bed.pod_cgroup_parent(qos, uid)
    return cfg


def container_config(bed, name: str, cmd: list[str], *, resources: dict | None = None,
                     log_path: str | None = None, labels=None, annotations=None) -> pb.ContainerConfig:
    cfg = pb.ContainerConfig()
    cfg.metadata.name = name
    cfg.image.image = bed.busybox_image
    cfg.command.extend(cmd)
    if log_path:
        cfg.log_path = log_path
    cfg.labels.update(labels or {})
    cfg.annotations.update(annotations or {})
    for key, value in (resources or {}).items():
        if key == "unified":
            cfg.linux.resources.unified.update(value)
        else:
            setattr(cfg.linux.resources, key, value)
    return cfg


def run_pod(cri: Cri, cfg: pb.PodSandboxConfig) -> str:
    return cri.rt.RunPodSandbox(pb.RunPodSandboxRequest(config=cfg), timeout=60).pod_sandbox_id


def start_container(cri: Cri, sandbox_id: str, sandbox_cfg: pb.PodSandboxConfig,
                    cfg: pb.ContainerConfig) -> str:
    cid = cri.rt.CreateContainer(
        pb.CreateContainerRequest(pod_sandbox_id=sandbox_id, config=cfg, sandbox_config=sandbox_cfg), timeout=60
    ).container_id
    cri.rt.StartContainer(pb.StartContainerRequest(container_id=cid), timeout=60)
    return cid


def remove_pod(cri: Cri, sandbox_id: str) -> None:
    cri.rt.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)
    cri.rt.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=60)


def wait_container_state(cri: Cri, cid: str, state: int, timeout_s: float = 20.0) -> pb.ContainerStatus:
    deadline = time.monotonic() + timeout_s
    while True:
        st = cri.rt.ContainerStatus(pb.ContainerStatusRequest(container_id=cid), timeout=10).status
        if st.state == state or time.monotonic() > deadline:
            return st
        time.sleep(0.1)


class Pods:
    """Pods created in a test, removed at the end even when it fails."""

    def __init__(self, bed, cri: Cri) -> None:
        self.bed, self.cri, self.ids = bed, cri, []
        self.uids: set[str] = set()  # every pod asked for, answered or not

    def run(self, name: str, *, qos: str, labels=None, annotations=None, resources=None,
            cmd=("sleep", "3600")):
        sb = sandbox_config(self.bed, name, qos=qos, labels=labels, annotations=annotations)
        self.uids.add(sb.metadata.uid)
        sid = run_pod(self.cri, sb)
        self.ids.append(sid)
        cid = start_container(self.cri, sid, sb, container_config(self.bed, "app", list(cmd), resources=resources))
        return sb, sid, cid

    def remove(self, sid: str) -> None:
        remove_pod(self.cri, sid)
        self.ids.remove(sid)

    def cleanup(self) -> None:
        # A RunPodSandbox cut off on its way back (a test killing koordnode mid-call) leaves a
        # sandbox the test never got the id of: found by its pod uid, or it outlives the test in
        # the session's containerd and every later test there sees a pod no one knows.
        try:
            listed = self.cri.rt.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items
            self.ids += [s.id for s in listed if s.metadata.uid in self.uids and s.id not in self.ids]
        except (grpc.RpcError, ValueError):  # ValueError: the test closed the channel
            pass
        for sid in list(self.ids):
            try:
                self.remove(sid)
            except Exception:
                pass
