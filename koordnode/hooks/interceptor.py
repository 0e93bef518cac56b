"""The hook chain behind the proxy's interceptor protocol (proxy/interceptor.py).

Structural: this module does not import the proxy; the daemon hands a ChainInterceptor to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from koordnode.hooks.be_start import BeStartWatch
from koordnode.hooks.chain import CallContext, HookChain, HookFailed, call_ids
from koordnode.metrics.recorder import Metrics


@dataclass(frozen=True)
class Interception:
    """What the Pre hooks made of a call (the shape proxy/interceptor.py's Interception names)."""

    request: Any  # to forward
    failure: str | None = None  # failure_policy = "fail" and a hook failed: fail the call
    token: Any = None  # the CallContext, handed back to after()
    log_fields: Mapping[str, Any] = field(default_factory=dict)


class ChainInterceptor:
    """Runs an intercepted call's Pre hooks before it is forwarded and schedules its Post hooks
    once the outcome is known. ``pod_labels_for(method, request)`` gives the labels of the pod a
    call is about (the skip label), read from a snapshot of the node state. ``be_starts`` notes
    the calls that start a BE pod's sandbox or container while they are with the runtime."""

    def __init__(self, chain: HookChain, pod_labels_for: Callable[[str, Any], dict[str, str]],
                 metrics: Metrics, be_starts: BeStartWatch | None = None) -> None:
        self._chain = chain
        self._pod_labels_for = pod_labels_for
        self._metrics = metrics
        self._be_starts = be_starts

    async def before(self, method: str, request: Any) -> Interception:
        call = CallContext(method=method, request=request, pod_labels=self._pod_labels_for(method, request))
        try:
            await self._chain.run_pre(call)
        except HookFailed as exc:
            return Interception(request=request, failure=str(exc), token=call, log_fields=call_ids(call))
        finally:
            self._metrics.observe_hook_delay(method, time.monotonic() - call.started)
        if self._be_starts is not None:
            self._be_starts.call_began(call)
        return Interception(request=call.request, token=call, log_fields=call_ids(call))

    def after(self, token: Any, sent_request: Any, response: Any, grpc_status: int | None,
              grpc_message: str) -> Mapping[str, Any]:
        call: CallContext = token
        if self._be_starts is not None:
            self._be_starts.call_ended(call)
        # The Post hooks (state recorder) see what the runtime really received.
        call.request = sent_request
        call.grpc_status = grpc_status
        call.grpc_message = grpc_message
        call.response = response
        fields: dict[str, Any] = {
            **call_ids(call),
            "duration_ms": round((time.monotonic() - call.started) * 1000, 3),
            "hook_failures": call.hook_failures or None,
            "hooks_skipped": call.skip_hooks or None,
        }
        self._chain.schedule_post(call)
        return fields
