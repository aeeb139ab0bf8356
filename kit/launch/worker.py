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
from kit.engines import engine_spec
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
from kit.spec.run import RunConfig
from kit.telemetry.base import TelemetryError
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


def _any_rank_stopping(flag: _StopFlag, device: torch.device) -> bool:
    """All-reduce the stop flag; doubles as the barrier that aligns every step's start."""
    t = torch.tensor([1 if flag.set else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class _ZeusWindows:
    """Zeus windows of one rank: each measured step, and the measured phase as a whole.

    A Zeus failure mid-run is noted in the rank's result and ends Zeus measurement (methods
    then return None in place of the windows object); training goes on.
    """

    PHASE = "measured-phase"

    def __init__(self, meter: "ZeusStepEnergy", result: RankResult) -> None:
        self._meter, self._result, self._phase_open = meter, result, False

    def _fail(self, e: Exception) -> None:
        self._result.notes.append(f"zeus stopped: {e}")

    def begin_step(self, step: int) -> "_ZeusWindows | None":
        try:
            if not self._phase_open:
                self._meter.begin(self.PHASE)
                self._phase_open = True
            self._meter.begin(f"step-{step}")
            return self
        except TelemetryError as e:
            self._fail(e)
            return None

    def end_step(self, step: int) -> tuple["_ZeusWindows | None", float | None]:
        try:
            return self, self._meter.end(f"step-{step}")
        except TelemetryError as e:
            self._fail(e)
            return None, None

    def end_phase(self) -> float | None:
        if not self._phase_open:
            return None
        try:
            return self._meter.end(self.PHASE)
        except TelemetryError as e:
            self._fail(e)
            return None


def _zeus_windows(cfg: RunConfig, local_rank: int, result: RankResult) -> _ZeusWindows | None:
    """Zeus step windows when the platform lists zeus and telemetry is on, else None."""
    if cfg.platform.is_cpu or "zeus" not in cfg.platform.telemetry or not cfg.telemetry_interval_ms:
        return None
    try:
        return _ZeusWindows(ZeusStepEnergy(local_rank), result)
    except TelemetryError as e:
        result.notes.append(f"zeus not used: {e}")
        return None


def run_rank(staging: Path) -> int:
    """Run this rank to completion; return its exit code."""
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
    marks = lifecycle.start_rank_marks(marks_path(staging, rank))
    marks.mark("imported", IMPORTED_AT)
    result.timeline = marks.times
    try:
        cfg = read_config(staging)
        engine = engine_spec(cfg.engine).build()
        placement = engine.setup(cfg, rank, local_rank, world)
        marks.mark("model_built")
        result.placement = {k: v for k, v in vars(placement).items() if k.endswith("_rank")}
        info = engine.info()
        result.versions, result.notes = info.versions, info.notes
        print(f"rank {rank}: placement {result.placement}", flush=True)
        zeus = _zeus_windows(cfg, local_rank, result)
        profiler = RankProfiler(cfg, staging, rank)
        status = "ok"
        for step in range(cfg.total_steps):
            profiler.before(step)
            if _any_rank_stopping(flag, engine.device):
                status = "interrupted"
                break
            phase = "warmup" if step < cfg.warmup else "measured"
            engine.synchronize()
            if zeus is not None and phase == "measured":
                zeus = zeus.begin_step(step)
            t0 = time.time()
            with profiler.step(step):
                out = engine.train_step(step)
                engine.synchronize()
            t1 = time.time()
            energy = None
            if zeus is not None and phase == "measured":
                zeus, energy = zeus.end_step(step)
            record = StepRecord(step, phase, t0, t1, out.tokens, out.loss, energy, out.phases,
                                out.expert_tokens)
            result.steps.append(record)
            append_step(steps_log, record, result.placement.get("pp_rank", 0))
            print(f"rank {rank}: step {step} {phase} {t1 - t0:.4f}s loss {out.loss}", flush=True)
            if step == 0:
                marks.mark("first_step", t1)
            profiler.after(step)  # stops and exports after the last profiled step, untimed
        if result.steps:
            marks.mark("last_step", result.steps[-1].t_end)
        if zeus is not None:
            result.measured_energy_j = zeus.end_phase()
        if status == "ok":
            # Drain what the engine still has in flight, then meet every peer: past this
            # barrier no rank waits on another, so each may exit without a teardown.
            engine.quiesce()
            _any_rank_stopping(flag, engine.device)
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
    sys.exit(run_rank(Path(sys.argv[1])))
