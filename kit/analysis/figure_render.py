"""Draw a report's figures once each, on every core of the host.

A report of 100 bundles has some 400 figures, and saving them is most of its time. Each figure
is a job (a function that builds a ``Figure``, or None when there is nothing to draw); the jobs
run in a pool of forked processes, one per core the process may use, each returning the PNG
bytes. The per-run views the figures draw from are made the same way (:func:`map_forked`).
Forked workers inherit the jobs and everything they read (bundles, views, scales), so nothing but
the PNGs crosses between processes. Where ``fork`` is not available, or there are
too few jobs to be worth a pool, they run in this process.
"""

import multiprocessing
import os
from collections.abc import Callable
from typing import Any, TypeVar

from matplotlib.figure import Figure

from kit.analysis.plots_common import png_bytes

T = TypeVar("T")

Job = Callable[[], Figure | None]
_POOL_MIN_JOBS = 4
"""Fewer jobs than this run in this process: starting workers would cost more."""

_task: Callable[[int], Any] | None = None
"""The task of the pool being run, inherited by its forked workers."""


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _call(index: int) -> Any:
    assert _task is not None
    return _task(index)


def map_forked(task: Callable[[int], T], count: int, workers: int | None = None) -> list[T]:
    """``[task(0), ..., task(count - 1)]``, computed in forked workers (one per core) when
    there are enough; ``task`` and what it reads are inherited, only results are pickled."""
    global _task
    workers = min(workers or cores(), count)
    if workers < 2 or count < _POOL_MIN_JOBS or (
            "fork" not in multiprocessing.get_all_start_methods()):
        return [task(i) for i in range(count)]
    _task = task
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return pool.map(_call, range(count), chunksize=1)
    finally:
        _task = None


def render_all(jobs: list[Job], workers: int | None = None) -> list[bytes | None]:
    """PNG bytes of every job's figure (None where a job draws nothing), in job order."""
    def render(index: int) -> bytes | None:
        fig = jobs[index]()
        return png_bytes(fig) if fig is not None else None

    return map_forked(render, len(jobs), workers)
