"""What a rank imports before its first two lifecycle marks, ranked (issue 34).

A rank's ``rank_imports`` phase is its process start to ``kit.launch.worker`` imported
(torch and the kit); its ``engine_imports`` phase is the engine's import as the worker does it
(``engine_spec(name).build()`` and ``Engine.import_framework``). This runs exactly those
imports in fresh interpreters: ``--repeats`` timed ones (median seconds of each phase), then
one under ``python -X importtime``, and prints for each phase the modules ranked by their own
(self) and cumulative import time and the self time summed per top-level package; and the
modules that had no cached bytecode (compiled from source by every rank: a package installed
with ``pip --no-compile`` where ``PYTHONDONTWRITEBYTECODE`` is set), per package.

    python benchmarks/startup/import_profile.py [--engine megatron --engine deepspeed]
        [--platform cpu|cuda] [--repeats 3] [--top 25]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK = "== engine imports =="

PROBE = f"""
import json, sys, time
import kit.launch.worker as worker
sys.stderr.write("{MARK}\\n")
sys.stderr.flush()
from kit.engines import engine_spec
engine = engine_spec(sys.argv[1]).build()
engine.import_framework(sys.argv[2] == "cpu")
done = time.time()
import os, psutil
uncached = sorted(name for name, m in list(sys.modules.items())
                  if getattr(getattr(m, "__spec__", None), "cached", None)
                  and str(m.__spec__.origin).endswith(".py")
                  and not os.path.exists(m.__spec__.cached))
print(json.dumps({{"started": psutil.Process().create_time(), "imported": worker.IMPORTED_AT,
                  "engine_imported": done, "uncached": uncached}}))
"""


@dataclass
class Entry:
    """One line of ``-X importtime``: a module, its own and its cumulative microseconds."""

    name: str
    depth: int
    self_us: int
    cumulative_us: int


def parse_importtime(text: str) -> tuple[list[Entry], list[Entry]]:
    """The entries before and after the probe's marker (rank imports, engine imports)."""
    phases: tuple[list[Entry], list[Entry]] = ([], [])
    current = 0
    for line in text.splitlines():
        if line.strip() == MARK:
            current = 1
            continue
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line[len("import time:"):].split("|", 2)
        stripped = name.lstrip(" ")
        depth = (len(name) - len(stripped) - 1) // 2
        phases[current].append(Entry(stripped.strip(), depth, int(own), int(cumulative)))
    return phases


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))


def run_probe(engine: str, platform: str, importtime: bool) -> tuple[dict[str, float], str]:
    """One fresh interpreter through the probe: its marks, and its stderr."""
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", PROBE,
           engine, platform]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=600)
    if r.returncode != 0:
        sys.exit(f"error: the {engine} probe failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _ms(us: int) -> str:
    return f"{us / 1000:9.1f}"


def report_phase(title: str, entries: list[Entry], top: int) -> list[str]:
    """The ranked tables of one phase."""
    out = [f"### {title}: {len(entries)} modules, {_ms(sum(e.self_us for e in entries))} ms "
           "of import work (sum of self times)"]
    packages: dict[str, int] = defaultdict(int)
    for e in entries:
        packages[e.name.split(".")[0]] += e.self_us
    out.append("self ms per top-level package:")
    for name, us in sorted(packages.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"  {_ms(us)}  {name}")
    out.append("modules by self ms (self, cumulative, depth):")
    for e in sorted(entries, key=lambda e: -e.self_us)[:top]:
        out.append(f"  {_ms(e.self_us)} {_ms(e.cumulative_us)}  {e.depth:2d}  {e.name}")
    out.append("modules by cumulative ms (cumulative, self, depth):")
    for e in sorted(entries, key=lambda e: -e.cumulative_us)[:top]:
        out.append(f"  {_ms(e.cumulative_us)} {_ms(e.self_us)}  {e.depth:2d}  {e.name}")
    return out


def profile(engine: str, platform: str, repeats: int, top: int) -> list[str]:
    """Timed phases and the ranked import tables of one engine's rank."""
    spans: dict[str, list[float]] = {"rank_imports": [], "engine_imports": []}
    for _ in range(repeats):
        marks, _ = run_probe(engine, platform, importtime=False)
        spans["rank_imports"].append(marks["imported"] - marks["started"])
        spans["engine_imports"].append(marks["engine_imported"] - marks["imported"])
    out = [f"## {engine} (platform {platform}), {repeats} fresh interpreters:"]
    for name, values in spans.items():
        out.append(f"{name}: median {statistics.median(values):.2f} s "
                   f"({', '.join(f'{v:.2f}' for v in values)})")
    marks, stderr = run_probe(engine, platform, importtime=True)
    rank, eng = parse_importtime(stderr)
    uncached: dict[str, int] = defaultdict(int)
    for name in marks["uncached"]:
        uncached[name.split(".")[0]] += 1
    out.append(f"modules imported without cached bytecode: {len(marks['uncached'])} ("
               + (", ".join(f"{k} {v}" for k, v in sorted(uncached.items(), key=lambda kv: -kv[1]))
                  or "none") + ")")
    out += report_phase("rank imports (kit.launch.worker)", rank, top)
    out += report_phase(f"engine imports ({engine})", eng, top)
    return out


def main() -> None:
    """Profile each engine's rank imports; print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", action="append", choices=("megatron", "deepspeed"))
    parser.add_argument("--platform", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    versions = []
    for dist in ("torch", "megatron-core", "deepspeed"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} absent")
    print(f"python {sys.version.split()[0]}, {', '.join(versions)}, "
          f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
    for engine in args.engine or ["megatron", "deepspeed"]:
        print("\n".join(profile(engine, args.platform, args.repeats, args.top)), flush=True)


if __name__ == "__main__":
    main()
