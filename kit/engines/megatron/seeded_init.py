"""Initialize weights so that the same seed gives the same model under every parallel layout.

megatron-core draws initial weights from one generator in module construction order. A rank
that builds fewer modules (a later pipeline stage, a slice of the experts) therefore draws
different numbers for the same weight than a one-process run does, and PP or EP runs cannot
be compared with their one-process equivalent. Here every random weight is redrawn from a
generator keyed by the seed and the weight's *global* name (global layer number, global expert
index), the full tensor is built and this rank keeps its tensor-parallel slice exactly as
megatron-core's CPU initialization slices it. Distributions are megatron-core's own
(``config.init_method`` / ``config.output_layer_init_method``). Norm weights and biases are
constants already and are left alone. Used on the CPU platform, where models are small and
layout parity is what tests check.
"""

import re
import zlib
from typing import Any

import torch

_LAYER = re.compile(r"^(.*?decoder\.layers\.)(\d+)(\..*)$")
_EXPERT = re.compile(r"^(.*\.local_experts\.)(\d+)(\..*)$")
_OUTPUT_INIT = ("linear_proj.weight", "linear_fc2.weight")


def _global_name(name: str, layer_numbers: dict[int, int], experts: tuple[int, int]) -> str:
    """``name`` with its local layer and expert indices replaced by global ones."""
    m = _LAYER.match(name)
    if m:
        name = f"{m[1]}{layer_numbers[int(m[2])]}{m[3]}"
    m = _EXPERT.match(name)
    if m:
        ep_rank, num_local = experts
        name = f"{m[1]}{ep_rank * num_local + int(m[2])}{m[3]}"
    return name


def _tp_slice(full: torch.Tensor, param: torch.nn.Parameter, rank: int, size: int,
              stride: int) -> torch.Tensor:
    """This rank's part of ``full``, as megatron-core's ``_initialize_affine_weight_cpu``."""
    dim = param.partition_dim  # type: ignore[attr-defined]
    per_stride = param.shape[dim] // stride
    return torch.cat(torch.split(full, per_stride, dim=dim)[rank::size], dim=dim)


def reinit_layout_invariant(chunk: torch.nn.Module, config: Any, seed: int) -> None:
    """Redraw the random weights of one model chunk from (seed, global name) generators."""
    from megatron.core import parallel_state as ps

    layers = getattr(getattr(chunk, "decoder", None), "layers", [])
    layer_numbers = {i: layer.layer_number - 1 for i, layer in enumerate(layers)}
    num_local = config.num_moe_experts // ps.get_expert_model_parallel_world_size() \
        if config.num_moe_experts else 0
    experts = (ps.get_expert_model_parallel_rank(), num_local)
    tied = getattr(chunk, "share_embeddings_and_output_weights", False)
    for name, param in chunk.named_parameters():
        if param.dim() < 2:
            continue
        if tied and name == "output_layer.weight":
            name = "embedding.word_embeddings.weight"
        key = _global_name(name, layer_numbers, experts)
        expert = ".local_experts." in name
        tp_rank = ps.get_expert_tensor_parallel_rank() if expert \
            else ps.get_tensor_model_parallel_rank()
        tp_size = ps.get_expert_tensor_parallel_world_size() if expert \
            else ps.get_tensor_model_parallel_world_size()
        sharded = getattr(param, "tensor_model_parallel", False) and tp_size > 1
        shape = list(param.shape)
        if sharded:
            shape[param.partition_dim] *= tp_size  # type: ignore[attr-defined]
        full = torch.empty(shape, dtype=torch.float32)
        init = config.output_layer_init_method if name.endswith(_OUTPUT_INIT) \
            else config.init_method
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed((seed * 1_000_003 + zlib.crc32(key.encode())) % 2**63)
            init(full)
        if sharded:
            # a gated fc1 holds [gate; up]: each rank keeps its slice of both halves
            stride = 2 if config.gated_linear_unit and name.endswith("linear_fc1.weight") else 1
            full = _tp_slice(full, param, tp_rank, tp_size, stride)
        with torch.no_grad():
            param.copy_(full)
