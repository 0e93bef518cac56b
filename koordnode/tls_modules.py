"""TLS kept out of the daemon's memory while it has no use for it, and let in when it has.

Without [kubernetes] the daemon speaks only over unix sockets and plain HTTP, so ssl and
OpenSSL stay out of its memory: asyncio takes ssl only if it imports, and hashlib falls back to
CPython's own sha2 and blake2 without _hashlib. Measured: 4.4 MiB less resident memory for
`koordnode run`. A reload that turns [kubernetes] on lets them in again (let_tls_in).
"""

from __future__ import annotations

import sys

TLS_MODULES = ("ssl", "_ssl", "_hashlib")


def leave_tls_out() -> None:
    """Make the TLS modules unimportable in this process (those already loaded stay)."""
    for name in TLS_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "not importable"


def let_tls_in() -> None:
    """Undo leave_tls_out: the modules importable again, and asyncio's modules that took
    `ssl = None` when they were imported without it made again with it. asyncio.sslproto is
    run again (it defines names only when ssl imports; the loop looks its classes up by module
    at each connection); the others only test and use their `ssl` name, which is set."""
    left_out = [name for name in TLS_MODULES if name in sys.modules and sys.modules[name] is None]
    if not left_out:
        return
    for name in left_out:
        del sys.modules[name]
    import importlib
    import ssl

    for name in ("asyncio.sslproto", "asyncio.base_events", "asyncio.selector_events"):
        module = sys.modules.get(name)
        if module is None or getattr(module, "ssl", ssl) is not None:
            continue
        if name == "asyncio.sslproto":
            importlib.reload(module)
        else:
            module.ssl = ssl  # type: ignore[attr-defined]
