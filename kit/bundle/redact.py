"""Copy a bundle without host names, user names and IP addresses, for sharing outside a site.

What is replaced, in every string of ``manifest.json`` and ``metrics.json`` and in every line of
the text files (``logs/``, ``profile/``):

- host names: each node's ``inventory[].host``, with any domain after it, becomes ``node<N>``;
- user names: names seen in home directories (``/home/NAME``, ``/Users/NAME``), in
  ``USER=``, ``LOGNAME=`` or ``SLURM_JOB_USER=``, and the user running the redaction (unless
  ``root``), become ``<user>`` wherever they appear as a word;
- IP addresses: IPv4 and IPv6 addresses become ``<ip>``, except loopback and unspecified
  (``127.0.0.1``, ``::1``, ``0.0.0.0``), which name no machine.

Parquet files hold only numbers and fixed words (``phase``, ``source``) and are copied as they
are. Chakra's protobuf execution traces (``profile/chakra/*.et``) are binary and are left out:
they are converted from the host ET and Kineto trace beside them, which are JSON text and are
redacted, so Chakra can convert the redacted copy again. Any other file that is neither JSON,
parquet nor UTF-8 text cannot be checked, so it is refused.
The redacted manifest records a :class:`~kit.bundle.schema.Redaction`, and ``SHA256SUMS`` is
rewritten, so the copy verifies. Over-redaction is possible (a host called ``gpu`` also hides
the word "gpu" in logs); under-redaction of the listed kinds is a bug.
"""

import getpass
import ipaddress
import json
import re
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kit.bundle.reader import read_bundle
from kit.bundle.schema import Manifest, MetricsFile, Redaction
from kit.bundle.verify import verify_bundle
from kit.bundle.writer import bundle_files, write_json, write_sums
from kit.errors import BundleError
from kit.spec.loader import describe_validation_error

_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:.])")
_USER_SOURCES = re.compile(
    r"/(?:home|Users)/([A-Za-z_][\w.-]*)|\b(?:USER|LOGNAME|SLURM_JOB_USER)=([A-Za-z_][\w.-]*)"
)
_NOT_USERS = frozenset({"root"})


def _word(text: str) -> str:
    """A pattern for ``text`` standing alone, not inside a longer name."""
    return rf"(?<![\w-]){re.escape(text)}(?![\w-])"


class Redactor:
    """Replace host names, user names and IP addresses in strings, counting replacements."""

    def __init__(self, hosts: list[str], users: set[str]) -> None:
        """Build the patterns.

        Args:
            hosts: Host names by node index; node N's becomes ``node<N>``.
            users: User names to hide.
        """
        self._hosts = [
            (re.compile(rf"(?<![\w.-]){re.escape(h)}(?:\.[A-Za-z0-9-]+)*(?![\w-])"), f"node{n}")
            for n, h in enumerate(hosts)
            if h
        ]
        self._users = [re.compile(_word(u)) for u in sorted(users, key=len, reverse=True)]
        self.replacements = 0

    def _sub(self, pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str],
             text: str) -> str:
        text, count = pattern.subn(repl, text)
        self.replacements += count
        return text

    def _ip(self, match: re.Match[str]) -> str:
        try:
            address = ipaddress.ip_address(match.group(0))
        except ValueError:  # a version string, a time, a MAC address: not an IP
            return match.group(0)
        if address.is_loopback or address.is_unspecified:
            return match.group(0)
        self.replacements += 1
        return "<ip>"

    def text(self, text: str) -> str:
        """Return ``text`` with every host, user and IP address replaced."""
        for pattern, node in self._hosts:
            text = self._sub(pattern, node, text)
        for pattern in self._users:
            text = self._sub(pattern, "<user>", text)
        for pattern in (_IPV4, _IPV6):
            text = pattern.sub(self._ip, text)
        return text

    def json(self, value: Any) -> Any:
        """Return a copy of a JSON value with :meth:`text` applied to every string value."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.json(v) for v in value]
        if isinstance(value, dict):
            return {k: self.json(v) for k, v in value.items()}
        return value


def _users_in(texts: list[str]) -> set[str]:
    """User names a bundle reveals, plus the user running this (see the module docstring)."""
    found = {name for t in texts for m in _USER_SOURCES.finditer(t) for name in m.groups() if name}
    try:
        found.add(getpass.getuser())
    except (KeyError, OSError):  # a container uid with no passwd entry and no $USER
        pass
    return found - _NOT_USERS


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


def redact_bundle(path: str | Path, dest_parent: Path) -> Path:
    """Write a redacted, verifiable copy of a bundle to ``dest_parent/<bundle_id>/``.

    Args:
        path: The bundle directory (left unchanged).
        dest_parent: An existing directory to hold the copy.

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
    hosts = [node.host for node in bundle.manifest.inventory]
    redactor = Redactor(hosts, _users_in(list(texts.values())))
    dest = dest_parent / root.name
    dest.mkdir()
    left_out = [rel for rel in files if _is_chakra_et(rel)]
    for rel in files:
        if rel in left_out:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".parquet"):
            shutil.copyfile(root / rel, dest / rel)
        elif rel not in ("manifest.json", "metrics.json"):
            (dest / rel).write_text(redactor.text(texts[rel]), encoding="utf-8")
    metrics = redactor.json(json.loads(texts["metrics.json"]))
    manifest = redactor.json(json.loads(texts["manifest.json"]))
    removed = ["host names -> node<N>", "user names -> <user>", "IP addresses -> <ip>"]
    if left_out:
        removed.append(f"{len(left_out)} Chakra protobuf ET(s) (profile/chakra/*.et, binary) "
                       "left out; convert the redacted host ET and Kineto trace again")
    manifest["redaction"] = Redaction(
        redacted_utc=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        removed=removed,
        replacements=redactor.replacements,
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
