"""The DeepSpeed config (the JSON dict ``deepspeed.initialize`` takes) for a kit run.

Mapping of the kit's options:

* ``--zero N`` -> ``zero_optimization.stage``; ``--offload`` -> ``offload_optimizer`` on the
  host (optimizer states and step in CPU memory, DeepSpeed's CPU Adam).
* ``--overlap`` -> ``zero_optimization.overlap_comm`` (reduce / gather overlapped with compute).
* ``--zero 3`` on a GPU, for a model whose weights fit a device easily: gathered weights are kept
  for the whole step (:func:`zero3_options`).
* micro-batch, global batch and DP -> ``train_micro_batch_size_per_gpu``,
  ``gradient_accumulation_steps`` and ``train_batch_size``.
* dtype bf16 / fp16 -> DeepSpeed's mixed precision (fp32 master weights in the optimizer).

Optimizer and clipping match the megatron engine's GPU path: AdamW, betas (0.9, 0.95), weight
decay 0.1, constant learning rate, gradient clipping at 1.0. Without offload it is torch's
AdamW (``torch_adam``; fused on GPUs), so no DeepSpeed op has to be compiled for it. With
offload on a GPU it is DeepSpeed's CPU Adam (what ZeRO-Offload is built around; its C++ op is
compiled on first use). On the cpu platform, where the "device" already is the host, the
offloaded step runs torch's AdamW too (``zero_force_ds_cpu_optimizer`` off): the same AdamW
update without a ~4.5 min build of ``cpu_adam`` on 2 cores; ZeRO's offload path (fp32 states
and step in host buffers, gradients copied out) is the same.
"""

from typing import Any

from kit.analysis.flops import params_count
from kit.spec.run import RunConfig

GiB = 2**30

KEEP_GATHERED_MEMORY_FRAC = 0.25
"""ZeRO-3 keeps every parameter it gathered until the step ends when the whole model's bf16
weights take at most this share of a device's memory (see :func:`zero3_options`)."""


def zero3_options(cfg: RunConfig) -> dict[str, Any]:
    """ZeRO-3 settings for speed on a GPU, where memory allows.

    By default ZeRO-3 frees each layer's gathered weights after using them and gathers them
    again in the backward and in every micro-batch's forward: for a model whose bf16 weights
    fit easily on one device that doubles the all-gathers and runs DeepSpeed's per-module
    fetch and release hooks on the host for nothing. When the whole model's bf16 weights take
    at most :data:`KEEP_GATHERED_MEMORY_FRAC` of a device's memory, ``stage3_max_live_parameters``
    and ``stage3_max_reuse_distance`` are raised to the model's size (no gathered parameter is
    released while it will be used again in the step), parameters under 10^6 elements stay
    whole on every rank (``stage3_param_persistence_threshold``: norms and biases, no gathers)
    and the prefetch bucket grows to 5 x 10^8 elements. Optimizer states and gradients stay
    sharded as ZeRO-3 shards them. Larger models keep DeepSpeed's defaults.
    """
    memory = cfg.platform.memory_per_device_gib
    params = params_count(cfg.workload)
    if cfg.platform.is_cpu or memory is None or (
            2 * params > KEEP_GATHERED_MEMORY_FRAC * memory * GiB):
        return {}
    return {
        "stage3_max_live_parameters": params,
        "stage3_max_reuse_distance": params,
        "stage3_param_persistence_threshold": 1_000_000,
        "stage3_prefetch_bucket_size": 500_000_000,
    }


def deepspeed_config(cfg: RunConfig) -> dict[str, Any]:
    """DeepSpeed's config dict for ``cfg``."""
    o = cfg.optim
    optimizer_params: dict[str, Any] = {
        "lr": cfg.lr,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
        "weight_decay": 0.1,
    }
    cpu = cfg.platform.is_cpu
    if cpu or not o.offload:
        optimizer_params["torch_adam"] = True
    if not cpu and not o.offload:
        optimizer_params["fused"] = True
    zero: dict[str, Any] = {"stage": o.zero, "overlap_comm": o.overlap}
    if o.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": not cpu}
    elif o.zero == 3:
        zero.update(zero3_options(cfg))
    return {
        "train_batch_size": cfg.global_batch_size,
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": cfg.grad_accum_steps,
        "optimizer": {"type": "AdamW", "params": optimizer_params},
        "gradient_clipping": 1.0,
        "zero_force_ds_cpu_optimizer": not cpu,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.dtype == "bf16"},
        "fp16": {"enabled": cfg.dtype == "fp16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        "dump_state": False,
    }
