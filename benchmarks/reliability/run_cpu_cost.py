"""CPU seconds a CPU-platform run costs, over the launcher and every process under it.

Four A/B comparisons behind issue 40's item 9 (the suite is CPU-bound on two cores):

* ``fork``: a 2-rank ``gpt3-tiny`` run with the kit at a reference commit (every rank imports
  torch and the engine) against this tree (ranks forked from one process that imported once,
  kit/launch/rank_fork.py). The reference is a ``git worktree``, the launcher's working folder
  and first on PYTHONPATH, which the ranks inherit.
* ``nodes``: a two-node ``gpt3-tiny --tp 2 --dp 2`` run (``--launcher torchrun``, both node
  agents on this host) with the kit at a reference commit (each node's ranks started by torch's
  elastic agent, every one importing) against this tree (each agent forks its node's ranks,
  kit/launch/elastic_fork.py).
* ``fabric``: ``charllm-kit fabric --nproc 4`` with the kit at a reference commit (each rank
  a new interpreter importing torch) against this tree (the ranks forked).
* ``omp``: a 1-rank run beside one busy process (as the suite's other worker is), with
  OpenMP's default wait policy and with ``OMP_WAIT_POLICY=PASSIVE`` (tests/conftest.py).

CPU is summed per process from psutil, polled every 50 ms until the process ends (a process's
last 50 ms may be missed: the same for both sides). Usage, from the repository root with the
kit's venv active::

    python benchmarks/reliability/run_cpu_cost.py --ref e46306e --reps 3 > results/x.txt
    python benchmarks/reliability/run_cpu_cost.py --ref 9aaf50d --only nodes > results/y.txt
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from kit.launch.local import free_port

REPO = Path(__file__).resolve().parents[2]


def tree_cpu(cmd: list[str], env: dict[str, str], cwd: Path = REPO) -> tuple[float, float, str]:
    """Run ``cmd`` in ``cwd`` (``python -m kit`` imports the kit found there); its wall seconds,
    the CPU seconds of it and every descendant, and its ``step time`` line.
    """
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=cwd)
    root = psutil.Process(proc.pid)
    seen: dict[int, float] = {}
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = [root]
        for p in procs:
            try:
                t = p.cpu_times()
                seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    step = next((ln for ln in out.splitlines() if ln.startswith("step time")), "no step time")
    return time.monotonic() - t0, sum(seen.values()), step


def run_cmd(out: Path, *args: str) -> list[str]:
    """``charllm-kit run gpt3-tiny ARGS`` with one warmup step, its bundle under ``out``."""
    return [sys.executable, "-m", "kit", "run", "gpt3-tiny", *args, "--warmup", "1",
            "--out", str(out)]


def two_nodes_cmd(out: Path) -> list[str]:
    """Both node agents of a two-node torchrun run on this host, under one shell."""
    port = free_port()
    node = ("{py} -m kit run gpt3-tiny --nodes 2 --tp 2 --dp 2 --launcher torchrun --node-rank {k}"
            " --rdzv-endpoint 127.0.0.1:{port} --steps 3 --warmup 1 --out {out} >/dev/null")
    both = " & ".join(node.format(py=sys.executable, k=k, port=port, out=out) for k in (0, 1))
    return ["bash", "-c", f"{both} & wait"]


def fabric_cmd(out: Path) -> list[str]:
    """A 4-rank fabric run of one size."""
    return [sys.executable, "-m", "kit", "fabric", "--nproc", "4", "--sizes", "64K", "--iters",
            "2", "--warmup", "1", "--out", str(out)]


AB = {
    "fork": ("gpt3-tiny --dp 2 --steps 3", "ranks forked",
             lambda out: run_cmd(out, "--dp", "2", "--steps", "3")),
    "nodes": ("gpt3-tiny --nodes 2 --tp 2 --dp 2 --launcher torchrun --steps 3",
              "each node's ranks forked", two_nodes_cmd),
    "fabric": ("fabric --nproc 4 --sizes 64K --iters 2 --warmup 1", "ranks forked", fabric_cmd),
}
"""The reference-against-this-tree comparisons: what runs, what this tree does, its command."""


def main() -> None:
    """Print the comparisons asked for (module docstring), one line per run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="commit whose ranks each import (before the fork)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=("fork", "nodes", "fabric", "omp"), action="append",
                    help="run only this comparison (repeatable; default: all four)")
    args = ap.parse_args()
    only = set(args.only or ("fork", "nodes", "fabric", "omp"))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, {os.cpu_count()} cores, "
          f"python {sys.version.split()[0]}, kit {head} against {args.ref}")
    print(f"$ python benchmarks/reliability/run_cpu_cost.py --ref {args.ref} --reps {args.reps}"
          + "".join(f" --only {o}" for o in args.only or ()))
    with tempfile.TemporaryDirectory() as tmp:
        ref = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(ref), args.ref],
                       cwd=REPO, check=True)
        try:
            for what in (w for w in AB if w in only):
                run, this, cmd = AB[what]
                print(f"# {what}: {run}, idle host; wall s, CPU s (all processes)")
                for rep in range(args.reps):
                    for name, path in ((f"ref {args.ref} (each rank imports)", ref),
                                       (f"this {head} ({this})", REPO)):
                        env = dict(os.environ, PYTHONPATH=str(path))
                        wall, cpu, _ = tree_cpu(cmd(Path(tmp) / "out"), env, cwd=path)
                        print(f"{what} rep {rep}  {name:40s} wall {wall:6.1f}  cpu {cpu:6.1f}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(ref)], cwd=REPO)
        if "omp" not in only:
            return
        print("# omp: gpt3-tiny --steps 30 (1 rank, 2 threads) beside one busy process")
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            for rep in range(2):
                for policy in ("default", "PASSIVE"):
                    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
                    if policy == "PASSIVE":
                        env["OMP_WAIT_POLICY"] = policy
                    wall, cpu, step = tree_cpu(run_cmd(Path(tmp) / "out", "--steps", "30"), env)
                    print(f"omp rep {rep}  policy {policy:8s} wall {wall:6.1f}  cpu {cpu:6.1f}  "
                          f"{' '.join(step.split())}")
        finally:
            hog.kill()


if __name__ == "__main__":
    main()
