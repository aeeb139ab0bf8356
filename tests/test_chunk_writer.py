"""The sampler's chunk writer: rows reach disk in order, on its thread; a failed write is raised."""

from pathlib import Path

import pytest

from kit.bundle.telemetry_fields import make_row
from kit.bundle.writer import concat_chunks
from kit.telemetry.chunks import ChunkWriter


def test_rows_reach_their_chunks_in_order(tmp_path: Path) -> None:
    writer = ChunkWriter(tmp_path, chunk_rows=2, flush_s=60.0)
    for i in range(7):
        writer.add([make_row(float(i), 0, 0, "host", power_w=float(i))])
    writer.flush()  # the last, shorter chunk; and every chunk handed over is on disk
    assert (writer.chunks, writer.rows_written) == (4, 7)
    assert [r["power_w"] for r in concat_chunks(tmp_path).to_pylist()] == [float(i)
                                                                          for i in range(7)]


def test_a_chunk_that_cannot_be_written_is_raised_naming_its_file(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    writer = ChunkWriter(gone, chunk_rows=1, flush_s=60.0)
    writer.add([make_row(1.0, 0, 0, "host", power_w=1.0)])
    with pytest.raises(OSError, match="gone"):
        writer.flush()
    assert writer.chunks == 0
