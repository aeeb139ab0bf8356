"""Time `charllm-kit report` on 100 bundles on this host (issue 38: <= 30 s on a 2-core host,
HTML under 5 MB).

The bundles are copies of the recorded GPU bundles made 4-GPU layouts (tests/many_bundles.py).
Prints the host, the date, the wall time of the report command (and of --single-file), the
size of the HTML and of its figure folder, and the number of figures. Run from the repository
root: ``PYTHONPATH=$PWD python benchmarks/report/scale.py [N]``.
"""

import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.many_bundles import many_bundles


def _report(bundles: list[Path], out: Path, *extra: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kit", "report", *map(str, bundles), "-o", str(out),
                    *extra], check=True, capture_output=True)
    return time.perf_counter() - start


def main(n: int) -> None:
    """Make ``n`` bundles, report on them twice (figures beside, then inlined), print."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bundles = many_bundles(root / "bundles", n)
        load = os.getloadavg()
        linked = _report(bundles, root / "r" / "report.html")
        single = _report(bundles, root / "s" / "report.html", "--single-file")
        figures = sorted((root / "r" / "report_figures").iterdir())
        print(f"date: {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}")
        print(f"host: {platform.node()} {platform.machine()}, {len(os.sched_getaffinity(0))} "
              f"cores usable, load average before {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
        print(f"command: charllm-kit report <{n} bundles> -o report.html")
        print(f"bundles: {n}, figures: {len(figures)}")
        print(f"report wall time: {linked:.1f} s (figures beside the HTML)")
        print(f"report wall time: {single:.1f} s (--single-file)")
        print(f"HTML: {(root / 'r' / 'report.html').stat().st_size / 1e6:.2f} MB, figures "
              f"folder {sum(f.stat().st_size for f in figures) / 1e6:.1f} MB; single file "
              f"{(root / 's' / 'report.html').stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
