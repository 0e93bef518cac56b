"""What the proxy needs from whoever looks at intercepted calls: the proxy's side of the seam.

The relay knows bytes and CRI methods; what happens to a decoded request (the hook chain, in
koordnode) lives behind this protocol, so `proxy/` depends on nothing above `cri/`. The daemon
hands an implementation in (hooks/interceptor.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Interception(Protocol):
    """The interceptor's answer before a call is forwarded."""

    # The request to forward: the decoded one, or a changed copy.
    @property
    def request(self) -> Any: ...

    # Set: the call must fail with this message (failure_policy = "fail"); the request is unchanged.
    @property
    def failure(self) -> str | None: ...

    # Handed back to Interceptor.after; the proxy does not look inside.
    @property
    def token(self) -> Any: ...

    # Identifiers worth logging with the call (pod, container id...).
    @property
    def log_fields(self) -> Mapping[str, Any]: ...


class Interceptor(Protocol):
    async def before(self, method: str, request: Any) -> Interception:
        """Look at (and maybe change) a decoded request before it is forwarded."""
        ...

    def after(self, token: Any, sent_request: Any, response: Any, grpc_status: int | None,
              grpc_message: str) -> Mapping[str, Any]:
        """The call's outcome (``response`` None unless it succeeded and decoded); ``sent_request``
        is what the runtime really received. Returns fields for the call's log line."""
        ...
