"""Energy cross-checks of every point of one or more sweep folders (issue 33).

    python3 benchmarks/parallel/energy_summary.py SWEEP_DIR... --json OUT.json

Reads each bundle's ``metrics.json`` (its ``power`` and ``per_device`` sections) and writes one
entry per point: ``name`` (the sweep's point id), ``status``, ``energy_j`` (the counter's),
``power_integral_j``, ``counter_vs_integral``, ``zeus_energy_j``, ``zeus_vs_counter``,
``samples_per_device`` (power samples inside the measured windows, per device),
``counter_readings_per_device``, ``window_s`` and ``window_short``. Prints a table and how many
ok points meet the goals: |zeus_vs_counter| <= 0.02 and |counter_vs_integral| <= 0.05, or a
bundle that says why not (``energy_source`` other than the counter, no Zeus).
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kit.sweep.index import INDEX_FILE


def points(sweep: Path) -> list[tuple[str, Path]]:
    """(point id, bundle folder) of every point the sweep's index lists with a bundle."""
    index = json.loads((sweep / INDEX_FILE).read_text())
    return [(p["id"], sweep / p["bundle"]) for p in index["points"] if p.get("bundle")]


def entry(name: str, bundle: Path) -> dict[str, Any]:
    """The point's energy figures, or its status when it has no metrics."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    metrics_path = bundle / "metrics.json"
    if not metrics_path.exists():
        return {"name": name, "status": manifest.get("status")}
    metrics = json.loads(metrics_path.read_text())
    power, devices = metrics.get("power", {}), metrics.get("per_device", [])
    keys = ("energy_j", "energy_source", "power_integral_j", "counter_vs_integral",
            "zeus_energy_j", "zeus_vs_counter", "window_s", "window_short")
    return {"name": name, "status": manifest.get("status"), **{k: power.get(k) for k in keys},
            "samples_per_device": [d.get("power_samples") for d in devices],
            "counter_readings_per_device": [d.get("counter_readings") for d in devices],
            "step_time_s": metrics["summary"].get("step_time_s")}


def _num(e: dict[str, Any], key: str, form: str) -> str:
    """A figure of ``e`` formatted, or "-"."""
    v = e.get(key)
    return form.format(v) if isinstance(v, int | float) else "-"


def meets(e: dict[str, Any]) -> bool | None:
    """Whether an ok point's energy agrees (None: it says why it cannot be checked)."""
    if e.get("status") != "ok" or e.get("energy_source") != "counter":
        return None
    z, c = e.get("zeus_vs_counter"), e.get("counter_vs_integral")
    if z is None or c is None:
        return None
    return abs(z) <= 0.02 and abs(c) <= 0.05


def main() -> int:
    """Summarize the sweeps given."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    entries = [entry(name, b) for s in args.sweeps if (s / INDEX_FILE).exists()
               for name, b in points(s) if (b / "manifest.json").exists()]
    fmt = "{:45s} {:11s} {:>9s} {:>9s} {:>8s} {:>8s} {:>6s} {:>6s}"
    print(fmt.format("point", "status", "energy J", "zeus J", "zeus/ctr", "ctr/int",
                     "win s", "samples"))
    for e in entries:
        samples = min((n for n in e.get("samples_per_device") or [] if n), default="-")
        print(fmt.format(e["name"][:45], str(e["status"]), _num(e, "energy_j", "{:.0f}"),
                         _num(e, "zeus_energy_j", "{:.0f}"),
                         _num(e, "zeus_vs_counter", "{:+.3f}"),
                         _num(e, "counter_vs_integral", "{:+.3f}"),
                         _num(e, "window_s", "{:.1f}"), str(samples)))
    verdicts = [meets(e) for e in entries]
    checked = [v for v in verdicts if v is not None]
    print(f"ok points checked: {len(checked)}; meeting |zeus_vs_counter| <= 0.02 and "
          f"|counter_vs_integral| <= 0.05: {sum(checked)}; not checkable: "
          f"{sum(v is None for v in verdicts)}")
    args.json.write_text(json.dumps(entries, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
