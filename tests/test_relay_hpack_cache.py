"""The relay's cached HPACK decoding must mean exactly what a plain decoder reads."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from koordnode.proxy.hpack_view import HeaderDecoder

NAMES = [":path", "content-type", "grpc-status", "grpc-message", "x-a", "x-b", "grpc-timeout"]
VALUES = ["/runtime.v1.RuntimeService/Version", "application/grpc", "0", "", "1", "2", "999m", "v" * 40]

header = st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES))
blocks = st.lists(st.lists(header, min_size=1, max_size=5), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(blocks, st.sampled_from([256, 4096]))
def test_cached_decoding_matches_a_plain_decoder(sequence, table_size):
    encoder = hpack.Encoder()
    encoder.header_table_size = table_size  # small tables evict: indices shift under the cache
    reference = hpack.Decoder()
    cached = HeaderDecoder()
    for headers in sequence:
        block = encoder.encode(headers)
        assert cached.decode(block) == reference.decode(block, raw=False) == headers


def test_repeated_indexed_blocks_are_served_from_the_cache():
    encoder = hpack.Encoder()
    cached = HeaderDecoder()
    headers = [(":status", "200"), ("content-type", "application/grpc")]
    first = encoder.encode(headers)
    cached.decode(first)
    again = encoder.encode(headers)  # now fully indexed
    assert cached.decode(again) == headers
    assert again in cached.cache
    # A block that inserts into the table invalidates what was cached.
    cached.decode(encoder.encode([("x-new", "value")]))
    assert cached.cache == {}
