"""Telemetry chunks built without pyarrow's pandas import: the same table ``from_pylist`` builds,
the same refusals, and a sampler-side chunk write that leaves pandas unimported."""

import os
import subprocess
import sys

import pyarrow as pa
import pytest

from kit.bundle.telemetry_fields import TELEMETRY_ARROW_SCHEMA, make_row
from kit.telemetry.arrow_rows import column, table_from_rows

from .conftest import REPO


def _rows() -> list[dict]:
    rows = [make_row(1700000000.25 + i, i % 3, None if i % 4 == 0 else i,
                     "host" if i % 2 else "nvml-é",  # a multi-byte UTF-8 string
                     power_w=None if i % 5 == 0 else 101.5 * i,
                     energy_j=10**12 + i,  # an int in a float64 column
                     mem_used_bytes=2**40 + i,
                     throttle=7.9 if i == 3 else None)  # a float in an int64 column: truncated
            for i in range(19)]
    rows[0]["not_a_column"] = "ignored"
    del rows[1]["cpu_power_w"]  # a missing key is null
    return rows


def test_the_table_is_the_one_from_pylist_builds():
    got = table_from_rows(_rows(), TELEMETRY_ARROW_SCHEMA)
    want = pa.Table.from_pylist(_rows(), schema=TELEMETRY_ARROW_SCHEMA)
    assert got.equals(want, check_metadata=True)
    assert got.column("throttle")[3].as_py() == 7
    assert table_from_rows([], TELEMETRY_ARROW_SCHEMA).equals(
        TELEMETRY_ARROW_SCHEMA.empty_table(), check_metadata=True)


@pytest.mark.parametrize(("values", "dtype", "error"), [
    (["7"], pa.int64(), TypeError),
    ([True], pa.int32(), TypeError),
    ([2**31], pa.int32(), OverflowError),
    ([3], pa.string(), TypeError),
    ([float("nan")], pa.int64(), ValueError),
    ([1.0], pa.float32(), TypeError),  # a type no telemetry column has
])
def test_a_value_the_column_cannot_hold_is_refused(values, dtype, error):
    with pytest.raises(error):
        column(values, dtype)


def test_writing_chunks_does_not_import_pandas(tmp_path):
    """The sampler process writes chunks while the ranks start beside it: pyarrow's pandas
    check would cost it 0.3-0.4 s of CPU."""
    code = ("import sys\n"
            "from pathlib import Path\n"
            "from kit.telemetry.chunks import ChunkWriter\n"
            "from kit.bundle.telemetry_fields import make_row\n"
            "w = ChunkWriter(Path(sys.argv[1]), chunk_rows=2, flush_s=60.0)\n"
            "w.add([make_row(1.0, 0, 0, 'host', power_w=5.0)] * 3)\n"
            "w.flush()\n"
            "print(w.chunks, 'pandas' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["2", "False"]
