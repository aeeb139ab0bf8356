"""The fsdp2 training engine: the kit's plain model sharded by PyTorch's ``fully_shard``.

The model is the deepspeed engine's :class:`~kit.engines.deepspeed.model.CausalLM` (same
layers, same per-layer initialization, same synthetic batches per data-parallel rank), so its
losses can be checked against the one-process run. Each transformer block is one FSDP2 unit
(with ``--speed compile``, compiled first); the root unit holds the embeddings, final norm and
output layer. Under mixed precision FSDP2 keeps fp32 parameter shards (the
master weights AdamW updates), gathers them in the training dtype for compute and
reduce-scatters gradients in fp32. Within a step's micro-batches, for a model that fits a
device easily (:func:`accumulates_unsharded`), each block's weights are gathered once in the
step's first forward and kept (not gathered again for its backward), gradients accumulate
unsharded, and the last micro-batch's backward reduce-scatters them and frees the weights;
otherwise each block is gathered for its forward and again for its backward in every
micro-batch, which also reduce-scatters its gradients, as FSDP2 does by default.
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
from kit.engines.deepspeed.model import Block, CausalLM, drawing_on, is_block
from kit.engines.deepspeed.speed import loss_function
from kit.engines.fsdp2.spec import accumulates_unsharded
from kit.engines.kernels.features import chosen_features

DEFAULT = frozenset({"cross_entropy"})
"""On by default on NVIDIA GPUs. Compiled blocks are not: on 2 H200s they made gpt3-1.3b DP2
slower (0.436 s a step against 0.359 s; the step is paced by the host) and gpt3-175b-4l no faster
(1.729 s against 1.726 s), benchmarks/parallel/results/h200x2-fsdp.txt."""

DEFAULT_AMD = DEFAULT
"""The same on ROCm (the fused cross-entropy was measured on CUDA only, as in the other
engines' ROCm sets)."""

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def compile_blocks(model: CausalLM) -> None:
    """Replace each transformer block by its ``torch.compile`` wrapper (before sharding).

    FSDP2's hooks then sit on the wrapper, outside the compiled region, as in torchtitan;
    ``nn.Module.compile`` (what the deepspeed engine uses) compiles the module's call with its
    hooks, which FSDP2's hooks break into many graphs. The blocks share one compiled graph.
    """
    for i, layer in enumerate(model.layers):
        if isinstance(layer, Block):
            model.layers[i] = torch.compile(layer)


class FSDP2Engine(Engine):
    """Train the kit's plain PyTorch model of a workload under PyTorch FSDP2."""

    name = "fsdp2"

    def __init__(self) -> None:
        self.cfg: RunConfig | None = None
        self.model: Any = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._features: frozenset[str] = frozenset()
        self._unsharded = False

    def import_framework(self, cpu: bool) -> None:
        """FSDP2 is part of torch: its module, imported before ``engine_imported``."""
        import torch.distributed.fsdp  # noqa: F401

    def setup(self, cfg: RunConfig, rank: int, local_rank: int, world_size: int) -> RankPlacement:
        """Join (or create) the default process group, build, compile and shard the model."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        self.cfg = cfg
        cpu = cfg.platform.is_cpu
        self.device = rank_device(cpu, local_rank)
        if not dist.is_initialized():
            dist.init_process_group(backend=cfg.platform.torch_backend, rank=rank,
                                    world_size=world_size)
        mesh = init_device_mesh(self.device.type, (world_size,))
        lifecycle.mark("process_groups")
        torch.manual_seed(cfg.seed)
        self._features = chosen_features(cfg, DEFAULT, DEFAULT_AMD)
        self._unsharded = accumulates_unsharded(cfg)
        w = cfg.workload
        # allocated where it trains: built on the host, nn.Linear's own initialization and the
        # copy of every draw ran on the CPU (gpt3-175b-4l: 82.8 s of model build on an H200)
        with drawing_on(self.device), self.device:
            model = CausalLM(w, padded_vocab_size(w.vocab_size), cfg.seed,
                             cfg.optim.recompute == "full", loss_function(self._features))
        if "compile" in self._features:
            compile_blocks(model)
        low = _DTYPES.get(cfg.dtype)
        policy = (MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
                  if low is not None else MixedPrecisionPolicy())
        for block in model.layers:
            if is_block(block):
                fully_shard(block, mesh=mesh, mp_policy=policy,
                            reshard_after_forward=not self._unsharded)
        self.model = fully_shard(model, mesh=mesh, mp_policy=policy)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
            weight_decay=0.1, fused=not cpu,
        )
        self.data = SyntheticTokens.of_run(cfg, rank)
        return RankPlacement(rank=rank, local_rank=local_rank,
                             node=int(os.environ.get("GROUP_RANK", "0")),
                             tp_rank=0, pp_rank=0, dp_rank=rank)

    def train_step(self, step: int) -> StepResult:
        """One optimizer step over the step's micro-batches."""
        cfg, model, optimizer = self.cfg, self.model, self.optimizer
        assert cfg is not None and optimizer is not None
        num_micro = cfg.grad_accum_steps
        losses = []
        for i, batch in enumerate(self.data.step_iterator(step, num_micro, self.device)):
            if self._unsharded:
                last = i == num_micro - 1
                model.set_requires_gradient_sync(last)
                model.set_reshard_after_backward(last)
            loss, _ = model(batch["tokens"], batch["labels"])
            (loss / num_micro).backward()
            losses.append(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens = cfg.micro_batch_size * num_micro * cfg.workload.seq_length
        return StepResult(loss=float(torch.stack(losses).float().mean()), tokens=tokens)

    def info(self) -> EngineInfo:
        """torch's version, and what FSDP2 shards and compiles."""
        notes = ["model: kit plain PyTorch layers (kit.engines.deepspeed.model), core attention "
                 "torch scaled_dot_product_attention"]
        if self.cfg is not None:
            notes.append(
                f"data parallel: PyTorch FSDP2 (torch.distributed.fsdp.fully_shard) over "
                f"{self.cfg.parallel.dp} ranks, one unit per transformer block and one for the "
                f"rest; weights, gradients and AdamW states sharded; compute in "
                f"{self.cfg.dtype}, gradients reduced in fp32 "
                + ("once per step (accumulated unsharded)" if self._unsharded
                   else "after each micro-batch"))
            notes.append(f"speed features: {', '.join(sorted(self._features)) or 'none'}")
        return EngineInfo(versions={"torch": torch.__version__}, notes=notes)

    def teardown(self) -> None:
        """Destroy process groups."""
        self.model = self.optimizer = None
        if dist.is_initialized():
            dist.destroy_process_group()
