"""Issue 34's start-up figures from sweep folders: one entry per point, a table, a JSON file.

    python3 benchmarks/startup/summarize.py results/startup --json OUT.json [--device TEXT]
    python3 benchmarks/startup/summarize.py --complete results/startup/NAME   # exit 0 if done

Reads every sweep folder under the given folder (``sweep.json``, each point's bundle's
``metrics.json`` ``lifecycle`` and ``manifest.json`` ``compile_cache``) and ``walls.txt`` (the
wall seconds of each ``charllm-kit sweep`` call, written by startup_gpu.sh). Per point:
``name`` (sweep/point), ``cold`` (its compile cache held nothing when it started: it compiled
everything), ``launch_to_first_step_s`` (launch to the first step *done*, the issue's figure;
``launch_to_first_step_start_s`` is to its start), ``phases`` (start-up phases, seconds) and
``teardown_s`` (last step to the bundle's assembly, with ``teardown_phases``).
"""

import argparse
import json
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

START_PHASES = ("launcher", "rank_imports", "engine_imports", "process_groups", "model_build",
                "first_step")
END_PHASES = ("rank_exit", "ranks_reaped", "sampler_stop", "bundle_start")
UNFINISHED = ("pending", "interrupted")


def complete(folder: Path) -> bool:
    """Whether a sweep folder exists and none of its points is left to run."""
    try:
        points = json.loads((folder / "sweep.json").read_text())["points"]
    except (OSError, ValueError, KeyError):
        return False
    return all(p["status"] not in UNFINISHED for p in points)


def walls(root: Path) -> dict[str, float]:
    """Seconds each sweep's ``charllm-kit sweep`` calls took, summed over calls."""
    total: dict[str, float] = defaultdict(float)
    path = root / "walls.txt"
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, t0, t1 = line.split()
        total[name] += float(t1) - float(t0)
    return dict(total)


def point_entry(sweep: str, folder: Path, point: dict) -> dict:
    """One point's entry (status only where it has no bundle)."""
    entry = {"name": f"{sweep}/{point['id']}", "sweep": sweep, "status": point["status"],
             "values": point.get("values", {})}
    if not point.get("bundle"):
        return entry
    bundle = folder / point["bundle"]
    life = json.loads((bundle / "metrics.json").read_text()).get("lifecycle") or {}
    cache = json.loads((bundle / "manifest.json").read_text()).get("compile_cache")
    phases = life.get("phases_s") or {}
    entry.update(
        cold=None if cache is None else not cache["warm"],
        cache_entries_before=None if cache is None else cache.get("entries_before"),
        cache_entries_after=None if cache is None else cache.get("entries_after"),
        launch_to_first_step_s=life.get("launch_to_first_step_end_s"),
        launch_to_first_step_start_s=life.get("launch_to_first_step_s"),
        phases={k: phases.get(k) for k in START_PHASES},
        teardown_s=life.get("last_step_to_assembly_s"),
        teardown_phases={k: phases.get(k) for k in END_PHASES},
    )
    return entry


def collect(root: Path) -> tuple[list[dict], dict[str, dict]]:
    """Every point of every sweep under ``root``, and per sweep its wall seconds and counts."""
    entries: list[dict] = []
    sweeps: dict[str, dict] = {}
    wall = walls(root)
    for index in sorted(root.glob("*/sweep.json"), key=lambda p: p.stat().st_mtime):
        folder = index.parent
        points = json.loads(index.read_text())["points"]
        mine = [point_entry(folder.name, folder, p) for p in points]
        entries += mine
        sweeps[folder.name] = {
            "wall_s": round(wall[folder.name], 1) if folder.name in wall else None,
            "points": len(mine), "ok": sum(e["status"] == "ok" for e in mine),
            "complete": complete(folder)}
    return entries, sweeps


def fmt(v: object) -> str:
    return "-" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)


def table(entries: list[dict], sweeps: dict[str, dict]) -> str:
    """The entries as a fixed-width table, then each sweep's wall time."""
    head = ["point", "status", "cold", "to 1st step done", *START_PHASES, "teardown"]
    rows = [[e["name"], e["status"], fmt(e.get("cold")), fmt(e.get("launch_to_first_step_s")),
             *(fmt((e.get("phases") or {}).get(k)) for k in START_PHASES),
             fmt(e.get("teardown_s"))] for e in entries]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False))
             for r in [head, *rows]]
    lines.append("")
    lines += [f"sweep {name}: {s['ok']}/{s['points']} ok, wall {fmt(s['wall_s'])} s"
              f"{'' if s['complete'] else ' (not complete)'}" for name, s in sweeps.items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--json", type=Path, help="Write the entries and sweep walls here.")
    ap.add_argument("--device", default=None, help="The device, in words, for the JSON.")
    ap.add_argument("--complete", action="store_true",
                    help="Only say (exit 0/1) whether FOLDER is a sweep with nothing left.")
    args = ap.parse_args()
    if args.complete:
        sys.exit(0 if complete(args.folder) else 1)
    entries, sweeps = collect(args.folder)
    print(table(entries, sweeps))
    if args.json:
        args.json.write_text(json.dumps({
            "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": args.device, "sweeps": sweeps, "points": entries}, indent=1) + "\n")


if __name__ == "__main__":
    main()
