"""What ``charllm-kit sweep`` prints: the dry-run plan and the summary table."""

from tabulate import tabulate

from kit.cli_tables import fmt
from kit.plan.memory import GIB
from kit.sweep.index import SweepIndex
from kit.sweep.plan import PlannedPoint

_REASON_WIDTH = 90


def plan_table(plan: list[PlannedPoint]) -> str:
    """One row per point: valid or skipped, estimated memory per device, and the reason."""
    rows = []
    for p in plan:
        mem = (f"{p.memory.required_bytes / GIB:.1f} / {p.memory.capacity_bytes / GIB:.0f}"
               if p.memory is not None and p.memory.capacity_bytes else "")
        rows.append([p.id, "valid" if p.valid else "skipped", mem, p.skip_reason or ""])
    valid = sum(p.valid for p in plan)
    table = tabulate(rows, headers=["point", "verdict", "memory GiB (need / have)", "reason"],
                     tablefmt="simple", maxcolwidths=[None, None, None, _REASON_WIDTH])
    return f"{table}\n{len(plan)} points: {valid} valid, {len(plan) - valid} skipped"


def summary_table(index: SweepIndex) -> str:
    """One row per point: status, step time, tokens/s, MFU, energy per token and bundle."""
    rows = []
    for p in index.points:
        s = p.summary
        mfu = s.get("mfu")
        rows.append([
            p.id, p.status + (" (kept)" if p.resumed else ""), fmt(s.get("step_time_s"), " s", 4),
            fmt(s.get("tokens_per_s"), "", 4), "n/a" if mfu is None else f"{mfu:.1%}",
            fmt(s.get("energy_j_per_token"), " J", 4), p.bundle or (p.reason or ""),
        ])
    return tabulate(
        rows, tablefmt="simple", maxcolwidths=[None] * 6 + [_REASON_WIDTH],
        headers=["point", "status", "step time", "tokens/s", "MFU", "energy/token",
                 "bundle (or reason)"],
    )
