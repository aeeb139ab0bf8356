"""The DeepSpeed config (the JSON dict ``deepspeed.initialize`` takes) for a kit run.

Mapping of the kit's options:

* ``--zero N`` -> ``zero_optimization.stage``; ``--offload`` -> ``offload_optimizer`` on the
  host (optimizer states and step in CPU memory, DeepSpeed's CPU Adam).
* ``--overlap`` -> ``zero_optimization.overlap_comm`` (reduce / gather overlapped with compute);
  always on under ``--zero 3``, as DeepSpeed itself defaults it for stage 3.
* ``--zero 3``: bucket, prefetch and persistence sizes from the model's layer size, and on a GPU,
  for a model whose weights fit a device easily, gathered weights kept for the whole step
  (:func:`zero3_options`); the engine also makes each transformer block one ZeRO-3 leaf.
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

from kit.config.run import RunConfig
from kit.config.workload import WorkloadSpec
from kit.metrics.flops import params_count

GiB = 2**30

KEEP_GATHERED_MEMORY_FRAC = 0.25
"""ZeRO-3 keeps every parameter it gathered until the step ends when the whole model's bf16
weights take at most this share of a device's memory (see :func:`zero3_options`)."""


def layer_params(workload: WorkloadSpec) -> int:
    """Parameters of one transformer layer (norms, attention, MLP and their biases)."""
    one, two = (params_count(workload.model_copy(update={"num_layers": n})) for n in (1, 2))
    return two - one


def zero3_options(cfg: RunConfig) -> dict[str, Any]:
    """ZeRO-3's bucket, prefetch and persistence sizes, derived from the model's shape.

    DeepSpeed's defaults are fixed element counts (prefetch 5 x 10^7, reduce bucket 5 x 10^8,
    persistence 10^5) whatever the model; these follow its layers instead:

    * ``stage3_param_persistence_threshold`` = 10 x hidden (the value DeepSpeed's Hugging Face
      integration derives for ``auto``): norms and biases stay whole on every rank, so none of
      those latency-bound gathers run, while every weight matrix (>= hidden^2) is sharded.
    * ``stage3_prefetch_bucket_size`` = two layers' parameters: the next layer's weights are
      gathered in full while this one computes (DeepSpeed's 0.9 x hidden^2 ``auto`` is less
      than one attention projection, so its prefetch never runs a layer ahead).
    * ``reduce_bucket_size`` = one layer's parameters: one gradient reduce-scatter per layer,
      overlapped with the previous layer's backward (``overlap_comm``, which
      :func:`deepspeed_config` keeps on for ZeRO-3), into ``contiguous_gradients`` buffers.

    On a GPU, when the whole model's bf16 weights take at most
    :data:`KEEP_GATHERED_MEMORY_FRAC` of a device's memory, ``stage3_max_live_parameters`` and
    ``stage3_max_reuse_distance`` are raised to the model's size: by default ZeRO-3 frees each
    layer's gathered weights after use and gathers them again in the backward and in every
    micro-batch's forward, which for such a model doubles the all-gathers for no memory it
    needs. Optimizer states and gradients stay sharded as ZeRO-3 shards them.
    """
    w = cfg.workload
    layer = layer_params(w)
    options: dict[str, Any] = {
        "contiguous_gradients": True,
        "reduce_bucket_size": layer,
        "stage3_prefetch_bucket_size": 2 * layer,
        "stage3_param_persistence_threshold": 10 * w.hidden_size,
    }
    memory = cfg.platform.memory_per_device_gib
    params = params_count(w)
    if not cfg.platform.is_cpu and memory is not None and (
            2 * params <= KEEP_GATHERED_MEMORY_FRAC * memory * GiB):
        options.update(stage3_max_live_parameters=params, stage3_max_reuse_distance=params)
    return options


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
    # ZeRO-3 overlaps always (DeepSpeed's own default for stage 3): without it the parameter
    # all-gathers and gradient reduce-scatters run on the compute stream and no prefetch hides
    zero: dict[str, Any] = {"stage": o.zero, "overlap_comm": o.overlap or o.zero == 3}
    if o.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": not cpu}
    if o.zero == 3:
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
