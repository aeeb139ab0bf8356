"""Where a profiled step's time goes: kernels and collectives by category, exposed vs overlapped.

Input is what ``torch.profiler`` exports (``export_chrome_trace``): complete events
(``"ph": "X"``) with a category and a duration in microseconds, and the ``ProfilerStep#<step>``
annotation :mod:`kit.launch.profiling` puts around each profiled step.

**Timeline.** A trace with device activity (``cat`` ``kernel``, ``gpu_memcpy``,
``gpu_memset``) is read on the device: its kernels, on every stream. A CPU-only trace is read on
the host: every CPU operator on every thread, plus gloo's own ``gloo:<collective>`` annotations,
which mark the collective's work (on gloo's worker threads for asynchronous collectives).

**Categories** are vendor-neutral. Compute: MatMul, attention, norm, elementwise/memory, other.
Communication, by collective type: AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv,
Broadcast, OtherComm. NCCL and RCCL kernels (``ncclDevKernel_*``, ``ncclKernel_*``; RCCL
keeps the names), gloo's ``gloo:*`` work and c10d's ``c10d::*`` operators map to the same
names; the ``Collective name`` argument PyTorch attaches to NCCL/RCCL kernels wins over the
kernel name (RCCL's generic kernels carry no type in their name).

**Partition.** Each instant of the step window is given to exactly one category: the innermost
(latest started) compute event running, else the latest started communication event (that
instant is *exposed* communication), else ``idle`` (on a device: no kernel; on a host: no traced
operator, i.e. Python and framework time or an untraced wait). So ``time_s`` over a step's
categories sums to the window. Per communication category, ``overlapped_s`` is the time its
events ran while some compute ran and ``exposed_s`` the time they ran alone (two collectives
running at once count in both).

**Calls and bytes** come from the events that do the work: kernels on a device, ``gloo:*`` on a
host. ``bytes`` is the rank's input message (shapes are recorded by the profiler; NCCL kernels
carry ``In msg nelems`` and ``dtype``): for all-gather one rank's shard, for the others the whole
buffer; null where the trace does not say.

**Pipeline bubble.** With ``pp > 1``, per step: the window from the stage's first forward
operator (the first one autograd recorded, i.e. the start of a forward-backward flow) to the end
of its last backward operator (``autograd::engine::evaluate_function``), on a device the kernels
those launched; ``idle_s`` is the time in it when no compute ran. Beside it the analytical
fraction of a 1F1B schedule, ``(p - 1) / (v * m + p - 1)`` (Narayanan et al., SC'21: ``p``
stages, ``m`` micro-batches per step, ``v`` virtual stages per rank). On a host timeline
Python time between operators counts as idle, so the measured fraction is an upper bound there.
"""

import heapq
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kit.bundle.reader import Bundle
from kit.config.run import RunConfig
from kit.errors import BundleError

CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
        ("AllReduce", r"all_?reduce"),
        ("AllGather", r"all_?gather"),
        ("ReduceScatter", r"reduce_?scatter"),
        ("SendRecv", r"send|recv"),
        ("attention", r"flash|fmha|attention|sdpa|softmax"),
        ("MatMul", r"gemm|matmul|cutlass|xmma|nvjet|cublas|aten::(addmm|mm|bmm|baddbmm)$"),
        ("norm", r"norm"),
        ("elementwise/memory", r"elementwise|vectorized|memcpy|memset|copy|fill|cat|unrolled|"
                               r"aten::(add|sub|mul|div|gelu|silu|relu|sum|mean|neg|exp|pow|"
                               r"empty|zeros?|ones|clone|contiguous|to|_to_copy)_?$"),
    )
)
"""Category name and the kernel/operator name pattern that selects it, in match order (the
kernel-share figure of old and new bundles alike)."""
OTHER = "other"
IDLE = "idle"
COMPUTE = ("MatMul", "attention", "norm", "elementwise/memory", OTHER)
COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "AllToAll", "SendRecv", "Broadcast",
               "OtherComm")
"""Communication categories, by collective type."""
_COMM_EVENT = re.compile(r"^(?:nccl(?:Dev)?Kernel_|rccl|msccl|gloo:|c10d::|nccl:)", re.IGNORECASE)
_COLLECTIVE_PREFIXES = (("allreduce", "AllReduce"), ("allgather", "AllGather"),
                        ("reducescatter", "ReduceScatter"), ("alltoall", "AllToAll"),
                        ("sendrecv", "SendRecv"), ("send", "SendRecv"), ("recv", "SendRecv"),
                        ("broadcast", "Broadcast"))
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_BACKWARD = "autograd::engine::evaluate_function"
STEP_MARK = "ProfilerStep#"


def categorize(name: str) -> str:
    """The category of one kernel or operator name (the kernel-share figure's)."""
    return next((cat for cat, pattern in CATEGORIES if pattern.search(name)), OTHER)


def collective_type(name: str, args: dict[str, Any] | None = None) -> str | None:
    """The collective type of a communication event, or None for a compute event."""
    if not _COMM_EVENT.search(name):
        return None
    label = str((args or {}).get("Collective name") or "") or re.sub(
        r"^(?:nccl(?:Dev)?Kernel_|gloo:|c10d::_?|nccl:)", "", name, flags=re.IGNORECASE)
    key = re.sub(r"[_\-\s]", "", label).lower()
    return next((cat for prefix, cat in _COLLECTIVE_PREFIXES if key.startswith(prefix)),
                "OtherComm")


def compute_category(name: str) -> str:
    """The compute category of a non-communication kernel or operator."""
    cat = categorize(name)
    return cat if cat in COMPUTE else OTHER


_DTYPE_BYTES = ((r"float8|int8|uint8|char|byte|bool", 1), (r"bfloat16|half|float16|short|int16", 2),
                (r"double|float64|long|int64", 8), (r"float|int", 4))


def dtype_bytes(dtype: str) -> int | None:
    """Bytes per element of a dtype as the profiler spells it (``float``, ``c10::BFloat16``)."""
    low = dtype.lower()
    return next((n for pattern, n in _DTYPE_BYTES if re.search(pattern, low)), None)


def message_bytes(args: dict[str, Any]) -> int | None:
    """The input message of a collective event, bytes; None when the trace does not say."""
    if "In msg nelems" in args and isinstance(args.get("dtype"), str):
        size = dtype_bytes(args["dtype"])
        return int(args["In msg nelems"]) * size if size else None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or not dims:
        return None
    total = 0
    for shape, dtype in zip(dims, types, strict=False):
        size = dtype_bytes(dtype) if isinstance(dtype, str) else None
        flat = isinstance(shape, list) and all(isinstance(d, int) for d in shape)
        if size is None or not flat:
            continue
        total += math.prod(shape) * size
    return total or None


class CategoryTime(BaseModel):
    """One category in one profiled step of one rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    category: str = Field(description="Compute category, collective type, or 'idle'.")
    kind: Literal["compute", "communication", "idle"]
    time_s: float = Field(ge=0, description="Share of the step window given to it (the "
                          "partition: the categories of a step sum to its window_s).")
    busy_s: float = Field(ge=0, description="Time any of its events ran, overlaps counted once.")
    calls: int = Field(ge=0, description="Kernels, operators or collectives in the window.")
    bytes: int | None = Field(None, ge=0, description="Communication: input message bytes "
                              "summed over calls; null when unknown or compute.")
    overlapped_s: float | None = Field(None, ge=0, description="Communication: time it ran "
                                       "while compute ran.")
    exposed_s: float | None = Field(None, ge=0, description="Communication: time it ran with "
                                    "no compute running.")


class Bubble(BaseModel):
    """The pipeline bubble of one stage in one step (``pp > 1`` only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float = Field(ge=0, description="First forward start to last backward end.")
    idle_s: float = Field(ge=0, description="Time in the window with no compute running.")
    measured_frac: float = Field(ge=0, le=1, description="idle_s / window_s.")
    analytical_frac: float = Field(ge=0, lt=1, description="(p - 1) / (v * m + p - 1).")


class StepBreakdown(BaseModel):
    """One profiled step of one rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0, description="Step number, as in steps.parquet.")
    window_s: float = Field(ge=0, description="Length of its ProfilerStep annotation.")
    wall_s: float | None = Field(None, description="The step's time as the rank measured it "
                                 "(steps.parquet t_end - t_start).")
    categories: list[CategoryTime]
    bubble: Bubble | None = None


class RankBreakdown(BaseModel):
    """``profile/rank<N>.breakdown.json``: where the profiled steps of one rank spent time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(ge=0)
    stage: int = Field(ge=0, description="Pipeline stage of the rank.")
    timeline: Literal["device", "host"] = Field(
        description="device: the device's kernels; host: CPU operators (no device activity).")
    steps: list[StepBreakdown] = Field(description="Profiled steps that completed, in order.")
    unprofiled_step_time_s: float | None = Field(
        description="Median time of the rank's measured steps that ran without the profiler; "
        "compare with the steps' wall_s to see the profiler's overhead.")


@dataclass(frozen=True)
class StepTimes:
    """The rank's own step times, for the breakdown's overhead comparison."""

    profiled_s: dict[int, float]
    unprofiled_median_s: float | None


@dataclass(frozen=True)
class _Event:
    start: float
    end: float
    category: str
    communication: bool
    work: bool
    """Counts as a call (and its bytes): a kernel, a ``gloo:*`` collective, a CPU operator."""
    nbytes: int | None


def _load(path: Path) -> list[dict[str, Any]]:
    try:
        events = json.loads(path.read_text(encoding="utf-8")).get("traceEvents", [])
    except (ValueError, AttributeError) as e:
        raise BundleError(f"{path} is not a Chrome trace ({e})") from None
    return [e for e in events if isinstance(e, dict)]


def _timed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), int | float)
            and isinstance(e.get("ts"), int | float)]


def _timeline_events(timed: list[dict[str, Any]], device: bool) -> list[_Event]:
    """The events the partition runs over, in microseconds."""
    out = []
    for e in timed:
        name, cat, args = str(e.get("name", "")), e.get("cat"), e.get("args") or {}
        if device and cat not in _DEVICE_CATS:
            continue
        if not device and not (cat == "cpu_op" or (cat == "user_annotation"
                                                   and name.startswith("gloo:"))):
            continue
        coll = collective_type(name, args)
        work = device or coll is None or name.startswith("gloo:")
        out.append(_Event(e["ts"], e["ts"] + max(e["dur"], 0.0),
                          coll or compute_category(name), coll is not None, work,
                          message_bytes(args) if coll is not None and work else None))
    return out


def _partition(events: list[_Event], lo: float, hi: float) -> tuple[dict[str, float], ...]:
    """Sweep ``[lo, hi]``: (partition, busy, overlapped, exposed) seconds per category."""
    bounds: list[tuple[float, int, int]] = []
    for i, e in enumerate(events):
        a, b = max(e.start, lo), min(e.end, hi)
        if b > a:
            bounds += [(a, 1, i), (b, 0, i)]
    bounds.sort()
    part: dict[str, float] = {}
    busy: dict[str, float] = {}
    over: dict[str, float] = {}
    expo: dict[str, float] = {}
    heaps: tuple[list[tuple[float, int]], list[tuple[float, int]]] = ([], [])  # compute, comm
    active: set[int] = set()
    per_cat: dict[str, int] = {}
    t = lo
    for when, opening, i in bounds + [(hi, 0, -1)]:
        span = when - t
        if span > 0:
            top = None
            for heap in heaps:
                while heap and heap[0][1] not in active:
                    heapq.heappop(heap)
                if top is None and heap:
                    top = events[heap[0][1]].category
            part[top or IDLE] = part.get(top or IDLE, 0.0) + span
            computing = bool(heaps[0])
            for cat, n in per_cat.items():
                if n:
                    busy[cat] = busy.get(cat, 0.0) + span
                    if cat in COLLECTIVES:
                        target = over if computing else expo
                        target[cat] = target.get(cat, 0.0) + span
            t = when
        if i < 0:
            break
        e = events[i]
        if opening:
            active.add(i)
            heapq.heappush(heaps[e.communication], (-e.start, i))
            per_cat[e.category] = per_cat.get(e.category, 0) + 1
        else:
            active.discard(i)
            per_cat[e.category] -= 1
    return part, busy, over, expo


def _categories(events: list[_Event], lo: float, hi: float) -> list[CategoryTime]:
    part, busy, over, expo = _partition(events, lo, hi)
    calls: dict[str, int] = {}
    nbytes: dict[str, int | None] = {}
    for e in events:
        if e.work and lo <= e.start < hi:
            calls[e.category] = calls.get(e.category, 0) + 1
            if e.communication:
                known = nbytes.get(e.category, 0)
                nbytes[e.category] = None if known is None or e.nbytes is None else (
                    known + e.nbytes)
    rows = []
    for cat in (*COMPUTE, *COLLECTIVES, IDLE):
        if cat not in part and cat not in busy and cat not in calls:
            continue
        comm = cat in COLLECTIVES
        rows.append(CategoryTime(
            category=cat, kind="communication" if comm else ("idle" if cat == IDLE else "compute"),
            time_s=part.get(cat, 0.0) / 1e6,
            busy_s=(part if cat == IDLE else busy).get(cat, 0.0) / 1e6,
            calls=calls.get(cat, 0), bytes=nbytes.get(cat) if comm else None,
            overlapped_s=over.get(cat, 0.0) / 1e6 if comm else None,
            exposed_s=expo.get(cat, 0.0) / 1e6 if comm else None))
    return rows


def _union(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` clipped to ``[lo, hi]``."""
    total, end = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, end), min(b, hi)
        if b > a:
            total += b - a
            end = b
    return total


def _pipeline_window(timed: list[dict[str, Any]], flows: list[dict[str, Any]], device: bool,
                     lo: float, hi: float) -> tuple[float, float] | None:
    """First forward start to last backward end within ``[lo, hi]`` (module docstring)."""
    starts = [f["ts"] for f in flows if f.get("ph") == "s" and lo <= f["ts"] <= hi]
    ends = [e["ts"] + e["dur"] for e in timed if str(e.get("name", "")).startswith(_BACKWARD)
            and lo <= e["ts"] <= hi]
    if not starts or not ends:
        return None
    first, last = min(starts), max(ends)
    if device:  # the kernels launched from inside that host span
        launches = {e["args"].get("correlation"): e["ts"] for e in timed
                    if e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and isinstance(e.get("args"), dict)}
        kernels = sorted((e["ts"], e["ts"] + e["dur"], launches.get(e["args"].get("correlation")))
                         for e in timed if e.get("cat") == "kernel"
                         and isinstance(e.get("args"), dict))
        inside = [(a, b) for a, b, at in kernels if at is not None and first <= at <= last]
        if not inside:
            return None
        first, last = inside[0][0], max(b for _, b in inside)
    return first, last


def _analytical_bubble(cfg: RunConfig) -> float:
    p, m, v = cfg.parallel.pp, cfg.grad_accum_steps, cfg.parallel.vpp or 1
    return (p - 1) / (v * m + p - 1)


def rank_breakdown(trace: Path, rank: int, stage: int, steps: list[int], times: StepTimes,
                   cfg: RunConfig) -> RankBreakdown:
    """The breakdown of ``steps`` (their ``ProfilerStep#`` windows) in one rank's trace.

    Raises:
        BundleError: The file is not a JSON Chrome trace.
    """
    raw = _load(trace)
    timed = _timed(raw)
    device = any(e.get("cat") in _DEVICE_CATS for e in timed)
    events = _timeline_events(timed, device)
    compute = [(e.start, e.end) for e in events if not e.communication]
    flows = [e for e in raw if e.get("cat") == "fwdbwd"]
    windows = {int(e["name"][len(STEP_MARK):]): (e["ts"], e["ts"] + e["dur"]) for e in timed
               if str(e.get("name", "")).startswith(STEP_MARK)
               and e["name"][len(STEP_MARK):].isdigit()}
    out = []
    for step in steps:
        if step not in windows:
            continue
        lo, hi = windows[step]
        bubble = None
        if cfg.parallel.pp > 1:
            span = _pipeline_window(timed, flows, device, lo, hi)
            if span is not None and span[1] > span[0]:
                idle = (span[1] - span[0]) - _union(compute, *span)
                bubble = Bubble(window_s=(span[1] - span[0]) / 1e6, idle_s=idle / 1e6,
                                measured_frac=min(1.0, max(0.0, idle / (span[1] - span[0]))),
                                analytical_frac=_analytical_bubble(cfg))
        out.append(StepBreakdown(step=step, window_s=(hi - lo) / 1e6,
                                 wall_s=times.profiled_s.get(step),
                                 categories=_categories(events, lo, hi), bubble=bubble))
    return RankBreakdown(rank=rank, stage=stage, timeline="device" if device else "host",
                         steps=out, unprofiled_step_time_s=times.unprofiled_median_s)


_BREAKDOWN = re.compile(r"rank(\d+)\.breakdown\.json")
_TRACE = re.compile(r"rank(\d+)\.json")


def read_breakdowns(bundle: Bundle) -> list[RankBreakdown]:
    """Every ``profile/rank<N>.breakdown.json`` of a bundle, by rank; empty for older bundles.

    Raises:
        BundleError: A breakdown file that does not match :class:`RankBreakdown`.
    """
    folder = bundle.path / "profile"
    files = sorted((int(m.group(1)), p) for p in folder.glob("rank*.breakdown.json")
                   if (m := _BREAKDOWN.fullmatch(p.name))) if folder.is_dir() else []
    out = []
    for _, path in files:
        try:
            out.append(RankBreakdown.model_validate_json(path.read_text(encoding="utf-8")))
        except (ValidationError, ValueError) as e:
            raise BundleError(f"{path} is not a profile breakdown ({e})".splitlines()[0]) from None
    return out


def category_totals(breakdown: RankBreakdown) -> dict[str, float]:
    """Seconds per category summed over the rank's profiled steps (the partition)."""
    totals: dict[str, float] = {}
    for step in breakdown.steps:
        for c in step.categories:
            totals[c.category] = totals.get(c.category, 0.0) + c.time_s
    return totals


def _self_times(ops: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Each CPU operator's duration minus its children's, per thread (events nest)."""
    out = []
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list[Any]] = []  # [end, name, self time]
        for e in events:
            while stack and stack[-1][0] <= e["ts"]:
                _, name, own = stack.pop()
                out.append((name, own))
            if stack:
                stack[-1][2] -= e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], e["dur"]])
        out += [(name, own) for _, name, own in stack]
    return out


def trace_breakdown(path: Path) -> dict[str, float]:
    """Seconds per category of kernel (or CPU operator self) time in one trace.

    Device kernels (``cat == "kernel"``) where the trace has them, else each CPU operator's
    self time, so nested calls are not counted twice. Empty when nothing is timed.

    Raises:
        BundleError: The file is not a JSON Chrome trace.
    """
    timed = _timed(_load(path))
    kernels = [(e["name"], e["dur"]) for e in timed if e.get("cat") == "kernel"]
    pairs = kernels or _self_times([e for e in timed if e.get("cat") == "cpu_op"])
    totals: dict[str, float] = {}
    for name, dur_us in pairs:
        cat = categorize(str(name))
        totals[cat] = totals.get(cat, 0.0) + max(dur_us, 0.0) / 1e6
    return totals


def kernel_times(bundle: Bundle) -> dict[str, dict[str, float]]:
    """Seconds per category for each trace ``profile/rank<N>.json`` (by file name)."""
    folder = bundle.path / "profile"
    traces = sorted((int(m.group(1)), p) for p in folder.glob("rank*.json")
                    if (m := _TRACE.fullmatch(p.name))) if folder.is_dir() else []
    out = {p.name: trace_breakdown(p) for _, p in traces}
    return {name: totals for name, totals in out.items() if totals}
