"""Turns an intercepted call's bytes into a CallContext for the hook chain, and back."""

from __future__ import annotations

import time
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from koordnode.hooks.chain import CallContext, HookChain, HookFailed, call_ids
from koordnode.proxy import h2wire
from koordnode.proxy.methods import OLD_API_PREFIX, SPECS_BY_PATH, MethodSpec
from koordnode.proxy.relay import BeforeResult
from koordnode.state import NodeState

log = structlog.get_logger("koordnode.proxy")


class ProxyStats:
    """Counters the status endpoint and metrics read."""

    def __init__(self) -> None:
        self.connections_open = 0
        self.connections_total = 0
        self.intercepted_calls = 0
        self.unparsed_bodies = 0
        self.failed_by_policy = 0


class HookCallHandler:
    def __init__(self, chain: HookChain, state: NodeState, stats: ProxyStats | None = None) -> None:
        self.chain = chain
        self.state = state
        self.stats = stats or ProxyStats()
        self._old_api_logged = False
        # Set by the daemon to feed the CRI call metrics; None keeps the relay free of them.
        self.on_completed = None

    def opened(self) -> None:
        self.stats.connections_open += 1
        self.stats.connections_total += 1

    def closed(self) -> None:
        self.stats.connections_open -= 1

    def completed(self, path: str, grpc_status: int | None, seconds: float) -> None:
        """Every relayed call, intercepted or not, once its status is known."""
        if self.on_completed is not None:
            self.on_completed(path, grpc_status, seconds)

    def lookup(self, path: str) -> MethodSpec | None:
        spec = SPECS_BY_PATH.get(path)
        if spec is None and not self._old_api_logged and path.startswith(OLD_API_PREFIX):
            self._old_api_logged = True
            log.warning("client uses the old runtime.v1alpha2 CRI API; forwarding without hooks",
                        path=path)
        return spec

    async def before(self, spec: MethodSpec, body: bytes) -> BeforeResult:
        message = h2wire.decode_grpc_message(body)
        request = None
        if message is not None:
            try:
                request = spec.request_cls.FromString(message)
            except DecodeError:
                request = None
        if request is None:
            # Compressed or malformed: the runtime is the judge, we just stay out of the way.
            self.stats.unparsed_bodies += 1
            log.warning("request body not parsed; forwarded unchanged", method=spec.name)
            return BeforeResult(body=body, ctx=None)
        self.stats.intercepted_calls += 1
        call = CallContext(
            method=spec.name, request=request, pod_labels=self.state.pod_labels_for(spec.name, request)
        )
        try:
            await self.chain.run_pre(call)
        except HookFailed as exc:
            self.stats.failed_by_policy += 1
            return BeforeResult(body=body, ctx=(spec, call), fail=(h2wire.GRPC_INTERNAL, f"koordnode: {exc}"))
        if call.request is not request:
            changed = call.request.SerializeToString()
            # Re-encoding may reorder unknown fields and map entries; send the client's own bytes
            # unless a hook really changed something.
            if changed != request.SerializeToString():
                body = h2wire.encode_grpc_message(changed)
        return BeforeResult(body=body, ctx=(spec, call))

    def after(self, ctx: Any, body: bytes, grpc_status: int | None, grpc_message: str) -> None:
        if ctx is None:
            return
        spec, call = ctx
        call.grpc_status = grpc_status
        call.grpc_message = grpc_message
        if grpc_status == 0:
            message = h2wire.decode_grpc_message(body)
            if message is not None:
                try:
                    call.response = spec.response_cls.FromString(message)
                except DecodeError:
                    call.response = None
        log.info(
            "cri call",
            method=spec.name,
            **call_ids(call),
            duration_ms=round((time.monotonic() - call.started) * 1000, 3),
            outcome="ok" if grpc_status == 0 else "error",
            grpc_status=grpc_status,
            grpc_message=grpc_message or None,
            hook_failures=call.hook_failures or None,
            hooks_skipped=call.skip_hooks or None,
        )
        self.chain.schedule_post(call)

