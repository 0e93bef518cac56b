"""Koordinator v1.8's formulas, written from its code, for tests to compute what they expect."""

from __future__ import annotations

import os

PAGE = os.sysconf("SC_PAGE_SIZE")


def koordinator_memory_high(request: int, limit: int, percent: int) -> int:
    """A container's memory.high (koordlet's cgreconcile): request + percent x (limit - request),
    rounded down to a page; `limit` is the node's allocatable memory for a container without one."""
    return (request + (limit - request) * percent // 100) // PAGE * PAGE
