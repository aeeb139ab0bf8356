"""How evenly a mixture-of-experts run's router spread its tokens over the experts.

Input is ``experts.parquet`` (:data:`kit.bundle.schema.EXPERTS_SCHEMA`): per step, rank, MoE
layer and expert, the tokens that rank routed there. An expert's load in a step and layer is
the sum over the ranks that hold the layer. Imbalance is read per measured step and layer,
then averaged (and its worst kept) over them:

- ``max_over_mean``: the busiest expert's tokens over the mean expert's (1 = balanced; with
  expert parallelism the busiest expert sets the pace of its rank's grouped GEMMs);
- ``cv``: standard deviation over mean of the tokens per expert (population form);
- ``ep_max_over_mean``: the same max/mean over expert-parallel ranks, each receiving the
  tokens of its ``experts / ep`` experts (what the all-to-all and the slowest rank see);
- ``dropped_frac``: the share of routed token slots (every token of the global batch routed
  to ``top_k`` experts, in each layer) that an expert at capacity dropped, per measured step
  (mean over layers); 0 for dropless routing. The counts are kept tokens, summed over the
  ranks that hold a layer, which see disjoint tokens (MoE under TP needs SP).
"""

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.schema import EXPERTS_SCHEMA


def experts_rows(step_rows: list[tuple[int, int, str, dict[str, list[int]]]]) -> pa.Table:
    """``experts.parquet`` from ``(step, rank, phase, expert_tokens)`` of every counted step."""
    rows = [{"step": step, "rank": rank, "phase": phase, "layer": int(layer), "expert": e,
             "tokens": n}
            for step, rank, phase, counts in step_rows
            for layer, per_expert in sorted(counts.items(), key=lambda kv: int(kv[0]))
            for e, n in enumerate(per_expert)]
    return pa.Table.from_pylist(rows, schema=EXPERTS_SCHEMA)


def load_matrix(table: pa.Table, phase: str = "measured") -> tuple[list[int], list[int],
                                                                   np.ndarray]:
    """Tokens per (step, layer, expert) summed over ranks, for the steps of ``phase``.

    Returns:
        The steps, the layers (both sorted) and an int64 array ``[steps, layers, experts]``.
    """
    rows = table.filter(pc.equal(table["phase"], phase)).to_pydict()
    steps = sorted(set(rows["step"]))
    layers = sorted(set(rows["layer"]))
    experts = max(rows["expert"], default=-1) + 1
    out = np.zeros((len(steps), len(layers), experts), dtype=np.int64)
    s_at = {s: i for i, s in enumerate(steps)}
    l_at = {n: i for i, n in enumerate(layers)}
    for s, n, e, t in zip(rows["step"], rows["layer"], rows["expert"], rows["tokens"],
                          strict=True):
        out[s_at[s], l_at[n], e] += t
    return steps, layers, out


def _imbalance(load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """max/mean and std/mean over the last axis (null, i.e. NaN, where nothing was routed)."""
    mean = load.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return load.max(axis=-1) / mean, load.std(axis=-1) / mean


def _stat(values: np.ndarray) -> tuple[float | None, float | None]:
    """Mean and max of the finite values, rounded; (None, None) when there are none."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return None, None
    return round(float(finite.mean()), 4), round(float(finite.max()), 4)


def expert_load_summary(table: pa.Table | None, top_k: int, ep: int,
                        tokens_per_step: int | None = None) -> dict[str, Any]:
    """``metrics.json`` ``expert_load`` of a run (empty when it has no measured routing rows).

    Args:
        table: ``experts.parquet`` rows, or None for a dense run.
        top_k: Experts each token is routed to.
        ep: Expert-parallel size (experts are split evenly over EP ranks, in order).
        tokens_per_step: Tokens of the global batch (each routed to ``top_k`` experts per
            layer), for the dropped share; None leaves it out.
    """
    if table is None or not table.num_rows:
        return {}
    steps, layers, load = load_matrix(table)
    if not steps:
        return {}
    experts = load.shape[-1]
    ratio, cv = _imbalance(load.astype(np.float64))
    per_rank = load.reshape(*load.shape[:2], ep, experts // ep).sum(axis=-1)
    ep_ratio, _ = _imbalance(per_rank.astype(np.float64))
    ratio_mean, ratio_max = _stat(ratio)
    cv_mean, cv_max = _stat(cv)
    ep_mean, ep_max = _stat(ep_ratio) if ep > 1 else (None, None)
    totals = load.sum(axis=0)  # [layers, experts] over the measured steps
    per_layer = []
    for i, layer in enumerate(layers):
        r, c = _stat(ratio[:, i])[0], _stat(cv[:, i])[0]
        whole = totals[i].sum()
        share = [round(float(x / whole), 4) for x in totals[i]] if whole else None
        per_layer.append({"layer": layer, "max_over_mean": r, "cv": c, "tokens_frac": share})
    return {
        "experts": experts, "layers": len(layers), "top_k": top_k, "measured_steps": len(steps),
        "max_over_mean": ratio_mean, "max_over_mean_worst": ratio_max,
        "cv": cv_mean, "cv_worst": cv_max,
        "ep": ep, "ep_max_over_mean": ep_mean, "ep_max_over_mean_worst": ep_max,
        "per_layer": per_layer,
        **_dropped(steps, load, top_k * tokens_per_step if tokens_per_step else None),
    }


def _dropped(steps: list[int], load: np.ndarray, routed: int | None) -> dict[str, Any]:
    """``dropped_frac`` (mean over measured steps), ``dropped_frac_worst`` and
    ``dropped_frac_by_step`` (``[step, share]``), each the mean over layers of
    ``1 - kept / routed``; empty without ``routed``."""
    if not routed:
        return {}
    per_step = 1.0 - load.sum(axis=-1).mean(axis=-1) / routed
    by_step = [[s, round(float(max(f, 0.0)), 6)] for s, f in zip(steps, per_step, strict=True)]
    shares = [f for _, f in by_step]
    return {"dropped_frac": round(sum(shares) / len(shares), 6),
            "dropped_frac_worst": max(shares), "dropped_frac_by_step": by_step}
