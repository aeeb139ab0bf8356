"""The kit's compile cache: torch inductor, FX-graph, AOTAutograd and Triton artifacts kept
between runs, so a sweep's later points skip the first point's compiles.

A run's compiled kernels (the kit's fused cross-entropy and bias kernels, megatron-core's
fusions, ``--compile``) are built by inductor and Triton on the first step; with their caches
in one directory that outlives the run, every later run of the same shapes loads them. Torch
keys each artifact by the graph, its shapes, dtypes and devices, and by torch's own build and
config, so a changed model shape or dtype compiles anew. The kit adds a directory level keyed
by what torch cannot see: the torch, megatron-core and DeepSpeed versions as installed, the
Python version, the kit's version and git commit, and a digest of the kit's engine sources
(an uncommitted edit of a kernel counts). A change of any of them starts a fresh directory;
old ones stay until ``charllm-kit cache clear``.

Python bytecode too, where nothing else keeps it: an environment with
``PYTHONDONTWRITEBYTECODE`` set over a torch installed without ``.pyc`` files (pip's
``--no-compile``, slim images) recompiles torch, sympy and megatron-core from source in every
rank of every run: 14.4 s of a 30.5 s rank start on one H200 (py-spy,
``benchmarks/startup/results/first-step-pyspy-h200x1.txt``). There the ranks get
``PYTHONPYCACHEPREFIX`` pointing at the keyed directory's ``bytecode/`` folder (files beside the
sources stay unwritten, as the variable asked) and write it once.

Where: ``$CHARLLM_COMPILE_CACHE`` (``run --compile-cache DIR`` sets it), else
``$XDG_CACHE_HOME/charllm-kit/compile`` (``~/.cache/charllm-kit/compile``); ``off`` leaves
torch's own defaults (a per-user folder under /tmp) alone. DeepSpeed's just-in-time C++ ops have
their own cache (``TORCH_EXTENSIONS_DIR``, kit.engines.deepspeed.environment).
"""

import hashlib
import importlib.util
import os
import platform
import shutil
from importlib import metadata
from pathlib import Path

import kit
from kit.cache import bytecode_precompile

CACHE_ENV = "CHARLLM_COMPILE_CACHE"
"""Environment variable naming the cache's root folder (or ``off``)."""
OFF = "off"
KEYED_PACKAGES = ("torch", "megatron-core", "deepspeed", "triton")
"""Installed packages whose versions key the cache (a missing one counts as ``none``)."""
TORCH_CACHE_VARS = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
}
"""Torch's cache-folder variables and the subfolder of the keyed directory each gets."""
BYTECODE = "bytecode"
"""The keyed directory's subfolder for the ranks' Python bytecode (bytecode_environment)."""
TORCH_CACHE_SWITCHES = {
    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
}
"""Caches torch may leave off by default (FX graphs, AOTAutograd), switched on."""


def default_root() -> Path:
    """``$XDG_CACHE_HOME/charllm-kit/compile``, i.e. ``~/.cache/charllm-kit/compile``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "charllm-kit" / "compile"


def cache_root() -> Path | None:
    """The cache's root folder, or None when ``$CHARLLM_COMPILE_CACHE`` is ``off``."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() == OFF:
        return None
    return Path(value).expanduser() if value else default_root()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def _engine_sources_digest() -> str:
    """A digest of the kit's engine sources (the code that gets compiled), edits included."""
    digest = hashlib.sha256()
    root = Path(kit.__file__).resolve().parent / "engines"
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def key_parts() -> dict[str, str]:
    """What the cache directory is keyed by, by name."""
    parts = {name: _version(name) for name in KEYED_PACKAGES}
    parts.update(python=platform.python_version(), kit=kit.__version__,
                 git_commit=kit.git_commit() or "none", engine_sources=_engine_sources_digest())
    return parts


def cache_key(parts: dict[str, str]) -> str:
    """A short readable key: torch's and Python's versions, then a digest of every part."""
    digest = hashlib.sha256(repr(sorted(parts.items())).encode()).hexdigest()[:16]
    return f"torch{parts.get('torch', 'none')}-py{parts.get('python', '')}-{digest}"


def cache_dir() -> Path | None:
    """This installation's keyed cache directory, or None when the cache is off."""
    root = cache_root()
    return None if root is None else root / cache_key(key_parts())


def entries(directory: Path) -> int:
    """How many compiled artifacts the cache directory holds (0 when it does not exist);
    Python bytecode is not counted: it says nothing about the kernels' compiles."""
    if not directory.is_dir():
        return 0
    count = 0
    for top in os.scandir(directory):  # the bytecode folder (thousands of files) is not walked
        if top.name == BYTECODE:
            continue
        if top.is_file():
            count += 1
        elif top.is_dir():
            count += sum(len(files) for _, _, files in os.walk(top.path))
    return count


def bytecode_environment(directory: Path, probe: str = "torch") -> dict[str, str]:
    """``PYTHONPYCACHEPREFIX`` into ``directory/bytecode`` where no bytecode would be kept.

    That is: ``PYTHONDONTWRITEBYTECODE`` is set, no prefix is, and ``probe`` (the package
    every rank imports first, found without importing it) has no ``.pyc`` beside its source.
    Empty otherwise: an installation with bytecode, or one that writes it, is left as it is.
    """
    if os.environ.get("PYTHONPYCACHEPREFIX") or not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return {}
    spec = importlib.util.find_spec(probe)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return {}
    if Path(importlib.util.cache_from_source(spec.origin)).exists():
        return {}
    return {"PYTHONPYCACHEPREFIX": str(directory / BYTECODE)}


def environment(directory: Path) -> dict[str, str]:
    """The variables that point torch's and Triton's caches into ``directory``."""
    env = {var: str(directory / sub) for var, sub in TORCH_CACHE_VARS.items()}
    env.update(TORCH_CACHE_SWITCHES)
    return env


def prepare() -> dict[str, object] | None:
    """Point this process's and its children's compile caches at the keyed directory.

    Called by the launcher before it starts ranks (they inherit the environment). Returns what
    the manifest records: ``dir``, ``key`` (its parts), ``warm`` (whether it held artifacts
    before this run), ``entries_before``, ``bytecode`` (the ranks' bytecode folder, or None
    where the installation keeps its own: bytecode_environment) and ``bytecode_precompile``
    (whether this run began filling that folder in the background, kit.cache.bytecode_precompile);
    None when the cache is off.
    """
    root = cache_root()
    if root is None:
        return None
    parts = key_parts()
    directory = root / cache_key(parts)
    before = entries(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.environ.update(environment(directory))
    bytecode = bytecode_environment(directory)
    precompiling = False
    if bytecode:
        os.environ.update(bytecode)
        os.environ.pop("PYTHONDONTWRITEBYTECODE")  # the prefix keeps the sources' folders clean
        precompiling = bytecode_precompile.start(directory / BYTECODE) is not None
    return {"dir": str(directory), "key": parts, "warm": before > 0, "entries_before": before,
            "bytecode": bytecode.get("PYTHONPYCACHEPREFIX"), "bytecode_precompile": precompiling}


def describe_root() -> list[tuple[str, str]]:
    """Rows for ``charllm-kit cache show``: the root, this installation's directory, each
    directory under the root with its files and size."""
    root = cache_root()
    if root is None:
        return [("compile cache", f"off (${CACHE_ENV}={OFF})")]
    current = root / cache_key(key_parts())
    rows = [("root", str(root)), ("this installation", str(current))]
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        files = [p for p in folder.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files) / 2**20
        label = f"{folder.name}{' (current)' if folder == current else ''}"
        rows.append((label, f"{len(files)} files, {size:.1f} MiB"))
    return rows


def clear(everything: bool) -> list[Path]:
    """Remove the directories of other installations (stale keys), or with ``everything``
    all of them; returns what was removed."""
    root = cache_root()
    if root is None or not root.is_dir():
        return []
    current = root / cache_key(key_parts())
    removed = [f for f in sorted(root.iterdir()) if everything or f != current]
    for folder in removed:
        shutil.rmtree(folder) if folder.is_dir() else folder.unlink()
    return removed
