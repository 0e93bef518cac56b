"""``[runtime]`` (proxy or NRI mode) and ``[proxy]`` (the CRI proxy between kubelet and runtime)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from koordnode.config.fields import setting, unix_socket_path

__all__ = ["FailurePolicy", "ProxyConfig", "RuntimeConfig", "RuntimeMode"]

FailurePolicy = Literal["ignore", "fail"]
RuntimeMode = Literal["proxy", "nri"]


@dataclass(frozen=True)
class RuntimeConfig:
    mode: RuntimeMode = setting(
        "proxy",
        doc='how koordnode hooks into pod and container creation: "proxy" (kubelet talks to '
        'koordnode\'s CRI socket) or "nri" (containerd calls koordnode as an NRI plugin)',
    )


@dataclass(frozen=True)
class ProxyConfig:
    listen: str = setting(
        "/var/run/koordnode/koordnode.sock",
        doc="CRI socket koordnode serves; point kubelet's --container-runtime-endpoint here",
        normalize=unix_socket_path,
    )
    backend: str = setting(
        "/run/containerd/containerd.sock",
        doc="CRI socket of the container runtime calls are forwarded to (path or unix://path)",
        normalize=unix_socket_path,
    )
    hook_timeout_ms: int = setting(
        200,
        min=1,
        max=60000,
        doc="milliseconds a runtime hook may take before the call goes on without it",
    )
    failure_policy: FailurePolicy = setting(
        "ignore",
        doc='when a hook fails or times out: "ignore" forwards the original request '
        '(fail-open), "fail" fails the CRI call',
    )

    @property
    def hook_timeout_s(self) -> float:
        return self.hook_timeout_ms / 1000

    def validate(self) -> list[str]:
        if self.listen == self.backend:
            return ["listen: is the same socket as backend; koordnode would call itself"]
        return []
