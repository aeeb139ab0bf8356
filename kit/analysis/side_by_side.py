"""Profile breakdowns and fabric curves of several bundles, side by side, for compare/report.

A bundle contributes what it has: a profiled run one row per profiled rank (its profiled steps
summed, kit.metrics.kernels), a fabric run one bus-bandwidth column (kit.fabric.results);
others contribute nothing, so these tables and figures only appear when some bundle has them.
"""

from typing import Any

from kit.bundle.reader import Bundle
from kit.fabric.results import FabricResults, read_fabric
from kit.metrics.kernels import COLLECTIVES, COMPUTE, IDLE, category_totals, read_breakdowns
from kit.neutralize import safe_table


def profile_shares(bundles: list[Bundle]) -> list[dict[str, Any]]:
    """Per bundle and profiled rank: profiled seconds, share per category, bubble fractions."""
    out = []
    for b in bundles:
        for rank in read_breakdowns(b):
            totals = category_totals(rank)
            total = sum(totals.values())
            if not total:
                continue
            bubbles = [s.bubble for s in rank.steps if s.bubble is not None]
            out.append({
                "bundle": b.path.name, "rank": rank.rank, "stage": rank.stage,
                "timeline": rank.timeline, "profiled_s": total,
                "share": {c: v / total for c, v in totals.items()},
                "bubble_measured": (sum(x.measured_frac for x in bubbles) / len(bubbles)
                                    if bubbles else None),
                "bubble_analytical": bubbles[0].analytical_frac if bubbles else None,
            })
    return out


def fabric_curves(bundles: list[Bundle]) -> list[tuple[Bundle, FabricResults]]:
    """The fabric bundles among ``bundles``, with their results."""
    return [(b, r) for b in bundles if (r := read_fabric(b)) is not None]


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.1f}%"


def side_by_side_text(bundles: list[Bundle], tablefmt: str = "simple") -> str:
    """Both tables as text (empty when no bundle has a profile or fabric results)."""
    parts = []
    shares = profile_shares(bundles)
    if shares:
        cats = [c for c in (*COMPUTE, *COLLECTIVES, IDLE) if any(c in s["share"] for s in shares)]
        rows = [[s["bundle"], s["rank"], s["stage"], f"{s['profiled_s']:.4g}",
                 *(_pct(s["share"].get(c)) for c in cats),
                 f"{_pct(s['bubble_measured'])} / {_pct(s['bubble_analytical'])}"
                 if s["bubble_measured"] is not None else ""] for s in shares]
        parts.append("profiled time by category (share of the profiled steps; communication "
                     "shares are exposed time):\n" + safe_table(
                         rows, headers=["bundle", "rank", "stage", "profiled s", *cats,
                                        "bubble measured / analytical"],
                         tablefmt=tablefmt, disable_numparse=True))
    curves = fabric_curves(bundles)
    if curves:
        keys = sorted({(p.op, p.size_bytes) for _, r in curves for p in r.points},
                      key=lambda k: (k[0], k[1]))
        cols = [{(p.op, p.size_bytes): p.busbw_gbps for p in r.points} for _, r in curves]
        rows = [[op, size, *(f"{c[(op, size)]:.3f}" if (op, size) in c else "" for c in cols)]
                for op, size in keys]
        parts.append("fabric bus bandwidth, GB/s (nccl-tests' busbw):\n" + safe_table(
            rows, headers=["op", "size (B)", *(f"{b.path.name}\n{r.ranks} ranks {r.backend}"
                                               for b, r in curves)],
            tablefmt=tablefmt, disable_numparse=True))
    return "\n\n".join(parts)


def side_by_side_dict(bundles: list[Bundle]) -> dict[str, Any]:
    """Both, as JSON data: ``profiles`` (profile_shares) and ``fabric`` (results per bundle)."""
    fabric = [{"bundle": b.path.name, **r.model_dump()} for b, r in fabric_curves(bundles)]
    return {"profiles": profile_shares(bundles), "fabric": fabric}
