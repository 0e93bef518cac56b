"""Read-only HPACK decoding of the header blocks the relay forwards unchanged.

The relay forwards every header block as the endpoint wrote it, so both endpoints' dynamic
tables stay theirs; it decodes each block with decoders of its own that follow the same tables.
"""

from __future__ import annotations

import re
from typing import cast

import hpack

# Header lists are only observed; a generous bound avoids rejecting what the endpoints accept.
MAX_HEADER_LIST = 16 * 1024 * 1024
# A header block is collected whole to be decoded; CRI metadata is a few hundred bytes. A
# larger block is relayed undecoded (the runtime judges it) and the connection stops being
# intercepted, rather than collecting an unbounded block.
MAX_HEADER_BLOCK = 1024 * 1024
# Distinct cached blocks: a peer cannot grow the cache without end.
_MAX_CACHED_BLOCKS = 256

# A header block made only of one-byte "indexed header field" representations (index 1..126).
# Decoding it reads the tables but cannot change them.
_ONLY_INDEXED = re.compile(rb"[\x81-\xfe]+")

Headers = list[tuple[str, str]]


class HeaderDecoder:
    """hpack's decoder plus a cache for the blocks that repeat call after call.

    Once both ends have indexed their usual headers, most blocks (a response's ":status 200",
    its "grpc-status 0" trailers, a request without a deadline) are a few indexed bytes, the same
    every time. Their meaning only changes when the dynamic table does, so they are cached until a
    block that changes the table comes by.
    """

    __slots__ = ("decoder", "cache")

    def __init__(self) -> None:
        self.decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self.cache: dict[bytes, Headers] = {}

    def set_max_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: the most the encoder may make the table."""
        self.decoder.max_allowed_table_size = size

    def decode(self, block: bytes) -> Headers:
        if _ONLY_INDEXED.fullmatch(block):
            headers = self.cache.get(block)
            if headers is None:
                headers = self.cache[block] = cast("Headers", self.decoder.decode(block, raw=False))
                if len(self.cache) > _MAX_CACHED_BLOCKS:
                    self.cache.clear()
            return headers
        table = self.decoder.header_table.dynamic_entries
        before = tuple(table)
        headers = cast("Headers", self.decoder.decode(block, raw=False))
        if self.cache and tuple(table) != before:
            self.cache.clear()
        return headers


class HeaderBlock:
    """A header block collected across CONTINUATION frames, up to MAX_HEADER_BLOCK bytes."""

    __slots__ = ("sid", "flags", "fragments", "size")

    def __init__(self, sid: int, flags: int, fragment: bytes) -> None:
        self.sid = sid
        self.flags = flags  # the HEADERS frame's: END_STREAM says whether these are trailers
        self.fragments = [fragment]
        self.size = len(fragment)

    def add(self, fragment: bytes | memoryview) -> bool:
        """Append a CONTINUATION's fragment; False (nothing copied) once past the bound."""
        self.size += len(fragment)
        if self.size > MAX_HEADER_BLOCK:
            self.fragments = []
            return False
        self.fragments.append(bytes(fragment))
        return True
