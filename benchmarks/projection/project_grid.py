"""Project the study's grids from what one node measured, as a report per grid.

    python3 benchmarks/projection/project_grid.py --bundles DIR [--bundles DIR...]
        [--out benchmarks/projection/results] SWEEP.yaml...

Every valid point of each sweep file (sweeps/h200-parallelism.yaml: 32 H200s, 4 nodes;
sweeps/h100-parallelism.yaml: 64 H100s, 8 nodes) is projected (kit.projection) from the bundles
found under the DIRs that were measured on the sweep's platform: training runs of the point's
architecture at any depth (e.g. mixtral-8x7b-4l for mixtral-8x7b, a 4-layer gpt3-175b for
gpt3-175b) and fabric bundles. A point with no such run is listed with the reason. Writes, per
sweep, ``<out>/<sweep>/<point>.projection.json``, ``<out>/grid-<sweep>.md`` (the table with
every figure's interval, the inputs and the assumptions) and, when any point was projected,
``<out>/grid-<sweep>.html`` (charllm-kit report of the projection files).
"""

import argparse
import json
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from tabulate import tabulate

from kit.analysis.compare import layout_label
from kit.analysis.report import write_report
from kit.config.run import RunConfig
from kit.errors import KitInputError
from kit.projection.file import SUFFIX, ProjectionFile, write_projection
from kit.projection.model import project
from kit.projection.request import ProjectionTarget
from kit.sweep.file import load_sweep
from kit.sweep.plan import plan_sweep


def bundles_by_platform(folders: list[Path]) -> dict[str, list[Path]]:
    """Finished bundles (runs ended ok, fabric bundles) under ``folders``, by platform name."""
    out: dict[str, list[Path]] = {}
    for folder in folders:
        for manifest in sorted(folder.rglob("manifest.json")):
            data = json.loads(manifest.read_text())
            if data["status"] == "ok" and (manifest.parent / "SHA256SUMS").is_file():
                out.setdefault(data["platform"]["name"], []).append(manifest.parent)
    return out


def target_of(cfg: RunConfig) -> ProjectionTarget:
    """A planned sweep point as a projection target."""
    p, o = cfg.parallel, cfg.optim
    return ProjectionTarget(
        workload=cfg.workload.name, nodes=cfg.nodes, tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp,
        ep=p.ep, vpp=p.vpp, sp=p.sp, micro_batch_size=cfg.micro_batch_size,
        global_batch_size=cfg.global_batch_size, recompute=o.recompute, overlap=o.overlap,
        dist_optimizer=o.dist_optimizer)


def _span(p: ProjectionFile, key: str, fmt: str, scale: float = 1.0) -> str:
    if p.summary.get(key) is None:
        return "n/a"
    low, point, high = (x * scale for x in p.interval[key])
    return f"{point:{fmt}} [{low:{fmt}}..{high:{fmt}}]"


def _row(point_id: str, p: ProjectionFile) -> list[str]:
    source = next(i.bundle for i in p.inputs if i.role == "compute")
    return [point_id, layout_label(p.config), str(p.summary["world_size"]),
            _span(p, "step_time_s", ".3g"), _span(p, "mfu", ".1f", 100),
            _span(p, "power_w_mean", ".0f"), _span(p, "energy_j_per_token", ".3g"),
            f"{p.memory['allocated_gib']:.0f}" + ("" if p.memory["fits"] else " (no fit)"),
            source]


def markdown(sweep: str, description: str, done: list[tuple[str, ProjectionFile]],
             missing: list[tuple[str, str]], inputs: list[Path]) -> str:
    """The grid's page: table with intervals, points not projected, inputs, assumptions."""
    header = ["point", "layout", "GPUs", "step s", "MFU %", "W per GPU", "J per token",
              "GiB per GPU", "scaled from"]
    counts = Counter(a for _, p in done for a in p.assumptions)
    common = [a for a, n in counts.items() if n == len(done)]
    parts = [
        f"# Projected: {sweep} ({description})",
        f"Written {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ} by "
        "`benchmarks/projection/project_grid.py` from one node's measurements. **Every figure "
        "here is PROJECTED** (`charllm-kit project`, docs/projection.md), none measured: each is "
        "`point [low..high]`, the interval spanning the model's alternative assumptions (idle "
        "gaps device- or host-bound, communication overlapped or not, slowest rank, phase "
        "powers) and the measured run's own step-to-step spread; it is not a statistical "
        "confidence interval, and what the model does not know (kernel efficiency at other "
        "shapes, inter-node congestion, thermal throttling at scale) is not in it.",
        "## Projected points",
        tabulate([_row(i, p) for i, p in done], headers=header, tablefmt="github",
                 disable_numparse=True) if done else "No point could be projected.",
    ]
    if missing:
        parts += ["## Not projected", "\n".join(f"- `{i}`: {why}" for i, why in missing)]
    parts += ["## Inputs (measured bundles)",
              "\n".join(f"- `{b.name}`" for b in inputs) or "- none on this platform"]
    if done:
        parts += ["## Assumptions (every point)", "\n".join(f"- {a}" for a in common),
                  "## Assumptions of single points"]
        parts.append("\n".join(f"- `{i}`: {a}" for i, p in done for a in p.assumptions
                               if a not in common) or "- none")
    return "\n\n".join(parts) + "\n"


def project_sweep(path: Path, inputs: dict[str, list[Path]], out: Path) -> list[Path]:
    """Project one sweep file; returns the files written."""
    spec = load_sweep(path)
    folder = out / spec.name
    done: list[tuple[str, ProjectionFile]] = []
    missing: list[tuple[str, str]] = []
    platform = str(spec.base.get("platform", ""))
    for point in plan_sweep(spec, require_present=False):
        if not point.valid or point.cfg is None:
            missing.append((point.id, f"not a valid point: {point.skip_reason}"))
            continue
        found = inputs.get(point.cfg.platform.name, [])
        if not found:
            missing.append((point.id, f"no bundle measured on {point.cfg.platform.name}"))
            continue
        try:
            proj = project(found, target_of(point.cfg), sys.argv)
        except KitInputError as e:
            missing.append((point.id, str(e)))
            continue
        done.append((point.id, proj))
        write_projection(proj, folder / f"{point.id}{SUFFIX}")
        print(f"{point.id:36} step {proj.summary['step_time_s']:.3f} s")
    for point_id, why in missing:
        print(f"{point_id:36} not projected: {why}")
    page = out / f"grid-{spec.name}.md"
    page.write_text(markdown(spec.name, spec.description, done, missing,
                             inputs.get(platform, [])))
    written = [page]
    if done:
        html = out / f"grid-{spec.name}.html"
        write_report([folder / f"{i}{SUFFIX}" for i, _ in done], html)
        written.append(html)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--bundles", type=Path, action="append", required=True)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/projection/results"))
    args = ap.parse_args()
    inputs = bundles_by_platform(args.bundles)
    args.out.mkdir(parents=True, exist_ok=True)
    for sweep in args.sweeps:
        for f in project_sweep(sweep, inputs, args.out):
            print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
