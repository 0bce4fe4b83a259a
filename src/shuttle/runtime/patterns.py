"""User patterns, compiled for a linear-time engine (RE2), never for a backtracking one.

A built-in object such as ``grep`` runs a pattern any client sends (a keyless node
takes built-in objects from anyone). Python's ``re`` backtracks: ``(a+)+$`` over 29
bytes held a node's GIL for 12 s, and each byte more doubles it. RE2 (google-re2)
matches in time linear in the input whatever the pattern, with bounded memory, and
releases the GIL while it matches.

The syntax stays Python's where RE2 has the same construct (classes, ``\\d\\w\\s\\b``,
``(?i)``, ``(?P<name>...)``, counted repetition up to 1000, ``[[:alpha:]]``). ``\\Z`` is
rewritten to RE2's ``\\z`` (the same meaning). What RE2 cannot do in linear time is
refused with :class:`InvalidArgumentError` naming the construct: backreferences,
look-ahead and look-behind, atomic groups, possessive quantifiers, conditionals.
Flags are RE2's options: ``multiline`` for Python's ``re.MULTILINE``, and
``ignore_case``.

Used at the client too (``runtime/site_probe.py``), so one pattern means the same
everywhere it runs; :func:`compile_pattern` is the one place patterns are compiled.
"""

from __future__ import annotations

import re
from typing import Any

import re2

from shuttle.errors import InvalidArgumentError

#: RE2's memory budget per compiled pattern (its default): a pattern whose automaton
#: needs more is refused at compile time, not run slowly.
PATTERN_MEMORY_BYTES_MAX = 8 << 20
#: Characters of a pattern kept in an error message.
PATTERN_SHOWN_CHARS_MAX = 200

#: Python constructs RE2 does not have, by how they start, with their names.
_UNSUPPORTED = (
    (re.compile(r"\(\?P=\w+\)"), "a named backreference (?P=name)"),
    (re.compile(r"(?<!\\)(?:\\\\)*\\[1-9]"), "a backreference (\\1 to \\9)"),
    (re.compile(r"\(\?<[=!]"), "a look-behind (?<= or (?<!"),
    (re.compile(r"\(\?[=!]"), "a look-ahead (?= or (?!"),
    (re.compile(r"\(\?>"), "an atomic group (?>...)"),
    (re.compile(r"\(\?\("), "a conditional (?(...)...)"),
    (re.compile(r"(?<!\\)[*+?}][+]"), "a possessive quantifier (*+, ++, ?+)"),
)


def compile_pattern(pattern: str, *, ignore_case: bool = False, multiline: bool = True) -> Any:
    """``pattern`` (Python ``re`` syntax, as bytes matched against bytes) for RE2.

    :class:`InvalidArgumentError` naming the construct RE2 refuses (backreference,
    look-around, atomic group, possessive quantifier) or RE2's own complaint."""
    if not isinstance(pattern, str):
        raise InvalidArgumentError(f"a pattern must be a string, got {type(pattern).__name__}")
    shown = _shown(pattern)
    for construct, name in _UNSUPPORTED:
        if construct.search(pattern):
            raise InvalidArgumentError(
                f"pattern {shown} uses {name}, which the linear-time engine (RE2) cannot "
                "match; built-in objects refuse patterns that could take exponential time. "
                "Rewrite it without that construct"
            )
    options = re2.Options()
    options.log_errors = False
    options.max_mem = PATTERN_MEMORY_BYTES_MAX
    options.case_sensitive = not ignore_case
    # Perl syntax (RE2's default): (?:...), (?i), \A, \z; ^ and $ at lines with (?m).
    source = ("(?m)" if multiline else "") + _python_to_re2(pattern)
    try:
        return re2.compile(source.encode(), options)
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args else "invalid"
        raise InvalidArgumentError(f"bad regular expression {shown}: {detail}") from None


def _python_to_re2(pattern: str) -> str:
    """Python's spellings RE2 writes differently: ``\\Z`` (end of text) is ``\\z``."""
    return re.sub(r"(?<!\\)((?:\\\\)*)\\Z", r"\1\\z", pattern)


def _shown(pattern: str) -> str:
    if len(pattern) <= PATTERN_SHOWN_CHARS_MAX:
        return repr(pattern)
    return repr(pattern[: PATTERN_SHOWN_CHARS_MAX - 3] + "...")
