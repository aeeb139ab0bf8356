"""Where a process's samples went, from py-spy's raw (collapsed-stack) output.

    python3 benchmarks/startup/pyspy_summary.py pyspy.txt [--top 40] [--match kit.run]

py-spy ``record -s -f raw`` writes one line per distinct stack: frames joined by ``;`` (the
first names the process, ``process PID:"command"``) and the sample count. This prints, per
process, its samples and the functions with the most inclusive samples (a function counted once
per stack however often it recurses), so the seconds before a rank's first step can be read as
"import megatron.core ... 4.1 s, NCCL init ... 2.0 s" at py-spy's rate (``--rate``, default 100).
"""

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def frame_name(frame: str) -> str:
    """``function (file:line)`` without the line: one entry per function."""
    return re.sub(r":\d+\)$", ")", frame.strip())


def summarise(path: Path) -> dict[str, tuple[int, Counter[str]]]:
    """Process (and thread, with py-spy ``-t``) -> (samples, inclusive samples per function)."""
    out: dict[str, tuple[int, Counter[str]]] = defaultdict(lambda: (0, Counter()))
    for raw in path.read_text(errors="replace").splitlines():
        m = LINE.match(raw)
        if not m:
            continue
        frames = m["stack"].split(";")
        depth = 0  # leading process frames (children nest under parents) and py-spy -t's thread
        while depth < len(frames) and frames[depth].startswith(("process ", "thread ")):
            depth += 1
        proc, count = " ".join(frames[:depth]), int(m["count"])
        total, funcs = out[proc]
        funcs.update({f: count for f in {frame_name(f) for f in frames[depth:]}})
        out[proc] = (total + count, funcs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--rate", type=float, default=100.0, help="py-spy's samples per second")
    ap.add_argument("--match", default="", help="only processes whose name contains this")
    args = ap.parse_args()
    for proc, (total, funcs) in sorted(summarise(args.raw).items(), key=lambda kv: -kv[1][0]):
        if args.match not in proc:
            continue
        print(f"== {proc[:160]}: {total} samples ({total / args.rate:.1f} s)")
        for name, n in funcs.most_common(args.top):
            print(f"{n / args.rate:8.2f} s  {n / total:6.1%}  {name[:150]}")


if __name__ == "__main__":
    main()
