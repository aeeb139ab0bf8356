"""The expert-load figure of a mixture-of-experts run: where its router sent the tokens.

Left: each expert's tokens over the measured steps relative to an even share, per MoE layer
(1.0 = balanced; under expert parallelism, expert columns are grouped by the EP rank that holds
them). Right: per measured step, the busiest expert's tokens over the mean expert's, one line
per layer (a band of min..max and the mean when there are many layers).
"""

import numpy as np
from matplotlib.figure import Figure

from kit.analysis.plots_common import title
from kit.analysis.run_view import RunView
from kit.metrics.expert_load import load_matrix

LINES_MAX = 8
"""Layers drawn one line each on the right; more are drawn as their mean and min..max."""


def expert_load(view: RunView) -> Figure | None:
    """The figure, or None when the bundle holds no measured routing counts."""
    table = view.bundle.experts
    if table is None:
        return None
    steps, layers, load = load_matrix(table)
    if not steps:
        return None
    experts = load.shape[-1]
    totals = load.sum(axis=0).astype(float)  # [layers, experts]
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = totals / totals.mean(axis=1, keepdims=True)
        ratio = load.max(axis=-1) / load.mean(axis=-1)  # [steps, layers]
    fig = Figure(figsize=(10, 0.9 + max(2.6, 0.22 * len(layers))), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(1.2, 1))
    spread = max(float(np.nanmax(np.abs(rel - 1))), 0.05) if rel.size else 0.05
    image = left.imshow(rel, aspect="auto", cmap="coolwarm", vmin=1 - spread, vmax=1 + spread,
                        interpolation="nearest")
    left.set_xlabel("expert")
    left.set_ylabel("MoE layer")
    left.set_yticks(range(len(layers)), [str(n) for n in layers] if len(layers) <= 32 else None)
    left.set_xticks(range(experts))
    ep = int(view.bundle.manifest.config["parallel"].get("ep", 1))
    for boundary in range(experts // ep, experts, experts // ep) if ep > 1 else ():
        left.axvline(boundary - 0.5, color="black", linewidth=1)
    fig.colorbar(image, ax=left, label="tokens / even share")
    x = np.asarray(steps)
    if len(layers) <= LINES_MAX:
        for i, layer in enumerate(layers):
            right.plot(x, ratio[:, i], marker="o", markersize=3, label=f"layer {layer}")
        right.legend(fontsize=7)
    else:
        right.fill_between(x, np.nanmin(ratio, 1), np.nanmax(ratio, 1), alpha=0.3,
                           label="min..max over layers")
        right.plot(x, np.nanmean(ratio, 1), label="mean over layers")
        right.legend(fontsize=7)
    right.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    right.set_xlabel("measured step")
    right.set_ylabel("busiest expert / mean expert")
    title(fig, f"Tokens per expert ({len(steps)} measured steps, top-{_top_k(view)} routing"
          f"{f', EP {ep}' if ep > 1 else ''})", view)
    return fig


def _top_k(view: RunView) -> int:
    return int(view.bundle.manifest.workload.get("moe_top_k") or 1)
