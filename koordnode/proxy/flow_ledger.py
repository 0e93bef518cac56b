"""HTTP/2 flow-control bookkeeping of one relayed connection (no I/O: it returns frames).

The backend never sees a held request body, so it would never return the window the client
spent on it, and a body larger than the window would stall. The relay returns that window to
the client itself as it holds each frame, up to a per-connection budget of held bytes. When it
then sends the (possibly changed) body, the backend returns window for bytes the client never
spent: that much (the debt) is withheld from the backend's connection-level WINDOW_UPDATEs.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from koordnode.proxy import h2wire as w

# Largest request body held for the hooks: containerd's own receive limit (16 MiB), so a
# larger request is refused as containerd would refuse it, and memory stays bounded.
MAX_INTERCEPTED_BODY = 16 * 1024 * 1024
# Request bytes one connection may have held for the hooks before we stop returning the
# client's flow-control window: the client then waits, as it would for a slow runtime.
MAX_HELD_PER_CONNECTION = 2 * MAX_INTERCEPTED_BODY


class FlowLedger:
    """The backend's windows as the relay sees them, the debt, and the held-bytes budget."""

    __slots__ = ("conn_window", "initial_window", "max_frame", "debt", "held", "withheld")

    def __init__(self) -> None:
        self.conn_window = w.DEFAULT_WINDOW  # what the backend still accepts on the connection
        self.initial_window = w.DEFAULT_WINDOW  # a new stream's window at the backend
        self.max_frame = w.DEFAULT_MAX_FRAME  # the backend's SETTINGS_MAX_FRAME_SIZE
        self.debt = 0  # window the backend will return that the client never spent
        self.held = 0  # request frame bytes held for the hooks
        # Window not returned to the client while over the budget: stream -> bytes, in order.
        self.withheld: dict[int, int] = {}

    def forwarded(self, length: int) -> None:
        """A client DATA frame went to the backend as is."""
        self.conn_window -= length

    def hold(self, sid: int, length: int) -> bytes:
        """A client DATA frame of `length` bytes is held: the WINDOW_UPDATEs to give the client
        now (none past the budget: the window is returned when held bytes are released)."""
        self.held += length
        if not length:
            return b""
        if self.held <= MAX_HELD_PER_CONNECTION:
            return w.window_update(0, length) + w.window_update(sid, length)
        self.withheld[sid] = self.withheld.get(sid, 0) + length
        return b""

    def release(self, length: int, live_streams: Container[int]) -> bytes:
        """`length` held bytes left memory: the withheld window to return once under budget
        (stream-level updates only for streams still open)."""
        self.held -= length
        if not self.withheld or self.held > MAX_HELD_PER_CONNECTION:
            return b""
        updates = [w.window_update(0, sum(self.withheld.values()))]
        updates += [w.window_update(sid, n) for sid, n in self.withheld.items() if sid in live_streams]
        self.withheld.clear()
        return b"".join(updates)

    def sent(self, length: int) -> None:
        """The relay itself sent `length` body bytes the client never spent window on."""
        self.conn_window -= length
        self.debt += length

    def backend_conn_update(self, increment: int) -> int:
        """A connection-level WINDOW_UPDATE from the backend: the increment to pass on."""
        self.conn_window += increment
        take = min(self.debt, increment)
        self.debt -= take
        return increment - take

    def backend_settings(self, settings: Mapping[int, int]) -> int:
        """The backend's SETTINGS: how much every open stream's window changed."""
        self.max_frame = settings.get(w.SETTINGS_MAX_FRAME_SIZE, self.max_frame)
        new = settings.get(w.SETTINGS_INITIAL_WINDOW_SIZE)
        if new is None:
            return 0
        delta = new - self.initial_window
        self.initial_window = new
        return delta
