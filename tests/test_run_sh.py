"""``./run.sh`` as a person types it: every command of the CLI passes through, a workload first
means ``run WORKLOAD``, and words that are neither get one line."""

import os
import shutil
import sys

import pytest

from kit.cli.commands import cli as kit_group

from .conftest import why_failed
from .test_container import run_sh


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", sorted(kit_group.commands))
def test_every_command_of_the_cli_passes_through(command):
    """The list comes from the CLI itself, so a command added later passes through too."""
    r = run_sh(command, "--help")
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.startswith(f"Usage: charllm-kit {command} "), r.stdout[:200]


@pytest.mark.timeout(120)
def test_submit_and_a_workload_first_take_their_own_options(tmp_path):
    r = run_sh("submit", "gpt3-tiny", "--tp", "2", "--out", str(tmp_path), "--dry-run",
               "--container-runtime", "none")
    assert r.returncode == 0, why_failed(r)
    assert r.stdout.startswith("#!/bin/bash\n") and "--tp 2" in r.stdout
    r = run_sh("gpt3-tiny", "--tp", "2", "--dry-run")
    assert r.returncode == 0, why_failed(r)
    assert "layout                tp=2 pp=1 dp=1 cp=1 ep=1 sp=False" in r.stdout


@pytest.mark.timeout(120)
def test_a_word_that_is_neither_a_command_nor_a_workload_is_one_line():
    r = run_sh("fabrik", "--nproc", "2")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("error: 'fabrik' is neither a command nor a workload; did you mean "
                        "'fabric'?\n")


@pytest.mark.training
@pytest.mark.timeout(300)
def test_fabric_through_run_sh_says_what_it_measures_as_it_goes(tmp_path):
    """`./run.sh fabric --nproc 2` runs the benchmark; each point is printed as it is measured,
    before the table."""
    r = run_sh("fabric", "--nproc", "2", "--ops", "all_reduce,send_recv", "--sizes", "4K,64K",
               "--iters", "1", "--warmup", "1", "--telemetry-interval-ms", "0", "--out",
               str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    lines = r.stderr.strip().splitlines()
    assert lines[0] == ("fabric on cpu x2: starting 2 ranks to time all_reduce, send_recv at 2 "
                        "size(s), 4 KiB to 64 KiB, in a host loop: 4 points")
    points = [ln.split(": ", 1)[1] for ln in lines[1:-1]]
    assert [p.split(":")[0] for p in points] == [
        "1/4 all_reduce 4 KiB x50", "2/4 all_reduce 64 KiB x50", "3/4 send_recv 4 KiB x50",
        "4/4 send_recv 64 KiB x50"]
    assert lines[-1] == "fabric on cpu x2: ranks done; stopping telemetry, writing the bundle"
    assert "iters" in r.stdout.splitlines()[1] and "graph" not in r.stdout


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("chromium") is not None, reason="chromium is installed here")
def test_run_sh_test_says_the_browser_test_is_skipped_before_it_runs():
    """``./run.sh test`` never installs system packages unannounced: asked not to, it says the
    browser test will be skipped, and the test's skip says why."""
    env = dict(os.environ, CHARLLM_NO_BROWSER="1", CHARLLM_VENV=sys.prefix)
    r = run_sh("test", "-rs", "-p", "no:cacheprovider", "tests/test_report_layouts.py", "-k",
               "renders_in_chromium", env=env)
    assert r.returncode == 0, why_failed(r)
    assert r.stderr.startswith("run.sh: chromium not installed (CHARLLM_NO_BROWSER is set): "
                               "the report's browser test"), r.stderr
    assert "headless Chromium not found" in r.stdout
