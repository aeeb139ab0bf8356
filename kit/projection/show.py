"""``charllm-kit project``'s output: the projection written to a file and shown as tables."""

import secrets
from datetime import datetime, timezone
from pathlib import Path

from kit.metrics.text import format_value
from kit.neutralize import safe_table, terminal_safe
from kit.projection.file import SUFFIX, ProjectionFile, memory_estimate_text, write_projection
from kit.projection.model import project
from kit.projection.request import ProjectionTarget

_SHOWN = (("step_time_s", "step time", "s"), ("tokens_per_s", "tokens/s", ""),
          ("tflops_per_gpu", "TFLOP/s per device", ""), ("mfu", "MFU", "fraction"),
          ("power_w_mean", "mean power per device", "W"),
          ("energy_j_per_token", "energy per token", "J"))
_TOP_COLLECTIVES = 8


def projection_name(p: ProjectionFile) -> str:
    """``<UTC>-<workload>-<platform>x<ranks>-<6 hex>.projection.json``, like a bundle id."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    cfg = p.config
    return (f"{stamp}-{cfg['workload']['name']}-{cfg['platform']['name']}x"
            f"{p.summary['world_size']}-{secrets.token_hex(3)}{SUFFIX}")


def run_projection(bundles: list[Path], target: ProjectionTarget, out: Path,
                   command: list[str]) -> tuple[ProjectionFile, Path]:
    """Project and write the file into ``out``; return both."""
    proj = project(list(bundles), target, command)
    return proj, write_projection(proj, out / projection_name(proj))


def _cell(p: ProjectionFile, key: str, unit: str) -> str:
    value = p.summary.get(key)
    if value is None:
        return "n/a"
    low, _, high = p.interval.get(key, [value, value, value])
    return (f"{format_value(value, unit)} [{format_value(low, unit)}.."
            f"{format_value(high, unit)}]")


def _host_text(step: dict) -> str:
    """The host-paced ranks' mutual waiting (kit.projection.host), where the step has it."""
    low, point, high = step.get("host_coupling") or (1.0, 1.0, 1.0)
    if high <= 1.0:
        return ""
    return (f"; host-paced ranks waiting on each other x{point:.3g} "
            f"[{low:.3g}..{high:.3g}]")


def projection_text(p: ProjectionFile) -> str:
    """The projection for people: figures with intervals, stages, collectives, assumptions."""
    rows = [(label, _cell(p, key, unit)) for key, label, unit in _SHOWN]
    peak = p.summary.get("power_w_peak")
    rows += [("peak power per device", "n/a" if peak is None else f"{peak:.4g} (as measured)"),
             ("memory per device (estimate)", memory_estimate_text(p)),
             ("world size", str(p.summary["world_size"]))]
    parts = ["PROJECTED (a model's figures, not a measurement): point [low..high]",
             safe_table(rows, headers=("figure", "projected"), disable_numparse=True)]
    step = p.step
    bubble = step["bubble_frac_analytical"]
    if "bound" in step:
        shares = ", ".join(f"{k} {v:.0%}" for k, v in step["bound_shares"].items())
        parts.append(f"bound: {step['bound']} (stage {step['bound_stage']}'s step: {shares})")
    if p.provenance:
        parts.append("rests on:\n" + "\n".join(f"  {k}: {v}" for k, v in p.provenance.items()))
    parts.append(f"{step['micro_batches']} micro-batches per step"
                 + (f"; pipeline bubble {step['bubble_s']:.4g} s (analytical fraction "
                    f"{bubble * 100:.1f}%)" if bubble is not None else "")
                 + _host_text(step))
    parts.append(safe_table(
        [(s.stage, f"{s.compute_s:.4g}", f"{s.idle_s[1]:.4g}", f"{s.blocking_comm_s[1]:.4g}",
          f"{s.micro_batch_s[1]:.4g}", f"{s.optimizer_s:.4g}", f"{s.tail_s[1]:.4g}")
         for s in p.stages],
        headers=("stage", "compute/mb s", "idle/mb s", "comm/mb s", "micro-batch s",
                 "optimizer s", "after pipeline s"), disable_numparse=True))
    top = sorted(p.collectives, key=lambda c: -c.exposed_s[1])[:_TOP_COLLECTIVES]
    if top:
        parts.append("collectives with the most exposed time (per micro-batch or per step):\n"
                     + safe_table([(c.stage, c.what, c.group, f"{c.group_size} ({c.nodes} node"
                                   f"{'s' if c.nodes > 1 else ''})", c.size_bytes, c.calls,
                                   c.scope, f"{c.exposed_s[1]:.4g}") for c in top],
                                headers=("stage", "collective", "group", "ranks", "bytes",
                                         "calls", "per", "exposed s"), disable_numparse=True))
    parts.append("inputs:\n" + "\n".join(f"  {i.role}: {i.bundle} ({i.what})"
                                         for i in p.inputs))
    parts.append("assumptions:\n" + "\n".join(f"  - {a}" for a in p.assumptions))
    parts += [f"note: {n}" for n in p.notes]
    return terminal_safe("\n\n".join(parts), keep_lines=True)  # it quotes bundles' words
