"""Draw a report's figures once each, on every core of the host.

A report of 100 bundles has some 50 figures, and drawing and saving them is most of its time.
Each figure is a job (a function that builds a ``Figure``, or None when there is nothing to
draw); the jobs run in a pool of forked processes, one per core the process may use, each
returning the PNG bytes. The per-run views the figures draw from, and the verified bundles the
comparison reads, are made the same way (:func:`map_forked`).
Forked workers inherit the jobs and everything they read (bundles, views, scales), so nothing but
the PNGs crosses between processes. Where ``fork`` is not available, or there are
too few jobs to be worth a pool, they run in this process.

A worker that dies (killed for memory, a crash in a renderer) does not hang the report: the
jobs it had not finished are run here, in order, after a one-line warning. Ctrl-C (or any
error here) cancels what is queued and stops the workers; workers die with this process.
"""

import ctypes
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # matplotlib is imported where figures are drawn: compare forks without it
    from matplotlib.figure import Figure

T = TypeVar("T")

Job = Callable[[], "Figure | None"]
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


def _worker_start() -> None:
    """In a worker: leave Ctrl-C to the report's process (which stops the workers), and be
    killed when that process dies (Linux), so a killed report leaves no worker behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: workers end when their queue closes
        pass


def map_forked(task: Callable[[int], T], count: int, workers: int | None = None) -> list[T]:
    """``[task(0), ..., task(count - 1)]``, computed in forked workers (one per core) when
    there are enough; ``task`` and what it reads are inherited, only results are pickled."""
    global _task
    workers = min(workers or cores(), count)
    if workers < 2 or count < _POOL_MIN_JOBS or (
            "fork" not in multiprocessing.get_all_start_methods()):
        return [task(i) for i in range(count)]
    _task = task
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_start)
    try:
        futures = [pool.submit(_call, i) for i in range(count)]
        results: list[T] = []
        broken = False
        for i, future in enumerate(futures):
            try:
                results.append(future.result())
            except BrokenProcessPool:  # a worker died: this job and those after it run here
                if not broken:
                    print("warning: a report worker died; the rest is done in this process",
                          file=sys.stderr)
                    broken = True
                results.append(task(i))
        return results
    except BaseException:  # Ctrl-C or an error of a job: stop now, not after the queue
        # the executor would wait for the jobs its workers run (and forgets them on shutdown)
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _task = None


def render_all(jobs: list[Job], workers: int | None = None) -> list[bytes | None]:
    """PNG bytes of every job's figure (None where a job draws nothing), in job order."""
    from kit.analysis.plots_common import png_bytes

    def render(index: int) -> bytes | None:
        fig = jobs[index]()
        return png_bytes(fig) if fig is not None else None

    return map_forked(render, len(jobs), workers)
