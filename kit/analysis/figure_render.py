"""Draw a report's figures once each, on every core of the host.

A report of 100 bundles has some 400 figures, and saving them is most of its time. Each figure
is a job (a function that builds a ``Figure``, or None when there is nothing to draw); the jobs
run in a pool of forked processes, one per core the process may use, each returning the PNG
bytes. Forked workers inherit the jobs and everything they read (bundles, views, scales), so
nothing but the PNGs crosses between processes. Where ``fork`` is not available, or there are
too few jobs to be worth a pool, they run in this process.
"""

import multiprocessing
import os
from collections.abc import Callable

from matplotlib.figure import Figure

from kit.analysis.plots_common import png_bytes

Job = Callable[[], Figure | None]
_POOL_MIN_JOBS = 4
"""Fewer jobs than this run in this process: starting workers would cost more."""

_jobs: list[Job] = []
"""The jobs of the pool being run, inherited by its forked workers."""


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _render(index: int) -> bytes | None:
    fig = _jobs[index]()
    return png_bytes(fig) if fig is not None else None


def render_all(jobs: list[Job], workers: int | None = None) -> list[bytes | None]:
    """PNG bytes of every job's figure (None where a job draws nothing), in job order."""
    global _jobs
    workers = min(workers or cores(), len(jobs))
    _jobs = jobs
    try:
        if workers < 2 or len(jobs) < _POOL_MIN_JOBS or (
                "fork" not in multiprocessing.get_all_start_methods()):
            return [_render(i) for i in range(len(jobs))]
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            return pool.map(_render, range(len(jobs)), chunksize=1)
    finally:
        _jobs = []
