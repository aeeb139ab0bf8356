"""Byte-compile the packages every rank imports, once, on many cores, while the ranks start.

Where the compile cache keeps the ranks' bytecode (``kit.cache.compile_cache.bytecode_environment``:
``PYTHONDONTWRITEBYTECODE`` over an installation without ``.pyc`` files, as on this
workplace's GPU machines), the first run finds that folder empty and each rank compiles
torch, sympy, megatron-core and the rest from source itself, one module after another:
4.6 s of rank imports and 4.5 s of engine imports on a cold H200 run against 1.6 and 1.2 s
warm (``benchmarks/startup/results/h200x1-startup-ab-zeus.txt``), and more inside the first
step (dynamo and inductor). One background ``compileall`` over those packages with a worker
per spare core writes the same files (``PYTHONPYCACHEPREFIX``) ahead of the ranks, which read
whatever is written by the time they import it and compile the rest as before; both write
atomically, so a race costs only the duplicate work. A marker file says a folder was filled
(a file that does not compile, if any, is left to whatever imports it), so later runs start
nothing; while one is under way (its pid in a file beside), the next point of a sweep starts
none beside it.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import psutil

RANK_PACKAGES = ("torch", "sympy", "mpmath", "networkx", "numpy", "jinja2", "triton",
                 "megatron", "deepspeed", "pydantic", "einops", "zeus", "psutil", "yaml", "kit")
"""Top-level packages a rank imports (its engine's, torch's own, and what torch.compile
pulls in), in the order they are compiled; a missing one is left out."""
DONE = ".precompiled"
"""The marker a finished precompile leaves in the bytecode folder."""
RUNNING = ".precompiling"
"""The pid of the precompile filling the folder now."""

_SCRIPT = """
import compileall, pathlib, sys
prefix, workers, *roots = sys.argv[1:]
for root in roots:  # a file that does not compile is left to the importer, as before
    compileall.compile_dir(root, quiet=2, workers=int(workers))
(pathlib.Path(prefix) / {done!r}).touch()
""".format(done=DONE)


def package_roots(names: tuple[str, ...] = RANK_PACKAGES) -> list[str]:
    """The source folders of the installed packages among ``names`` (found, not imported)."""
    roots = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(str(p) for p in spec.submodule_search_locations)
    return roots


def start(prefix: Path, roots: list[str] | None = None,
          workers: int | None = None) -> subprocess.Popen | None:
    """Compile ``roots`` (default: :func:`package_roots`) into bytecode folder ``prefix`` in a
    background process; None when ``prefix`` is complete already (its marker), is being
    filled by an earlier run's precompile, or there is nothing to compile. ``workers``
    defaults to half the cores (the ranks have the rest)."""
    if (prefix / DONE).exists() or _under_way(prefix):
        return None
    roots = package_roots() if roots is None else roots
    if not roots:
        return None
    prefix.mkdir(parents=True, exist_ok=True)
    workers = workers or max(1, (os.cpu_count() or 2) // 2)
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, str(prefix), str(workers), *roots],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    (prefix / RUNNING).write_text(str(proc.pid))
    return proc


def _under_way(prefix: Path) -> bool:
    """Whether an earlier run's precompile into ``prefix`` is still running (a killed one
    leaves its pid behind, which then names no process, or a zombie where the sweep that
    started it has not reaped it yet)."""
    try:
        pid = int((prefix / RUNNING).read_text())
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (OSError, ValueError, psutil.Error):
        return False
