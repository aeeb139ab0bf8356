"""The sampler process's output: rows buffered and written out as Parquet chunk files."""

import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from kit.atomic_write import write_atomic
from kit.telemetry.arrow_rows import table_from_rows
from kit.telemetry.fields import TELEMETRY_ARROW_SCHEMA, make_row

CHUNK_GLOB = "chunk-*.parquet"
"""Names of the chunk files; their zero-padded indices sort in write order."""


def rss_bytes() -> int:
    """Resident set size of this process now.

    Not ``getrusage``'s ``ru_maxrss``: Linux keeps that across ``execve``, so a spawned child
    starts with its parent's peak (a training rank's, with torch loaded) as its own.
    """
    return psutil.Process().memory_info().rss


class ChunkWriter:
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
        self._warm_up()

    @staticmethod
    def _warm_up() -> None:
        """Write one row to memory: a process's first Parquet write pays pyarrow's one-off
        initialisation, which would otherwise stall the first chunk's tick."""
        row = make_row(0.0, 0, None, "host")
        pq.write_table(table_from_rows([row], TELEMETRY_ARROW_SCHEMA), pa.BufferOutputStream())

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
        table = table_from_rows(rows, TELEMETRY_ARROW_SCHEMA)  # not from_pylist: no pandas
        write_atomic(path, lambda tmp: pq.write_table(table, tmp))  # never seen half-written
        rss = rss_bytes()
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        self.rss_first_chunk_bytes = self.rss_first_chunk_bytes or rss
        self.chunks += 1
        self.rows_written += len(rows)
        self._last_write = time.monotonic()

