"""How long `charllm-kit compare` takes on 200 whole bundles (target: under 5 s).

compare verifies every bundle before reading it (every file hashed), so this is the cost a
study of a few hundred runs pays each time it is compared. The bundles are hard-linked copies of
a recorded GPU bundle (140 KiB, telemetry included), so building them costs nothing.

    python3 benchmarks/perf/compare_200.py [--bundles N] [--repeat R]

Prints a header (date, host, load, commit), each repeat's wall time and the median. Exit 1 when
compare fails; the time is reported, not judged: the tests assert behaviour only.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests/data/bundles/telemetry/20261122T094842Z-gpt3-1.3b-h200-bceb8a"
TARGET_S = 5.0


def main() -> int:
    """Time compare of hard-linked copies; exit 1 when it fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip() or "unknown"
    print(f"# {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ} compare of {args.bundles} bundles; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; commit {commit}")
    times = []
    with tempfile.TemporaryDirectory(prefix="compare-200-") as tmp:
        paths = [str(shutil.copytree(RECORDED, Path(tmp) / f"copy{i:03d}", copy_function=os.link))
                 for i in range(args.bundles)]
        for n in range(args.repeat):
            start = time.monotonic()
            r = subprocess.run([sys.executable, "-m", "kit", "compare", *paths],
                               capture_output=True, text=True, cwd=REPO)
            elapsed = time.monotonic() - start
            if r.returncode != 0:
                print(f"compare failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")
                return 1
            times.append(elapsed)
            print(f"repeat {n + 1}: {elapsed:.2f} s")
    median = statistics.median(times)
    print(f"median {median:.2f} s for {args.bundles} bundles (target < {TARGET_S:g} s: "
          f"{'met' if median < TARGET_S else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
