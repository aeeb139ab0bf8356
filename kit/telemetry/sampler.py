"""The telemetry sampler: one process per node that samples every source on a fixed period.

The sampling loop runs in its own process (``spawn``, never ``fork``: the parent may hold CUDA
or gloo state), so it never competes for a training rank's GIL and a slow counter read never
stalls a step. Within it, the loop reads every source's fast fields each tick, while each
source's slow fields (an energy counter, per-link byte counters) are read by slow lanes
(:mod:`kit.telemetry.slow_lanes`), one thread per device, each field at its own period, in
rows of their own: a slow read never delays a fast row, and the fast period does not grow with
the number of devices. The process writes rows to Parquet chunk files as it goes, so its memory
stays flat over long runs and a crash loses at most one chunk, and it ends by writing
``sampler-report.json`` beside them, with each field's measured period and its own CPU time.

No death can block its parent: the two talk over one pipe (never a shared lock or
``multiprocessing.Event``, whose ``set()`` waits for a sleeper that may be dead). The parent
writes "stop" to it; the child sees the parent die as end-of-file on it; the parent sees the
child die as end-of-file too, and every wait is bounded. On SIGTERM the child writes its last
chunk and its report, then exits. A child that vanished leaves its chunks and the report it
wrote at its first tick, marked incomplete: a lost telemetry source, never a lost run.

Typical use::

    sampler = TelemetrySampler([("host", {"node": 0})], interval_ms=100, chunks_dir=d)
    sampler.start()
    try:
        train()
    finally:
        report = sampler.stop()
    table = concat_chunks(d)  # kit.bundle.writer
"""

import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

from kit.errors import KitInputError
from kit.telemetry import load_source_class, source_target
from kit.telemetry.base import TelemetryError, TelemetrySource
from kit.telemetry.chunks import CHUNK_GLOB, ChunkWriter, rss_bytes
from kit.telemetry.edges import (
    make_edge_dir,
    make_edge_pipe,
    mark_sampler_ready,
    open_edge_pipe,
)
from kit.telemetry.field_periods import FieldPeriods
from kit.telemetry.sampler_report import REPORT_NAME, SamplerErrorRecord, SamplerReport
from kit.telemetry.slow_lanes import SamplerClock, SlowLane

__all__ = ["CHUNK_GLOB", "REPORT_NAME", "SamplerErrorRecord", "SamplerReport", "SourceSpec",
           "TelemetrySampler"]

SourceSpec = tuple[str, Mapping[str, Any]]
"""A source to build in the sampler process: registry name and constructor kwargs (picklable)."""

LANE_JOIN_S = 5.0
"""How long the loop waits for a source's slow lanes to end before closing the source: longer
than any one vendor read takes. A lane still reading then is left running and the source is
not closed under it (the process is about to end)."""


@dataclass(frozen=True)
class _ChildConfig:
    """Everything the sampler process needs, picklable for ``spawn``."""

    sources: list[tuple[str, str, dict[str, Any]]]  # (name, "module:Class", kwargs)
    interval_ms: float
    chunks_dir: Path
    chunk_rows: int
    flush_s: float
    edge_path: Path | None = None
    """The named pipe ranks poke at the measured phase's edges (kit.telemetry.edges)."""


class _SamplerLoop:
    """The sampler process's state: its sources and their slow lanes, its writer and the report
    it fills."""

    def __init__(self, cfg: _ChildConfig) -> None:
        self._cfg = cfg
        self._writer = ChunkWriter(cfg.chunks_dir, cfg.chunk_rows, cfg.flush_s)
        self._sources: dict[str, TelemetrySource] = {}
        self._readable: dict[str, list[str]] = {}
        self._lanes: dict[str, list[SlowLane]] = {}
        self._slow_rows: SimpleQueue[tuple[str, dict[str, Any]]] = SimpleQueue()
        self._periods = FieldPeriods()
        self._clock = SamplerClock()
        self.report = SamplerReport(interval_ms=cfg.interval_ms)
        self._first_edge: tuple[float, float, int, int] | None = None
        """(monotonic, CPU seconds, ticks, missed ticks) at the first measured-phase edge."""
        for name, target, kwargs in cfg.sources:
            try:
                source = load_source_class(target)(**kwargs)
            except Exception as e:  # noqa: BLE001 - recorded in the report; others go on.
                self.record(time.time(), name, "", e)
                continue
            self._sources[name] = source
            self.report.sources[name] = source.fields()
            self.report.devices[name] = source.devices()
            self._readable[name] = [f for f, info in self.report.sources[name].items()
                                    if info.readable]

    def _final_fields(self, name: str, source: TelemetrySource) -> None:
        """Re-read a source's ``fields()`` after its last sample: verdicts learned mid-run
        (a counter that never moved, a device lost at some time) reach the bundle."""
        try:
            self.report.sources[name] = source.fields()
        except Exception as e:  # noqa: BLE001 - keep the verdicts read at start.
            self.record(time.time(), name, "", e)

    def record(self, t: float, source: str, what: str, e: BaseException) -> None:
        """Add a failure of ``source`` (or ``"sampler"``) to the report; lanes call it too."""
        self.report.errors.append(
            SamplerErrorRecord(t, source, f"{what}{type(e).__name__}: {e}"))

    def _start_lanes(self) -> None:
        """Start a slow lane for every slow reader of every source."""
        for name, source in list(self._sources.items()):
            try:
                readers = source.slow_readers()
            except Exception as e:  # noqa: BLE001 - its fast fields are still read.
                self.record(time.time(), name, "slow readers: ", e)
                continue
            self._lanes[name] = [SlowLane(name, r, self._clock, self._slow_rows, self.record)
                                 for r in readers]
            for lane in self._lanes[name]:
                lane.start()

    def _stop_lanes(self, name: str, final: bool = False) -> bool:
        """Stop a source's slow lanes and wait for them (bounded); whether all ended.

        ``final`` (the sampler stops, the source is healthy): each ended lane then reads its
        edge fields once more, so the energy counter's last reading follows the run's end.
        """
        lanes = self._lanes.pop(name, [])
        for lane in lanes:
            lane.stop()
        deadline = time.monotonic() + LANE_JOIN_S
        ended = [lane.join(max(0.0, deadline - time.monotonic())) for lane in lanes]
        if not all(ended):
            self.record(time.time(), name, "", TelemetryError(
                f"a slow read did not end within {LANE_JOIN_S:g} s; the source was not closed"))
        elif final:
            for lane in lanes:
                lane.read_edges()
        return all(ended)

    def poke_lanes(self) -> None:
        """The measured phase starts or ends: every lane reads its edge fields now."""
        for lanes in self._lanes.values():
            for lane in lanes:
                lane.poke()

    def _close(self, name: str, source: TelemetrySource) -> None:
        """End a source: its lanes, its final verdicts, its handles."""
        if self._stop_lanes(name):
            self._final_fields(name, source)
            source.close()

    def _add(self, name: str, rows: list[dict[str, Any]]) -> None:
        self._periods.add(name, self._readable[name], rows)
        self._writer.add(rows)

    def _drain_slow_rows(self) -> None:
        """Write the rows the slow lanes queued since the last tick."""
        while True:
            try:
                name, row = self._slow_rows.get_nowait()
            except Empty:
                return
            self._add(name, [row])

    def _tick(self, t: float) -> None:
        """Sample every live source's fast fields once, dropping any that raises; then write
        what the slow lanes read meanwhile."""
        for name, source in list(self._sources.items()):
            try:
                self._add(name, source.sample(t))
            except Exception as e:  # noqa: BLE001 - a broken source must not stop the others.
                self.record(t, name, "", e)
                del self._sources[name]
                self._close(name, source)
        self._drain_slow_rows()

    def run(self, conn: Connection, wake_fd: int, edge_fd: int | None) -> None:
        """Sample on a fixed schedule until the parent says stop, goes away, or SIGTERM comes.

        Ticks are scheduled at ``start + k * interval`` on the monotonic clock, so the period
        does not drift with the time each tick takes; a tick that overruns skips the ticks it
        missed instead of bursting to catch up. Row times are unix seconds derived from the
        monotonic clock (:class:`SamplerClock`). Between ticks the loop sleeps in ``wait`` on
        the parent's pipe and on ``wake_fd`` (written by the SIGTERM handler), so any of the
        three ends the sleep at once; so does a poke on ``edge_fd`` (the measured phase's
        edge), which has every slow lane read its edge fields at once and sampling go on.
        """
        interval_s = self._cfg.interval_ms / 1000.0
        self._start_lanes()
        next_tick = first_tick = last_tick = time.monotonic()
        while self.report.ended_by is None:
            last_tick = time.monotonic()
            self._tick(self._clock.unix(last_tick))
            self.report.ticks += 1
            if self.report.ticks == 1:
                first_tick = last_tick
                self.report.rss_start_bytes = rss_bytes()
                self.report.write(self._cfg.chunks_dir / REPORT_NAME)  # what a kill leaves
                if self._cfg.edge_path is not None:  # the ranks wait for it to train
                    mark_sampler_ready(self._cfg.edge_path)
                conn.send("started")
            next_tick += interval_s
            behind_s = time.monotonic() - next_tick
            if behind_s > 0:
                missed = int(behind_s / interval_s) + 1
                self.report.missed_ticks += missed
                next_tick += missed * interval_s
            while True:
                ended_by = _wait_for_end(conn, wake_fd, edge_fd, next_tick - time.monotonic())
                if ended_by != _EDGE:
                    break
                self.poke_lanes()
                self._edge_passed()
            self.report.ended_by = ended_by
        if self.report.ticks > 1:
            self.report.mean_period_ms = 1000.0 * (last_tick - first_tick) / (self.report.ticks - 1)

    def _edge_passed(self) -> None:
        """Note the process's CPU time and ticks at a measured-phase edge: the report's
        ``measured_*`` figures run from the first edge to the latest."""
        times = os.times()
        now = (time.monotonic(), times.user + times.system, self.report.ticks,
               self.report.missed_ticks)
        if self._first_edge is None:
            self._first_edge = now
            return
        first, r = self._first_edge, self.report
        r.measured_wall_s, r.measured_cpu_s = now[0] - first[0], now[1] - first[1]
        r.measured_ticks, r.measured_missed_ticks = now[2] - first[2], now[3] - first[3]

    def finish(self, started_mono: float) -> None:
        """Stop the lanes, flush the last chunk, close the sources, write the complete report.

        Each live source's ``fields()`` is read again first (:meth:`_final_fields`).

        Args:
            started_mono: Monotonic time at which the process started (for ``wall_s``).
        """
        try:
            for name in list(self._lanes):
                if not self._stop_lanes(name, final=True):
                    self._sources.pop(name, None)  # a read is still running in it: not closed
            self._drain_slow_rows()
            self._writer.flush()
        finally:
            for name, source in self._sources.items():
                self._close(name, source)
            self.report.complete = True
            self.report.rows_written = self._writer.rows_written
            self.report.chunks = self._writer.chunks
            self.report.field_periods_ms = self._periods.worst_ms()
            self.report.rss_first_chunk_bytes = self._writer.rss_first_chunk_bytes
            self.report.rss_peak_bytes = max(
                self.report.rss_start_bytes, self._writer.rss_peak_bytes, rss_bytes()
            )
            times = os.times()
            self.report.cpu_s = times.user + times.system
            self.report.wall_s = time.monotonic() - started_mono
            self.report.write(self._cfg.chunks_dir / REPORT_NAME)


_EDGE = "edge"
"""What :func:`_wait_for_end` returns for a poke at the measured phase's edge."""


def _wait_for_end(conn: Connection, wake_fd: int, edge_fd: int | None,
                  timeout_s: float) -> str | None:
    """Sleep up to ``timeout_s``; return why sampling must end, :data:`_EDGE` for a poke at
    the measured phase's edge, or None to sample again."""
    ready = wait([conn, wake_fd, *([edge_fd] if edge_fd is not None else [])],
                 max(0.0, timeout_s))
    if edge_fd is not None and edge_fd in ready:
        try:
            os.read(edge_fd, 512)
        except BlockingIOError:  # another waiter took it: nothing to do
            return None
        return _EDGE
    if wake_fd in ready:
        os.read(wake_fd, 512)
        return "SIGTERM"
    if conn in ready:
        try:
            conn.recv()
        except (EOFError, OSError):
            return "parent gone"
        return "stop"
    return None


def _sampler_main(cfg: _ChildConfig, conn: Connection) -> None:
    """Entry point of the sampler process."""
    started_mono = time.monotonic()
    # Ctrl-C reaches the whole foreground process group; the parent handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM (a job's end, sent to every process) only wakes the loop: the last chunk and
    # the report still get written.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    loop = _SamplerLoop(cfg)
    edge_fds = open_edge_pipe(cfg.edge_path) if cfg.edge_path is not None else None
    try:
        try:
            if loop.report.sources:
                loop.run(conn, wake_r, edge_fds[0] if edge_fds else None)
        except Exception as e:
            loop.record(time.time(), "sampler", "", e)
            raise
        finally:
            loop.finish(started_mono)
    except OSError:
        # A chunk or the report could not be written (a full disk): the chunks written stay,
        # and the launcher, which cannot write either, names the file in one line. A traceback
        # here (one per failed write, chained) would bury that line.
        sys.exit(1)


class TelemetrySampler:
    """Runs the telemetry sampling loop of one node in a separate process.

    Args:
        sources: Sources to build in the sampler process, as (registry name, kwargs); names
            must be unique.
        interval_ms: Sampling period in milliseconds.
        chunks_dir: Directory for chunk files and the report; created if absent, and must not
            hold chunks of an earlier run.
        chunk_rows: Rows per chunk file; bounds the sampler's memory and what a crash loses.
        flush_s: Longest time rows wait in memory before a chunk is written.

    Raises:
        KitInputError: Unknown source name, duplicate names, or a non-positive period or
            chunk size.
    """

    def __init__(
        self,
        sources: Sequence[SourceSpec],
        *,
        interval_ms: float,
        chunks_dir: Path,
        chunk_rows: int = 2000,
        flush_s: float = 2.0,
    ) -> None:
        names = [name for name, _ in sources]
        if not names or len(set(names)) != len(names):
            raise KitInputError(f"telemetry sources must be non-empty and unique: {names}")
        if interval_ms <= 0 or chunk_rows < 1:
            raise KitInputError(
                f"telemetry interval_ms ({interval_ms}) and chunk_rows ({chunk_rows}) must be > 0"
            )
        self._edge_dir = make_edge_dir()
        make_edge_pipe(self._edge_dir / "edge")
        self._cfg = _ChildConfig(
            sources=[(name, source_target(name), dict(kwargs)) for name, kwargs in sources],
            interval_ms=float(interval_ms),
            chunks_dir=Path(chunks_dir),
            chunk_rows=chunk_rows,
            flush_s=flush_s,
            edge_path=self._edge_dir / "edge",
        )
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=_sampler_main,
            args=(self._cfg, child_conn),
            name="telemetry-sampler",
            daemon=True,
        )
        self._child_conn: Connection | None = child_conn

    @property
    def pid(self) -> int | None:
        """Process id of the sampler process; ``None`` before :meth:`start`."""
        return self._proc.pid

    @property
    def edge_path(self) -> Path:
        """The named pipe to poke at the measured phase's edges (:mod:`kit.telemetry.edges`);
        the ranks find it in :data:`~kit.telemetry.edges.EDGE_ENV`."""
        assert self._cfg.edge_path is not None
        return self._cfg.edge_path

    @property
    def report_path(self) -> Path:
        """Where the sampler process writes its report."""
        return self._cfg.chunks_dir / REPORT_NAME

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the sampler process and return once it has taken its first sample.

        Raises:
            TelemetryError: ``chunks_dir`` holds an earlier run's files, or the process exited
                (e.g. no source could be built) or did not sample within ``timeout_s``.
        """
        try:
            self.begin()
            deadline = time.monotonic() + timeout_s
            while not self.poll_started(deadline,
                                        wait_s=max(0.0, deadline - time.monotonic())):
                pass
        except BaseException:
            self._remove_edge_pipe()
            raise

    def begin(self) -> None:
        """Start the sampler process and return at once (:meth:`poll_started` says when it has
        sampled): the launcher starts its ranks meanwhile.

        Raises:
            TelemetryError: ``chunks_dir`` holds an earlier run's files.
        """
        chunks_dir = self._cfg.chunks_dir
        chunks_dir.mkdir(parents=True, exist_ok=True)
        if self.report_path.exists() or any(chunks_dir.glob(CHUNK_GLOB)):
            self._remove_edge_pipe()
            raise TelemetryError(f"{chunks_dir} already holds telemetry; use an empty directory")
        self._proc.start()
        assert self._child_conn is not None
        self._child_conn.close()  # the child's end lives in the child only: its death is EOF
        self._child_conn = None

    def poll_started(self, deadline: float, wait_s: float = 0.0) -> bool:
        """Whether the process :meth:`begin` started has taken its first sample (waiting up to
        ``wait_s`` for it); call until True.

        Args:
            deadline: ``time.monotonic()`` by which the first sample must have come.
            wait_s: How long to wait for it in this call.

        Raises:
            TelemetryError: The process exited before sampling (e.g. no source could be built),
                or ``deadline`` passed without a sample (the process is then killed).
        """
        try:
            if self._conn.poll(wait_s):
                self._conn.recv()
                return True
        except (EOFError, OSError):
            self._proc.join(5)
            self._remove_edge_pipe()
            raise TelemetryError(
                f"telemetry sampler exited before sampling: {self._why()}"
            ) from None
        if time.monotonic() >= deadline:
            self._proc.kill()
            self._proc.join(5)
            self._remove_edge_pipe()
            raise TelemetryError("telemetry sampler took no sample in time")
        return False

    def stop(self, timeout_s: float = 30.0) -> SamplerReport:
        """Ask the sampler process to finish, wait for it (bounded) and return its report.

        A process that is gone (killed, crashed) or does not finish within ``timeout_s`` (it is
        then killed) leaves the report it wrote after its first tick, returned with
        ``complete`` False and an error saying how it ended; the chunks it wrote stay valid.

        Raises:
            TelemetryError: Never started, or it left no report at all.
        """
        if self._proc.pid is None:
            raise TelemetryError("telemetry sampler was never started")
        try:
            self._conn.send("stop")
        except OSError:  # it is gone already: its end of the pipe is closed
            pass
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
            ending = f"did not stop within {timeout_s:g} s and was killed"
        else:
            ending = _exit_text(self._proc.exitcode)
        self._conn.close()
        self._remove_edge_pipe()
        if not self.report_path.exists():
            raise TelemetryError(f"telemetry sampler failed: {self._why()}")
        report = SamplerReport.read(self.report_path)
        if not report.complete:
            report.errors.append(SamplerErrorRecord(
                time.time(), "sampler",
                f"the sampler process {ending} before the run ended; samples after its last "
                "chunk are lost, those before are kept",
            ))
        return report

    def _remove_edge_pipe(self) -> None:
        """Remove the edge pipe's folder (a rank's late poke then finds no pipe)."""
        shutil.rmtree(self._edge_dir, ignore_errors=True)

    def _why(self) -> str:
        """Explain an exited sampler process: its report's errors, else its exit code."""
        if self.report_path.exists():
            errors = SamplerReport.read(self.report_path).errors
            return "; ".join(f"{e.source}: {e.message}" for e in errors) or "no error recorded"
        return f"{_exit_text(self._proc.exitcode)}, no report written"


def _exit_text(exitcode: int | None) -> str:
    """How a process ended, from ``Process.exitcode`` (negative: killed by that signal)."""
    if exitcode is not None and exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"
