"""The sampler process's output: rows buffered and written out as Parquet chunk files."""

import queue
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from kit.atomic_write import write_atomic
from kit.bundle.telemetry_fields import TELEMETRY_ARROW_SCHEMA, make_row
from kit.telemetry.arrow_rows import table_from_rows

CHUNK_GLOB = "chunk-*.parquet"
"""Names of the chunk files; their zero-padded indices sort in write order."""
MAX_PENDING = 4
"""Chunks that may wait for the writer thread; one more waits in the sampler's loop (a disk
that stalls then stalls the loop, as a write in the tick did, instead of growing its memory)."""


def rss_bytes() -> int:
    """Resident set size of this process now.

    Not ``getrusage``'s ``ru_maxrss``: Linux keeps that across ``execve``, so a spawned child
    starts with its parent's peak (a training rank's, with torch loaded) as its own.
    """
    return psutil.Process().memory_info().rss


class ChunkWriter:
    """Buffers rows and writes them out as Parquet chunk files, on a thread of its own.

    A chunk is written every ``chunk_rows`` rows or ``flush_s`` seconds, whichever comes
    first, so a crash of the process loses at most that much and the chunks still waiting for
    the writer (at most :data:`MAX_PENDING`; each waits tens of milliseconds unless the disk
    stalls). The sampler's loop only hands each chunk's rows over: written inside the tick, a
    chunk made that tick take 29-57 ms instead of 17 on a 2-core host with both cores busy (4
    fake GPUs at 20 ms: 9 of the 12 ticks that overran were ticks that wrote one). On the
    writer thread it costs the loop at most a GIL switch interval. A write that fails is raised
    by the next :meth:`add` or :meth:`flush`.
    """

    def __init__(self, chunks_dir: Path, chunk_rows: int, flush_s: float) -> None:
        self._dir = chunks_dir
        self._chunk_rows = chunk_rows
        self._flush_s = flush_s
        self._last_handed = time.monotonic()
        self._rows: list[dict[str, Any]] = []
        self._pending: queue.Queue[list[dict[str, Any]]] = queue.Queue(MAX_PENDING)
        self._error: BaseException | None = None
        self.chunks = 0
        self.rows_written = 0
        self.rss_peak_bytes = 0
        self.rss_first_chunk_bytes = 0
        self._warm_up()
        threading.Thread(target=self._write_pending, name="chunk-writer", daemon=True).start()

    @staticmethod
    def _warm_up() -> None:
        """Write one row to memory: a process's first Parquet write pays pyarrow's one-off
        initialisation, which would otherwise stall the first chunk."""
        row = make_row(0.0, 0, None, "host")
        pq.write_table(table_from_rows([row], TELEMETRY_ARROW_SCHEMA), pa.BufferOutputStream())

    def add(self, rows: list[dict[str, Any]]) -> None:
        """Buffer rows, handing every full chunk (and, after ``flush_s``, what is buffered) to
        the writer thread.

        Raises:
            OSError: An earlier chunk could not be written.
        """
        self._raise_failure()
        self._rows.extend(rows)
        while len(self._rows) >= self._chunk_rows:
            self._hand_over(self._rows[: self._chunk_rows])
            del self._rows[: self._chunk_rows]
        if self._rows and time.monotonic() - self._last_handed >= self._flush_s:
            self._hand_over(self._rows)
            self._rows = []

    def flush(self) -> None:
        """Write whatever is buffered as a last, shorter chunk, and wait until every chunk
        handed over is on disk.

        Raises:
            OSError: A chunk could not be written.
        """
        if self._rows:
            self._hand_over(self._rows)
            self._rows = []
        self._pending.join()
        self._raise_failure()

    def _hand_over(self, rows: list[dict[str, Any]]) -> None:
        self._pending.put(rows)
        self._last_handed = time.monotonic()

    def _raise_failure(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _write_pending(self) -> None:
        """The writer thread: write each chunk handed over, in order."""
        while True:
            rows = self._pending.get()
            try:
                self._write(rows)
            except BaseException as e:  # noqa: BLE001 - raised in the sampler's loop instead
                self._error = self._error or e
            finally:
                self._pending.task_done()

    def _write(self, rows: list[dict[str, Any]]) -> None:
        path = self._dir / f"chunk-{self.chunks:06d}.parquet"
        table = table_from_rows(rows, TELEMETRY_ARROW_SCHEMA)  # not from_pylist: no pandas
        write_atomic(path, lambda tmp: pq.write_table(table, tmp))  # never seen half-written
        rss = rss_bytes()
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        self.rss_first_chunk_bytes = self.rss_first_chunk_bytes or rss
        self.chunks += 1
        self.rows_written += len(rows)
