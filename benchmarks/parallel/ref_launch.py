"""What the parallel reference benchmarks share: starting their own torchrun ranks, and the
``charllm-kit run`` of the same work they are compared with, in the same call."""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO = BENCHMARKS.parent


def env() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH`` (the ranks import kit)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep + path if path else ''}"}


def torchrun_result(script: str, nproc: int, worker_args: list[str]) -> dict:
    """Run ``script --worker`` on ``nproc`` torchrun ranks; what rank 0 wrote to ``--result``."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", script, "--worker", "--result", str(result),
               *worker_args]
        subprocess.run(cmd, check=True, cwd=REPO, env=env())
        return json.loads(result.read_text())


def kit_summary(run_args: list[str]) -> tuple[str, dict]:
    """Run ``charllm-kit run RUN_ARGS`` (echoing it); its bundle's name and summary metrics."""
    cmd = [sys.executable, "-m", "kit", "run", *run_args]
    print("$", shlex.join(["charllm-kit", "run", *run_args]), flush=True)
    done = subprocess.run(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, text=True)
    print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"charllm-kit run failed (exit {done.returncode})")
    bundle = Path(done.stdout.strip().splitlines()[-1])
    return bundle.name, json.loads((bundle / "metrics.json").read_text())["summary"]


def shared_arguments(parser: argparse.ArgumentParser, kit_args: str) -> None:
    """The options both references take: the workload, steps, the kit's extra options, CPU
    mode, the JSON output, and the hidden ones of their own torchrun ranks."""
    parser.add_argument("--workload", default="gpt3-1.3b")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--kit-args", default=kit_args, help="extra `charllm-kit run` options")
    parser.add_argument("--cpu", action="store_true", help="CPU ranks over gloo (a check)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
