"""The node-sized matrix of the study: which runs each finding needs on 1, 2, 4 or 8 devices.

The study's models run at full width, cut in depth to fit one node (``workloads/*-4l``,
``*-8l``: every layer has the real model's shape); the deepest model whose layouts the memory
estimate accepts is taken. The points, deduplicated where findings share one:

- layouts (position, throttling, links, placement): TP only, TP x PP, PP only and TP x DP at
  micro-batch 1 with full recomputation, the study's parallelism sweep;
- micro-batch bursts: the TP x PP layout at micro-batch 1, 2, 4, 8 with the global batch fixed
  (the micro-batch count falls 16 -> 2 and the pipeline bubble grows), and the same sizes with
  the count fixed at 2 (a global batch that grows with them), to separate the two causes;
- recomputation and overlap: the TP x DP layout (grad-reduce overlap needs DP) with each on and
  off, everything else fixed;
- the fabric benchmark (collective bus bandwidth), what the links can carry.

On the cpu platform the same matrix runs gpt3-tiny on two rank processes: a demonstration of
the pipeline, not of the hardware.
"""

import math
from dataclasses import dataclass
from typing import Any

from kit.config.loader import load_platform
from kit.errors import KitInputError
from kit.plan import plan_run
from kit.plan.detect import detect_platform, platform_present
from kit.plan.resolve import RunRequest
from kit.study.catalog import FINDING_IDS
from kit.study.estimate import step_s
from kit.sweep.file import SweepSpec
from kit.telemetry.devices import local_accelerator_names

NODE_SIZES = (1, 2, 4, 8)
GLOBAL_BATCH = 16
"""Samples per step: the study's global batch of 128 over 32 GPUs is 16 per node of four."""
FIXED_COUNT = 2
"""Micro-batches per step of the fixed-count series (micro-batch 8 at global batch 16 has 2)."""
GPU_WORKLOADS = ("gpt3-175b-8l", "gpt3-175b-4l", "gpt3-13b", "gpt3-2.7b", "gpt3-1.3b")
"""Deepest first; gpt3-175b-4l is the study's GPT-3 175B at full width (4 of 96 layers), and
its 8-layer cut is for 8 devices only (PP8 needs 8 layers; on 4 the 4-layer cut keeps the
points short)."""
CPU_WORKLOAD = "gpt3-tiny"
WINDOW_S = {False: 10.0, True: 5.0}
"""Measured seconds per GPU point (full, quick): a point of short steps (global batch 2) runs
more of them, so that every point's peak power rests on about as many samples; a peak over
fewer samples reads lower, and would bias the burst comparison."""
MAX_STEPS = 50
LAYOUT_FINDINGS = ("thermal-position", "pp-throttle", "tp-pp-links", "thermal-placement")


@dataclass(frozen=True)
class Node:
    """The node the study runs on: its platform and how many devices the study uses."""

    platform: str
    devices: int

    @property
    def is_cpu(self) -> bool:
        """Whether this is the cpu platform (a demonstration; ranks are processes)."""
        return self.platform == "cpu"

    @property
    def label(self) -> str:
        """``<platform>x<devices>``, e.g. ``h200x4``: names the study folder and its files."""
        return f"{self.platform}x{self.devices}"


def detect_node(platform: str | None, devices: int | None) -> Node:
    """This node, or the one named (``platform``, ``devices``) for a dry run elsewhere.

    Without ``devices``: every visible device of this GPU node (rounded down to 1, 2, 4 or 8),
    the platform's devices per node for one named that is not here, 2 rank processes on cpu.

    Raises:
        KitInputError: An unknown platform, a device count the study has no matrix for, or a
            GPU platform named without its devices here and no count given.
    """
    spec = load_platform(platform) if platform else detect_platform()
    if devices is None:
        if spec.is_cpu:
            devices = 2
        elif platform_present(spec):
            found = len(local_accelerator_names())
            devices = max(n for n in NODE_SIZES if n <= max(found, 1))
        else:
            devices = min(spec.devices_per_node or 1, max(NODE_SIZES))
    if devices not in NODE_SIZES:
        raise KitInputError(f"--devices {devices}: the study has matrices for "
                            f"{', '.join(map(str, NODE_SIZES))} devices")
    return Node(spec.name, devices)


def _layouts(n: int) -> dict[str, dict[str, Any]]:
    """The study's layout families on ``n`` devices (DP explicit: the world is ``n``), with
    sequence parallelism wherever TP > 1, as in the study."""
    if n == 1:
        return {"single": {"tp": 1, "pp": 1, "dp": 1}}
    half = n // 2
    sp = {"sp": True} if half > 1 else {}
    return {
        "tp": {"tp": n, "pp": 1, "dp": 1, "sp": True},
        "tp_pp": {"tp": half, "pp": 2, "dp": 1, **sp},
        "pp": {"tp": 1, "pp": n, "dp": 1},
        "tp_dp": {"tp": half, "pp": 1, "dp": 2, "dist_optimizer": True, **sp},
    }


@dataclass(frozen=True)
class StudyPoint:
    """One run of the matrix and the findings that read it."""

    values: dict[str, Any]
    findings: tuple[str, ...]


@dataclass(frozen=True)
class StudyMatrix:
    """Everything the study runs on one node."""

    node: Node
    quick: bool
    workload: str
    base: dict[str, Any]
    points: list[StudyPoint]
    fabric: dict[str, Any] | None
    """``charllm-kit fabric`` options (FabricRequest fields), or None when not needed."""

    @property
    def name(self) -> str:
        """The study folder's name, e.g. ``study-h200x4`` (``-quick`` for the quick form)."""
        return f"study-{self.node.label}" + ("-quick" if self.quick else "")

    def sweep_spec(self) -> SweepSpec:
        """The runs as a sweep (kit.sweep runs, resumes and skips them)."""
        return SweepSpec(name=self.name, description=f"charllm-kit study on {self.node.label}",
                         base=self.base, axes=[{"points": [p.values for p in self.points]}])


def _candidate_points(node: Node, quick: bool) -> list[StudyPoint]:
    layouts = _layouts(node.devices)
    full = {"recompute": "full", "overlap": False, "micro_batch_size": 1,
            "global_batch_size": GLOBAL_BATCH}
    names = ["tp", "tp_pp", "pp"] if quick and node.devices > 1 else list(layouts)
    points = [StudyPoint({**layouts[k], **full}, LAYOUT_FINDINGS) for k in names]
    burst = layouts.get("tp_pp", layouts.get("single"))
    sizes = [1, 8] if quick else [1, 2, 4, 8]
    for mb in sizes:
        points.append(StudyPoint({**burst, **full, "micro_batch_size": mb},
                                 ("microbatch-bursts",)))
    for mb in sizes[:-1]:
        gbs = FIXED_COUNT * mb * burst["dp"]
        points.append(StudyPoint({**burst, **full, "micro_batch_size": mb,
                                  "global_batch_size": gbs}, ("microbatch-bursts",)))
    toggled = layouts.get("tp_dp", layouts.get("single"))
    combos = [("none", False), ("full", False), ("none", True)] + ([] if quick else
                                                                     [("full", True)])
    for recompute, overlap in combos:
        values = {**toggled, **full, "recompute": recompute, "overlap": overlap}
        points.append(StudyPoint(values, ("recompute-power", "overlap-power")))
    return _merge(points)


def _merge(points: list[StudyPoint]) -> list[StudyPoint]:
    """One point per distinct run, with the findings of every copy, in first-seen order."""
    seen: dict[str, StudyPoint] = {}
    for p in points:
        key = repr(sorted(p.values.items()))
        old = seen.get(key)
        tags = p.findings if old is None else tuple(dict.fromkeys(old.findings + p.findings))
        seen[key] = StudyPoint(p.values, tags)
    return list(seen.values())


def _fits(workload: str, base: dict[str, Any], values: dict[str, Any]) -> bool:
    try:
        plan = plan_run(RunRequest(**{**base, **values, "workload": workload}),
                        require_present=False)
    except KitInputError:
        return False
    return plan.refusal is None


def _workload(node: Node, base: dict[str, Any], points: list[StudyPoint]) -> str:
    """The deepest study model whose layouts (micro-batch 1) all fit this node's memory."""
    if node.is_cpu:
        return CPU_WORKLOAD
    layouts = [p.values for p in points if set(p.findings) & set(LAYOUT_FINDINGS)]
    ladder = GPU_WORKLOADS if node.devices >= 8 else GPU_WORKLOADS[1:]
    for name in ladder:
        if all(_fits(name, base, v) for v in layouts):
            return name
    return GPU_WORKLOADS[-1]


def _timed(point: StudyPoint, base: dict[str, Any], window_s: float) -> StudyPoint:
    """The point with enough measured steps to span about ``window_s`` (by the estimate)."""
    try:
        cfg = plan_run(RunRequest(**{**base, **point.values}), require_present=False).cfg
    except KitInputError:
        return point  # the sweep's plan says why it cannot run
    steps = min(MAX_STEPS, max(base["steps"], math.ceil(window_s / step_s(cfg))))
    return point if steps == base["steps"] else StudyPoint({**point.values, "steps": steps},
                                                           point.findings)


def build_matrix(node: Node, quick: bool, only: tuple[str, ...] = ()) -> StudyMatrix:
    """The study's runs on ``node``; ``only`` keeps the points of those findings.

    Steps: the full form measures at least 8 steps after 2 warmup, ``quick`` 4 after 1, and on
    GPUs as many more as span :data:`WINDOW_S` (see :mod:`kit.study.estimate`); cpu 2 after 1.

    Raises:
        KitInputError: An unknown finding id in ``only``.
    """
    unknown = sorted(set(only) - set(FINDING_IDS))
    if unknown:
        raise KitInputError(f"--only {','.join(unknown)}: unknown finding; known: "
                            f"{', '.join(FINDING_IDS)}")
    steps, warmup = (2, 1) if node.is_cpu else (4, 1) if quick else (8, 2)
    base: dict[str, Any] = {"platform": node.platform, "steps": steps, "warmup": warmup,
                            "telemetry_interval_ms": 0 if node.is_cpu else 20}
    points = _candidate_points(node, quick)
    base["workload"] = _workload(node, base, points)
    if not node.is_cpu:
        points = [_timed(p, base, WINDOW_S[quick]) for p in points]
    if only:
        points = [p for p in points if set(p.findings) & set(only)]
        if not points:
            raise KitInputError(f"--only {','.join(only)}: no run of this node serves "
                                "these findings (docs/study.md)")
    wants_fabric = node.devices > 1 and (not only or "tp-pp-links" in only)
    fabric = None
    if wants_fabric:
        fabric = {"platform": node.platform, "nproc": node.devices,
                  "ops": "all_reduce,all_gather,send_recv",
                  "sizes": "64K,1M" if node.is_cpu else "1M,16M,256M",
                  "iters": 10 if node.is_cpu else 20,
                  "telemetry_interval_ms": 0 if node.is_cpu else 20}
    return StudyMatrix(node, quick, base["workload"], base, points, fabric)
