"""The DeepSpeed training engine: one rank's ZeRO or pipeline engine and its step loop.

Without pipeline parallelism the whole model (:class:`~kit.engines.deepspeed.model.CausalLM`,
built under ``deepspeed.zero.Init`` for ZeRO-3) is wrapped by ``deepspeed.initialize`` with ZeRO
stage 0-3; each micro-batch is a forward,
``engine.backward`` and ``engine.step`` (DeepSpeed steps the optimizer at the last micro-batch).
With ``--pp`` > 1 the model is a ``PipelineModule`` and one ``train_batch`` runs DeepSpeed's
1F1B schedule over the step's micro-batches. Data are the kit's synthetic tokens, indexed by the
data-parallel rank DeepSpeed assigns, so the batches match the megatron engine's.
"""

import os
from typing import Any

import torch
import torch.distributed as dist

from kit import lifecycle
from kit.config.run import RunConfig
from kit.config.workload import padded_vocab_size
from kit.engines.base import Engine, EngineInfo, RankPlacement, StepResult, rank_device
from kit.engines.data import SyntheticTokens
from kit.engines.deepspeed import speed
from kit.engines.deepspeed.config import deepspeed_config
from kit.engines.deepspeed.environment import prepare_deepspeed_environment
from kit.engines.deepspeed.model import (
    MOE_AUX_LOSS_COEFF,
    Block,
    CausalLM,
    drawing_on,
    pipeline_module,
)
from kit.engines.kernels.compiled import compile_modules
from kit.engines.kernels.deferred_compile import deferred_torch_compile


class DeepSpeedEngine(Engine):
    """Train the kit's plain PyTorch model of a workload under DeepSpeed."""

    name = "deepspeed"

    def __init__(self) -> None:
        self.cfg: RunConfig | None = None
        self.engine: Any = None
        self._pipe = False
        self._pipe_losses: list[torch.Tensor] = []
        self._features: frozenset[str] = frozenset()
        self._loss_fn = speed.plain_loss

    def import_framework(self, cpu: bool) -> None:
        """DeepSpeed, its environment prepared first."""
        prepare_deepspeed_environment(cpu)
        import deepspeed  # noqa: F401

    def setup(self, cfg: RunConfig, rank: int, local_rank: int, world_size: int) -> RankPlacement:
        """Initialize DeepSpeed's communication (an existing default group kept), build and wrap
        the model.
        """
        cpu = cfg.platform.is_cpu
        self.import_framework(cpu)
        import deepspeed

        self.cfg = cfg
        self.device = rank_device(cpu, local_rank)
        deepspeed.init_distributed(
            dist_backend=cfg.platform.torch_backend,
            auto_mpi_discovery=False,
            rank=rank,
            world_size=world_size,
            verbose=False,
        )
        lifecycle.mark("process_groups")
        torch.manual_seed(cfg.seed)
        w, p = cfg.workload, cfg.parallel
        vocab = padded_vocab_size(w.vocab_size)
        recompute = cfg.optim.recompute == "full"
        config = deepspeed_config(cfg)
        self._features = speed.enabled(cfg)
        self._loss_fn = speed.loss_function(self._features)
        self._pipe = p.pp > 1
        with drawing_on(self.device):  # on CUDA the weights are drawn there: seconds less
            if self._pipe:
                module = pipeline_module(w, vocab, cfg.seed, p.pp, recompute, self._pipe_loss)
            else:
                module = self._build_model(cfg, vocab, recompute, config)
        if self._pipe:
            params: Any = [q for q in module.parameters() if q.requires_grad]
        else:
            params = list(module.parameters())
            if w.is_moe:
                from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

                params = split_params_into_different_moe_groups_for_optimizer(
                    {"params": params, "name": "parameters"}
                )
        if "compile" in self._features:
            compile_modules([module], Block)
        # DeepSpeed's optimizer check imports its Muon optimizer, whose torch.compile
        # decorators would import inductor (most of a tiny ZeRO run's model build on CPU)
        with deferred_torch_compile():
            self.engine, *_ = deepspeed.initialize(model=module, model_parameters=params,
                                                   config=config)
        if self._pipe:
            dp_rank = self.engine.grid.get_data_parallel_id()
            pp_rank = self.engine.grid.get_stage_id()
        else:
            dp_rank, pp_rank = rank, 0
        self.data = SyntheticTokens.of_run(cfg, dp_rank)
        self._last_stage = pp_rank == p.pp - 1
        return RankPlacement(
            rank=rank,
            local_rank=local_rank,
            node=int(os.environ.get("GROUP_RANK", "0")),
            tp_rank=0,
            pp_rank=pp_rank,
            dp_rank=dp_rank,
        )

    def _build_model(
        self, cfg: RunConfig, vocab: int, recompute: bool, config: dict[str, Any]
    ) -> CausalLM:
        """The whole model; under ZeRO-3 partitioned layer by layer as it is built.

        Below ZeRO-3 it is built on the engine's device, where DeepSpeed would move it: built on
        the host, ``nn.Linear``'s own initialization and the copy of every draw made on the GPU
        ran on the CPU (a ZeRO-1 model build of gpt3-1.3b took 18.1 s on an H200 against
        megatron's 2.6-3.3 s, ``benchmarks/parallel/results/bundles-h200x4-layouts-host.tar.gz``).

        ``deepspeed.zero.Init`` keeps a rank from ever holding the full model, so ZeRO-3 runs
        models larger than one device's (or the host's) memory. Each transformer block is a
        ZeRO-3 leaf (``set_z3_leaf_modules``): its weights are gathered in one fetch before
        the block and released after it, instead of DeepSpeed's fetch and release hooks around
        each of its ~10 submodules in the forward and the backward (host work that, on a small
        model, leaves the GPU waiting).
        """
        import deepspeed

        if cfg.optim.zero != 3:
            with self.device:
                return CausalLM(cfg.workload, vocab, cfg.seed, recompute, self._loss_fn)
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = CausalLM(cfg.workload, vocab, cfg.seed, recompute, self._loss_fn)
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, [Block])
        return model

    def _pipe_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The pipeline's loss function on the last stage; keeps each micro-batch's loss."""
        loss = self._loss_fn(logits, labels)
        self._pipe_losses.append(loss.detach())
        return loss

    def train_step(self, step: int) -> StepResult:
        """One optimizer step over the step's micro-batches."""
        cfg = self.cfg
        assert cfg is not None
        num_micro = cfg.grad_accum_steps
        batches = self.data.step_iterator(step, num_micro, self.device)
        if self._pipe:
            self._pipe_losses = []
            self.engine.train_batch(data_iter=((b["tokens"], b["labels"]) for b in batches))
            losses = self._pipe_losses if self._last_stage else []
        else:
            losses = []
            for batch in batches:
                loss, aux = self.engine(batch["tokens"], batch["labels"])
                self.engine.backward(loss if aux is None else loss + MOE_AUX_LOSS_COEFF * aux)
                self.engine.step()
                losses.append(loss.detach())
        mean = float(torch.stack(losses).float().mean()) if losses else None
        tokens = cfg.micro_batch_size * num_micro * cfg.workload.seq_length
        return StepResult(loss=mean, tokens=tokens)

    def info(self) -> EngineInfo:
        """Versions of torch and DeepSpeed, and what DeepSpeed runs."""
        from importlib.metadata import version

        notes = ["model: kit plain PyTorch layers (kit.engines.deepspeed.model), core attention "
                 "torch scaled_dot_product_attention"]
        if self.cfg is not None:
            o = self.cfg.optim
            if self._pipe:
                notes.append(f"deepspeed pipeline engine, {self.cfg.parallel.pp} stages, "
                             f"ZeRO stage {o.zero}")
            else:
                notes.append(f"deepspeed ZeRO stage {o.zero}"
                             + (", optimizer offloaded to the host" if o.offload else ""))
            if o.zero == 3:
                zero = deepspeed_config(self.cfg)["zero_optimization"]
                notes.append("ZeRO-3 options (kit.engines.deepspeed.config.zero3_options): "
                             + ", ".join(f"{k}={v}" for k, v in zero.items() if k != "stage")
                             + "; transformer blocks are ZeRO-3 leaf modules")
            notes.append(f"speed features: {', '.join(sorted(self._features)) or 'none'}")
            blockers = speed.compile_blockers(self.cfg)
            if self.cfg.speed is None and not self.cfg.platform.is_cpu and blockers:
                notes.append(f"compile off: {', '.join(blockers)}")
        return EngineInfo(
            versions={"torch": torch.__version__, "deepspeed": version("deepspeed")},
            notes=notes,
        )

    def teardown(self) -> None:
        """Destroy process groups."""
        self.engine = None
        if dist.is_initialized():
            dist.destroy_process_group()
