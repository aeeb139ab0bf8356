"""The telemetry sampler: one process per node that samples every source on a fixed period.

The sampling loop runs in its own process (``spawn``, never ``fork``: the parent may hold CUDA
or gloo state), so it never competes for a training rank's GIL and a slow counter read never
stalls a step. The child writes rows to Parquet chunk files as it goes, so its memory stays
flat over long runs and a crash loses at most one chunk, and it ends by writing
``sampler-report.json`` beside them.

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

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from kit.atomic_write import write_atomic
from kit.errors import KitInputError
from kit.telemetry import load_source_class, source_target
from kit.telemetry.base import FieldInfo, TelemetryError, TelemetrySource
from kit.telemetry.fields import TELEMETRY_ARROW_SCHEMA

SourceSpec = tuple[str, Mapping[str, Any]]
"""A source to build in the sampler process: registry name and constructor kwargs (picklable)."""

REPORT_NAME = "sampler-report.json"
"""File name of the report the sampler process writes into its chunks directory."""

CHUNK_GLOB = "chunk-*.parquet"
"""Names of the chunk files; their zero-padded indices sort in write (and time) order."""


@dataclass(frozen=True)
class SamplerErrorRecord:
    """One failure inside the sampler process.

    Attributes:
        t: Unix seconds when it happened.
        source: Name of the source that failed, or ``"sampler"`` for the loop itself.
        message: Exception type and message.
    """

    t: float
    source: str
    message: str


@dataclass
class SamplerReport:
    """What the sampler process did, written by it as ``sampler-report.json``.

    Attributes:
        interval_ms: Requested sampling period in milliseconds.
        ticks: Sampling ticks taken.
        rows_written: Rows in all chunk files.
        chunks: Chunk files written.
        mean_period_ms: Mean time between ticks in milliseconds; ``None`` under two ticks.
        missed_ticks: Ticks skipped because a tick overran its period.
        sources: Per source name, what it reported by ``fields()``.
        devices: Per source name, what it reported by ``devices()``.
        errors: Sources that failed to build or to sample (each then dropped), and any fatal
            error of the loop itself.
        rss_start_bytes: Resident memory of the process after its first tick.
        rss_first_chunk_bytes: Resident memory right after the first chunk was written (the
            Parquet writer's one-off allocations are done by then); 0 if none was.
        rss_peak_bytes: Largest resident memory seen: after the first tick, at every chunk
            write (where memory peaks: a full buffer and its Arrow table) and at the end.
        complete: True once the process finished normally; a report left by a process that
            was killed is the one it wrote after its first tick (sources and devices only).
        ended_by: What ended the sampling: "stop" (the parent asked), "parent gone",
            "SIGTERM", or null while it runs or when it was killed.
    """

    interval_ms: float
    ticks: int = 0
    rows_written: int = 0
    chunks: int = 0
    mean_period_ms: float | None = None
    missed_ticks: int = 0
    sources: dict[str, dict[str, FieldInfo]] = field(default_factory=dict)
    devices: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    errors: list[SamplerErrorRecord] = field(default_factory=list)
    rss_start_bytes: int = 0
    rss_peak_bytes: int = 0
    rss_first_chunk_bytes: int = 0
    complete: bool = False
    ended_by: str | None = None

    def write(self, path: Path) -> None:
        """Write the report as JSON, atomically."""
        text = json.dumps(asdict(self), indent=1)
        write_atomic(path, lambda tmp: tmp.write_text(text))

    @classmethod
    def read(cls, path: Path) -> "SamplerReport":
        """Read a report written by :meth:`write`."""
        data = json.loads(path.read_text())
        data["sources"] = {
            name: {f: FieldInfo(**info) for f, info in fields.items()}
            for name, fields in data["sources"].items()
        }
        data["errors"] = [SamplerErrorRecord(**e) for e in data["errors"]]
        return cls(**data)


@dataclass(frozen=True)
class _ChildConfig:
    """Everything the sampler process needs, picklable for ``spawn``."""

    sources: list[tuple[str, str, dict[str, Any]]]  # (name, "module:Class", kwargs)
    interval_ms: float
    chunks_dir: Path
    chunk_rows: int
    flush_s: float


def _rss_bytes() -> int:
    """Resident set size of this process now.

    Not ``getrusage``'s ``ru_maxrss``: Linux keeps that across ``execve``, so a spawned child
    starts with its parent's peak (a training rank's, with torch loaded) as its own.
    """
    return psutil.Process().memory_info().rss


class _ChunkWriter:
    """Buffers rows and writes them out as Parquet chunk files.

    A chunk is written every ``chunk_rows`` rows or ``flush_s`` seconds, whichever comes
    first, so a crash of the process loses at most that much.
    """

    def __init__(self, chunks_dir: Path, chunk_rows: int, flush_s: float) -> None:
        self._dir = chunks_dir
        self._chunk_rows = chunk_rows
        self._flush_s = flush_s
        self._last_write = time.monotonic()
        self._rows: list[dict[str, Any]] = []
        self.chunks = 0
        self.rows_written = 0
        self.rss_peak_bytes = 0
        self.rss_first_chunk_bytes = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Buffer rows, writing out every full chunk."""
        self._rows.extend(rows)
        while len(self._rows) >= self._chunk_rows:
            self._write(self._rows[: self._chunk_rows])
            del self._rows[: self._chunk_rows]
        if self._rows and time.monotonic() - self._last_write >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        """Write whatever is buffered as a last, shorter chunk."""
        if self._rows:
            self._write(self._rows)
            self._rows = []

    def _write(self, rows: list[dict[str, Any]]) -> None:
        path = self._dir / f"chunk-{self.chunks:06d}.parquet"
        table = pa.Table.from_pylist(rows, schema=TELEMETRY_ARROW_SCHEMA)
        write_atomic(path, lambda tmp: pq.write_table(table, tmp))  # never seen half-written
        rss = _rss_bytes()
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        self.rss_first_chunk_bytes = self.rss_first_chunk_bytes or rss
        self.chunks += 1
        self.rows_written += len(rows)
        self._last_write = time.monotonic()


class _SamplerLoop:
    """The sampler process's state: its sources, its writer and the report it fills."""

    def __init__(self, cfg: _ChildConfig) -> None:
        self._cfg = cfg
        self._writer = _ChunkWriter(cfg.chunks_dir, cfg.chunk_rows, cfg.flush_s)
        self._sources: dict[str, TelemetrySource] = {}
        self.report = SamplerReport(interval_ms=cfg.interval_ms)
        for name, target, kwargs in cfg.sources:
            try:
                source = load_source_class(target)(**kwargs)
            except Exception as e:  # noqa: BLE001 - recorded in the report; others go on.
                self.record(time.time(), name, e)
                continue
            self._sources[name] = source
            self.report.sources[name] = source.fields()
            self.report.devices[name] = source.devices()

    def _final_fields(self, name: str, source: TelemetrySource) -> None:
        """Re-read a source's ``fields()`` after its last sample: verdicts learned mid-run
        (a counter that never moved, a device lost at some time) reach the bundle."""
        try:
            self.report.sources[name] = source.fields()
        except Exception as e:  # noqa: BLE001 - keep the verdicts read at start.
            self.record(time.time(), name, e)

    def record(self, t: float, source: str, e: BaseException) -> None:
        """Add a failure of ``source`` (or ``"sampler"``) to the report."""
        self.report.errors.append(SamplerErrorRecord(t, source, f"{type(e).__name__}: {e}"))

    def _tick(self, t: float) -> None:
        """Sample every live source once; drop any that raises."""
        rows: list[dict[str, Any]] = []
        for name, source in list(self._sources.items()):
            try:
                rows.extend(source.sample(t))
            except Exception as e:  # noqa: BLE001 - a broken source must not stop the others.
                self.record(t, name, e)
                del self._sources[name]
                self._final_fields(name, source)
                source.close()
        self._writer.add(rows)

    def run(self, conn: Connection, wake_fd: int) -> None:
        """Sample on a fixed schedule until the parent says stop, goes away, or SIGTERM comes.

        Ticks are scheduled at ``start + k * interval`` on the monotonic clock, so the period
        does not drift with the time each tick takes; a tick that overruns skips the ticks it
        missed instead of bursting to catch up. Row times are unix seconds derived from the
        monotonic clock, so a wall-clock step (NTP) cannot reorder them. Between ticks the loop
        sleeps in ``wait`` on the parent's pipe and on ``wake_fd`` (written by the SIGTERM
        handler), so any of the three ends the sleep at once.
        """
        interval_s = self._cfg.interval_ms / 1000.0
        wall0, mono0 = time.time(), time.monotonic()
        next_tick = first_tick = last_tick = mono0
        while self.report.ended_by is None:
            last_tick = time.monotonic()
            self._tick(wall0 + (last_tick - mono0))
            self.report.ticks += 1
            if self.report.ticks == 1:
                first_tick = last_tick
                self.report.rss_start_bytes = _rss_bytes()
                self.report.write(self._cfg.chunks_dir / REPORT_NAME)  # what a kill leaves
                conn.send("started")
            next_tick += interval_s
            behind_s = time.monotonic() - next_tick
            if behind_s > 0:
                missed = int(behind_s / interval_s) + 1
                self.report.missed_ticks += missed
                next_tick += missed * interval_s
            self.report.ended_by = _wait_for_end(conn, wake_fd, next_tick - time.monotonic())
        if self.report.ticks > 1:
            self.report.mean_period_ms = 1000.0 * (last_tick - first_tick) / (self.report.ticks - 1)

    def finish(self) -> None:
        """Flush the last chunk, close the sources and write the complete report.

        Each live source's ``fields()`` is read again first (:meth:`_final_fields`).
        """
        try:
            self._writer.flush()
        finally:
            for name, source in self._sources.items():
                self._final_fields(name, source)
                source.close()
            self.report.complete = True
            self.report.rows_written = self._writer.rows_written
            self.report.chunks = self._writer.chunks
            self.report.rss_first_chunk_bytes = self._writer.rss_first_chunk_bytes
            self.report.rss_peak_bytes = max(
                self.report.rss_start_bytes, self._writer.rss_peak_bytes, _rss_bytes()
            )
            self.report.write(self._cfg.chunks_dir / REPORT_NAME)


def _wait_for_end(conn: Connection, wake_fd: int, timeout_s: float) -> str | None:
    """Sleep up to ``timeout_s``; return why sampling must end, or None to sample again."""
    ready = wait([conn, wake_fd], max(0.0, timeout_s))
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
    # Ctrl-C reaches the whole foreground process group; the parent handles it and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM (a job's end, sent to every process) only wakes the loop: the last chunk and
    # the report still get written.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    loop = _SamplerLoop(cfg)
    try:
        try:
            if loop.report.sources:
                loop.run(conn, wake_r)
        except Exception as e:
            loop.record(time.time(), "sampler", e)
            raise
        finally:
            loop.finish()
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
        self._cfg = _ChildConfig(
            sources=[(name, source_target(name), dict(kwargs)) for name, kwargs in sources],
            interval_ms=float(interval_ms),
            chunks_dir=Path(chunks_dir),
            chunk_rows=chunk_rows,
            flush_s=flush_s,
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
    def report_path(self) -> Path:
        """Where the sampler process writes its report."""
        return self._cfg.chunks_dir / REPORT_NAME

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the sampler process and return once it has taken its first sample.

        Raises:
            TelemetryError: ``chunks_dir`` holds an earlier run's files, or the process exited
                (e.g. no source could be built) or did not sample within ``timeout_s``.
        """
        chunks_dir = self._cfg.chunks_dir
        chunks_dir.mkdir(parents=True, exist_ok=True)
        if self.report_path.exists() or any(chunks_dir.glob(CHUNK_GLOB)):
            raise TelemetryError(f"{chunks_dir} already holds telemetry; use an empty directory")
        self._proc.start()
        assert self._child_conn is not None
        self._child_conn.close()  # the child's end lives in the child only: its death is EOF
        self._child_conn = None
        try:
            if not self._conn.poll(timeout_s):
                self._proc.kill()
                self._proc.join(5)
                raise TelemetryError(f"telemetry sampler took no sample within {timeout_s} s")
            self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(5)
            raise TelemetryError(
                f"telemetry sampler exited before sampling: {self._why()}"
            ) from None

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
