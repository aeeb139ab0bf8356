"""``run --profile``: Kineto traces of chosen steps on chosen ranks, their breakdown, Chakra ETs.

A profiling rank starts torch.profiler before the barrier that opens its first profiled step
and stops it after the last one has been timed, so neither the start-up nor the trace export
falls inside a step's measured time; each profiled step is wrapped in a ``ProfilerStep#<step>``
annotation (the name Holistic Trace Analysis and Chakra's linker look for), which gives the
breakdown its windows. Steps outside ``--profile-steps`` run with no profiler at all.

Files, all under the bundle's ``profile/`` (docs/bundle-format.md):

- ``rank<N>.json``: the Chrome trace (CPU operators, device kernels on a GPU; shapes recorded,
  so collectives have sizes).
- ``rank<N>.breakdown.json``: :class:`kit.metrics.kernels.RankBreakdown` of those steps.
- with ``--chakra``, ``chakra/rank<N>.host_et.json``: PyTorch's ExecutionTraceObserver output,
  recorded together with the Kineto trace (the profiler starts and stops it), and
  ``chakra/rank<N>.et`` when the ``chakra`` package could link and convert them.

Every file is written under a temporary name and renamed, so a rank killed while writing leaves
no torn file; a rank that fails mid-profile still exports what it recorded, and its breakdown
keeps only the steps that completed.
"""

import os
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function

from kit.atomic_write import write_atomic
from kit.config.run import RunConfig
from kit.launch.rankfile import RANKS_DIR, StepRecord

PROFILE_DIR = "profile"
CHAKRA_DIR = "chakra"
STEP_MARK = "ProfilerStep#"
"""Prefix of the annotation around each profiled step; the step number follows."""


def profiled_steps(cfg: RunConfig) -> range:
    """Step numbers profiled by a profiling rank; empty when the run does not profile."""
    if not cfg.profile:
        return range(0)
    if cfg.profile_steps is not None:
        return range(*cfg.profile_steps)
    step = cfg.warmup - 1 if cfg.warmup else 0
    return range(step, step + 1)


def profiles_rank(cfg: RunConfig, rank: int) -> bool:
    """Whether ``rank`` profiles in this run."""
    return cfg.profile and (cfg.profile_ranks is None or rank in cfg.profile_ranks)


class RankProfiler:
    """The profiler of one rank over the whole run (a no-op on ranks and steps not chosen)."""

    def __init__(self, cfg: RunConfig, staging: Path, rank: int) -> None:
        self._cfg, self._rank = cfg, rank
        self._steps = profiled_steps(cfg) if profiles_rank(cfg, rank) else range(0)
        self._folder = staging / PROFILE_DIR
        self._scratch_et = staging / RANKS_DIR / f"rank{rank}.host_et.json"
        self._prof: profile | None = None
        self._et: ExecutionTraceObserver | None = None
        self._trace: Path | None = None
        self._done: list[int] = []
        self.notes: list[str] = []
        measured = [s for s in self._steps if s >= cfg.warmup]
        if measured:
            self.notes.append(
                f"profiled steps {measured[0]}..{measured[-1]} are measured: their times "
                "include the profiler's overhead (profile/rank<N>.breakdown.json compares them)")

    def before(self, step: int) -> None:
        """Start the profiler before the barrier of the first profiled step."""
        if step != (self._steps[0] if self._steps else None) or self._prof is not None:
            return
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        if self._cfg.chakra:
            self._scratch_et.parent.mkdir(exist_ok=True)
            self._et = ExecutionTraceObserver().register_callback(str(self._scratch_et))
        self._prof = profile(activities=activities, record_shapes=True,
                             execution_trace_observer=self._et)
        self._prof.start()

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Mark the enclosed (timed) step as ``ProfilerStep#<step>`` when it is profiled."""
        if self._prof is None or step not in self._steps:
            yield
            return
        with record_function(f"{STEP_MARK}{step}"):
            yield
        self._done.append(step)

    def after(self, step: int) -> None:
        """After the last profiled step has been timed: stop and export."""
        if self._prof is not None and step == self._steps[-1]:
            self._stop()

    def _stop(self) -> None:
        assert self._prof is not None
        prof, self._prof = self._prof, None
        prof.stop()
        self._folder.mkdir(exist_ok=True)
        self._trace = self._folder / f"rank{self._rank}.json"
        write_atomic(self._trace, lambda tmp: prof.export_chrome_trace(str(tmp)))
        if self._et is not None:
            self._et.unregister_callback()  # finishes the host ET's JSON

    def close(self, steps: list[StepRecord], stage: int) -> None:
        """After the loop, or after a failure: export, write the breakdown, convert to Chakra.

        Never raises: a profile that cannot be analysed is a note, not a failed run.
        """
        try:
            if self._prof is not None:
                self._stop()
            if self._trace is None:
                return
            self._write_breakdown(steps, stage)
            if self._et is not None and self._done == list(self._steps):
                self._chakra()
        except Exception as e:  # the run's result must not depend on its profile
            self.notes.append(f"profile: rank {self._rank}: {type(e).__name__}: {e}")
            print(f"rank {self._rank}: profile: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)

    def _write_breakdown(self, steps: list[StepRecord], stage: int) -> None:
        from kit.metrics.kernels import StepTimes, rank_breakdown

        assert self._trace is not None
        wall = {s.step: s.t_end - s.t_start for s in steps}
        others = [wall[s.step] for s in steps
                  if s.phase == "measured" and s.step not in self._steps]
        times = StepTimes(
            profiled_s={s: wall[s] for s in self._done if s in wall},
            unprofiled_median_s=statistics.median(others) if others else None,
        )
        table = rank_breakdown(self._trace, self._rank, stage, self._done, times, self._cfg)
        dest = self._folder / f"rank{self._rank}.breakdown.json"
        write_atomic(dest, lambda tmp: tmp.write_text(table.model_dump_json(indent=1) + "\n",
                                                         encoding="utf-8"))

    def _chakra(self) -> None:
        from kit.interop.chakra import chakra_missing, link_and_convert

        folder = self._folder / CHAKRA_DIR
        folder.mkdir(exist_ok=True)
        host_et = folder / f"rank{self._rank}.host_et.json"
        os.replace(self._scratch_et, host_et)
        missing = chakra_missing()
        if missing:
            self.notes.append(f"chakra: ETs not converted ({missing})")
            return
        assert self._trace is not None
        self.notes += link_and_convert(self._rank, host_et, self._trace,
                                       folder / f"rank{self._rank}.et")
