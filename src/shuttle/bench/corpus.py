"""A generated text corpus for grep benchmarks: reproducible from its seed alone.

The issue-24 validation needs a corpus that is not the Python standard library (which
the simulator's agrep trace already searched) and that anyone can make again without
a download. :func:`generate_corpus` writes prose-like text: a vocabulary of
pseudo-words (lower-case letters, 2-12 long), word frequencies following Zipf's law as
natural text does, lines of 4-16 words, file sizes log-normal (median and spread
given), all drawn from one NumPy ``PCG64`` generator seeded by ``seed``. The same
spec gives the same bytes: :func:`corpus_digest` names them (the validation records it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shuttle.errors import ConfigError

#: Distinct words: enough that a short pattern matches a realistic share of lines.
VOCABULARY_WORDS = 20_000
#: Zipf exponent of word frequencies (natural language: about 1).
ZIPF_EXPONENT = 1.07
_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


@dataclass(frozen=True)
class CorpusSpec:
    """How many files, their size distribution, and the seed."""

    files: int = 1200
    median_bytes: int = 8192
    #: Standard deviation of log(size): 1.0 gives sizes from about 1 KiB to 100 KiB.
    sigma: float = 1.0
    seed: int = 24
    #: Key prefix of the files (``corpus/00017.txt``).
    prefix: str = "corpus/"

    def __post_init__(self) -> None:
        if self.files < 1:
            raise ConfigError(f'"files" must be >= 1, got {self.files!r}')
        if self.median_bytes < 16:
            raise ConfigError(f'"median_bytes" must be >= 16, got {self.median_bytes!r}')
        if not self.sigma >= 0:
            raise ConfigError(f'"sigma" must be >= 0, got {self.sigma!r}')

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _vocabulary(rng: np.random.Generator) -> list[bytes]:
    lengths = rng.integers(2, 13, size=VOCABULARY_WORDS)
    letters = _LETTERS[rng.integers(0, 26, size=int(lengths.sum()))].tobytes()
    words, at = [], 0
    for n in lengths.tolist():
        words.append(letters[at : at + n])
        at += n
    return words


def generate_corpus(spec: CorpusSpec) -> Iterator[tuple[str, bytes]]:
    """``(key, text)`` for each file of the corpus, in order."""
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    words = _vocabulary(rng)
    ranks = np.arange(1, VOCABULARY_WORDS + 1, dtype=np.float64)
    weights = ranks**-ZIPF_EXPONENT
    cumulative = np.cumsum(weights / weights.sum())
    sizes = np.exp(rng.normal(np.log(spec.median_bytes), spec.sigma, size=spec.files))
    width = len(str(spec.files - 1))
    for index, target in enumerate(sizes.astype(np.int64).tolist()):
        target = max(16, target)
        # Draw words in bulk (about 6.5 bytes each with their space), then cut lines.
        count = target // 5 + 16
        picks = np.searchsorted(cumulative, rng.random(count)).tolist()
        per_line = rng.integers(4, 17, size=count // 4 + 1).tolist()
        lines, at, size = [], 0, 0
        for n in per_line:
            if size >= target or at >= count:
                break
            line = b" ".join(words[i] for i in picks[at : at + n])
            at += n
            lines.append(line)
            size += len(line) + 1
        yield f"{spec.prefix}{index:0{width}d}.txt", b"\n".join(lines) + b"\n"


def corpus_digest(spec: CorpusSpec) -> tuple[str, int]:
    """The corpus's SHA-256 over its keys and contents in order, and its bytes."""
    digest = hashlib.sha256()
    total = 0
    for key, data in generate_corpus(spec):
        digest.update(key.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        total += len(data)
    return digest.hexdigest(), total
