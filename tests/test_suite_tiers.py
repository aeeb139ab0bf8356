"""The suite's tiers: ``./run.sh test --fast`` leaves out the tests that start ranks, a Slurm
cluster or an image build (pyproject.toml's markers; tests/conftest.py marks by fixture)."""
# ruff: noqa: D103  (test names say what they check)

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, why_failed


def collected(*args: str) -> set[str]:
    """The test ids ``./run.sh test ARGS --collect-only`` names, in one process."""
    env = dict(os.environ, CHARLLM_NO_BROWSER="1", CHARLLM_VENV=sys.prefix,
               CHARLLM_TEST_WORKERS="0")
    r = subprocess.run([str(REPO / "run.sh"), "test", *args, "--collect-only",
                        "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=REPO,
                       env=env, timeout=300)
    assert r.returncode == 0, why_failed(r)
    return {line for line in r.stdout.splitlines() if "::" in line}


@pytest.mark.timeout(600)
def test_fast_leaves_out_training_slurm_and_image_tests_and_keeps_the_rest():
    files = ("tests/test_flops.py", "tests/test_run_cpu.py", "tests/test_bundle_archive.py",
             "tests/test_multinode_slurm.py", "tests/test_container.py")
    full, fast = collected(*files), collected("--fast", *files)

    def named(part: str, ids: set[str]) -> bool:
        return any(part in i for i in ids)

    assert named("test_flops.py::", fast)
    assert named("test_submit_dry_run_prints_the_script", fast)  # needs no cluster
    for left_out in ("test_run_cpu.py::",  # its module's mark
                     # marked through a fixture: the shared CPU run, Slurm, the built image
                     "test_pack_refuses_a_bundle_that_does_not_verify", "test_scancel",
                     "test_cpu_image_trains"):
        assert named(left_out, full) and not named(left_out, fast), left_out
