"""What the relay asks of whoever looks at the calls it relays (proxy/handler.py in koordnode).

The relay knows frames and streams; which calls are held, what happens to a held request and
what is recorded about each call live behind this protocol.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass
class BeforeResult:
    body: bytes  # gRPC-framed request body to send to the backend
    ctx: Any = None  # handed back to CallHandler.after
    fail: tuple[int, str] | None = None  # (grpc code, message): answer the client with this instead


class CallHandler(Protocol):
    def lookup(self, path: str) -> Any | None:
        """The method's spec when its request must be held for `before`, else None."""
        ...

    async def before(self, spec: Any, body: bytes) -> BeforeResult: ...

    def after(self, ctx: Any, body: bytes, grpc_status: int | None, grpc_message: str) -> None: ...

    def completed(self, path: str, grpc_status: int | None, seconds: float) -> None:
        """Every relayed call, held or not, once its response ended."""
        ...

    def opened(self) -> None: ...

    def closed(self) -> None: ...
