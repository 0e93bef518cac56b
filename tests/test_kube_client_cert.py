"""koordnode authenticating to a real kube-apiserver with a client certificate, as clusters
issue them: embedded in the kubeconfig (client-certificate-data / client-key-data, as kubeadm
writes it), and as files rotated while koordnode's watches are open (as the kubelet rotates its
own). Who the API server took koordnode for is asked of it (SelfSubjectReview), not assumed."""

from __future__ import annotations

# ruff: noqa: F811  (the `plane` fixture is imported, then requested by name)

import asyncio
import base64
import os
import textwrap
from pathlib import Path

from kube_cluster_support import (  # noqa: F401
    NODES, Node, _start, _stop, configmap, plane, set_configmap, write_kubeconfig)
from testbed.kube_bed import ControlPlane

from koordnode.kube.client import KubeClient
from koordnode.kube.credentials import Credentials

REVIEW = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


async def who(client: KubeClient) -> tuple[str, list[str]]:
    """The user name and groups the API server took the client for."""
    review = await client.create(REVIEW, {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    info = review["status"]["userInfo"]
    return info["username"], info.get("groups", [])


def test_embedded_client_certificate_authenticates(plane: ControlPlane, tmp_path: Path) -> None:
    cert, key = plane.client_certificate(tmp_path / "pki", "koordnode", ("koordnode",))
    path = write_kubeconfig(plane, tmp_path / "kubeconfig", textwrap.dedent(f"""\
        client-certificate-data: {base64.b64encode(cert.read_bytes()).decode()}
        client-key-data: {base64.b64encode(key.read_bytes()).decode()}
        """), embed_ca=True)
    client = KubeClient(Credentials.from_kubeconfig(str(path)))
    assert asyncio.run(who(client)) == ("koordnode", ["koordnode", "system:authenticated"])


def test_rotated_client_certificate_files_are_used_while_watches_stay_open(plane: ControlPlane,
                                                                           tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    current_cert, current_key = tmp_path / "current.crt", tmp_path / "current.key"

    def rotate_to(groups: tuple[str, ...], subdir: str) -> None:
        cert, key = plane.client_certificate(pki / subdir, "koordnode", groups)
        for source, target in ((key, current_key), (cert, current_cert)):  # each moved into place whole
            staged = target.with_suffix(".new")
            staged.write_bytes(source.read_bytes())
            os.replace(staged, target)

    rotate_to(("koordnode", "first-cert"), "1")
    path = write_kubeconfig(plane, tmp_path / "kubeconfig",
                            f"client-certificate: {current_cert}\nclient-key: {current_key}\n")
    admin = plane.client()
    node = Node(plane, tmp_path, NODES[0], kubeconfig=path)

    async def scenario() -> None:
        await asyncio.to_thread(set_configmap, admin, configmap(61, 50, 40))
        stop, tasks = await _start(node)
        try:
            await node.wait("the first NodeSLO", lambda: node.config.strategy.cpu_suppress.threshold_percent == 61)
            assert "first-cert" in (await who(node.link.client))[1]
            watches_before = node.link.status()["watches"]["nodeslo"]
            rotate_to(("koordnode", "second-cert"), "2")
            # The open watch goes on (a client certificate counts at the handshake); the next
            # change arrives on it, and every new request presents the new certificate.
            await asyncio.to_thread(set_configmap, admin, configmap(62, 50, 40))
            await node.wait("the NodeSLO after the rotation",
                            lambda: node.config.strategy.cpu_suppress.threshold_percent == 62)
            name, groups = await who(node.link.client)
            assert name == "koordnode" and "second-cert" in groups and "first-cert" not in groups
            assert node.link.client.credentials.client_cert_loads == 2
            assert node.link.client.credentials.rotation_problem is None
            watches_after = node.link.status()["watches"]["nodeslo"]
            assert watches_after["connected"] and watches_after["relists"] == watches_before["relists"]
        finally:
            await _stop(stop, tasks)

    asyncio.run(scenario())
