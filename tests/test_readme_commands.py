"""The README's commands do what it says: those that run anywhere (``--dry-run``) succeed with a
layout the kit would run, not one it refuses, and the tour's ``project`` line works on CPU with
the bundles the tour's own ``run`` and ``fabric`` lines make."""

import json
import re
import shlex
from pathlib import Path

import pytest

from .conftest import REPO, TP2_DP2, bundle_path, kit_cli, why_failed


def readme_commands() -> list[list[str]]:
    """Every ``charllm-kit ...`` line of the README's bash blocks, as argv (without the name)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = (shlex.split(ln, comments=True) for block in blocks for ln in block.splitlines())
    return [argv[1:] for argv in lines if argv[:1] == ["charllm-kit"]]


def dry_run_commands() -> list[list[str]]:
    """Every ``charllm-kit ... --dry-run`` line of the README's bash blocks, as argv."""
    return [argv for argv in readme_commands() if "--dry-run" in argv]


def tour_line(first: str, *more: str) -> list[str]:
    """The one README line that starts ``charllm-kit FIRST MORE...``."""
    found = [argv for argv in readme_commands() if argv[:1 + len(more)] == [first, *more]]
    assert len(found) == 1, found
    return found[0]


def test_the_readme_shows_dry_runs():
    assert [argv[:2] for argv in dry_run_commands()] == [["run", "llama3-70b"],
                                                         ["sweep", "sweeps/h200-optimization.yaml"],
                                                         ["study", "--dry-run"]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("argv", dry_run_commands(), ids=" ".join)
def test_each_readme_dry_run_succeeds_and_would_run(argv):
    r = kit_cli(*argv, timeout=240)
    assert r.returncode == 0, why_failed(r)
    assert "refuses" not in r.stdout and "would not fit" not in r.stdout, r.stdout


def _made(argv: list[str], out: Path, *shorter: str) -> Path:
    """Run a README line for real on CPU into ``out`` (``shorter``: fewer iterations, same
    layout)."""
    r = kit_cli(*argv, *shorter, "--out", str(out), timeout=900)
    assert r.returncode == 0, why_failed(r)
    return bundle_path(r.stdout)


@pytest.mark.timeout(1500)
def test_the_tours_project_line_works_on_the_bundles_the_tour_makes(tp2_dp2_bundle, tmp_path):
    """``project results/<run> results/<fabric> ...``: <run> made by the tour's ``run gpt3-tiny
    --tp 2 --dp 2`` (pipeline-free), <fabric> by its ``fabric --nproc 4``."""
    assert tour_line("run", "gpt3-tiny", "--tp", "2", "--dp", "2") == list(TP2_DP2)
    run = tp2_dp2_bundle  # that line's run, shared with test_run_cpu
    fabric = _made(tour_line("fabric"), tmp_path, "--iters", "2", "--warmup", "1")
    argv = tour_line("project")
    argv = [str(run) if a == "results/<run>" else str(fabric) if a == "results/<fabric>" else a
            for a in argv]
    assert str(run) in argv and str(fabric) in argv, argv
    r = kit_cli(*argv, "--out", str(tmp_path / "projected"), "--json", timeout=600)
    assert r.returncode == 0, why_failed(r)
    out = json.loads(r.stdout)
    assert out["projected"] is True and Path(out["file"]).is_file()
    assert [i["role"] for i in out["inputs"]] == ["compute", "fabric"]
