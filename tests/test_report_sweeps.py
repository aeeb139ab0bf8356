"""What the report says across configurations, on real CPU runs: what a sweep varies on purpose
is said as its axes, not flagged (kit.analysis.comparability).
"""
# ruff: noqa: D103  (test names say what they check)

import html
import re
import shutil
from pathlib import Path

import pytest

from kit.study.run import conclude

from .conftest import kit_cli, why_failed

pytestmark = pytest.mark.training

SWEEP = """name: batches
base: {workload: gpt3-tiny, platform: cpu, steps: 2, warmup: 1, telemetry_interval_ms: 0}
axes:
  - zip: {micro_batch_size: [1, 2], global_batch_size: [4, 8]}
"""


@pytest.fixture(scope="module")
def batch_sweep(tmp_path_factory) -> Path:
    """A sweep folder of two points: micro-batch 1 at global batch 4, 2 at 8."""
    out = tmp_path_factory.mktemp("batch-sweep")
    (out / "batches.yaml").write_text(SWEEP)
    r = kit_cli("sweep", str(out / "batches.yaml"), "--out", str(out / "results"))
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "results" / "batches"


SWEPT_NOTE = ("[swept] the swept axes, varied on purpose (so not flagged as differences): "
              "micro_batch_size 1, 2; global_batch_size 4, 8")


def test_a_sweeps_axes_are_said_as_swept_not_flagged(batch_sweep, tmp_path):
    r = kit_cli("compare", str(batch_sweep))
    assert r.returncode == 0, r.stderr
    checks = r.stdout.split("comparability:\n")[1].split("\n\n")[0]
    assert SWEPT_NOTE in checks and "[batch]" not in checks
    # the same bundles given one by one came from nowhere in particular: the warning stands
    bundles = sorted(str(p) for p in batch_sweep.glob("*/2*"))
    r = kit_cli("compare", *bundles)
    checks = r.stdout.split("comparability:\n")[1].split("\n\n")[0]
    assert "[batch] different micro-batch" in checks and "[batch] different global batch" in checks
    assert "[swept]" not in checks
    r = kit_cli("report", str(batch_sweep), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, why_failed(r)
    section = (tmp_path / "r.html").read_text().split('<h2 id="comparability">')[1]
    lines = [html.unescape(x) for x in re.findall(r"<li>(.*?)</li>", section.split("</ul>")[0])]
    assert SWEPT_NOTE in lines and not any(x.startswith("[batch]") for x in lines)


def test_the_study_report_says_its_factors_are_swept(batch_sweep, tmp_path):
    folder = shutil.copytree(batch_sweep, tmp_path / "study")  # a study folder is its sweep's
    bundles = sorted(folder.glob("*/2*"))
    _, _, report = conclude(folder, bundles, "cpux1", say=lambda line: None)
    section = report.read_text().split('<h2 id="comparability">')[1].split("</ul>")[0]
    lines = [html.unescape(x) for x in re.findall(r"<li>(.*?)</li>", section)]
    assert SWEPT_NOTE in lines and not any(x.startswith("[batch]") for x in lines)
