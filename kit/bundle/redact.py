"""Copy a bundle without what a site would not share (``bundle pack --redact``).

Every string of ``manifest.json`` and ``metrics.json``, every line of the other text files
(``logs/``, ``profile/``, ``job/sbatch.sh``, any other member) and the key-value metadata and
strings of the parquet files (:mod:`kit.bundle.redact_parquet`) go through the rules of
:mod:`kit.bundle.redact_rules`: secrets (keys, tokens, passwords in URLs, environment lines,
options, headers and JSON keys), Slurm accounts (and partitions when asked), user names
wherever they appear, e-mail addresses, host names in every form (short, FQDN, any case, Slurm
node lists, NCCL prefixes), IP addresses, and device UUIDs, MAC addresses, InfiniBand GUIDs and
serials (stable pseudonyms, so devices stay distinguishable). The redacted manifest records the
rules applied, each with its count, in a :class:`~kit.bundle.schema.Redaction`; never the
names it replaced.

A parquet file the kit wrote holds only numbers and fixed words and is copied as it is.
Chakra's protobuf execution traces (``profile/chakra/*.et``) are binary and are left out:
they are converted from the host ET and Kineto trace beside them, which are JSON text and are
redacted, so Chakra can convert the redacted copy again. Any other file that is neither JSON,
parquet nor UTF-8 text cannot be checked, so it is refused. ``SHA256SUMS`` is rewritten, so
the copy verifies."""

import json
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from kit.bundle.reader import read_bundle
from kit.bundle.redact_parquet import parquet_text, redact_parquet
from kit.bundle.redact_rules import Redactor
from kit.bundle.schema import Manifest, MetricsFile, Redaction
from kit.bundle.verify import verify_bundle
from kit.bundle.writer import bundle_files, write_json, write_sums
from kit.config.loader import describe_validation_error
from kit.errors import BundleError


def _is_chakra_et(rel: str) -> bool:
    """A Chakra protobuf ET (binary; left out of a redacted copy)."""
    return rel.startswith("profile/chakra/") and rel.endswith(".et")


def _read_texts(root: Path, files: list[str]) -> dict[str, str]:
    """Every file but parquet and Chakra ETs, as text; refuse one that is not UTF-8."""
    texts = {}
    for rel in files:
        if rel.endswith(".parquet") or _is_chakra_et(rel):
            continue
        try:
            texts[rel] = (root / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise BundleError(
                f"bundle {root}: {rel} is binary, so it cannot be checked for host names or "
                "IPs; share this bundle unredacted or not at all"
            ) from None
    return texts


def redact_bundle(path: str | Path, dest_parent: Path, partitions: bool = False) -> Path:
    """Write a redacted, verifiable copy of a bundle to ``dest_parent/<bundle_id>/``.

    Args:
        path: The bundle directory (left unchanged).
        dest_parent: An existing directory to hold the copy.
        partitions: Also hide Slurm partition names.

    Returns:
        The redacted bundle directory.

    Raises:
        BundleError: The bundle does not read, holds a binary file other than parquet or a
            Chakra ET, or
            redaction broke its schema (a host name equal to a field's fixed value).
    """
    bundle = read_bundle(path)
    root, files = bundle.path, bundle_files(bundle.path)
    texts = _read_texts(root, files)
    tables = [parquet_text(root / rel) for rel in files if rel.endswith(".parquet")]
    inventory = bundle.manifest.inventory
    uuids = [str(g["uuid"]) for node in inventory for g in node.gpus if g.get("uuid")]
    redactor = Redactor([*texts.values(), *tables], [node.host for node in inventory], uuids,
                        partitions)
    dest = dest_parent / root.name
    dest.mkdir()
    left_out = [rel for rel in files if _is_chakra_et(rel)]
    for rel in files:
        if rel in left_out:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".parquet"):
            redact_parquet(root / rel, dest / rel, redactor.text)
        elif rel not in ("manifest.json", "metrics.json"):
            (dest / rel).write_text(redactor.text(texts[rel]), encoding="utf-8")
    metrics = redactor.json(json.loads(texts["metrics.json"]))
    manifest = redactor.json(json.loads(texts["manifest.json"]))
    removed = redactor.rules()
    if left_out:
        removed.append(f"{len(left_out)} Chakra protobuf ET(s) (profile/chakra/*.et, binary) "
                       "left out; convert the redacted host ET and Kineto trace again")
    manifest["redaction"] = Redaction(
        redacted_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        removed=removed,
        replacements=sum(redactor.counts.values()),
    ).model_dump(mode="json")
    try:
        write_json(dest / "metrics.json", MetricsFile.model_validate(metrics))
        write_json(dest / "manifest.json", Manifest.model_validate(manifest))
    except ValidationError as e:
        raise BundleError(
            f"bundle {root}: redaction broke the manifest or metrics schema "
            f"({describe_validation_error(e)}); a host or user name equals a fixed value"
        ) from None
    write_sums(dest)
    verify_bundle(dest)
    return dest
