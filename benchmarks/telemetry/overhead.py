"""Telemetry overhead: the same training with telemetry off, at 100 ms and at 10 ms.

    python3 benchmarks/telemetry/overhead.py DEVICE_NAME OUT_DIR [-- extra run options]

Runs `charllm-kit run` three times in one process tree, interleaved twice (off, 100, 10, off,
100, 10) to spread drift, and writes overhead-<device>.json with the median measured step time
of each setting (keys: device, date, off_step_s, on_100ms_step_s, on_10ms_step_s, plus the
ratios and the command).
"""

import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

RUN = ["python3", "-m", "kit", "run", "gpt3-1.3b", "--micro-batch", "4", "--global-batch", "16",
       "--steps", "30", "--warmup", "5"]
SETTINGS = {"off_step_s": 0, "on_100ms_step_s": 100, "on_10ms_step_s": 10}


def step_time(out: Path, interval_ms: int, extra: list[str]) -> float:
    """Median measured step time of one run."""
    cmd = [*RUN, *extra, "--telemetry-interval-ms", str(interval_ms), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    bundle = Path(res.stdout.strip().splitlines()[-1])
    return json.loads((bundle / "metrics.json").read_text())["summary"]["step_time_s"]


def main() -> None:
    """Run the settings and write the JSON."""
    device, out = sys.argv[1], Path(sys.argv[2])
    extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    times: dict[str, list[float]] = {k: [] for k in SETTINGS}
    for _ in range(2):
        for key, interval in SETTINGS.items():
            times[key].append(step_time(out / "overhead-runs", interval, extra))
            print(f"{key} {interval} ms: {times[key][-1]:.4f} s", flush=True)
    result = {k: statistics.median(v) for k, v in times.items()}
    result.update(
        device=device,
        date=datetime.date.today().isoformat(),
        ratio_100ms=result["on_100ms_step_s"] / result["off_step_s"],
        ratio_10ms=result["on_10ms_step_s"] / result["off_step_s"],
        all_step_s=times,
        command=" ".join(RUN + extra),
    )
    (out / f"overhead-{device}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
