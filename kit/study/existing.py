"""``charllm-kit study --from``: the findings and report of bundles that already exist.

Another site's bundles, a sweep's, a partial study's: nothing runs. The paths are read as
``compare`` reads them (:func:`kit.analysis.inputs.expand_inputs`: a sweep folder stands for its
bundles, a folder of bundles for the bundles in it), a study folder also for the bundles of its
``fabric/``; each bundle must verify (:func:`kit.bundle.verified.read_verified_bundle`), or
with ``--allow-unverified`` is used and marked as unverified in the findings and the report.
The findings go to ``<out>/study-<node>-from-bundles/``, the node named after the bundles'
platforms and ranks (``h200x4``); files of an earlier ``--from`` there are replaced.
"""

from collections.abc import Callable
from pathlib import Path

from kit.analysis.inputs import expand_inputs
from kit.bundle.guard import bundle_input_errors
from kit.bundle.reader import Bundle
from kit.bundle.verified import read_verified_bundle
from kit.errors import KitInputError
from kit.output_target import check_output_dir
from kit.study.facts import read_facts
from kit.study.run import FABRIC_DIR, MATRIX_FILE, StudyOutcome, conclude

FOLDER_SUFFIX = "from-bundles"
"""The findings folder's name after ``study-<node>-``: told apart from a study's own folder."""


def node_label(bundles: list[Bundle]) -> str:
    """The node the bundles ran on, as the study names it: ``<platform>x<most ranks>``, one per
    platform, joined by ``+``."""
    ranks: dict[str, int] = {}
    for b in bundles:
        name = str(b.manifest.platform.get("name") or "unknown")
        world = int(b.manifest.config.get("nodes") or 1) * int(
            b.manifest.config.get("devices_per_node") or 1)
        ranks[name] = max(ranks.get(name, 0), world)
    return "+".join(f"{p}x{n}" for p, n in sorted(ranks.items())) or "none"


def _with_fabric(paths: list[Path]) -> list[Path]:
    """``paths``, each study folder followed by its ``fabric/`` folder (the links finding
    reads the fabric benchmark, which the study keeps outside its sweep)."""
    out = []
    for p in paths:
        out.append(p)
        if (p / MATRIX_FILE).is_file() and (p / FABRIC_DIR).is_dir() and any(
                (p / FABRIC_DIR).iterdir()):
            out.append(p / FABRIC_DIR)
    return out


@bundle_input_errors
def conclude_existing(paths: list[Path], out: Path, allow_unverified: bool,
                      say: Callable[[str], None]) -> StudyOutcome:
    """Verify and read the bundles at ``paths``, then write their findings and report.

    Raises:
        KitInputError: No paths; a path that is neither a bundle nor a folder of bundles; a
            bundle that does not verify (without ``allow_unverified``) or cannot be read (an
            unverified one's tables too: over the read budget, unreadable); an output folder
            that cannot be written.
    """
    if not paths:
        raise KitInputError("study --from needs one or more bundles or folders of bundles")
    inputs = expand_inputs(_with_fabric(paths))
    for note in inputs.notes:
        say(note)
    seen: dict[Path, Bundle] = {}
    for path in inputs.bundles:
        seen.setdefault(path.resolve(), read_verified_bundle(path, allow_unverified))
    bundles = list(seen.values())
    unverified = {b.path.name: str(b.verification_error) for b in bundles
                  if b.verification_error is not None}
    for b in bundles:
        if b.verification_error is not None:  # its tables were not checked: refuse them here
            read_facts(b.path)  # as compare refuses an unverified bundle it cannot read
            say(f"warning: unverified: {b.path.name}: {b.verification_error}")
    folder = out / f"study-{node_label(bundles)}-{FOLDER_SUFFIX}"
    check_output_dir(folder)
    folder.mkdir(parents=True, exist_ok=True)
    results, findings_file, report = conclude(folder, [b.path for b in bundles],
                                              node_label(bundles), say, unverified=unverified)
    return StudyOutcome(folder, results, findings_file, report, any_failed=False)
