"""What ``charllm-kit sweep`` prints: the dry-run plan and the summary table."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.metrics.text import fmt
from kit.neutralize import safe_table
from kit.plan.memory import GIB
from kit.sweep.index import SweepIndex
from kit.sweep.plan import PlannedPoint

_REASON_WIDTH = 90


@dataclass(frozen=True)
class PlannedJob:
    """How ``sweep --launcher slurm`` would submit a valid point: one sbatch job.

    Attributes:
        name: The job name (``--job-name``).
        nodes: Nodes the job asks for.
        point_dir: The point's folder, which receives its bundle and the job's output.
        script: The sbatch script, as submitted.
    """

    name: str
    nodes: int
    point_dir: Path
    script: str


def _submit_cell(job: PlannedJob | None) -> str:
    if job is None:
        return ""
    return f"sbatch {job.name}, {job.nodes} node(s) -> {job.point_dir}/"


def resume_verdict(plan: list[PlannedPoint], kept: dict[str, str] | None) -> dict[str, str]:
    """What ``--resume`` would do with each valid point: ``done (STATUS, kept)`` for a point
    whose bundle it keeps (``kept``: id -> that bundle's status), else ``to run``."""
    if kept is None:
        return {}
    return {p.id: f"done ({kept[p.id]}, kept)" if p.id in kept else "to run"
            for p in plan if p.valid}


def plan_table(plan: list[PlannedPoint], jobs: dict[str, PlannedJob] | None = None,
               kept: dict[str, str] | None = None) -> str:
    """One row per point: valid or skipped, estimated memory per device, and the reason; with
    ``jobs`` (``--launcher slurm``), the Slurm job each valid point would be submitted as; with
    ``kept`` (``--resume``: id -> status of the bundle it keeps), which points are done."""
    rows = []
    resume = resume_verdict(plan, kept)
    for p in plan:
        mem = (f"{p.memory.required_bytes / GIB:.1f} / {p.memory.capacity_bytes / GIB:.0f}"
               if p.memory is not None and p.memory.capacity_bytes else "")
        verdict = "valid" if p.valid else "skipped"
        if p.id in resume:
            verdict += f": {resume[p.id]}"
        row = [p.id, verdict, mem, p.skip_reason or ""]
        rows.append(row if jobs is None else [*row[:3], _submit_cell(jobs.get(p.id)), row[3]])
    headers = ["point", "verdict", "memory GiB (need / have)", "reason"]
    widths: list[int | None] = [None, None, None, _REASON_WIDTH]
    if jobs is not None:
        headers.insert(3, "submit (Slurm job -> folder)")
        widths.insert(3, None)
    valid = sum(p.valid for p in plan)
    table = safe_table(rows, headers=headers, tablefmt="simple", maxcolwidths=widths)
    done = (f" ({sum(v != 'to run' for v in resume.values())} done, kept by --resume)"
            if kept is not None else "")
    return f"{table}\n{len(plan)} points: {valid} valid{done}, {len(plan) - valid} skipped"


def plan_json(name: str, plan: list[PlannedPoint], jobs: dict[str, PlannedJob] | None,
              kept: dict[str, str] | None = None) -> dict[str, Any]:
    """The dry-run plan as data: every point's verdict, memory estimate, with ``jobs`` the job
    it would be submitted as (name, nodes, folder, the sbatch script itself), and with ``kept``
    (``--resume``) what resuming does with it (``resume``: null for a skipped point)."""
    points = []
    resume = resume_verdict(plan, kept)
    for p in plan:
        job = (jobs or {}).get(p.id)
        points.append({
            "id": p.id, "values": p.values, "verdict": "valid" if p.valid else "skipped",
            "reason": p.skip_reason, "resume": resume.get(p.id),
            "memory": None if p.memory is None else {
                "required_bytes": p.memory.required_bytes,
                "capacity_bytes": p.memory.capacity_bytes},
            "submit": None if job is None else {
                "job_name": job.name, "nodes": job.nodes, "out": str(job.point_dir),
                "script": job.script},
        })
    valid = sum(p.valid for p in plan)
    return {"sweep": name, "launcher": "local" if jobs is None else "slurm", "points": points,
            "valid": valid, "skipped": len(plan) - valid}


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
    return safe_table(
        rows, tablefmt="simple", maxcolwidths=[None] * 6 + [_REASON_WIDTH],
        headers=["point", "status", "step time", "tokens/s", "MFU", "energy/token",
                 "bundle (or reason)"],
    )
