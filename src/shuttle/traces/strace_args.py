"""strace's argument text: the arguments of one call split at top-level commas, and
a quoted string argument decoded (:mod:`shuttle.traces.strace` reads the calls)."""

from __future__ import annotations

import codecs


def split_args(text: str) -> list[str]:
    """Split strace's argument text at top-level commas.

    Commas inside strings (with backslash escapes), ``{...}``, ``[...]`` and
    ``(...)`` do not split. Raises :class:`ValueError` on an unterminated string.
    """
    args: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                raise ValueError("unterminated string")
        elif c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    tail = text[start:].strip()
    if tail or args:
        args.append(tail)
    return args


def decode_string(arg: str) -> str:
    """The text of a strace string argument (``"a\\tb"`` → ``a<TAB>b``).

    A trailing ``...`` (truncated by ``-s``) is dropped. Raises :class:`ValueError`
    if ``arg`` is not a quoted string.
    """
    if arg.endswith("..."):
        arg = arg[:-3]
    if len(arg) < 2 or arg[0] != '"' or arg[-1] != '"':
        raise ValueError(f"expected a quoted string, got {arg[:60]!r}")
    body = arg[1:-1]
    if "\\" not in body:
        return body
    raw, _ = codecs.escape_decode(body.encode("utf-8", "surrogateescape"))
    return bytes(raw).decode("utf-8", "surrogateescape")
