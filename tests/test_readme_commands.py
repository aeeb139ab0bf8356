"""The README's commands that run anywhere (``--dry-run``) do what it says: they succeed, and a
layout it shows is one the kit would run, not one it refuses."""

import re
import shlex

import pytest

from .conftest import REPO, kit_cli, why_failed


def dry_run_commands() -> list[list[str]]:
    """Every ``charllm-kit ... --dry-run`` line of the README's bash blocks, as argv."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = []
    for line in (ln for block in blocks for ln in block.splitlines()):
        argv = shlex.split(line, comments=True)
        if argv[:1] == ["charllm-kit"] and "--dry-run" in argv:
            commands.append(argv[1:])
    return commands


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
