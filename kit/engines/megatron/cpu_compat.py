"""Make megatron-core run on a CPU-only host (gloo), applied only on CPU platforms.

megatron-core assumes CUDA in a few places that the kit's CPU path reaches (0.16.x):

* ``torch.cuda.current_device()`` is used as a device (rotary embeddings, buffers). Here it
  returns ``torch.device("cpu")``, which every such ``.to(device=...)`` / ``device=`` accepts.
* Literal ``device="cuda"`` in the schedules (``total_num_tokens = torch.zeros(...,
  device="cuda")``). A :class:`torch.overrides.TorchFunctionMode` rewrites any ``device``
  argument naming cuda to cpu for every torch call made while the mode is active.
* ``te_general_gemm`` is referenced in the MoE router even without Transformer Engine
  (a NameError in 0.16.1); it is defined as ``None`` so the router takes its torch path.

Nothing here changes numerics: the same torch kernels run, only their device changes.
"""

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


class CudaToCpuMode(TorchFunctionMode):
    """Rewrite ``device=cuda`` arguments (and ``.cuda()`` calls) to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to and args[1:] and _is_cuda(args[1]):
            args = (args[0], torch.device("cpu"), *args[2:])
        return func(*args, **kwargs)


def apply_cpu_compat() -> CudaToCpuMode:
    """Patch this (rank) process for CPU; returns the mode to enter around training."""
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    try:
        from megatron.core.transformer.moe import moe_utils

        if not hasattr(moe_utils, "te_general_gemm"):
            moe_utils.te_general_gemm = None  # type: ignore[attr-defined]
    except ImportError:  # older megatron-core without this module: nothing to fix
        pass
    return CudaToCpuMode()
