"""Where a profiled mixture-of-experts step goes: expert GEMMs, permutation, router, all-to-all.

Reads a rank's Chrome trace (``profile/rank<N>.json`` of ``run --profile``) and gives every
kernel (on a GPU; every CPU operator on a host timeline) a category, then partitions each
profiled step's window the way :mod:`kit.metrics.kernels` does (the innermost running
compute, else exposed communication, else idle), so the categories sum to the window.

Attribution: under the profiler the engine wraps each MoE layer's stages in ``moe:<stage>``
ranges (:mod:`kit.engines.megatron.moe_ranges`). A kernel belongs to the ranges around the
host call that launched it (matched by the trace's ``correlation`` id); a backward operator
belongs to the stage of the forward operator that made its autograd node (the trace's
``Sequence number``), and the optimizer's kernels to torch's ``Optimizer.step`` range.

Categories: ``expert GEMMs`` (matrix kernels of the experts' forward and backward: grouped
GEMMs and per-expert weight-gradient GEMMs), ``expert other`` (their activation and copies),
``router`` (gating GEMM, top-k, softmax, load-balancing loss), ``permute/unpermute`` (the
dispatcher's token sorting and restoring, forward and backward), collectives by type
(``AllToAll`` is the expert dispatch), ``optimizer``, the rest by kernel name as in
:mod:`kit.metrics.kernels` (``MatMul`` = the dense layers' GEMMs), and ``idle`` (the device
waiting on the host: host gaps).
"""

import bisect
from collections import defaultdict
from pathlib import Path
from typing import Any

from kit.metrics.kernels import (
    _DEVICE_CATS,
    IDLE,
    STEP_MARK,
    _Event,
    _load,
    _partition,
    _timed,
    collective_type,
    compute_category,
)

STAGE_CATEGORY = {
    "moe:router": "router",
    "moe:permute": "permute/unpermute",
    "moe:unpermute": "permute/unpermute",
    "moe:expert_stage": "permute/unpermute",
    "moe:dispatch": "permute/unpermute",
    "moe:combine": "permute/unpermute",
    "moe:experts": "experts",
    "optimizer": "optimizer",
}
"""Range label -> category of the non-communication work under it."""
ORDER = ("expert GEMMs", "expert other", "router", "permute/unpermute", "AllToAll", "MatMul",
         "attention", "norm", "elementwise/memory", "other", "optimizer", "AllReduce",
         "AllGather", "ReduceScatter", "SendRecv", "Broadcast", "OtherComm", IDLE)
"""Categories in the order they are printed."""


def _own_label(e: dict[str, Any], backward_of: dict[int, str]) -> str | None:
    """The label an operator or range sets for what runs inside it, None to inherit."""
    name = str(e.get("name", ""))
    if name.startswith("moe:"):
        return name
    if name.startswith("Optimizer.step"):
        return "optimizer"
    if name.startswith("autograd::engine::evaluate_function"):
        seq = (e.get("args") or {}).get("Sequence number")
        return backward_of.get(seq) if isinstance(seq, int) else None
    return None


class _Labels:
    """Per host thread, the label in force at each instant (innermost range wins)."""

    def __init__(self, host: list[dict[str, Any]]) -> None:
        by_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for e in host:
            by_tid[e.get("tid")].append(e)
        self._forward: dict[int, str] = {}
        # forward first (the main thread's forward ops map sequence numbers to stages), then
        # the threads that run backward nodes; a pass over all threads twice settles both
        self._segments: dict[Any, tuple[list[float], list[str | None]]] = {}
        self.labelled: dict[int, str | None] = {}
        for _ in range(2):
            for tid, events in by_tid.items():
                self._segments[tid] = self._sweep(events)

    def _sweep(self, events: list[dict[str, Any]]) -> tuple[list[float], list[str | None]]:
        """One thread's labels in force, as (segment starts, labels).

        Records each event's inherited label, and the forward operators' sequence numbers ->
        stage for the backward nodes swept later.
        """
        events = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
        starts: list[float] = []
        labels: list[str | None] = []
        stack: list[tuple[float, str | None]] = []  # (end, label)

        def emit(t: float) -> None:
            label = stack[-1][1] if stack else None
            if starts and starts[-1] == t:
                labels[-1] = label
            else:
                starts.append(t)
                labels.append(label)

        for e in events:
            start, end = e["ts"], e["ts"] + max(e["dur"], 0.0)
            while stack and stack[-1][0] <= start:
                closed = stack.pop()[0]
                emit(closed)
            parent = stack[-1][1] if stack else None
            label = _own_label(e, self._forward) or parent
            self.labelled[id(e)] = label
            seq = (e.get("args") or {}).get("Sequence number")
            if (isinstance(seq, int) and label in STAGE_CATEGORY and label != "optimizer"
                    and not str(e.get("name", "")).startswith("autograd::")):
                self._forward.setdefault(seq, label)
            stack.append((end, label))
            emit(start)
        while stack:
            emit(stack.pop()[0])
        return starts, labels

    def at(self, tid: Any, t: float) -> str | None:
        """The label in force on host thread ``tid`` at time ``t``."""
        starts, labels = self._segments.get(tid, ([], []))
        i = bisect.bisect_right(starts, t) - 1
        return labels[i] if i >= 0 else None


def _category(name: str, args: dict[str, Any], label: str | None) -> tuple[str, bool]:
    """(category, is communication) of one kernel or operator under ``label``."""
    coll = collective_type(name, args)
    if coll is not None:
        return coll, True
    base = compute_category(name)
    stage = STAGE_CATEGORY.get(label or "")
    if stage == "experts":
        return ("expert GEMMs" if base == "MatMul" else "expert other"), False
    return stage or base, False


def step_breakdowns(trace: Path) -> list[dict[str, Any]]:
    """The MoE breakdown of every profiled step in one rank's trace.

    Returns:
        Per step, in step order: ``step``, ``window_s``, ``categories`` (category -> seconds
        of the window, summing to it) and ``calls`` (kernels or operators per category).

    Raises:
        BundleError: The file is not a JSON Chrome trace.
    """
    timed = _timed(_load(trace))
    device = any(e.get("cat") in _DEVICE_CATS for e in timed)
    host = [e for e in timed if e.get("cat") in ("cpu_op", "user_annotation")]
    labels = _Labels(host)
    launches = {(e.get("args") or {}).get("correlation"): e for e in timed  # CUDA and HIP
                if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    events: list[_Event] = []
    calls: list[tuple[float, str]] = []
    for e in timed:
        name, cat, args = str(e.get("name", "")), e.get("cat"), e.get("args") or {}
        if device:
            if cat not in _DEVICE_CATS:
                continue
            launch = launches.get(args.get("correlation"))
            label = labels.at(launch.get("tid"), launch["ts"]) if launch else None
        else:
            if cat != "cpu_op" and not (cat == "user_annotation" and name.startswith("gloo:")):
                continue
            label = labels.labelled.get(id(e))
        category, comm = _category(name, args, label)
        events.append(_Event(e["ts"], e["ts"] + max(e["dur"], 0.0), category, comm, True, None))
        calls.append((e["ts"], category))
    out = []
    for e in timed:
        name = str(e.get("name", ""))
        if not (name.startswith(STEP_MARK) and name[len(STEP_MARK):].isdigit()):
            continue
        lo, hi = e["ts"], e["ts"] + e["dur"]
        part = _partition(events, lo, hi)[0]
        counted: dict[str, int] = defaultdict(int)
        for t, category in calls:
            if lo <= t < hi:
                counted[category] += 1
        out.append({"step": int(name[len(STEP_MARK):]), "window_s": (hi - lo) / 1e6,
                    "categories": {k: v / 1e6 for k, v in part.items()},
                    "calls": dict(counted)})
    return sorted(out, key=lambda s: s["step"])


def format_breakdown(step: dict[str, Any], step_time_s: float | None = None) -> str:
    """One step's breakdown as aligned text lines: milliseconds and share of the window."""
    window = step["window_s"]
    cats = step["categories"]
    lines = [f"profiled step {step['step']}: window {window * 1e3:.1f} ms"
             + (f" (unprofiled median step {step_time_s * 1e3:.1f} ms)" if step_time_s else "")]
    for name in [*ORDER, *sorted(set(cats) - set(ORDER))]:
        if cats.get(name):
            label = "idle (host gaps)" if name == IDLE else name
            lines.append(f"  {label:<22} {cats[name] * 1e3:9.2f} ms  {cats[name] / window:6.1%}"
                         f"  {step['calls'].get(name, 0):6d} calls")
    return "\n".join(lines)
