"""The megatron-core training engine: one rank's model, optimizer and step loop.

megatron-core runs end to end on every platform: its DDP wrapper (contiguous grad buffers,
optional overlap and distributed optimizer) or its Megatron-FSDP wrapper (``--fsdp``), its
optimizer and its pipeline schedules. On a CPU
platform :mod:`kit.engines.megatron.cpu_compat` first patches the places where megatron-core
assumes CUDA, and weights are drawn layout-invariantly
(:mod:`kit.engines.megatron.seeded_init`) so equivalent layouts train the same model.
"""

import os
import warnings
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from kit import lifecycle
from kit.config.run import RunConfig
from kit.engines.base import Engine, EngineInfo, RankPlacement, StepResult, rank_device
from kit.engines.data import SyntheticTokens
from kit.engines.execution import Execution
from kit.engines.kernels.cross_entropy import vocab_parallel_cross_entropy
from kit.engines.megatron import adapter, features, speed
from kit.engines.megatron.context_parallel import batch_on_this_rank
from kit.engines.megatron.expert_load import ExpertLoad
from kit.engines.megatron.model import build_model_chunks, transformer_config
from kit.engines.megatron.phase_timers import PhaseTimers
from kit.engines.megatron.spec import GRAD_BUCKET_ELEMENTS


def _loss_func(
    output_tensor: torch.Tensor, cp_group: Any = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean loss over this rank's tokens, and a detached copy to report.

    Under context parallelism each rank holds ``1/cp`` of the sequence. megatron-core's
    schedule multiplies the returned loss by the CP size and its DDP averages gradients over
    data x context parallel ranks (Megatron-LM's ``loss_func`` returns the local token sum over
    the whole sequence's token count for that reason), so the loss trained on is the local mean
    over ``cp``; the reported copy is the whole sequence's mean (averaged over the CP group).
    """
    loss = output_tensor.float().mean()
    # clone: megatron's schedule divides the returned loss in place by the micro-batch count,
    # and a detached view would share that storage.
    report = loss.detach().clone()
    if cp_group is not None:
        dist.all_reduce(report, group=cp_group)
        report /= cp_group.size()
        loss = loss / cp_group.size()
    return loss, {"lm loss": report}


def _forward_step(
    data_iterator: Any, model: torch.nn.Module, cp_group: Any = None
) -> tuple[torch.Tensor, Any]:
    batch = next(data_iterator)
    if cp_group is not None:
        batch = batch_on_this_rank(batch, cp_group)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, partial(_loss_func, cp_group=cp_group)


class MegatronEngine(Engine):
    """Train a megatron-core GPTModel on synthetic tokens."""

    name = "megatron"

    def __init__(self) -> None:
        self.cfg: RunConfig | None = None
        self._cpu_mode: Any = None
        self._speed_notes: list[str] = []
        self._features: frozenset[str] = frozenset()
        self._execution: Execution | None = None
        self._phases: PhaseTimers | None = None
        self._graph: Any = None
        self._forward_step: Any = _forward_step
        self._expert_load: ExpertLoad | None = None

    @property
    def _graphed(self) -> bool:
        """Whether this rank's step is one CUDA graph (False before :meth:`setup`)."""
        return self._execution is not None and self._execution.graphed

    def import_framework(self, cpu: bool) -> None:
        """megatron-core (imported by the spec's ``build``, its fusions' compile deferred)."""
        from megatron.core import parallel_state  # noqa: F401

    def setup(self, cfg: RunConfig, rank: int, local_rank: int, world_size: int) -> RankPlacement:
        """Create process groups and build model, optimizer and data for this rank."""
        from megatron.core import parallel_state as ps

        self.cfg = cfg
        cpu = cfg.platform.is_cpu
        if cpu:
            from kit.engines.megatron.cpu_compat import apply_cpu_compat

            self._cpu_mode = apply_cpu_compat()
            self._cpu_mode.__enter__()
        self.device = rank_device(cpu, local_rank)
        # No device_id: bound to a device, torch initializes an NCCL communicator for every
        # group at its creation, and megatron-core creates a dozen or more (20-23 s of start-up
        # on 4 H100s, benchmarks/parallel/results/); unbound, each group connects at its first
        # collective, and groups the layout never uses never do. The first (eager) step runs
        # every collective of the step before a CUDA graph captures it.
        if not dist.is_initialized():
            dist.init_process_group(backend=cfg.platform.torch_backend, rank=rank,
                                    world_size=world_size)
        p = cfg.parallel
        adapter.initialize_model_parallel(p.tp, p.pp, p.cp, p.ep, p.vpp)
        lifecycle.mark("process_groups")
        torch.manual_seed(cfg.seed)
        from megatron.core import tensor_parallel

        self._features = features.enabled(cfg)
        self._execution = features.execution(cfg)
        graph = self._graphed
        # a CUDA graph replays generators only in their graph-safe form
        tensor_parallel.model_parallel_cuda_manual_seed(
            cfg.seed, **({} if cpu else {"use_cudagraphable_rng": graph, "force_reset_rng": True}))
        if graph:
            # the parameters' autograd nodes bind to the stream current when DDP makes them:
            # make it the stream the step will be captured on (see step_graph)
            torch.cuda.set_stream(torch.cuda.Stream())
        if "wgrad_fusion" in self._features:
            adapter.install_wgrad_accumulation(speed.WgradAccumulation)
        adapter.use_cross_entropy(
            vocab_parallel_cross_entropy if "cross_entropy" in self._features else None)
        adapter.use_foreach_multi_tensor_ops("foreach_optim" in self._features)
        if cfg.workload.is_moe:
            adapter.use_sync_free_permute("sync_free_permute" in self._features)
        self.config = transformer_config(cfg)
        chunks = build_model_chunks(cfg, self.config)
        if cpu:
            from kit.engines.megatron.seeded_init import reinit_layout_invariant

            for chunk in chunks:
                reinit_layout_invariant(chunk, self.config, cfg.seed)
        self._wrap_ddp(chunks)
        if cfg.workload.is_moe:
            self._expert_load = ExpertLoad(chunks, cfg.workload.num_experts, self.device,
                                           padded=cfg.workload.moe_padded)
            if cfg.profile:
                from kit.engines.megatron.moe_ranges import label_moe_stages

                label_moe_stages(chunks)
        if "cuda_graph" in self._features and not graph:
            self._speed_notes.append(self._execution.note())
        # per-phase timers, except in a graphed step (no Python runs there) or when switched off
        timed = cfg.phase_timers and not graph
        self._phases = PhaseTimers(self.config, cuda=not cpu) if timed else None

        self.data = SyntheticTokens.of_run(cfg, ps.get_data_parallel_rank())
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self._schedule = get_forward_backward_func()
        self._fwd_bwd = self._schedule
        if graph:
            from kit.engines.megatron.step_graph import StepGraph

            self._graph = self._fwd_bwd = StepGraph(self._schedule, torch.cuda.current_stream())
        self._is_last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        cp_group = ps.get_context_parallel_group() if p.cp > 1 else None
        self._forward_step = partial(_forward_step, cp_group=cp_group)
        return RankPlacement(
            rank=rank,
            local_rank=local_rank,
            node=int(os.environ.get("GROUP_RANK", "0")),
            tp_rank=ps.get_tensor_model_parallel_rank(),
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            dp_rank=ps.get_data_parallel_rank(),
            cp_rank=ps.get_context_parallel_rank(),
            ep_rank=ps.get_expert_model_parallel_rank(),
        )

    def _wrap_ddp(self, chunks: list[torch.nn.Module]) -> None:
        """Wrap chunks in megatron's DDP (or Megatron-FSDP) and build megatron's optimizer.

        ``--fsdp`` follows Megatron-LM's ``get_model``: chunks go to the GPU and into
        ``Float16Module`` first, then into megatron-core's ``FullyShardedDataParallel``
        (``optim_grads_params``), and the optimizer is the distributed optimizer, which is the
        only one megatron-core builds over Megatron-FSDP's sharded parameters.
        """
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module

        cfg = self.cfg
        assert cfg is not None
        o = cfg.optim
        sharded_optimizer = o.dist_optimizer or o.fsdp
        # a graphed step cannot wait for an eager all-gather (features.graph_blockers' docstring)
        gather_overlapped = o.overlap and sharded_optimizer and not self._graphed
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=o.overlap,
            overlap_param_gather=gather_overlapped,
            use_distributed_optimizer=sharded_optimizer,
            bucket_size=GRAD_BUCKET_ELEMENTS if o.overlap else None,
            **(adapter.megatron_fsdp_ddp_config_kwargs(cfg.platform.is_cpu) if o.fsdp else {}),
        )
        wrapper = adapter.megatron_fsdp_wrapper() if o.fsdp else DistributedDataParallel
        features = self._features
        self._speed_notes = [f"speed features: {', '.join(sorted(features)) or 'none'}"]
        if o.overlap and sharded_optimizer and not o.fsdp and self._graphed:
            self._speed_notes.append(
                "overlap: gradient reduce-scatters overlapped inside the CUDA graph; the "
                "parameter all-gather runs after the optimizer step, not overlapped")
        wrapped = []
        for i, chunk in enumerate(chunks):
            if not cfg.platform.is_cpu:
                chunk.cuda(torch.cuda.current_device())
            if "compile" in features:
                speed.compile_layers([chunk])
            if cfg.dtype in ("bf16", "fp16"):
                chunk = Float16Module(self.config, chunk)
            wrapped.append(
                wrapper(
                    config=self.config,
                    ddp_config=ddp_config,
                    module=chunk,
                    disable_bucketing=i > 0,
                )
            )
        self.model = wrapped
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=cfg.lr,
                weight_decay=0.1,
                adam_beta1=0.9,
                adam_beta2=0.95,
                clip_grad=1.0,
                bf16=cfg.dtype == "bf16",
                fp16=cfg.dtype == "fp16",
                params_dtype=torch.float32,
                use_distributed_optimizer=sharded_optimizer,
            ),
            wrapped,
        )
        if "fused_adam" in features and not speed.use_fused_adamw(self.optimizer):
            self._speed_notes.append("fused AdamW unavailable: megatron-core chose its optimizer")
        self.config.finalize_model_grads_func = finalize_model_grads
        self.config.no_sync_func = [m.no_sync for m in wrapped]
        if len(wrapped) == 1:
            self.config.no_sync_func = self.config.no_sync_func[0]
        if o.overlap:
            self.config.grad_sync_func = [m.start_grad_sync for m in wrapped]
            if len(wrapped) == 1:
                self.config.grad_sync_func = self.config.grad_sync_func[0]

    def train_step(self, step: int) -> StepResult:
        """Run the micro-batches of one global batch through megatron-core's schedule."""
        cfg = self.cfg
        assert cfg is not None
        num_micro = cfg.grad_accum_steps
        for m in self.model:
            m.zero_grad_buffer()
        self.optimizer.zero_grad()
        chunks = len(self.model)
        iters = [self.data.step_iterator(step, num_micro, self.device) for _ in range(chunks)]
        losses = self._fwd_bwd(
            forward_step_func=self._forward_step,
            data_iterator=iters if chunks > 1 else iters[0],
            model=self.model if chunks > 1 else self.model[0],
            num_microbatches=num_micro,
            seq_length=cfg.workload.seq_length,
            micro_batch_size=cfg.micro_batch_size,
            forward_only=False,
            **adapter.forward_backward_kwargs(self._schedule),
        )
        if self._phases is not None:
            self._phases.time_optimizer(self.optimizer.step)
        else:
            self.optimizer.step()
        loss = None
        if self._is_last_stage and losses:
            loss = float(torch.stack([x["lm loss"] for x in losses]).mean())
        tokens = cfg.micro_batch_size * num_micro * cfg.workload.seq_length
        phases = self._phases.read() if self._phases is not None else None
        experts = self._expert_load.read() if self._expert_load is not None else None
        return StepResult(loss=loss, tokens=tokens, phases=phases, expert_tokens=experts)

    def info(self) -> EngineInfo:
        """Versions of torch and megatron-core, and the attention implementation."""
        notes = ["core attention: torch scaled_dot_product_attention (kit SDPAttention)",
                 *self._speed_notes]
        if self.cfg is not None and self.cfg.optim.fsdp:
            overlap = ("on cpu its parameter all-gathers are synchronous "
                       "(kit.engines.megatron.cpu_compat: asynchronous gloo gathers corrupted "
                       "the heap of rank processes)" if self.cfg.platform.is_cpu else
                       "it overlaps parameter all-gathers and gradient reduce-scatters with "
                       "compute whether or not --overlap is given")
            notes.append("data parallel: megatron-core Megatron-FSDP (optim_grads_params: "
                         f"parameters, gradients and optimizer states sharded over DP); {overlap}")
        if self.cfg is not None and self.cfg.platform.is_cpu:
            notes.append(
                "cpu: megatron-core with kit.engines.megatron.cpu_compat over gloo; "
                "weights drawn by kit.engines.megatron.seeded_init (layout-invariant)"
            )
        return EngineInfo(
            versions={"torch": torch.__version__, "megatron-core": str(adapter.mcore_version())},
            notes=notes,
        )

    def quiesce(self) -> None:
        """Finish in-flight collectives.

        Megatron-FSDP starts the next step's parameter all-gathers asynchronously right after
        each optimizer step; after the last step nobody waits for them, so they are drained
        here before their groups and buffers go away.
        """
        if self.cfg is not None and self.cfg.optim.fsdp:
            with warnings.catch_warnings():  # "still pending all-gather tasks": expected here
                warnings.filterwarnings("ignore", message="There are still pending")
                for chunk in self.model:
                    chunk.stop_communication()
        self.synchronize()

    def teardown(self) -> None:
        """Finish in-flight collectives (:meth:`quiesce`), then destroy process groups."""
        from megatron.core import parallel_state as ps

        self.quiesce()

        if self._graph is not None:
            self._graph.release()
            self._graph = None
            torch.cuda.set_stream(torch.cuda.default_stream())
        ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self._cpu_mode is not None:
            self._cpu_mode.__exit__(None, None, None)
            self._cpu_mode = None
