"""MLCommons' own checkers (mlperf-logging, in the `test` extra) on the kit's MLPerf exports.

The exports of a real CPU run and of every recorded GPU bundle under ``tests/data/bundles/*/`` go
through ``system_desc_checker``, which must pass, and the training compliance checker, which must
report exactly what follows from a kit run not being an MLPerf submission and nothing else:

- its benchmark is not on MLPerf's list, so that check fails and the checker finds no rules
  file for it (``Could not find config file``) and then stops with ``FileNotFoundError``;
- it trains on synthetic tokens generated per step: no training data set (``train_samples``),
  none read from storage whose page cache a run would clear (``cache_clear``);
- it does not evaluate: no ``eval_samples``, no ``eval_accuracy``.
"""

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.mllog import constants

from kit.interop import mllog_constants

from .conftest import REPO, kit_cli, why_failed

pytestmark = pytest.mark.timeout(300)

RULESET = "6.1.0"
"""The newest training ruleset of mlperf-logging 4.1.68, and its command line's default."""
RULES_DIR = Path(mlp_compliance.__file__).parent
RECORDED = sorted(p.parent for p in (REPO / "tests/data/bundles").glob("*/*/manifest.json"))
"""Bundles of real GPU runs, committed as evidence (read only)."""
SEPARATOR = "\n" + "-" * 30 + "\n"
"""How the compliance checker joins its messages into one log record."""


def test_kit_mllog_names_are_mlperf_loggings():
    names = [n for n in vars(mllog_constants) if n.isupper()]
    ours = {n: getattr(mllog_constants, n) for n in names if not n.startswith("KIT_")}
    assert ours == {n: getattr(constants, n, None) for n in ours}
    defined = {v for n, v in vars(constants).items() if n.isupper() and isinstance(v, str)}
    kit_own = {getattr(mllog_constants, n) for n in names if n.startswith("KIT_")}
    assert kit_own == {"data_parallel_size", "train_loss", "kit_status"}
    assert not kit_own & defined, "mllog now names these: use its constants"


@pytest.fixture(params=[pytest.param("cpu-run", marks=pytest.mark.training),
                        *(b.name for b in RECORDED)])
def bundle(request) -> Path:
    """The real CPU run's bundle, then each recorded GPU bundle."""
    if request.param == "cpu-run":
        return request.getfixturevalue("cpu_bundle")
    return next(b for b in RECORDED if b.name == request.param)


def export(command: str, bundle: Path, out: Path) -> Path:
    r = kit_cli("bundle", command, str(bundle), "-o", str(out), "--org", "ExampleLab",
                timeout=120)
    assert r.returncode == 0, why_failed(r)
    return out


def compliance_messages(log: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The first line of each message the training compliance checker reports on ``log``.

    Through its Python entry points, since its command line stops with a traceback before it
    prints its messages (see the test below): ``check_file`` runs the rules until it tries to
    open the benchmark's rules file, and ``log_messages`` reports what it found until then.
    """
    mlp_compliance.enqueued_configs.clear()  # a module-level queue the stop leaves filled
    checker = mlp_compliance.make_checker("training", RULESET, quiet=False, werror=False)
    with pytest.raises(FileNotFoundError):
        checker.check_file(str(log), f"training_{RULESET}/common.yaml")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        checker.log_messages()
    (report,) = caplog.messages
    return sorted(m.splitlines()[0] for m in report.strip().split(SEPARATOR))


def not_a_submission(benchmark: str) -> list[str]:
    """What the compliance checker reports on any kit run (see the module docstring)."""
    return sorted([
        "CHECK for 'submission_benchmark' failed in line 1:",
        f"Could not find config file: {RULES_DIR}/training_{RULESET}/open_{benchmark}.yaml",
        "Required EXACTLY_ONE occurrence of 'train_samples' but found 0",
        "Required AT_LEAST_ONE occurrence of 'cache_clear' but found 0",
        "Required EXACTLY_ONE occurrence of 'eval_samples' but found 0",
        "Required AT_LEAST_ONE occurrence of 'eval_accuracy' but found 0",
    ])


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def test_compliance_checker_reports_only_what_a_kit_run_is_not(bundle, tmp_path, caplog):
    log = export("export-mllog", bundle, tmp_path / "result_0.txt")
    benchmark = manifest(bundle)["workload"]["name"]
    assert compliance_messages(log, caplog) == not_a_submission(benchmark)


def test_compliance_checker_command_stops_at_a_benchmark_outside_mlperf(cpu_bundle, tmp_path):
    log = export("export-mllog", cpu_bundle, tmp_path / "result_0.txt")
    r = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", str(log),
         "--ruleset", RULESET, "--log_output", str(tmp_path / "checker.log")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    rules = RULES_DIR / f"training_{RULESET}" / "open_gpt3-tiny.yaml"
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        f"FileNotFoundError: [Errno 2] No such file or directory: '{rules}'")


def test_system_desc_checker_passes(bundle, tmp_path):
    desc = export("system-desc", bundle, tmp_path / "system.json")
    r = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.system_desc_checker", str(desc),
         "training", RULESET, "--log_output", str(tmp_path / "checker.log")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    m = manifest(bundle)
    system = f"{m['platform']['name']}_n{len(m['inventory'])}"
    # The command exits 0 either way: what it logs tells whether the description passed.
    assert r.returncode == 0
    assert r.stderr.splitlines()[0] == f"INFO -   System description checker passed for {system}"
