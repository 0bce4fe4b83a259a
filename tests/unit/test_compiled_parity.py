"""The compiled hot modules (mypyc, ``shuttle.compiled``) and their pure Python give
identical bytes and errors.

The pure modules cannot share a process with the compiled ones (they would share
names), so the same cases run twice: here, with the compiled modules, and in a
subprocess with ``SHUTTLE_PURE=1``; the two transcripts must be equal. A case's
transcript holds every byte the codec produced, every event or frame it decoded and
every error (type and message). The wire's own tests also run once more under
``SHUTTLE_PURE=1``, so both implementations pass them.

Run as a script (``python tests/unit/test_compiled_parity.py``), this file reads
pickled cases on stdin and writes their pickled transcript on stdout.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shuttle import compiled

ROOT = Path(__file__).resolve().parents[2]
Case = tuple[Any, ...]


# --- the transcript (runs in both processes) ----------------------------------------


def _outcome(call: Callable[[], Any]) -> Any:
    """What ``call`` returned (bytes normalized: which buffer type is not the codec's
    contract, only its contents), or the error it raised, by type and message."""
    try:
        return ("ok", _plain(call()))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


def _plain(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return ("bytes", bytes(value))
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value):
        fields = [f.name for f in dataclasses.fields(value)]
        return (type(value).__name__, [(f, _plain(getattr(value, f))) for f in fields])
    if type(value).__module__.startswith("shuttle."):
        return (type(value).__name__, repr(value))
    return value


def _ready_pair(limits: Any) -> tuple[Any, Any]:
    from shuttle.wire import Challenge, Connection, Hello, Role, Welcome

    client, server = Connection(Role.CLIENT), Connection(Role.SERVER, limits)
    client.receive_event(server.send_bytes(Challenge(bytes(32), False, "blake3-keyed-v1")))
    server.receive_event(client.send_bytes(Hello(2, 2, "parity")))
    client.receive_event(server.send_bytes(Welcome(2, "n1", limits.to_wire())))
    return client, server


def _drain(conn: Any, out: list[Any]) -> None:
    from shuttle.wire import NEED_DATA

    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            return
        out.append(_plain(event))


def run_case(case: Case) -> Any:
    """One case's transcript."""
    from shuttle.wire import Limits
    from shuttle.wire.events import FrameKind
    from shuttle.wire.frames import FrameReader, encode_frame_fast, nested_too_deep

    what = case[0]
    if what == "encode":
        _, kind, header, payload, hmax, pmax, join = case
        return _outcome(
            lambda: encode_frame_fast(FrameKind(kind), header, payload, hmax, pmax, join)
        )
    if what == "nested":
        return _outcome(lambda: nested_too_deep(case[1], case[2]))
    if what == "reader":  # a byte stream through a bare reader, in chunks
        _, stream, sizes, hmax, pmax, grow = case
        reader = FrameReader(header_bytes_max=hmax, payload_bytes_max=pmax, grow_payloads=grow)
        out: list[Any] = [_outcome(lambda: reader.whole_frame(stream))]
        pos = 0
        try:
            for size in [*sizes, len(stream)]:
                reader.feed(stream[pos : pos + size])
                pos += size
                while (frame := reader.next_frame()) is not None:
                    out.append(_plain(frame))
                out.append((reader.buffered_bytes, reader.at_frame_boundary()))
        except Exception as exc:
            out.append(("error", type(exc).__name__, str(exc)))
        return out
    if what == "call":  # one call through a handshaked pair, fast lanes and long way
        _, rid, op, args, payload, result, reply, hmax, pmax, join = case
        limits = Limits(header_bytes_max=hmax, payload_bytes_max=pmax)
        client, server = _ready_pair(limits)
        out = [_outcome(lambda: client.send_request(rid, op, args, payload, join_below=join))]
        if out[0][0] != "ok":
            return out
        wire = b"".join(out[0][1][i][1] for i in range(len(out[0][1])))
        got = _outcome(lambda: server.receive_request(wire))
        out.append(got)
        if got == ("ok", None):  # not the fast lane's: the long way says what it is
            out.append(_outcome(lambda: server.receive_event(wire)))
        sent = _outcome(lambda: server.send_response(rid, result, reply, join_below=join))
        out.append(sent)
        if sent[0] == "ok":
            back = b"".join(part[1] for part in sent[1])
            first = _outcome(lambda: client.receive_response(back))
            out.append(first)
            if first == ("ok", None):
                out.append(_outcome(lambda: client.receive_event(back)))
        return out
    if what == "stream":  # arbitrary bytes reaching a ready node or client, chunked
        _, role, stream, sizes, hmax, pmax = case
        limits = Limits(header_bytes_max=hmax, payload_bytes_max=pmax)
        client, server = _ready_pair(limits)
        conn = server if role == "server" else client
        if role == "client":  # responses need requests in flight
            for rid in range(1, 4):
                client.send_request(rid, "op", {})
        out = []
        pos = 0
        try:
            for size in [*sizes, len(stream)]:
                chunk = stream[pos : pos + size]
                pos += size
                if chunk:
                    conn.receive_data(chunk)
                    _drain(conn, out)
            out.append(conn.partial_frame)
        except Exception as exc:
            out.append(("error", type(exc).__name__, str(exc)))
        return out
    raise AssertionError(f"unknown case {what!r}")


# --- the cases ----------------------------------------------------------------------


def _value(rng: random.Random, depth: int) -> Any:
    pick = rng.randrange(9 if depth < 4 else 6)
    if pick == 0:
        return rng.choice([0, 1, -1, 127, 128, 255, 256, 65535, 1 << 32, -(1 << 40), 1 << 63])
    if pick == 1:
        return "".join(rng.choice("aé/_0 \u2603") for _ in range(rng.randrange(40)))
    if pick == 2:
        return rng.randbytes(rng.randrange(40))
    if pick == 3:
        return rng.choice([None, True, False, 0.5, -1e300])
    if pick == 4:
        return "x" * rng.choice([31, 32, 255, 256, 65536])
    if pick == 5:
        return rng.randrange(1 << 20)
    if pick == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    if pick == 7:
        return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(5))}
    nest: Any = 1
    for _ in range(rng.choice([3, 63, 64, 65, 80])):
        nest = [nest] if rng.random() < 0.5 else {"n": nest}
    return nest


def _payload(rng: random.Random) -> bytes:
    size = rng.choice([0, 0, 1, 100, 4096, 4096, (64 << 10) - 1, 64 << 10, (64 << 10) + 7])
    return rng.randbytes(size)


def _frame(rng: random.Random) -> bytes:
    from shuttle.wire.events import FrameKind
    from shuttle.wire.frames import encode_frame_fast

    kind = rng.choice([FrameKind.REQUEST, FrameKind.RESPONSE, FrameKind.ERROR, FrameKind.GOODBYE])
    header: Any
    if kind is FrameKind.REQUEST:
        header = [rng.choice([1, 2, 2, 0, -1, "x"]), rng.choice(["read", "", "x" * 200]), {}]
    elif kind is FrameKind.RESPONSE:
        header = [rng.choice([1, 2, 3, 9]), _value(rng, 2)]
    elif kind is FrameKind.ERROR:
        header = [rng.choice([0, 1, 2]), "not_found", "gone"]
    else:
        header = rng.choice([{"reason": "bye"}, [1]])
    if rng.random() < 0.2:
        header = _value(rng, 0)
    return b"".join(encode_frame_fast(kind, header, _payload(rng), 1 << 20, 16 << 20))


def _corrupt(rng: random.Random, data: bytes) -> bytes:
    if not data or rng.random() < 0.4:
        return data
    buf = bytearray(data)
    how = rng.randrange(4)
    if how == 0:  # flip a byte, most often in the prefix or header
        at = rng.randrange(min(len(buf), 40))
        buf[at] ^= 1 << rng.randrange(8)
    elif how == 1:
        del buf[rng.randrange(len(buf)) :]
    elif how == 2:
        buf[rng.randrange(len(buf))] = rng.randrange(256)
    else:
        buf += rng.randbytes(rng.randrange(1, 30))
    return bytes(buf)


def _sizes(rng: random.Random, total: int) -> list[int]:
    if rng.random() < 0.3:
        return []
    return [rng.choice([1, 2, 11, 12, 13, 100, 4096, 70000]) for _ in range(rng.randrange(1, 8))]


def cases(seed: int, count: int) -> list[Case]:
    rng = random.Random(seed)
    limits = [(1 << 20, 16 << 20), (64, 16 << 20), (1 << 20, 100), (1 << 20, 70000)]
    out: list[Case] = []
    for _ in range(count):
        hmax, pmax = rng.choice(limits)
        what = rng.randrange(5)
        if what == 0:
            out.append(
                ("encode", rng.randrange(1, 8), _value(rng, 0), _payload(rng), hmax, pmax,
                 rng.choice([0, 1 << 16]))
            )  # fmt: skip
        elif what == 1:
            out.append(("nested", _value(rng, 0), rng.choice([0, 1, 3, 64])))
        elif what == 2:
            stream = _corrupt(rng, b"".join(_frame(rng) for _ in range(rng.randrange(1, 4))))
            out.append(("reader", stream, _sizes(rng, len(stream)), hmax, pmax, rng.random() < 0.5))
        elif what == 3:
            # Well-typed calls only: compiled code checks argument types (TypeError),
            # pure Python does not; mypy keeps every caller to the annotations.
            args = {"key": "k", "offset": 4096, "x": _value(rng, 1)}
            out.append(
                ("call", rng.choice([1, 7, 1 << 40]), rng.choice(["read", "", "x" * 129]), args,
                 _payload(rng), _value(rng, 1), _payload(rng), hmax, pmax,
                 rng.choice([0, 1 << 16]))
            )  # fmt: skip
        else:
            stream = _corrupt(rng, b"".join(_frame(rng) for _ in range(rng.randrange(1, 4))))
            out.append(
                ("stream", rng.choice(["server", "client"]), stream, _sizes(rng, len(stream)),
                 hmax, pmax)
            )  # fmt: skip
    return out


def transcript(batch: list[Case]) -> list[Any]:
    return [run_case(case) for case in batch]


def _pure_transcript(batch: list[Case]) -> list[Any]:
    env = {**os.environ, compiled.PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, __file__],
        input=pickle.dumps(batch),
        capture_output=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    result: list[Any] = pickle.loads(done.stdout)
    return result


# --- the tests ----------------------------------------------------------------------

needs_compiled = pytest.mark.skipif(
    not compiled.active().compiled,
    reason=f"compiled modules not in use: {compiled.active().reason}",
)


def test_the_compiled_build_is_current() -> None:
    """A stale build would silently test (and run) the pure modules: fail loudly instead.
    ``SHUTTLE_PURE=1`` runs deliberately without the compiled modules."""
    if os.environ.get(compiled.PURE_ENV, "") not in ("", "0"):
        pytest.skip(f"{compiled.PURE_ENV} is set")
    status = compiled.check()
    assert status.compiled, (
        f"Shuttle's compiled modules are {status.reason}. "
        "Set SHUTTLE_PURE=1 to test the pure modules alone."
    )


@needs_compiled
def test_the_compiled_modules_are_the_ones_imported() -> None:
    import importlib

    for name in compiled.BUILT:  # the C extensions too: their users fall back quietly
        module = importlib.import_module(name)
        assert compiled.is_compiled(module), f"{name} came from {module.__file__}"


@needs_compiled
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compiled_and_pure_give_identical_bytes_and_errors(seed: int) -> None:
    batch = cases(seed, 400)
    ours, theirs = transcript(batch), _pure_transcript(batch)
    assert len(ours) == len(theirs) == len(batch)
    for case, mine, pure in zip(batch, ours, theirs, strict=True):
        assert mine == pure, f"compiled and pure differ on {str(case)[:300]}"
    # The cases reach the errors, not only the happy path.
    flat = repr(ours)
    for error in ("RemoteProtocolError", "LimitExceededError", "RequestRejected"):
        assert error in flat, f"no case of seed {seed} reached {error}"


@needs_compiled
def test_the_wire_tests_pass_on_the_pure_modules_too() -> None:
    """The codec's own tests, once more with SHUTTLE_PURE=1 (this run has the compiled)."""
    env = {**os.environ, compiled.PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "tests/unit/wire"],
        cwd=ROOT, env=env, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout.decode(errors="replace")[-3000:]


def test_shuttle_pure_forces_the_pure_modules() -> None:
    env = {**os.environ, compiled.PURE_ENV: "1"}
    code = (
        "import shuttle.wire.frames as f, shuttle.compiled as c; "
        "print(c.is_compiled(f), c.active().compiled)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, check=True, timeout=60
    )
    assert done.stdout.split() == [b"False", b"False"]


if __name__ == "__main__":
    sys.stdout.buffer.write(pickle.dumps(transcript(pickle.loads(sys.stdin.buffer.read()))))
