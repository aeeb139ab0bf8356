"""Entry point of one training rank: ``python -m kit.launch.worker STAGING_DIR``.

Reads the resolved config, runs warmup and measured steps through the engine and writes its
:class:`~kit.launch.rankfile.RankResult`. SIGTERM/SIGINT set a flag; at the next step boundary
all ranks agree (an all-reduce of the flag) and stop together with status ``interrupted``, so a
stopped run still yields complete step records.

A rank never outlives its launcher (an OOM kill of the launcher must not leave ranks holding
GPUs): a thread watches the parent, and when it is gone raises the same flag, then kills the
rank outright if it has not ended within :data:`ORPHAN_GRACE_S` (a peer may be stuck in a
collective).
"""

import gc
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from kit import lifecycle
from kit.config.run import RunConfig
from kit.engines import engine_spec
from kit.launch.early_groups import EarlyProcessGroup, early_group_wanted
from kit.launch.local import LAUNCHER_PID_ENV
from kit.launch.profiling import RankProfiler
from kit.launch.rankfile import (
    RankResult,
    StepRecord,
    append_step,
    marks_path,
    open_steps_log,
    read_config,
    write_rank_result,
)
from kit.launch.stall_dumps import arm_stall_dumps
from kit.measure_window import MAX_EXTENSION
from kit.telemetry.base import TelemetryError
from kit.telemetry.edges import poke_sampler, wait_for_sampler
from kit.telemetry.zeus import ZeusStepEnergy

IMPORTED_AT = time.time()
"""When this module's imports (torch, the kit) were done: the rank's ``imported`` mark."""

ORPHAN_GRACE_S = 10.0
"""Seconds a rank whose launcher died may take to stop at a step boundary before it kills
itself."""
PARENT_POLL_S = 0.5


class _StopFlag:
    """Set by SIGTERM/SIGINT, or when the launcher is gone (``orphaned`` says which)."""

    def __init__(self, launcher_pid: int) -> None:
        self.set = False
        self.orphaned = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)
        # a forked rank starts with both blocked, so that none is lost before this point
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        threading.Thread(target=self._watch_parent, args=(launcher_pid,), daemon=True,
                         name="watch-launcher").start()

    def _handle(self, signum: int, frame: object) -> None:
        self.set = True

    def _watch_parent(self, launcher_pid: int) -> None:
        """Poll the parent pid (re-parenting to init or a subreaper means it died)."""
        while os.getppid() == launcher_pid:
            time.sleep(PARENT_POLL_S)
        print(f"launcher (pid {launcher_pid}) is gone: stopping", file=sys.stderr, flush=True)
        self.orphaned = self.set = True
        time.sleep(ORPHAN_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)


def _print_traceback() -> None:
    """Print the current exception to the rank's log, unless the log cannot take it."""
    try:
        traceback.print_exc()
    except OSError:  # e.g. no space left for the log itself
        pass


def _agree(flag: _StopFlag, more: bool, device: torch.device) -> tuple[bool, bool]:
    """All-reduce (max) of the stop flag and of rank 0's wish for more measured steps.

    Doubles as the barrier that aligns every step's start: every rank leaves it with the same
    two answers, so all stop, go on or extend the measured phase together.
    """
    t = torch.tensor([1 if flag.set else 0, 1 if more else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    stop, go_on = t.tolist()
    return bool(stop), bool(go_on)


class _MeasuredWindow:
    """Rank 0's view of the measured phase: whether it has lasted ``cfg.min_measured_s``.

    Only rank 0 asks for more steps (:func:`_agree` spreads its answer), so the ranks' clocks
    need not agree; the phase grows to at most :data:`MAX_EXTENSION` x ``cfg.steps`` steps.
    """

    def __init__(self, cfg: RunConfig, rank: int) -> None:
        self._cfg, self._rank = cfg, rank
        self._t0: float | None = None
        self.extended_to = 0
        """Measured steps run in all once the phase was extended (0: not extended)."""

    @property
    def first(self) -> bool:
        """Whether no measured step has started yet."""
        return self._t0 is None

    def started(self, phase: str, t: float) -> None:
        """A step of ``phase`` starts at unix time ``t``."""
        if phase == "measured" and self._t0 is None:
            self._t0 = t

    def wants_more(self, step: int) -> bool:
        """Whether rank 0 wants step ``step`` run although the asked-for steps are done."""
        cfg = self._cfg
        if (self._rank != 0 or step < cfg.total_steps or self._t0 is None
                or step >= cfg.warmup + cfg.steps * MAX_EXTENSION
                or time.time() - self._t0 >= cfg.min_measured_s):
            return False
        self.extended_to = step + 1 - cfg.warmup
        return True

    def note(self) -> str:
        """What the extension did, for the bundle's notes."""
        cfg = self._cfg
        return (f"measured phase extended from {cfg.steps} to {self.extended_to} steps: "
                f"--min-measured-s {cfg.min_measured_s:g} (docs/metrics.md)")


class _ZeusPhase:
    """Zeus's window of one rank around the whole measured phase.

    One window, not one per step: each window's start and end synchronize the device and read
    NVML's energy counter (4 ms of CPU each), which cost 3.3% of throughput per step on
    4 x H200 (issue 33). Per-step energy comes from the sampled counter instead. A Zeus failure
    is noted in the rank's result and ends Zeus measurement; training goes on.
    """

    WINDOW = "measured-phase"

    def __init__(self, meter: "ZeusStepEnergy", result: RankResult) -> None:
        self._meter, self._result, self.open = meter, result, False
        self._failed = False

    def begin(self) -> None:
        """Open the window before the first measured step; later calls do nothing."""
        if self.open or self._failed:
            return
        try:
            self._meter.begin(self.WINDOW)
            self.open = True
        except TelemetryError as e:
            self._result.notes.append(f"zeus stopped: {e}")
            self._failed = True

    def end(self) -> float | None:
        """Close the window; its energy in joules, or None when it never opened or failed."""
        if not self.open or self._failed:
            return None
        try:
            return self._meter.end(self.WINDOW)
        except TelemetryError as e:
            self._result.notes.append(f"zeus stopped: {e}")
            return None


def _zeus_phase(cfg: RunConfig, local_rank: int, result: RankResult) -> _ZeusPhase | None:
    """Zeus's measured-phase window when the platform lists zeus and telemetry is on, else None."""
    if cfg.platform.is_cpu or "zeus" not in cfg.platform.telemetry or not cfg.telemetry_interval_ms:
        return None
    try:
        return _ZeusPhase(ZeusStepEnergy(local_rank), result)
    except TelemetryError as e:
        result.notes.append(f"zeus not used: {e}")
        return None


def freeze_imported_objects() -> None:
    """Leave what the imports made (~300k objects, as old as the process) out of collections.

    A full collection walks every tracked object: 0.5-0.7 s on a 2-core host after torch,
    the engine and ``torch._dynamo`` are imported, paid by every automatic oldest-generation
    collection and by DeepSpeed ZeRO-3's explicit ``gc.collect()`` while it flattens the
    parameters (``defragment``, inside the model build). ``gc.freeze`` moves them to a
    permanent generation the collector skips; reference counting still frees them, and the
    rank has made no tensor yet whose cycles it would keep.
    """
    gc.freeze()


def preload(staging: Path) -> None:
    """Import, once for every rank forked after it (kit.launch.rank_fork), what each imports.

    That is the run's engine and ``torch._dynamo``, which every torch optimizer imports as it
    takes its parameters (0.5 s of CPU per rank on a 2-core host). Nothing is computed: a
    process that ran an OpenMP region cannot fork ranks that use OpenMP.
    """
    cfg = read_config(staging)
    engine_spec(cfg.engine).build().import_framework(cfg.platform.is_cpu)
    import torch._dynamo  # noqa: F401

    freeze_imported_objects()


def run_rank(staging: Path, started: float | None = None) -> int:
    """Run this rank to completion; return its exit code.

    ``started``: when the process that imported for it began (a forked rank's zygote), if
    not this one.
    """
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    node = int(os.environ.get("GROUP_RANK", "0"))
    result = RankResult(rank=rank, local_rank=local_rank, node=node)
    flag = _StopFlag(int(os.environ.get(LAUNCHER_PID_ENV, os.getppid())))
    arm_stall_dumps(staging, rank)  # before any process group: the flight recorder's size
    engine = None
    profiler: RankProfiler | None = None
    steps_log = open_steps_log(staging, rank)
    marks = lifecycle.start_rank_marks(marks_path(staging, rank), started)
    marks.mark("imported", IMPORTED_AT)
    result.timeline = marks.times
    try:
        cfg = read_config(staging)
        # the rendezvous waits on the peers while this rank imports its engine
        # (kit.launch.early_groups)
        group = EarlyProcessGroup(cfg, rank, world) if early_group_wanted() else None
        engine = engine_spec(cfg.engine).build()
        engine.import_framework(cfg.platform.is_cpu)
        freeze_imported_objects()
        marks.mark("engine_imported")
        if group is not None:
            group.wait()
        placement = engine.setup(cfg, rank, local_rank, world)
        marks.mark("model_built")
        result.placement = {k: v for k, v in vars(placement).items() if k.endswith("_rank")}
        info = engine.info()
        result.versions, result.notes = info.versions, info.notes
        print(f"rank {rank}: placement {result.placement}", flush=True)
        zeus = _zeus_phase(cfg, local_rank, result)
        profiler = RankProfiler(cfg, staging, rank)
        waited = wait_for_sampler(lambda: flag.set)
        if waited >= 0.5:
            result.notes.append(f"waited {waited:.1f} s before the first step for the node's "
                                "telemetry sampler to take its first sample")
        status = "ok"
        window = _MeasuredWindow(cfg, rank)
        step = 0
        while True:
            stop, more = _agree(flag, window.wants_more(step), engine.device)
            if stop:
                status = "interrupted"
                break
            if step >= cfg.total_steps and not more:
                break
            phase = "warmup" if step < cfg.warmup else "measured"
            profiler.before(step)
            engine.synchronize()
            if phase == "measured" and zeus is not None:
                zeus.begin()
            if phase == "measured" and window.first and local_rank == 0:
                poke_sampler()  # the energy counter is read as the measured phase starts
            t0 = time.time()
            window.started(phase, t0)
            with profiler.step(step):
                out = engine.train_step(step)
                engine.synchronize()
            t1 = time.time()
            record = StepRecord(step, phase, t0, t1, out.tokens, out.loss, None, out.phases,
                                out.expert_tokens)
            result.steps.append(record)
            append_step(steps_log, record, result.placement.get("pp_rank", 0))
            print(f"rank {rank}: step {step} {phase} {t1 - t0:.4f}s loss {out.loss}", flush=True)
            if step == 0:
                marks.mark("first_step", t1)
            profiler.after(step)  # stops and exports after the last profiled step, untimed
            step += 1
        if local_rank == 0 and result.steps and result.steps[-1].phase == "measured":
            poke_sampler()  # ... and as it ends
        if zeus is not None:
            result.measured_energy_j = zeus.end()
        if result.steps:
            marks.mark("last_step", result.steps[-1].t_end)
        if window.extended_to:
            result.notes.append(window.note())
        if status == "ok":
            # Drain what the engine still has in flight, then meet every peer: past this
            # barrier no rank waits on another, so each may exit without a teardown.
            engine.quiesce()
            _agree(flag, False, engine.device)
        result.status = status
        if flag.orphaned:
            result.error = f"rank {rank}: stopped because its launcher died"
        result.mem_peak_bytes = engine.peak_memory_bytes()
        return 0
    except torch.OutOfMemoryError as e:
        result.status, result.error = "oom", f"rank {rank}: out of memory: {e}".splitlines()[0]
        _print_traceback()
        return 1
    except Exception as e:  # any failure ends up in the bundle, not only in a log
        result.status = "failed"
        result.error = f"rank {rank}: {type(e).__name__}: {e}".splitlines()[0]
        _print_traceback()
        return 1
    finally:
        if profiler is not None:
            profiler.close(result.steps, result.placement.get("pp_rank", 0))
            result.notes += profiler.notes
        if engine is not None and result.mem_peak_bytes is None:
            try:
                result.mem_peak_bytes = engine.peak_memory_bytes()
            except Exception:  # the device may be unusable after a failure
                pass
        marks.mark("exiting")
        try:
            write_rank_result(staging, result)
            steps_log.close()
        except OSError as e:  # a full disk: the launcher still sees how the process ended
            print(f"rank {rank}: cannot write its result: {e}", file=sys.stderr, flush=True)
        if result.status in ("ok", "interrupted"):
            # Done, its result written, no peer waiting on it: free the device now, not after
            # a teardown nobody waits for (destroying NCCL communicators and the CUDA context
            # took ~10 s on an H100, benchmarks/reliability/results/faults-h100.txt).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


if __name__ == "__main__":
    # Exit as a forked rank does (kit.launch.rank_fork), without interpreter teardown: a failed
    # rank may leave a thread inside a C++ call (the early process group still waiting for its
    # peers, kit.launch.early_groups), and finalizing around it aborts the process (SIGABRT)
    # instead of ending with the rank's exit code.
    code = run_rank(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
