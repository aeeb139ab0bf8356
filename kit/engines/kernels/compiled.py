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


def compile_modules(roots: list[torch.nn.Module], kind: type[torch.nn.Module]) -> int:
    """``torch.compile`` every ``kind`` module under ``roots`` in place; returns how many.

    Modules of one class share one compiled graph: parameters are graph inputs (dynamo inlines
    nn modules), so 24 or 96 transformer layers compile once, not once each.
    """
    count = 0
    for root in roots:
        for module in root.modules():
            if isinstance(module, kind):
                module.compile()
                count += 1
    return count
