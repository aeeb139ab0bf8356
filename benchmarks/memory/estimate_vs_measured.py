"""Run a few configs on this host and print the memory estimate beside each rank's measured peak.

Usage, from the repository root (``--set gpu`` on one H100/H200, ``--set cpu`` anywhere):

    python benchmarks/memory/estimate_vs_measured.py --set gpu [--out DIR]

Each config runs through ``charllm-kit run`` (2 steps, so the peak includes the optimizer
states AdamW allocates in the first one; telemetry off,
``--force`` so the estimate cannot veto its own check); the bundle's ``per_rank``
``mem_peak_bytes`` (``torch.cuda.max_memory_allocated`` on GPUs, peak RSS on cpu) is compared
with :func:`kit.plan.memory.estimate_vs_measured` for that rank's pipeline stage. Large
workloads are cut to a few layers (width, heads, vocabulary and sequence kept) so that one
device holds them. Prints a table and writes ``estimate_vs_measured-<platform>.json`` to
``benchmarks/memory/results/``.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml
from tabulate import tabulate

from kit.bundle.reader import read_bundle
from kit.config.loader import load_workload
from kit.config.run import RunConfig
from kit.plan.memory import estimate_vs_measured

RESULTS = Path(__file__).resolve().parent / "results"

# (label, workload, layers kept or None, extra `run` arguments)
CONFIGS = {
    "gpu": [
        ("gpt3-1.3b mb4", "gpt3-1.3b", None, ["--micro-batch", "4", "--global-batch", "4"]),
        ("gpt3-1.3b mb4 full recompute", "gpt3-1.3b", None,
         ["--micro-batch", "4", "--global-batch", "4", "--recompute", "full"]),
        ("gpt3-1.3b mb8 selective", "gpt3-1.3b", None,
         ["--micro-batch", "8", "--global-batch", "8", "--recompute", "selective"]),
        ("llama3-8b 4 layers mb1", "llama3-8b", 4, ["--global-batch", "1"]),
        ("mixtral-8x7b 2 layers mb1", "mixtral-8x7b", 2, ["--global-batch", "1"]),
    ],
    "cpu": [
        ("gpt3-small mb1", "gpt3-small", None, ["--global-batch", "1"]),
        ("gpt3-small mb2", "gpt3-small", None, ["--micro-batch", "2", "--global-batch", "2"]),
        ("gpt3-tiny tp2", "gpt3-tiny", None, ["--tp", "2"]),
        ("mixtral-tiny", "mixtral-tiny", None, []),
    ],
}


def workload_arg(name: str, layers: int | None, tmp: Path) -> str:
    """A shipped workload's name, or a YAML of it cut to ``layers`` layers."""
    if layers is None:
        return name
    cut = load_workload(name).model_copy(update={"name": f"{name}-{layers}l",
                                                 "num_layers": layers})
    path = tmp / f"{cut.name}.yaml"
    path.write_text(yaml.safe_dump(cut.model_dump(mode="json")))
    return str(path)


def measure(label: str, workload: str, args: list[str], out: Path) -> list[dict[str, object]]:
    """Run one config; one row per rank: estimate, measured peak and error."""
    cmd = [sys.executable, "-m", "kit", "run", workload, "--steps", "1", "--warmup", "1",
           "--telemetry-interval-ms", "0", "--force", "--out", str(out), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [{"config": label, "error_message": tail}]
    bundle = read_bundle(done.stdout.strip().splitlines()[-1])
    cfg = RunConfig.model_validate(bundle.manifest["config"])
    rows = []
    for rank in bundle.metrics["per_rank"]:
        cmp = estimate_vs_measured(cfg, rank["mem_peak_bytes"], rank["pp_rank"])
        rows.append({"config": label, "platform": cfg.platform.name, "rank": rank["rank"],
                     "stage": rank["pp_rank"], **cmp})
    return rows


def main() -> None:
    """Measure the chosen set, print the table and write the JSON next to this script."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--platform", help="Passed to run (default: detect this host).")
    parser.add_argument("--out", type=Path, help="Where bundles go (default: a temp dir).")
    a = parser.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        out = a.out or tmp / "bundles"
        extra = ["--platform", a.platform] if a.platform else []
        for label, name, layers, args in CONFIGS[a.set]:
            rows += measure(label, workload_arg(name, layers, tmp), [*extra, *args], out)
            print(json.dumps(rows[-1]), flush=True)
    platform = next((r["platform"] for r in rows if "platform" in r), a.set)
    table = [[r["config"], r.get("stage"), r.get("estimate_gib"), r.get("measured_gib"),
              r.get("error"), r.get("error_message", "")] for r in rows]
    print(tabulate(table, headers=["config", "stage", "estimate GiB", "measured GiB", "error",
                                   "failure"], floatfmt=".3f"))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"estimate_vs_measured-{platform}.json"
    path.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "set": a.set, "command": sys.argv, "rows": rows}, indent=2))
    print(path)


if __name__ == "__main__":
    main()
