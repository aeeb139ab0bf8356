"""What ``compare`` and ``report`` read: bundles, or sweep folders standing for their bundles.

After ``charllm-kit sweep ... --out results``, ``results/`` holds bundles of single runs beside
sweep folders (``results/<sweep>/``, with ``sweep.json``, one folder per point and the point's
bundle inside), so ``compare results/*`` names both. A sweep folder stands for the bundles its
index records, in the index's order; a point without a bundle (skipped, pending, or an error
before the run) is left out and said in a note. A folder of bundles (``compare results``, the
``--out`` of runs) stands for the bundles and sweep folders directly in it, in name order.
When every bundle came from one sweep folder, the axes that sweep varies are its swept axes
(:attr:`Inputs.swept`): the comparability checks say them instead of flagging them.
"""

from dataclasses import dataclass, field
from pathlib import Path

from kit.errors import KitInputError
from kit.sweep.folder import SweepFolder, read_sweep_folder


@dataclass
class Inputs:
    """Bundle paths to read, and notes on what sweep folders left out."""

    bundles: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sweeps: list[SweepFolder] = field(default_factory=list)
    """The sweep folders that stood for some of ``bundles``."""

    @property
    def swept(self) -> tuple[str, ...]:
        """The axes the bundles vary on purpose: those of their sweep when all of them came
        from one sweep folder, else none (bundles from elsewhere may differ in anything)."""
        if len(self.sweeps) != 1 or len(self.bundles) != len(self.sweeps[0].bundles):
            return ()
        return self.sweeps[0].varied()


def expand_inputs(paths: list[str | Path]) -> Inputs:
    """Replace each sweep folder in ``paths`` by its bundles; other paths stay as given.

    A folder that is neither a bundle nor a sweep folder stands for the bundles and sweep
    folders directly in it (staging folders, which start with a dot, left out).

    Raises:
        KitInputError: A sweep folder whose index is unreadable, or one with no bundle yet; a
            folder with neither a bundle nor a sweep folder in it.
    """
    out = Inputs()
    for p in paths:
        sweep = read_sweep_folder(p)
        if sweep is None:
            held = _held(Path(p))
            if held is None:
                out.bundles.append(Path(p))
                continue
            if not held:
                raise KitInputError(f"{p} is neither a bundle nor a folder of bundles (no "
                                    f"manifest.json in it or in a folder directly under it)")
            inner = expand_inputs(held)
            out.bundles += inner.bundles
            out.sweeps += inner.sweeps
            out.notes += [f"folder {p}: its {len(held)} bundles and sweep folders used "
                          f"(as {Path(p) / '*'})", *inner.notes]
            continue
        if not sweep.bundles:
            raise KitInputError(f"{sweep.describe()}: none of its points has a bundle yet; "
                                f"run it (charllm-kit sweep ... --resume) first")
        out.bundles += sweep.bundles
        out.sweeps.append(sweep)
        missing = sweep.without_bundle()
        if missing:
            used = len(sweep.bundles)
            out.notes.append(f"sweep folder {sweep.path}: {used} bundle{'s' if used > 1 else ''} "
                             f"used; no bundle for {', '.join(missing)}")
    return out


def _held(path: Path) -> list[Path] | None:
    """The bundles and sweep folders directly in ``path``, when it is a folder but no bundle
    (None: a bundle, or not a folder, read as given)."""
    if not path.is_dir() or (path / "manifest.json").exists():
        return None
    children = [c for c in sorted(path.iterdir()) if not c.name.startswith(".")]
    for child in children:
        if child.is_symlink() and not _inside(path, child):
            raise KitInputError(f"folder {path}: {child.name} is a link to a place outside the "
                                "folder; not read (name what it points to to use it)")
    return [c for c in children if c.is_dir()
            and ((c / "manifest.json").is_file() or read_sweep_folder(c) is not None)]


def _inside(folder: Path, child: Path) -> bool:
    """Whether ``child`` of ``folder``, links followed, stays inside it: a folder received
    from another site must not make ``compare`` read elsewhere (as sweep.json paths may not)."""
    try:
        return child.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False
