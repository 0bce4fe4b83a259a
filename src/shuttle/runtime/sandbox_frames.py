"""The frames a sandbox worker and its node speak over their socketpair, used by both
sides (:mod:`shuttle.runtime.sandbox` at the node, :mod:`shuttle.runtime.sandbox_worker`
in the worker): the header, the kinds, the size limit, and sending and receiving one
frame.

Every message is a frame: a 13-byte header (the body's length as a big-endian u32,
the kind as a u8, and the CPU seconds a call used as a big-endian double, 0 in other
frames) and the body. Requests and replies strictly alternate, except
that while a call runs the worker may send CALLOUTs (the object calling through a
reference) and the node may, while serving one, call the object again (a nested CALL):

========================  ==============  ============================================
kind                      direction       body
========================  ==============  ============================================
LOAD                      node → worker   values ``[code, rid, params, checkpoint,
                                          cpu_s_per_call, cpu_factor]``
CALL                      node → worker   values ``[method, args, kwargs]``
CHECKPOINT                node → worker   empty
CALLOUT_RESULT            node → worker   values ``result``
CALLOUT_ERROR             node → worker   values ``[code, message]``
STARTED                   worker → node   empty (limits set, ready for LOAD)
JAIL_FAILED               worker → node   UTF-8 text: the jail could not be built (the
                                          step and the kernel's answer); instead of
                                          STARTED, and the worker exits
READY                     worker → node   values ``[type_label, methods, migratable]``
RESULT                    worker → node   values ``result``
RESULT_BYTES              worker → node   the raw bytes
ERROR                     worker → node   values ``[code, message, stop_reason]``
CALLOUT                   worker → node   values ``[ref, method, args, kwargs]``
========================  ==============  ============================================

"values" is :func:`shuttle.runtime.values.pack`. A result that is a bytes-like object
travels as RESULT_BYTES, neither re-encoded nor copied on the way (``sendmsg`` from
the object's buffer, ``recv(MSG_WAITALL)`` into the node's result). An ERROR with a
``stop_reason`` means the worker is exiting (it ran out of memory).
"""

from __future__ import annotations

import socket
import struct

from shuttle.errors import LimitExceededError

#: Largest frame body either side sends or accepts. A checkpoint carries an object's
#: whole state: 64 MiB holds four of the wire's 16 MiB payloads while staying an
#: eighth of the default memory limit, so one message is never most of a worker.
MESSAGE_BYTES_MAX = 64 << 20

#: Body length, kind, CPU seconds of the call a RESULT answers.
FRAME_HEADER = struct.Struct(">IBd")

# Frame kinds (see the table above).
LOAD = 1
CALL = 2
CHECKPOINT = 3
CALLOUT_RESULT = 4
CALLOUT_ERROR = 5
READY = 10
STARTED = 15
RESULT = 11
RESULT_BYTES = 12
ERROR = 13
CALLOUT = 14
JAIL_FAILED = 16


class PeerClosed(Exception):
    """The other end of the socket closed (or died) between or inside frames."""


def send_frame(
    sock: socket.socket, kind: int, *parts: bytes | bytearray | memoryview, cpu_s: float = 0.0
) -> None:
    """Send one frame whose body is ``parts`` concatenated (byte buffers, sent
    without joining them), with ``cpu_s`` in its header. :class:`LimitExceededError`
    past :data:`MESSAGE_BYTES_MAX`; ``OSError`` from the socket passes through."""
    size = sum(len(part) for part in parts)
    if size > MESSAGE_BYTES_MAX:
        raise LimitExceededError(
            f"a {size}-byte message is over the sandbox's limit of {MESSAGE_BYTES_MAX} bytes"
        )
    buffers = [FRAME_HEADER.pack(size, kind, cpu_s), *parts]
    sent = sock.sendmsg(buffers)
    if sent == FRAME_HEADER.size + size:
        return
    # A signal or a full socket buffer cut the send short: send the rest in order.
    for buffer in buffers:
        if sent >= len(buffer):
            sent -= len(buffer)
            continue
        sock.sendall(memoryview(buffer)[sent:])
        sent = 0


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes; :class:`PeerClosed` if the peer closes first.

    One ``recv(MSG_WAITALL)`` straight into the result in the common case; an
    interrupted receive finishes in a buffer (one copy)."""
    if size == 0:
        return b""
    data = sock.recv(size, socket.MSG_WAITALL)
    if len(data) == size:
        return data
    if not data:
        raise PeerClosed("the peer closed the socket")
    buffer = bytearray(size)
    got = len(data)
    buffer[:got] = data
    view = memoryview(buffer)
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise PeerClosed(f"the peer closed the socket {got} bytes into a {size}-byte frame")
        got += n
    return bytes(buffer)


def recv_header(sock: socket.socket) -> tuple[int, int, float]:
    """The next frame's ``(body size, kind, cpu_s)``; :class:`LimitExceededError` if
    the size is over :data:`MESSAGE_BYTES_MAX` (the stream cannot be trusted after that)."""
    size, kind, cpu_s = FRAME_HEADER.unpack(recv_exact(sock, FRAME_HEADER.size))
    if size > MESSAGE_BYTES_MAX:
        raise LimitExceededError(
            f"announced a {size}-byte message, over the limit of {MESSAGE_BYTES_MAX} bytes"
        )
    return size, kind, cpu_s
