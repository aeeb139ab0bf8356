"""The CLI's process does its Arrow work without importing pandas (kit.arrow_pandas)."""

import re
import subprocess
import sys

from .conftest import REPO, why_failed


def _imports(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m kit ARGS``; how it ended and the modules it imported."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "kit", *args],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    return r, set(re.findall(r"^import time:.*\|\s+(\S+)$", r.stderr, re.M))


def test_verify_compare_and_report_read_bundles_without_pandas(cpu_bundle, tmp_path):
    for args in (["bundle", "verify", str(cpu_bundle)],
                 ["compare", str(cpu_bundle)],
                 ["report", str(cpu_bundle), "-o", str(tmp_path / "report.html")]):
        r, modules = _imports(*args)
        assert r.returncode == 0, why_failed(r)
        # a refused import is listed as "pandas" too; an import that happens brings pandas.core
        assert "pyarrow.lib" in modules and "pandas.core" not in modules, args


KEPT_OUT = """
import sys
import numpy as np
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
from kit import arrow_pandas

arrow_pandas.keep_out()
try:
    import pandas
except ModuleNotFoundError as e:
    print("refused:", "kit.arrow_pandas" in str(e))
a = pa.array([1.5, None, 3])
pq.write_table(pa.table({"a": a}), sys.argv[1])
t = pq.read_table(sys.argv[1])
print(t["a"].to_numpy().tolist(), pc.fill_null(t["a"], 0).to_pylist(), pa.scalar(2).as_py())
print("pandas" in sys.modules)
"""

ALREADY = """
import pandas
from kit import arrow_pandas

arrow_pandas.keep_out()
import pandas.api.types
print("kept", type(pandas.Series([1]).to_numpy()).__name__)
"""


def test_pyarrow_works_with_pandas_kept_out_and_a_pandas_already_there_stays(tmp_path):
    r = subprocess.run([sys.executable, "-c", KEPT_OUT, str(tmp_path / "a.parquet")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.splitlines() == ["refused: True", "[1.5, nan, 3.0] [1.5, 0.0, 3.0] 2",
                                     "False"]
    r = subprocess.run([sys.executable, "-c", ALREADY], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.strip() == "kept ndarray"
