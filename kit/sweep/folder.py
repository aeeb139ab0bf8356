"""A finished or stopped sweep's folder, read back: which points have bundles, where.

``compare``, ``report`` and ``bundle show`` meet sweep folders where bundles are expected
(``results/*`` after a sweep names both); they read them through :func:`read_sweep_folder`.
"""

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import ValidationError

from kit.errors import KitInputError
from kit.neutralize import has_control
from kit.sweep.index import INDEX_FILE, SweepIndex

INDEX_MAX_BYTES = 64 * 2**20
"""Largest ``sweep.json`` read (one of 100,000 points is about 50 MB)."""


@dataclass(frozen=True)
class SweepFolder:
    """A sweep folder's index: its points' bundles and the points that have none."""

    path: Path
    index: SweepIndex

    @property
    def bundles(self) -> list[Path]:
        """The points' bundles, in the index's order."""
        return [self.path / p.bundle for p in self.index.points if p.bundle]

    def varied(self) -> tuple[str, ...]:
        """The run fields its points set to more than one value (the axes it sweeps), in
        first-seen order; a field a point leaves out takes the base's value, one more value."""
        fields = list(dict.fromkeys(k for p in self.index.points for k in p.values))
        return tuple(f for f in fields if len({json.dumps(p.values.get(f), sort_keys=True)
                                               for p in self.index.points}) > 1)

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
    if index_file.stat().st_size > INDEX_MAX_BYTES:
        raise KitInputError(f"{index_file} is over {INDEX_MAX_BYTES} bytes; not read")
    try:
        index = SweepIndex.model_validate_json(index_file.read_text(encoding="utf-8"))
    except (ValidationError, ValueError, RecursionError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise KitInputError(f"{index_file} is not a sweep index ({first})") from None
    for point in index.points:
        if point.bundle and not _inside(folder, point.bundle):
            raise KitInputError(
                f"{index_file}: point {point.id!r} names the bundle {point.bundle!r}, which is "
                "not a path inside the sweep folder; not read")
    return SweepFolder(folder, index)


def _inside(folder: Path, bundle: str) -> bool:
    """Whether ``bundle`` (from the index) is a relative path that stays inside ``folder``,
    links followed: a received sweep folder must not make ``compare`` read elsewhere."""
    rel = PurePosixPath(bundle)
    if has_control(bundle) or rel.is_absolute() or ".." in rel.parts or "\\" in bundle:
        return False
    try:
        return (folder / rel).resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False
