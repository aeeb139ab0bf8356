"""Make megatron-core run on a CPU-only host over gloo; applied only on CPU platforms.

megatron-core assumes CUDA in places every parallel layout reaches. This module is the one
place that patches them, for megatron-core 0.16 to 0.19 (every patched name exists in 0.16.1
and 0.19.2). :func:`apply_cpu_compat` patches this rank process and returns a
:class:`CudaToCpuMode` to enter around training.

* **Device queries.** ``torch.cuda.current_device()`` is used as a device in ~120 places
  (buffers, rotary embeddings, DDP grad buffers, the distributed optimizer) and formatted
  into ``f"cuda:{...}"`` by Megatron-FSDP. It returns index 0 (a marked ``int``), which
  :class:`CudaToCpuMode` maps to the CPU wherever a device is passed.
* **Literal cuda devices.** ``device="cuda"``, ``.cuda()`` and ``.to("cuda")`` in the schedules,
  p2p communication and buffers. :class:`CudaToCpuMode`, a ``TorchFunctionMode``, rewrites
  them to the CPU for every torch call made while it is active.
* **Pinned staging.** Under context parallelism the rotary embedding picks its rank's chunks
  with an index built in pinned host memory (``pin_memory=True``) for a copy to the GPU;
  there is no pinned allocator without an accelerator, so the mode drops the flag.
* **Tensor type names.** Grad clipping and the (distributed) optimizer assert
  ``param.type() == 'torch.cuda.FloatTensor'``; inside the mode ``Tensor.type()`` of a CPU
  tensor reports its cuda name. Nothing else changes: the same CPU tensor is used.
* **Streams and events.** ``torch.cuda.Stream/Event/current_stream/default_stream/stream/
  synchronize/is_current_stream_capturing`` (MoE dispatcher, 0.19 grad sync) become no-ops:
  CPU ops run in program order, which is what a single stream gives.
* **RNG tracker.** megatron's ``CudaRNGStatesTracker`` saves and restores the cuda generator
  (sequence-parallel regions, expert init, recomputation fork it). Its state accessors are
  mapped to the CPU default generator, so forks and recompute replay the CPU stream exactly.
* **MoE.** ``te_general_gemm`` is referenced by the router without Transformer Engine (a
  NameError in 0.16.1): it is defined as ``None`` so the router takes its torch path. The
  alltoall dispatcher moves its split sizes to host only when they are on cuda; on CPU they
  stayed tensors, which gloo's ``all_to_all_single`` refuses: they become host arrays too.
* **Uneven collectives.** Under TP + SP the alltoall dispatcher all-gathers and
  reduce-scatters token slices of different lengths per rank (list forms of
  ``all_gather`` / ``reduce_scatter``). NCCL takes uneven sizes, gloo refuses them: here they
  are padded to the longest slice for ``all_gather`` and done as an ``all_reduce`` of the
  concatenation for ``reduce_scatter`` (the same sums).
* **Sequence parallelism.** megatron-core refuses torch ``LayerNorm`` under SP; the kit's
  :mod:`~kit.engines.megatron.norms` supplies norms whose params are tagged
  ``sequence_parallel=True`` (so their grads are all-reduced over TP).
* **Pipeline p2p over gloo.** With ``batch_p2p_comm=True`` interleaved PP with PP=2 sends an
  activation and a gradient to the same peer in one batch with the same tag, and gloo may
  deliver them swapped: a silent wrong result. :func:`cpu_config_overrides` turns batching off
  on CPU (megatron then orders sends and receives by rank parity, which gloo matches).

* **Backward under the mode.** A ``TorchFunctionMode`` is switched off while it handles a
  call, so hooks that run inside ``torch.autograd.backward`` (Megatron-FSDP allocates its
  gradient buckets there) would see cuda devices. :func:`cpu_config_overrides` sets
  ``deallocate_pipeline_outputs``, which makes megatron's schedules call the autograd engine
  directly (``custom_backward``, the same gradients), so the mode stays on in the hooks.
  Recomputation's own backward (``CheckpointFunction`` calls ``torch.autograd.backward``,
  which torch 2.13 made overridable) is run by the mode with itself kept on
  (:func:`_backward_under`): ``--recompute full`` with SP or with the MoE alltoall dispatcher.
* **Megatron-FSDP.** Its gradient reduction fuses the division into NCCL's ``PREMUL_SUM``,
  which gloo lacks; the engine turns that fusion off on CPU (scale, then sum: the same
  result). Its DTensor meshes say ``device_type="cuda"`` but are built from gloo groups
  (``DeviceMesh.from_group``) and hold CPU tensors, which works as it is. Its parameter
  all-gathers are made synchronous (:func:`_patch_megatron_fsdp_gathers`): full sharding
  always issues them asynchronously (prefetching the next units and, after each optimizer
  step, the next step's), and over gloo that corrupted a rank's heap (SIGABRT:
  ``malloc(): unaligned tcache chunk detected``, ``free(): invalid size``) in 8 of 12 runs of
  40 to 80 steps (DP2 and TP2 x DP2, megatron-core 0.16.1, torch 2.13, a 2-core host), against
  0 of 11 runs of 60 to 80 steps with synchronous gathers (mixtral-tiny DP2 among them). The
  gathered values are the same; on a CPU the overlap bought nothing (gloo's threads and the
  compute share the cores).

The causal attention mask needs no patch here: the kit's ``SDPAttention`` is causal by itself
and ignores ``attention_mask``, so megatron never builds its mask (on cuda) for it.

Nothing here changes the math: the same torch kernels run, only their device changes.
"""

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp
from torch.overrides import TorchFunctionMode

_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
}


class _CpuDeviceIndex(int):
    """What ``torch.cuda.current_device()`` returns on CPU: index 0, standing for the CPU.

    An int, so ``f"cuda:{torch.cuda.current_device()}"`` still parses (Megatron-FSDP builds
    its device that way); :class:`CudaToCpuMode` maps it, and the cuda device it names, to
    the CPU.
    """


def _is_cuda(device: object) -> bool:
    if isinstance(device, _CpuDeviceIndex):
        return True
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


class CudaToCpuMode(TorchFunctionMode):
    """Rewrite cuda devices to the CPU and report CPU tensors' types under their cuda names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
        if kwargs.get("pin_memory"):  # staging for a host-to-device copy (CP's rotary slice)
            kwargs["pin_memory"] = False
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.record_stream:
            return None
        if func is torch.Tensor.to and args[1:] and _is_cuda(args[1]):
            args = (args[0], torch.device("cpu"), *args[2:])
        if func is torch.autograd.backward:
            return _backward_under(self, *args, **kwargs)
        out = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return _CUDA_TYPE_NAMES.get(out, out)
        return out


def _backward_under(mode: TorchFunctionMode, tensors: Any, grad_tensors: Any = None,
                    retain_graph: bool | None = None, create_graph: bool = False,
                    inputs: Any = None) -> None:
    """``torch.autograd.backward`` run with ``mode`` on: the autograd engine called directly.

    Since torch 2.13 ``torch.autograd.backward`` is itself overridable, so a mode that handles
    it is switched off for the backward it starts, and the functions that backward runs
    (megatron's all-to-all of the MoE dispatcher and the SP gathers, under ``--recompute
    full``, whose ``CheckpointFunction`` calls it) would allocate on the cuda device they
    name. The same steps as torch's own, the engine's call inside ``mode``.
    """
    from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
    from torch.autograd.graph import _engine_run_backward

    outputs = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    grads = _make_grads(outputs, _tensor_or_tensors_to_tuple(grad_tensors, len(outputs)),
                        is_grads_batched=False)
    with mode:
        _engine_run_backward(outputs, grads, create_graph if retain_graph is None else retain_graph,
                             create_graph, tuple(inputs or ()), allow_unreachable=True,
                             accumulate_grad=True)


class _NoStream:
    """A CPU stand-in for ``torch.cuda.Stream``: work is already ordered."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def wait_stream(self, _: Any) -> None:
        """Nothing to wait for."""

    def wait_event(self, _: Any) -> None:
        """Nothing to wait for."""

    def record_event(self, event: Any = None) -> "_NoEvent":
        """An event that is always complete."""
        return event if event is not None else _NoEvent()

    def synchronize(self) -> None:
        """Nothing is queued."""

    def query(self) -> bool:
        """Always done."""
        return True


class _NoEvent:
    """A CPU stand-in for ``torch.cuda.Event``: always complete."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    def record(self, _: Any = None) -> None:
        """Nothing to record."""

    def wait(self, _: Any = None) -> None:
        """Nothing to wait for."""

    def synchronize(self) -> None:
        """Nothing is queued."""

    def query(self) -> bool:
        """Always done."""
        return True


def _patch_cuda_runtime() -> None:
    cuda = torch.cuda
    cuda.current_device = lambda: _CpuDeviceIndex(0)  # type: ignore[assignment]
    cuda.synchronize = lambda *_, **__: None  # type: ignore[assignment]
    cuda.Stream = _NoStream  # type: ignore[assignment,misc]
    cuda.Event = _NoEvent  # type: ignore[assignment,misc]
    cuda.current_stream = lambda *_, **__: _NoStream()  # type: ignore[assignment]
    cuda.default_stream = lambda *_, **__: _NoStream()  # type: ignore[assignment]
    cuda.stream = lambda *_, **__: contextlib.nullcontext()  # type: ignore[assignment]
    cuda.is_current_stream_capturing = lambda: False  # type: ignore[assignment]


def _patch_rng_tracker() -> None:
    """Point the tracker's cuda generator accessors at the CPU default generator."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda *_, **__: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *_, **__: torch.set_rng_state(state)
    torch.cuda.get_rng_state = lambda *_, **__: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.set_rng_state = (  # type: ignore[assignment]
        lambda state, *_, **__: torch.set_rng_state(state))
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)  # type: ignore[assignment]


def _uneven_all_gather(all_gather: Callable[..., Any]) -> Callable[..., Any]:
    """``all_gather`` into a list whose tensors differ in their first dimension, over gloo."""

    def gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None,
               async_op: bool = False) -> Any:
        if len({t.shape for t in tensor_list}) == 1:
            return all_gather(tensor_list, tensor, group=group, async_op=async_op)
        longest = max(t.shape[0] for t in tensor_list)
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        slots = [torch.empty_like(padded) for _ in tensor_list]
        all_gather(slots, padded, group=group)
        for out, slot in zip(tensor_list, slots, strict=True):
            out.copy_(slot[: out.shape[0]])
        return _DoneWork() if async_op else None

    return gather


def _uneven_reduce_scatter(reduce_scatter: Callable[..., Any]) -> Callable[..., Any]:
    """``reduce_scatter`` of a list whose tensors differ in their first dimension, over gloo."""

    def scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: Any = ReduceOp.SUM,
                group: Any = None, async_op: bool = False) -> Any:
        if len({t.shape for t in input_list}) == 1:
            return reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
        summed = torch.cat(input_list)
        dist.all_reduce(summed, op=op, group=group)
        rank = dist.get_rank(group)
        start = sum(t.shape[0] for t in input_list[:rank])
        output.copy_(summed[start : start + output.shape[0]])
        return _DoneWork() if async_op else None

    return scatter


class _DoneWork:
    """The handle of a collective that already finished."""

    def wait(self, *_: Any) -> bool:
        """Already done."""
        return True

    def is_completed(self) -> bool:
        """Already done."""
        return True


def _patch_uneven_collectives() -> None:
    dist.all_gather = _uneven_all_gather(dist.all_gather)
    dist.reduce_scatter = _uneven_reduce_scatter(dist.reduce_scatter)


def _host_splits(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """``maybe_move_tensor_to_cpu`` that also converts CPU tensors, as it does cuda ones."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def _patch_moe() -> None:
    try:
        from megatron.core.transformer.moe import moe_utils, token_dispatcher
    except ImportError:  # a release without these modules: nothing to fix
        return
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]
    for module in (moe_utils, token_dispatcher):
        if hasattr(module, "maybe_move_tensor_to_cpu"):
            module.maybe_move_tensor_to_cpu = _host_splits  # type: ignore[attr-defined]


def _patch_megatron_fsdp_gathers() -> None:
    """Megatron-FSDP's parameter all-gathers wait for their data before returning."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer import (
        AllGatherPipeline,
    )

    gather = AllGatherPipeline.all_gather_params
    if getattr(gather, "_kit_synchronous", False):
        return

    @functools.wraps(gather)
    def synchronous(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["async_param_gather"] = False
        return gather(self, *args, **kwargs)

    synchronous._kit_synchronous = True  # type: ignore[attr-defined]
    AllGatherPipeline.all_gather_params = synchronous  # type: ignore[method-assign]


def cpu_config_overrides() -> dict[str, Any]:
    """``TransformerConfig`` settings the CPU path needs (see the module docstring)."""
    return {"batch_p2p_comm": False, "use_cpu_initialization": True,
            "bias_dropout_fusion": False, "deallocate_pipeline_outputs": True}


def apply_cpu_compat() -> CudaToCpuMode:
    """Patch this (rank) process for CPU; returns the mode to enter around training."""
    _patch_cuda_runtime()
    _patch_rng_tracker()
    _patch_moe()
    _patch_uneven_collectives()
    _patch_megatron_fsdp_gathers()
    return CudaToCpuMode()
