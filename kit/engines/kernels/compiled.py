"""``torch.compile`` for the engine's small element-wise functions, on CUDA only.

Each function is pure tensor arithmetic on fixed shapes, so inductor turns it into one Triton
kernel with no graph breaks; on other devices (the CPU platform, tests) it runs eagerly.
"""

from collections.abc import Callable
from functools import cache

import torch


@cache
def compiled(fn: Callable[..., torch.Tensor], device_type: str) -> Callable[..., torch.Tensor]:
    """``fn`` compiled for CUDA (fixed shapes: one compile per run), ``fn`` itself elsewhere."""
    if device_type != "cuda":
        return fn
    return torch.compile(fn, dynamic=False, fullgraph=True)
