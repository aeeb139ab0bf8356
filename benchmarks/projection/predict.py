"""Project the validation points from measured bundles: one projection file per point.

    python3 benchmarks/projection/predict.py --out PRED_DIR [--platform h100]
        [--like MEASURED_DIR] BUNDLE...

BUNDLE...: the 1-GPU runs, the fabric bundle(s) and GEMM tables (``*.gemm.json``) of the
machine, or of another GPU kind with ``--platform`` naming this one (a projection across
kinds; it then needs the GEMM tables of both). Without ``--like`` the points are issue 37's
(points.POINTS); with it, one per measured training bundle found under
MEASURED_DIR, at that bundle's own layout, batch and devices per node, so every measurement has
its prediction whatever flags it ran with. ``--platform`` names the full platform profile when
the 1-GPU runs recorded a cut one (runs on part of a host). Prints one line per point.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from points import POINTS, WORKLOAD, point_name, target_fields  # noqa: E402

from kit.errors import KitInputError  # noqa: E402
from kit.projection.file import SUFFIX, write_projection  # noqa: E402
from kit.projection.model import project  # noqa: E402
from kit.projection.request import ProjectionTarget  # noqa: E402


def measured_configs(folder: Path) -> list[dict[str, Any]]:
    """Resolved configs of the training bundles under ``folder`` (any depth)."""
    import json

    out = []
    for manifest in sorted(folder.rglob("manifest.json")):
        data = json.loads(manifest.read_text())
        if data["workload"].get("family") != "fabric":
            out.append(data["config"])
    return out


def target_of(config: dict[str, Any], platform: str | None) -> ProjectionTarget:
    """The projection target of a measured bundle's config."""
    p, o = config["parallel"], config["optim"]
    return ProjectionTarget(
        workload=None if config["workload"]["name"] == WORKLOAD else config["workload"]["name"],
        platform=platform, nodes=config["nodes"], tp=p["tp"], pp=p["pp"], dp=p["dp"],
        cp=p["cp"], ep=p["ep"], vpp=p["vpp"], sp=p["sp"],
        micro_batch_size=config["micro_batch_size"],
        global_batch_size=config["global_batch_size"], recompute=o["recompute"],
        overlap=o["overlap"], dist_optimizer=o["dist_optimizer"],
        devices_per_node=config["devices_per_node"])


def issue_targets(platform: str | None) -> dict[str, ProjectionTarget]:
    """Issue 37's points (points.POINTS)."""
    return {name: ProjectionTarget(platform=platform, devices_per_node=gpus,
                                   **target_fields(name))
            for name, (gpus, _) in POINTS.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--platform")
    ap.add_argument("--like", type=Path)
    args = ap.parse_args()
    if args.like:
        targets = {}
        for config in measured_configs(args.like):
            targets[point_name(config)] = target_of(config, args.platform)
    else:
        targets = issue_targets(args.platform)
    failed = 0
    for name, target in targets.items():
        try:
            proj = project(args.bundles, target, sys.argv)
        except KitInputError as e:
            print(f"{name:28} not projected: {e}")
            failed += 1
            continue
        write_projection(proj, args.out / f"{name}{SUFFIX}")
        low, point, high = proj.interval["step_time_s"]
        power = proj.summary["power_w_mean"]
        print(f"{name:28} step {point:.4f} s [{low:.4f}..{high:.4f}]  power "
              + ("n/a" if power is None else f"{power:.0f} W")
              + f"  from {next(i.bundle for i in proj.inputs if i.role == 'compute')}"
              + f" ({proj.source_kind})")
    return 1 if failed == len(targets) else 0


if __name__ == "__main__":
    sys.exit(main())
