"""Run ``async def`` tests without a pytest plugin: each gets its own event loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")


def async_test(fn: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Turn an ``async def`` test into a plain one that runs it with ``asyncio.run``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper
