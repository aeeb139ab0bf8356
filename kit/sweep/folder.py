"""A finished or stopped sweep's folder, read back: which points have bundles, where.

``compare``, ``report`` and ``bundle show`` meet sweep folders where bundles are expected
(``results/*`` after a sweep names both); they read them through :func:`read_sweep_folder`.
"""

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from kit.errors import KitInputError
from kit.sweep.index import INDEX_FILE, SweepIndex


@dataclass(frozen=True)
class SweepFolder:
    """A sweep folder's index: its points' bundles and the points that have none."""

    path: Path
    index: SweepIndex

    @property
    def bundles(self) -> list[Path]:
        """The points' bundles, in the index's order."""
        return [self.path / p.bundle for p in self.index.points if p.bundle]

    def without_bundle(self) -> list[str]:
        """``<point> (<status>)`` for each point that has no bundle."""
        return [f"{p.id} ({p.status})" for p in self.index.points if not p.bundle]

    def describe(self) -> str:
        """One line: the sweep, how many points have bundles, and where they are."""
        n = len(self.index.points)
        return (f"{self.path} is a sweep folder (sweep {self.index.name}: {n} point"
                f"{'s' if n != 1 else ''}, {len(self.bundles)} with a bundle)")


def read_sweep_folder(path: str | Path) -> SweepFolder | None:
    """The sweep folder at ``path``, or None when ``path`` holds no ``sweep.json``.

    Raises:
        KitInputError: ``sweep.json`` is there but is not a sweep index.
    """
    folder = Path(path)
    index_file = folder / INDEX_FILE
    if not index_file.is_file():
        return None
    try:
        index = SweepIndex.model_validate_json(index_file.read_text(encoding="utf-8"))
    except (ValidationError, ValueError) as e:
        first = str(e).splitlines()[0]
        raise KitInputError(f"{index_file} is not a sweep index ({first})") from None
    return SweepFolder(folder, index)
