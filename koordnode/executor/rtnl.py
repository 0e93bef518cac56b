"""Read-only rtnetlink: the qdiscs of the current network namespace, with the stdlib only.

One ``RTM_GETQDISC`` dump on a plain ``AF_NETLINK`` socket. It exists so that a node with
``[net] enable = false`` can check on every reconcile pass that none of koordnode's qdiscs
is left over without loading pyroute2 (~10 MB); everything that changes tc state still goes
through pyroute2 (koordnode/executor/netqos.py).

Message layouts (linux/netlink.h, linux/rtnetlink.h, linux/pkt_sched.h):
``nlmsghdr`` = len u32, type u16, flags u16, seq u32, pid u32;
``tcmsg`` = family u8, 3 pad bytes, ifindex i32, handle u32, parent u32, info u32;
then ``rtattr``s = len u16, type u16, payload padded to 4 bytes (``TCA_KIND`` = 1: a
NUL-terminated string).
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

__all__ = ["Qdisc", "dump_qdiscs", "parse_qdisc_dump"]

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLM_F_REQUEST = 0x1
NLM_F_DUMP_INTR = 0x10
NLM_F_DUMP = 0x300
TCA_KIND = 1
_NLA_TYPE_MASK = 0x3FFF  # without the NLA_F_NESTED / NLA_F_NET_BYTEORDER bits

_NLMSGHDR = struct.Struct("=IHHII")
_TCMSG = struct.Struct("=BxxxiIII")
_RTATTR = struct.Struct("=HH")
_ERRNO = struct.Struct("=i")
# The kernel sizes dump messages to at most 32 KiB; a bigger buffer never truncates one.
_RECV_BUFFER = 64 * 1024


@dataclass(frozen=True)
class Qdisc:
    index: int  # interface index
    handle: int  # major << 16 | minor, as tc prints it in hex
    parent: int  # 0xFFFFFFFF for a root qdisc
    kind: str  # "htb", "fq_codel", "noqueue", ...


def _align(length: int) -> int:
    return (length + 3) & ~3


def _kind(data: bytes, start: int, end: int) -> str:
    pos = start
    while pos + _RTATTR.size <= end:
        length, rta_type = _RTATTR.unpack_from(data, pos)
        if length < _RTATTR.size or pos + length > end:
            raise ValueError("malformed netlink attribute")
        if rta_type & _NLA_TYPE_MASK == TCA_KIND:
            return data[pos + _RTATTR.size:pos + length].split(b"\0", 1)[0].decode("ascii", "replace")
        pos += _align(length)
    return ""


def parse_qdisc_dump(data: bytes, seq: int) -> tuple[list[Qdisc], bool]:
    """The qdiscs in one datagram of a dump answering request ``seq``, and whether the dump
    is complete (NLMSG_DONE seen). Raises OSError for a netlink error reply and ValueError
    for a malformed or interrupted dump."""
    qdiscs: list[Qdisc] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, msg_type, flags, msg_seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            raise ValueError("truncated netlink message")
        body, end = offset + _NLMSGHDR.size, offset + length
        offset += _align(length)
        if msg_seq != seq:
            continue  # not ours (nothing else is sent on this socket, but be strict)
        if flags & NLM_F_DUMP_INTR:
            raise ValueError("qdisc dump interrupted by a concurrent change")
        if msg_type == NLMSG_DONE:
            return qdiscs, True
        if msg_type == NLMSG_ERROR:
            (error,) = _ERRNO.unpack_from(data, body)
            if error:
                raise OSError(-error, f"RTM_GETQDISC: {os.strerror(-error)}")
            continue
        if msg_type == RTM_NEWQDISC:
            if body + _TCMSG.size > end:
                raise ValueError("truncated tcmsg")
            _family, index, handle, parent, _info = _TCMSG.unpack_from(data, body)
            qdiscs.append(Qdisc(index, handle, parent, _kind(data, body + _TCMSG.size, end)))
    return qdiscs, False


def dump_qdiscs(timeout_s: float = 5.0) -> list[Qdisc]:
    """Every qdisc of every interface in this process's network namespace.

    Raises OSError (socket errors, timeout, a netlink error reply) or ValueError (a reply
    that cannot be parsed); callers fall back to pyroute2 then.
    """
    seq = 1
    request = (_NLMSGHDR.pack(_NLMSGHDR.size + _TCMSG.size, RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
               + _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))
    out: list[Qdisc] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.settimeout(timeout_s)
        sock.sendto(request, (0, 0))
        while True:
            data, _ancillary, msg_flags, _address = sock.recvmsg(_RECV_BUFFER)
            if msg_flags & socket.MSG_TRUNC:
                raise ValueError("netlink message larger than the receive buffer")
            if not data:
                raise ValueError("netlink socket closed during the dump")
            qdiscs, done = parse_qdisc_dump(data, seq)
            out.extend(qdiscs)
            if done:
                return out
