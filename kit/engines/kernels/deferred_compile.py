"""Import a framework without importing torch's compiler stack until something compiles.

megatron-core decorates about thirty small functions with ``jit_fuser``, which is
``torch.compile``. Decorating compiles nothing (compilation happens at the first call), but it
imports ``torch._dynamo`` and inductor at once: most of megatron-core's import time (about 60%
on a 2-core CPU host), paid even by runs that never call those functions (the cpu platform, a
layout without bias fusions). While :func:`deferred_torch_compile` is active, ``torch.compile``
returns a wrapper that calls the real ``torch.compile`` with the same arguments at its first
call, so the compiler is imported when, and only if, a decorated function runs.
"""

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _deferred(real: Callable[..., Any]) -> Callable[..., Any]:
    """A ``torch.compile`` that defers the real one to the compiled function's first call."""

    def compile_later(model: Any = None, **kwargs: Any) -> Any:
        if model is None:  # @torch.compile(**options)
            return lambda fn: compile_later(fn, **kwargs)
        if not inspect.isfunction(model):  # modules and the like: nothing to gain
            return real(model, **kwargs)
        compiled: Callable[..., Any] | None = None

        @functools.wraps(model)
        def call(*args: Any, **kw: Any) -> Any:
            nonlocal compiled
            if torch.compiler.is_compiling():  # traced inside a compiled region: inline it,
                return model(*args, **kw)      # as dynamo does a compiled function
            if compiled is None:
                compiled = real(model, **kwargs)
            return compiled(*args, **kw)

        return call

    return compile_later


@contextmanager
def deferred_torch_compile() -> Iterator[None]:
    """Within the block, ``torch.compile(fn)`` compiles ``fn`` at its first call and imports
    nothing now; functions decorated inside keep that behaviour after the block."""
    real = torch.compile
    torch.compile = _deferred(real)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.compile = real  # type: ignore[assignment]
