"""Gradient norm, clipping and parameter copies as torch ``_foreach`` kernels.

Without Transformer Engine or apex, megatron-core's optimizer falls back to
``local_multi_tensor_l2_norm`` and ``local_multi_tensor_scale``: one kernel per tensor, and
the norm gathers every per-tensor norm to the host (``torch.tensor`` of ~300 GPU scalars is
~300 synchronizations per step). These drop-ins keep the interface of apex's
``amp_C.multi_tensor_l2norm`` / ``multi_tensor_scale`` (as called through megatron-core's
``local_multi_tensor_applier``) and stay on the device.
"""

from typing import Any

import torch


def l2_norm(_chunk_size: int, _noop_flag: Any, tensor_lists: list[list[torch.Tensor]],
            _per_tensor: bool, *_: Any) -> tuple[torch.Tensor, None]:
    """The L2 norm over all tensors of ``tensor_lists[0]``, as a one-element fp32 tensor."""
    norms = torch._foreach_norm(tensor_lists[0])
    return torch.linalg.vector_norm(torch.stack(norms).float()).reshape(1), None


def scale(_chunk_size: int, _noop_flag: Any, tensor_lists: list[list[torch.Tensor]],
          factor: float) -> None:
    """``dst = src * factor`` over two lists; in place when they are the same tensors.

    (Between different tensors the copy comes first and the product is taken in ``dst``'s
    dtype; megatron-core copies with factor 1.0 and scales only in place.)
    """
    src, dst = tensor_lists
    if all(s is d for s, d in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, factor)
        return
    torch._foreach_copy_(dst, src)
    if factor != 1.0:
        torch._foreach_mul_(dst, factor)
