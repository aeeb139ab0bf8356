"""GEMM efficiency by shape: the shapes a layout's transformer layers make, and a measured table.

A TP shard's GEMMs are smaller than one GPU's and run below its rate, so the one-GPU MatMul
seconds scaled by FLOPs alone under-predict a sharded layer. A *GEMM table*
(``<platform>.gemm.json``, written by ``charllm-kit platforms gemm``, kit.projection.gemm_bench)
holds the achieved TFLOP/s of ``torch.matmul`` in the platform's dtype at each shape a layer
makes. The MatMul seconds of a target stage are then::

    source MatMul s x (eff(source shapes) / eff(target shapes)) x FLOP ratio

where ``eff`` of a set of GEMMs is their FLOP-weighted harmonic mean rate, ``sum F_g / sum
(F_g / rate_g)``: the rate at which the table says those GEMMs, run one after another, would
go. A GEMM's rate is the table's at its exact shape and pass; a shape not measured takes the
rate interpolated linearly in ``log FLOPs`` (``2 m n k``) between the measured shapes of the
same pass whose FLOPs enclose it, clamped to the smallest and largest. FLOPs is the one-number
summary of a GEMM's size that tile occupancy and per-launch overhead follow; the layers' shapes
are one family (``T x h`` by ``h x n/t``), so within it rate is monotone in FLOPs.

Shapes per layer and micro-batch on one rank, ``T = b s / c`` tokens (with SP the column
linears all-gather first, so a rank multiplies all ``T``): QKV ``T x h -> (h + 2 g d_h)/t``,
projection ``T x h/t -> h``, FC1 ``T x h -> f a/t`` (``a`` 2 with SwiGLU), FC2 ``T x f/t ->
h``, and on the last stage the logits ``T x h -> V/t``. Each in three passes: forward (``m=T,
k=in, n=out``), the input gradient (``m=T, k=out, n=in``) and the weight gradient (``m=out,
k=T, n=in``). MoE layers' expert GEMMs run ``E/e`` experts of ``e T k_top / E`` tokens each.
Full recompute runs the forwards twice.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.config.run import RunConfig
from kit.config.workload import padded_vocab_size
from kit.errors import KitInputError

SUFFIX = ".gemm.json"
KIND = "charllm-kit gemm table"
Pass = Literal["forward", "dgrad", "wgrad"]
PASSES: tuple[Pass, ...] = ("forward", "dgrad", "wgrad")


@dataclass(frozen=True)
class Gemm:
    """One GEMM a rank runs: ``(m x k) @ (k x n)``, ``count`` times per micro-batch."""

    name: str
    pass_: Pass
    m: int
    n: int
    k: int
    count: int

    @property
    def flops(self) -> float:
        """``2 m n k`` per call."""
        return 2.0 * self.m * self.n * self.k

    @property
    def shape(self) -> tuple[str, int, int, int]:
        """``(pass, m, n, k)``: what the table is keyed by."""
        return (self.pass_, self.m, self.n, self.k)


def _linear(name: str, tokens: int, d_in: int, d_out: int, count: int,
            forwards: int) -> list[Gemm]:
    """The three passes of one linear layer ``tokens x d_in -> d_out`` (module docstring)."""
    return [Gemm(name, "forward", tokens, d_out, d_in, count * forwards),
            Gemm(name, "dgrad", tokens, d_in, d_out, count),
            Gemm(name, "wgrad", d_out, d_in, tokens, count)]


def layer_gemms(cfg: RunConfig) -> list[Gemm]:
    """The GEMMs of one transformer layer on one rank, per micro-batch (module docstring)."""
    w, p = cfg.workload, cfg.parallel
    t, h = p.tp, w.hidden_size
    tokens = cfg.micro_batch_size * w.seq_length // p.cp
    head = h // w.num_attention_heads
    fwd = 2 if cfg.optim.recompute == "full" else 1
    gated = 2 if w.activation == "swiglu" else 1
    out = [*_linear("qkv", tokens, h, (h + 2 * w.query_groups * head) // t, 1, fwd),
           *_linear("proj", tokens, h // t, h, 1, fwd)]
    if w.is_moe:
        experts = w.num_experts or 1
        per_expert = max(1, round(p.ep * tokens * w.moe_top_k / experts))
        local = max(1, experts // p.ep)
        out += [*_linear("expert_fc1", per_expert, h, w.ffn_hidden_size * gated // t, local, fwd),
                *_linear("expert_fc2", per_expert, w.ffn_hidden_size // t, h, local, fwd)]
    else:
        out += [*_linear("fc1", tokens, h, w.ffn_hidden_size * gated // t, 1, fwd),
                *_linear("fc2", tokens, w.ffn_hidden_size // t, h, 1, fwd)]
    return out


def logits_gemms(cfg: RunConfig) -> list[Gemm]:
    """The output layer's GEMMs on the last stage, per micro-batch."""
    w, p = cfg.workload, cfg.parallel
    tokens = cfg.micro_batch_size * w.seq_length // p.cp
    return _linear("logits", tokens, w.hidden_size,
                   padded_vocab_size(w.vocab_size, p.tp) // p.tp, 1, 1)


def stage_gemms(cfg: RunConfig, stage: int) -> list[Gemm]:
    """Every GEMM one rank of ``stage`` runs per micro-batch (counts over its layers)."""
    layers = cfg.workload.num_layers // cfg.parallel.pp
    out = [Gemm(g.name, g.pass_, g.m, g.n, g.k, g.count * layers) for g in layer_gemms(cfg)]
    return out + (logits_gemms(cfg) if stage == cfg.parallel.pp - 1 else [])


class GemmPoint(BaseModel):
    """One measured shape."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(description="Which linear layer first asked for it (qkv, fc1, ...).")
    pass_: Pass = Field(alias="pass", description="forward, dgrad or wgrad.")
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    time_s: float = Field(gt=0, description="Median seconds of one call.")
    tflops: float = Field(gt=0, description="Achieved TFLOP/s: 2 m n k / time_s.")


class GemmTable(BaseModel):
    """``<platform>.gemm.json``: achieved GEMM rates of one GPU kind (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    kind: Literal["charllm-kit gemm table"] = KIND
    version: Literal[1] = 1
    platform: str = Field(description="The platform profile's name (h100, h200, cpu, ...).")
    device: str = Field(description="The device the driver named, as measured.")
    dtype: str = Field(description="The dtype multiplied (the platform's training dtype).")
    created_utc: str
    torch_version: str
    command: list[str]
    points: list[GemmPoint]

    def rate_tflops(self, g: Gemm) -> float:
        """Achieved TFLOP/s at ``g``'s shape and pass (module docstring: exact, else log-FLOPs
        interpolation among the same pass's shapes, clamped)."""
        same = [p for p in self.points if p.pass_ == g.pass_] or list(self.points)
        for p in same:
            if (p.m, p.n, p.k) == (g.m, g.n, g.k):
                return p.tflops
        by_flops: dict[float, list[float]] = {}
        for p in same:
            by_flops.setdefault(math.log(2.0 * p.m * p.n * p.k), []).append(p.tflops)
        xs = sorted(by_flops)
        ys = [sum(by_flops[x]) / len(by_flops[x]) for x in xs]
        x = math.log(g.flops)
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
        i = next(j for j in range(1, len(xs)) if xs[j] >= x)
        f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + f * (ys[i] - ys[i - 1])

    def covers(self, g: Gemm) -> bool:
        """Whether ``g``'s exact shape and pass were measured."""
        return any((p.pass_, p.m, p.n, p.k) == g.shape for p in self.points)

    def efficiency_tflops(self, gemms: list[Gemm]) -> float:
        """FLOP-weighted harmonic mean rate of ``gemms`` (module docstring)."""
        flops = sum(g.flops * g.count for g in gemms)
        seconds = sum(g.flops * g.count / (self.rate_tflops(g) * 1e12) for g in gemms)
        return flops / seconds / 1e12


def read_gemm_table(path: str | Path) -> GemmTable:
    """Read and check a GEMM table.

    Raises:
        KitInputError: Unreadable, not JSON, not a GEMM table, or without points.
    """
    p = Path(path)
    try:
        table = GemmTable.model_validate(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError) as e:
        raise KitInputError(f"{p} is not a readable GEMM table "
                            f"({str(e).splitlines()[0]})") from None
    if not table.points:
        raise KitInputError(f"{p} holds no measured GEMM")
    return table


def write_gemm_table(table: GemmTable, path: Path) -> Path:
    """Write ``table`` to ``path`` (which must end in :data:`SUFFIX`)."""
    if not path.name.endswith(SUFFIX):
        raise KitInputError(f"a GEMM table's name ends in {SUFFIX}: {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table.model_dump_json(indent=1, by_alias=True) + "\n", encoding="utf-8")
    return path


def is_gemm_table(path: str | Path) -> bool:
    """Whether ``path`` names a GEMM table (by its suffix)."""
    return str(path).endswith(SUFFIX)


def shipped_table(platform: str) -> Path | None:
    """``platforms/<platform>.gemm.json`` in the kit's home, where one was kept."""
    from kit.paths import platforms_dir

    path = platforms_dir() / f"{platform}{SUFFIX}"
    return path if path.is_file() else None
