"""Print a profiled bundle's per-rank breakdown and check it against the measured step times.

For every profiled rank and step: seconds, share, calls, bytes and exposed/overlapped time per
category (kit.metrics.kernels), then two checks, each a line starting ``ok`` or ``FAIL``:

* the categories sum to the step's profiled window (the partition; within 1 us);
* the window matches the step's wall time in steps.parquet within TOLERANCE (the window is the
  ProfilerStep annotation inside the rank's own step timing, so they differ by the profiler's
  bookkeeping only).

Also prints the profiled steps' wall time beside the median of the unprofiled measured steps,
which is the profiler's overhead. Exit 1 when a check fails.

    python3 benchmarks/profile/check_breakdown.py results/<bundle>
"""

import sys
from pathlib import Path

from tabulate import tabulate

from kit.bundle.reader import read_bundle
from kit.metrics.kernels import read_breakdowns

TOLERANCE = 0.03
"""Largest relative difference between the categories' sum and the step's wall time."""


def main(path: Path) -> int:
    """Print and check; return the exit code."""
    bundle = read_bundle(path)
    failed = 0
    for rank in read_breakdowns(bundle):
        for step in rank.steps:
            rows = [(c.category, c.kind, f"{c.time_s * 1e3:.3f}",
                     f"{c.time_s / step.window_s:.1%}", c.calls,
                     "" if c.bytes is None else c.bytes,
                     "" if c.exposed_s is None else f"{c.exposed_s * 1e3:.3f}",
                     "" if c.overlapped_s is None else f"{c.overlapped_s * 1e3:.3f}")
                    for c in step.categories]
            print(f"rank {rank.rank} (stage {rank.stage}, {rank.timeline} timeline), step "
                  f"{step.step}: window {step.window_s * 1e3:.3f} ms")
            print(tabulate(rows, headers=("category", "kind", "ms", "share", "calls", "bytes",
                                          "exposed ms", "overlapped ms"),
                           disable_numparse=True))
            total = sum(c.time_s for c in step.categories)
            ok = abs(total - step.window_s) < 1e-6
            failed += not ok
            print(f"{'ok' if ok else 'FAIL'}  categories sum to {total * 1e3:.3f} ms, the "
                  f"window is {step.window_s * 1e3:.3f} ms")
            if step.wall_s is None:
                failed += 1
                print("FAIL  no wall time for the step")
                continue
            diff = abs(total - step.wall_s) / step.wall_s
            ok = diff <= TOLERANCE
            failed += not ok
            print(f"{'ok' if ok else 'FAIL'}  categories sum within {diff:.2%} of the step's "
                  f"wall time {step.wall_s * 1e3:.3f} ms (tolerance {TOLERANCE:.0%})")
            if step.bubble is not None:
                print(f"      pipeline bubble: measured {step.bubble.measured_frac:.1%}, "
                      f"analytical {step.bubble.analytical_frac:.1%}")
        if rank.unprofiled_step_time_s is not None and rank.steps:
            walls = [s.wall_s for s in rank.steps if s.wall_s is not None]
            print(f"rank {rank.rank}: profiled step(s) {', '.join(f'{w * 1e3:.1f}' for w in walls)}"
                  f" ms vs median unprofiled measured step "
                  f"{rank.unprofiled_step_time_s * 1e3:.1f} ms")
    if not read_breakdowns(bundle):
        print(f"FAIL  {path} has no profile/rank<N>.breakdown.json")
        failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
