"""How long the study's runs take, before they run: start-up plus steps at this node's pace.

A point costs its start-up (the launch, the first step's compilation and allocation, a CUDA
graph's capture, writing the bundle: everything beyond its steps at the median step time) plus
its other steps, the measured ones at least the run's ``min_measured_s``. A GPU step takes the
model FLOPs (Megatron-LM's count, 4/3 of it with full recomputation) at the pace's MFU of the
platform's peak; a cpu step of gpt3-tiny takes the pace's seconds per sample of a
data-parallel replica. The pace, first found:

1. the last study's bundles on this node (:func:`learned_pace`: the study folders of this node
   in the study's ``--out``): their medians, each bundle's start-up from its lifecycle and
   steps;
2. the platform file's ``study_pace`` (:func:`platform_pace`): measured on that kind of node,
   its source beside it;
3. the kit's defaults below.

While the study runs, the time left is the estimate of the points left scaled by how the
finished ones compared with theirs.
"""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from kit.config.platform import PlatformSpec
from kit.config.run import RunConfig
from kit.metrics.flops import model_flops_per_step

GPU_STARTUP_S = 25.0
"""Start-up of a point on a GPU platform without a ``study_pace``: 4 H100/H200s took about 25 s
after the start-up work of issue 38."""
CPU_STARTUP_S = 33.0
"""Two gpt3-tiny ranks on the project's busy 2-core CPU host (launch_to_first_step_s of their
bundles)."""
ASSUMED_MFU = 0.3
"""MFU on a GPU platform without a ``study_pace``: the study's layouts on 4 H200s reached MFU
0.30-0.39 (issue 38); the lower end is safer."""
CPU_SAMPLE_S = 0.1
"""gpt3-tiny on cpu, seconds per sample of a data-parallel replica: a PP2 step of 16 samples
took 1.6-4.7 s on the busy 2-core host."""
FABRIC_S = {"cpu": 40.0, "gpu": 60.0}
"""The fabric benchmark's run (three collectives at two or three sizes), start-up included."""
REPORT_S = {"cpu": 30.0, "gpu": 10.0}
"""Findings and the report. On one H100 (a1d78de) the findings file was written 3 s before
the study ended, at most 4 s after its last point's bundle; a cpu host reads its bundles
slower."""
FULL_RECOMPUTE_WORK = 4 / 3
"""Full recomputation runs the forward pass twice: 3 passes of work become 4."""


@dataclass(frozen=True)
class Pace:
    """How fast this node runs the study's points.

    Attributes:
        startup_s: Seconds per point beyond its steps at the median step time.
        mfu: GPU: model-FLOPs utilization, full recomputation's second forward counted.
        sample_s: cpu: seconds per sample of a data-parallel replica.
        source: Where the numbers come from, for the dry run's footer.
    """

    startup_s: float
    mfu: float
    sample_s: float
    source: str

    def describe(self, cpu: bool) -> str:
        """``start-up 17 s per point, MFU 0.47 (<source>)``."""
        speed = f"{self.sample_s:.2f} s per sample" if cpu else f"MFU {self.mfu:.2f}"
        return f"start-up {self.startup_s:.0f} s per point, {speed} ({self.source})"


def _nearest(by_devices: dict[int, float], devices: int) -> float:
    return by_devices[min(by_devices, key=lambda n: (abs(n - devices), n))]


def platform_pace(platform: PlatformSpec, devices: int) -> Pace:
    """The platform file's measured pace for ``devices``, else the kit's defaults."""
    if platform.is_cpu:
        return Pace(CPU_STARTUP_S, ASSUMED_MFU, CPU_SAMPLE_S, "the kit's cpu defaults")
    measured = platform.study_pace
    if measured is None:
        return Pace(GPU_STARTUP_S, ASSUMED_MFU, CPU_SAMPLE_S,
                    f"the kit's defaults; platform {platform.name} has no study_pace")
    return Pace(_nearest(measured.startup_s, devices), measured.mfu, CPU_SAMPLE_S,
                f"platform {platform.name}'s study_pace")


@dataclass(frozen=True)
class _Record:
    platform: str
    world_size: int
    startup_s: float | None
    mfu: float | None
    sample_s: float


def _record(bundle: Path) -> _Record | None:
    """One finished point's pace, from its manifest, metrics and steps (None if unreadable)."""
    try:
        manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
        metrics = json.loads((bundle / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    cfg, summary = manifest.get("config") or {}, metrics.get("summary") or {}
    step = summary.get("step_time_s")
    if manifest.get("status") != "ok" or not step or not cfg.get("global_batch_size"):
        return None
    work = FULL_RECOMPUTE_WORK if (cfg.get("optim") or {}).get("recompute") == "full" else 1.0
    dp = (cfg.get("parallel") or {}).get("dp") or 1
    mfu = summary.get("mfu")
    return _Record((cfg.get("platform") or {}).get("name", "?"), summary.get("world_size") or 1,
                   _startup_s(bundle, metrics.get("lifecycle") or {}, step),
                   mfu * work if mfu else None, step * dp / cfg["global_batch_size"])


def _startup_s(bundle: Path, lifecycle: dict[str, Any], step_s: float) -> float | None:
    """Launch to the first step's end, the steps after it beyond the median step, and the last
    step to the bundle's assembly."""
    first, tail = lifecycle.get("launch_to_first_step_end_s"), lifecycle.get(
        "last_step_to_assembly_s")
    if first is None or tail is None:
        return None
    try:
        steps = pq.read_table(bundle / "steps.parquet", columns=["step", "t_end"]).to_pydict()
    except (OSError, ValueError):
        return None
    ends: dict[int, float] = {}
    for n, t in zip(steps["step"], steps["t_end"], strict=True):
        ends[n] = max(t, ends.get(n, t))
    if not ends:
        return None
    later = max(ends.values()) - ends[min(ends)] - (len(ends) - 1) * step_s
    return first + tail + max(later, 0.0)


def study_folders(out: Path, label: str) -> list[Path]:
    """This node's study folders under ``out`` (full and quick), where they exist."""
    return [f for f in (out / f"study-{label}", out / f"study-{label}-quick") if f.is_dir()]


def learned_pace(out: Path, label: str, platform: PlatformSpec, devices: int) -> Pace | None:
    """The pace the bundles of this node's earlier studies under ``out`` ran at (medians over
    ``<out>/study-<label>[-quick]/<point>/<bundle>/``), or None where there are none.

    Only bundles of ``platform`` on ``devices`` ranks that ended ok count; a figure no bundle
    has (a start-up, where the bundles predate the lifecycle record) is the platform's.
    """
    folders = study_folders(out, label)
    bundles = [m.parent for f in folders for m in sorted(f.glob("*/*/manifest.json"))]
    records = [r for b in bundles if (r := _record(b)) is not None
               and r.platform == platform.name and r.world_size == devices]
    if not records:
        return None
    base = platform_pace(platform, devices)

    def median(values: list[float | None], fallback: float) -> float:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else fallback

    return Pace(median([r.startup_s for r in records], base.startup_s),
                median([r.mfu for r in records], base.mfu),
                statistics.median(r.sample_s for r in records),
                f"{len(records)} bundle{'s' * (len(records) > 1)} of "
                f"{' and '.join(str(f) for f in folders)}")


def step_s(cfg: RunConfig, pace: Pace) -> float:
    """One optimizer step of ``cfg``, predicted."""
    if cfg.platform.is_cpu:
        return pace.sample_s * cfg.global_batch_size / cfg.parallel.dp
    flops = model_flops_per_step(cfg.workload, cfg.global_batch_size, cfg.parallel.tp)
    if cfg.optim.recompute == "full":
        flops *= FULL_RECOMPUTE_WORK
    peak = cfg.platform.peak_tflops.get(cfg.dtype)
    if not peak:  # a platform without a declared peak: as slow as cpu, to be safe
        return CPU_SAMPLE_S * cfg.global_batch_size / cfg.parallel.dp
    return flops / (cfg.world_size * peak * 1e12 * pace.mfu)


def point_s(cfg: RunConfig, pace: Pace) -> float:
    """The whole point: start-up, the warmup steps after the first and the measured steps
    (at least ``min_measured_s`` of them, as the run extends itself)."""
    step = step_s(cfg, pace)
    # the first step is the start-up's (a run without warmup measures it: one step less here)
    return pace.startup_s + (cfg.warmup - 1) * step + max(cfg.steps * step, cfg.min_measured_s)


def fmt_duration(seconds: float) -> str:
    """``12 min 30 s`` or ``45 s``."""
    s = round(seconds)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"
