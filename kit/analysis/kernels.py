"""Kernel time by category from the Chrome traces in a bundle's ``profile/`` folder.

A trace is what ``torch.profiler`` exports (``export_chrome_trace``): complete events
(``"ph": "X"``) with a category and a duration in microseconds. Device kernels
(``cat == "kernel"``) are counted where the trace has them; a CPU-only trace counts each
operator's self time (its duration minus its nested operators' on the same thread), so nested
calls are not counted twice. Names are sorted into the reference study's categories (MatMul,
SendRecv, AllGather, ReduceScatter, AllReduce, elementwise/memory, norm, other) plus
attention, by the first pattern of :data:`CATEGORIES` that matches.
"""

import json
import re
from pathlib import Path
from typing import Any

from kit.bundle.reader import Bundle
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
"""Category name and the kernel/operator name pattern that selects it, in match order."""
OTHER = "other"


def categorize(name: str) -> str:
    """The category of one kernel or operator name."""
    return next((cat for cat, pattern in CATEGORIES if pattern.search(name)), OTHER)


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
    """Seconds per category in one trace; empty when it has no timed kernels or operators.

    Raises:
        BundleError: The file is not a JSON Chrome trace.
    """
    try:
        events = json.loads(path.read_text(encoding="utf-8")).get("traceEvents", [])
    except (ValueError, AttributeError) as e:
        raise BundleError(f"{path} is not a Chrome trace ({e})") from None
    timed = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
             and isinstance(e.get("dur"), int | float) and isinstance(e.get("ts"), int | float)]
    kernels = [(e["name"], e["dur"]) for e in timed if e.get("cat") == "kernel"]
    pairs = kernels or _self_times([e for e in timed if e.get("cat") == "cpu_op"])
    totals: dict[str, float] = {}
    for name, dur_us in pairs:
        cat = categorize(str(name))
        totals[cat] = totals.get(cat, 0.0) + max(dur_us, 0.0) / 1e6
    return totals


def kernel_times(bundle: Bundle) -> dict[str, dict[str, float]]:
    """Seconds per category for each trace under ``profile/`` (by file name); empty if none."""
    folder = bundle.path / "profile"
    traces = sorted(folder.rglob("*.json")) if folder.is_dir() else []
    out = {str(p.relative_to(folder)): trace_breakdown(p) for p in traces}
    return {name: totals for name, totals in out.items() if totals}
