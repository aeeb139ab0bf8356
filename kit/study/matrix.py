"""The node-sized matrix of the study: which runs each finding needs on 1, 2, 4 or 8 devices.

The study's models run at full width, cut in depth to fit one node (``workloads/*-4l``,
``*-8l``: every layer has the real model's shape). The points of each finding, deduplicated
where findings share one:

- layouts (position, throttling, links, placement): TP only, TP x PP, PP only and TP x DP at
  micro-batch 1 with full recomputation, the study's parallelism sweep (two devices or more:
  one has no layouts to compare);
- micro-batch bursts: the TP x PP layout at micro-batch 1, 2, 4, 8 with the global batch fixed
  (the micro-batch count falls 16 -> 2 and the pipeline bubble grows), and the same sizes with
  the count fixed at 2 (a global batch that grows with them), to separate the two causes;
- recomputation and overlap: the TP x DP layout with each on and off, everything else fixed;
  data parallelism gives the overlap a gradient reduction to hide, so on one device, with no
  communication at all, the overlap finding has no points (not measurable here);
- the fabric benchmark (collective bus bandwidth), what the links can carry.

Each finding's points are comparable by construction: one model for the whole node, the
deepest whose memory estimate fits every point of every finding (where none does, the model
that fits the most findings, and the others are dropped whole, saying why), and one execution
mode per finding: where one of its layouts cannot be one CUDA graph (a pipeline), its other
points run with ``--eager`` too (:class:`HeldMode`).

On the cpu platform the same matrix runs gpt3-tiny on two rank processes: a demonstration of
the pipeline, not of the hardware.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from kit.config.loader import load_platform
from kit.config.platform import PlatformSpec
from kit.config.run import RunConfig
from kit.engines import engine_spec
from kit.errors import KitInputError
from kit.plan import plan_run
from kit.plan.detect import detect_platform, platform_present
from kit.plan.memory import GIB
from kit.plan.resolve import RunRequest
from kit.study.catalog import FINDING_IDS
from kit.study.estimate import platform_pace, step_s
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
GPU_WARMUP = 3
"""Warmup steps of a GPU point: a graphed step runs its first call eagerly (compilation, cuBLAS
plans, the optimizer's states allocated), captures the CUDA graph on the second
(:class:`kit.engines.megatron.step_graph.StepGraph`) and first replays it on the third. With 1,
the one-H100 study (a1d78de) measured the capture: its first measured step took 4.4-6.0 s
against a median of 1.2-1.5 s. :mod:`kit.study.warmup` checks every point for what is left."""
LAYOUT_FINDINGS = ("thermal-position", "pp-throttle", "tp-pp-links", "thermal-placement")
TOGGLE_FINDINGS = ("recompute-power", "overlap-power")
ONE_DEVICE = {
    **dict.fromkeys(LAYOUT_FINDINGS, "one device: no second GPU or layout to compare"),
    "overlap-power": "one device: no gradient reduction or tensor-parallel communication to "
                     "overlap, so --overlap changes nothing",
}
"""Why a finding has no points on a one-device node (the plan and the findings file say so)."""


@dataclass(frozen=True)
class Node:
    """The node the study runs on: its platform and how many devices the study uses."""

    platform: str
    devices: int
    source: str = ""
    """The platform as ``--platform`` named it (a name or a YAML file), for the runs; empty:
    its name."""

    @property
    def platform_ref(self) -> str:
        """What the runs get as their platform."""
        return self.source or self.platform

    @property
    def is_cpu(self) -> bool:
        """Whether this is the cpu platform (a demonstration; ranks are processes)."""
        return self.platform == "cpu"

    @property
    def label(self) -> str:
        """``<platform>x<devices>``, e.g. ``h200x4``: names the study folder and its files."""
        return f"{self.platform}x{self.devices}"

    def spec(self) -> PlatformSpec:
        """The platform's profile."""
        return load_platform(self.platform_ref)


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
    return Node(spec.name, devices, platform or "")


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


def layout_name(values: dict[str, Any]) -> str:
    """``tp2-pp2-dp1-sp``: a point's layout, as bundles and findings name it."""
    name = f"tp{values.get('tp', 1)}-pp{values.get('pp', 1)}-dp{values.get('dp', 1)}"
    return name + ("-sp" if values.get("sp") else "")


@dataclass(frozen=True)
class StudyPoint:
    """One run of the matrix and the findings that read it."""

    values: dict[str, Any]
    findings: tuple[str, ...]


@dataclass(frozen=True)
class HeldMode:
    """The execution mode every point of one finding runs in, and why.

    Attributes:
        mode: ``graphed`` or ``eager``.
        because: What keeps the finding's eager points eager (their layouts' graph blockers,
            :func:`kit.engines.megatron.features.graph_blockers`); empty when graphed.
        held_eager: Layouts that could be graphed, run with ``--eager`` to match the others.
    """

    mode: Literal["graphed", "eager"]
    because: tuple[str, ...] = ()
    held_eager: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The findings file's ``execution`` of a finding."""
        return {"mode": self.mode, "because": list(self.because),
                "held_eager": list(self.held_eager)}

    def describe(self) -> str:
        """``graphed``, ``eager (why)`` or ``eager (why; L1, L2 held eager to match)``."""
        if self.mode == "graphed":
            return "graphed"
        held = (f"; {', '.join(self.held_eager)} run with --eager to match"
                if self.held_eager else "")
        return f"eager ({'; '.join(self.because)}{held})"


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
    execution: dict[str, HeldMode] = field(default_factory=dict)
    """Finding id -> the execution mode all its points run in (findings with points)."""
    not_run: dict[str, str] = field(default_factory=dict)
    """Finding id -> why the matrix has no points for it on this node (dropped or absent)."""

    @property
    def name(self) -> str:
        """The study folder's name, e.g. ``study-h200x4`` (``-quick`` for the quick form)."""
        return f"study-{self.node.label}" + ("-quick" if self.quick else "")

    def sweep_spec(self, extra: list[StudyPoint] | None = None) -> SweepSpec:
        """The runs as a sweep (kit.sweep runs, resumes and skips them); ``extra`` points (the
        warm-up check's reruns, :mod:`kit.study.warmup`) follow the matrix's."""
        points = self.points + (extra or [])
        return SweepSpec(name=self.name, description=f"charllm-kit study on {self.node.label}",
                         base=self.base, axes=[{"points": [p.values for p in points]}])


def _finding_points(node: Node, quick: bool) -> tuple[dict[str, list[dict[str, Any]]],
                                                      dict[str, str]]:
    """Each finding's points on ``node`` (the model not chosen yet), and the findings the node
    cannot serve at all, with why."""
    n = node.devices
    layouts = _layouts(n)
    full = {"recompute": "full", "overlap": False, "micro_batch_size": 1,
            "global_batch_size": GLOBAL_BATCH}
    wanted: dict[str, list[dict[str, Any]]] = {}
    not_run = dict(ONE_DEVICE) if n == 1 else {}
    if n > 1:
        names = ["tp", "tp_pp", "pp"] if quick else list(layouts)
        for f in LAYOUT_FINDINGS:
            wanted[f] = [{**layouts[k], **full} for k in names]
    burst = layouts.get("tp_pp", layouts.get("single"))
    sizes = [1, 8] if quick else [1, 2, 4, 8]
    series = [{**burst, **full, "micro_batch_size": mb} for mb in sizes]
    series += [{**burst, **full, "micro_batch_size": mb,
                "global_batch_size": FIXED_COUNT * mb * burst["dp"]} for mb in sizes[:-1]]
    wanted["microbatch-bursts"] = series
    toggled = layouts.get("tp_dp", layouts.get("single"))
    combos = [("none", False), ("full", False), ("none", True)] + ([] if quick else
                                                                     [("full", True)])
    pairs = [{**toggled, **full, "recompute": r, "overlap": o} for r, o in combos
             if n > 1 or not o]
    for f in TOGGLE_FINDINGS:
        if f not in not_run:
            wanted[f] = pairs
    return wanted, not_run


def _plan(workload: str, base: dict[str, Any], values: dict[str, Any]) -> tuple[
        RunConfig | None, str | None]:
    """The point's resolved config and, when it cannot run, why (one short phrase)."""
    try:
        plan = plan_run(RunRequest(**{**base, **values, "workload": workload}),
                        require_present=False)
    except KitInputError as e:
        return None, str(e)
    if plan.refusal is None:
        return plan.cfg, None
    m = plan.memory
    return plan.cfg, (f"needs an estimated {m.required_bytes / GIB:.1f} GiB per device of "
                      f"{(m.capacity_bytes or 0) / GIB:.1f} GiB")


def _describe(values: dict[str, Any]) -> str:
    return (f"{layout_name(values)} micro-batch {values['micro_batch_size']} at global batch "
            f"{values['global_batch_size']}, recompute {values['recompute']}")


def _misfits(name: str, base: dict[str, Any],
             wanted: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """The findings a point of which does not fit on model ``name``, each with its first such
    point and why."""
    misfit: dict[str, str] = {}
    for finding_id, points in wanted.items():
        for values in points:
            why = _plan(name, base, values)[1]
            if why is not None:
                misfit[finding_id] = f"{_describe(values)} {why}"
                break
    return misfit


def _choose_workload(node: Node, base: dict[str, Any],
                     wanted: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, str]]:
    """The deepest study model on which every point of every finding fits, and the findings it
    leaves out, with why: none, unless no model fits them all; then the model that fits the
    most findings whole (deepest first among equals), the smallest where none fits any."""
    if node.is_cpu:
        return CPU_WORKLOAD, {}
    ladder = GPU_WORKLOADS if node.devices >= 8 else GPU_WORKLOADS[1:]
    tried = [(name, _misfits(name, base, wanted)) for name in ladder]
    name, misfit = min(tried, key=lambda t: len(t[1]))
    if not misfit:
        return name, {}
    if len(misfit) == len(wanted):
        name, misfit = tried[-1]
        return name, {f: f"no study model fits {node.label}: on {name}, the smallest, {why}"
                      for f, why in misfit.items()}
    return name, {f: (f"no study model fits all its points on {node.label}: on {name}, which "
                      f"the other findings' points fit, {why}") for f, why in misfit.items()}


def _held_mode(workload: str, base: dict[str, Any],
               points: list[dict[str, Any]]) -> tuple[HeldMode, list[dict[str, Any]]]:
    """One execution mode for a finding's points: graphed if every point can be, else eager,
    the points that could be graphed given ``eager`` (returned in place of ``points``)."""
    modes = []
    for values in points:
        cfg = _plan(workload, base, values)[0]
        modes.append(None if cfg is None else engine_spec(cfg.engine).execution(cfg))
    known = [m for m in modes if m is not None]
    if all(m.graphed for m in known):
        return HeldMode("graphed"), points
    because = tuple(dict.fromkeys(w for m in known if not m.graphed for w in m.eager_because))
    held = [v for v, m in zip(points, modes, strict=True) if m is not None and m.graphed]
    return (HeldMode("eager", because, tuple(dict.fromkeys(layout_name(v) for v in held))),
            [{**v, "eager": True} if m is not None and m.graphed else v
             for v, m in zip(points, modes, strict=True)])


def _merge(wanted: dict[str, list[dict[str, Any]]]) -> list[StudyPoint]:
    """One point per distinct run, with every finding that reads it, in first-seen order."""
    seen: dict[str, StudyPoint] = {}
    for finding_id, points in wanted.items():
        for values in points:
            key = repr(sorted(values.items()))
            old = seen.get(key)
            tags = (finding_id,) if old is None else tuple(dict.fromkeys(
                old.findings + (finding_id,)))
            seen[key] = StudyPoint(values, tags)
    return list(seen.values())


def _timed(point: StudyPoint, base: dict[str, Any], window_s: float) -> StudyPoint:
    """The point with enough measured steps to span about ``window_s``, by the platform's
    pace (never the learned one: the steps name the point, which must stay the same for
    ``--resume``)."""
    try:
        cfg = plan_run(RunRequest(**{**base, **point.values}), require_present=False).cfg
    except KitInputError:
        return point  # the sweep's plan says why it cannot run
    pace = platform_pace(cfg.platform, cfg.world_size)
    steps = min(MAX_STEPS, max(base["steps"], math.ceil(window_s / step_s(cfg, pace))))
    return point if steps == base["steps"] else StudyPoint({**point.values, "steps": steps},
                                                           point.findings)


def build_matrix(node: Node, quick: bool, only: tuple[str, ...] = ()) -> StudyMatrix:
    """The study's runs on ``node``; ``only`` keeps the points of those findings.

    Steps: the full form measures at least 8 steps, ``quick`` 4, after :data:`GPU_WARMUP`
    warmup, and on GPUs as many more as span :data:`WINDOW_S` (see :mod:`kit.study.estimate`);
    cpu 2 after 1.

    Raises:
        KitInputError: An unknown finding id in ``only``, ``only`` findings this node runs no
            point for, or a node on which no study model fits a point of any finding.
    """
    unknown = sorted(set(only) - set(FINDING_IDS))
    if unknown:
        raise KitInputError(f"--only {','.join(unknown)}: unknown finding; known: "
                            f"{', '.join(FINDING_IDS)}")
    steps, warmup = (2, 1) if node.is_cpu else (4, GPU_WARMUP) if quick else (8, GPU_WARMUP)
    base: dict[str, Any] = {"platform": node.platform_ref, "steps": steps, "warmup": warmup,
                            "telemetry_interval_ms": 0 if node.is_cpu else 20}
    wanted, not_run = _finding_points(node, quick)
    base["workload"], dropped = _choose_workload(node, base, wanted)
    not_run.update(dropped)
    execution = {}
    for finding_id in [f for f in wanted if f not in not_run]:
        execution[finding_id], wanted[finding_id] = _held_mode(base["workload"], base,
                                                               wanted[finding_id])
    points = _merge({f: p for f, p in wanted.items() if f not in not_run})
    if only:
        points = [p for p in points if set(p.findings) & set(only)]
    if not node.is_cpu:
        points = [_timed(p, base, WINDOW_S[quick]) for p in points]
    if only and not points:
        why = "; ".join(f"{f}: {not_run[f]}" for f in only if f in not_run)
        raise KitInputError(f"--only {','.join(only)}: no run of this node serves these "
                            f"findings ({why or 'docs/study.md'})")
    if not points:
        raise KitInputError(f"no finding of the study can run on {node.label}: "
                            f"{next(iter(dropped.values()))}")
    wants_fabric = (node.devices > 1 and "tp-pp-links" not in not_run
                    and (not only or "tp-pp-links" in only))
    fabric = None
    if wants_fabric:
        fabric = {"platform": node.platform_ref, "nproc": node.devices,
                  "ops": "all_reduce,all_gather,send_recv",
                  "sizes": "64K,1M" if node.is_cpu else "1M,16M,256M",
                  "iters": 10 if node.is_cpu else 20,
                  "telemetry_interval_ms": 0 if node.is_cpu else 20}
    served = {f for p in points for f in p.findings}
    return StudyMatrix(node, quick, base["workload"], base, points, fabric,
                       {f: m for f, m in execution.items() if f in served},
                       {f: why for f, why in not_run.items() if not only or f in only})
