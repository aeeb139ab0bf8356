"""The rules ``bundle pack --redact`` applies to every string of a bundle, and what they find.

Each rule has a name, a line for the bundle's ``redaction.removed`` and a count. The names a
bundle reveals (hosts, users, accounts, partitions, device UUIDs and serials) are collected from
all its text first, so each is replaced wherever it appears, in every file, by the same stable
pseudonym (devices stay distinguishable: ``GPU-uuid-0``, ``serial-1``). Over-redaction is
possible (a user called ``gpu`` also hides the word in logs); under-redaction of a listed kind
is a bug.
"""

import getpass
import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from kit.bundle.redact_scan import Hint, LinedText, Replacement

SECRET_NAME = (r"[A-Za-z0-9_]*(?:(?<!PER_)TOKEN(?!S|IZER)|KEY(?!S)|SECRET|PASSWORD|PASSWD"
               r"|PASSPHRASE|CREDENTIAL|AUTH|COOKIE)[A-Za-z0-9_]*")
"""An environment variable or option that holds a secret (case ignored)."""
_SECRET_ASSIGN = re.compile(rf"(?i)\b({SECRET_NAME})([\"']?\s*[=:]\s*)"
                            r"(\"[^\"\n]*\"|'[^'\n]*'|[^\s,;]+)")
_SECRET_OPTION_NAME = r"--[\w-]*(?:token|key|secret|password|passwd|auth)[\w-]*"
"""A command-line option that takes a secret (case ignored)."""
_SECRET_OPTION = re.compile(rf"(?i)({_SECRET_OPTION_NAME})"
                            r"(=|\s+)(\"[^\"\n]*\"|'[^'\n]*'|[^\s-][^\s]*)")
_SECRET_OPTION_WORD = re.compile(rf"(?i){_SECRET_OPTION_NAME}")
_TOKEN_FORMATS = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|AKIA[0-9A-Z]{16}"
    r"|xox[abpr]-[\w-]{10,}|sk-[A-Za-z0-9_-]{20,})|(?i:bearer\s+)[\w.~+/-]{8,}=*")
_EMAIL = re.compile(r"[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:.])")
_UUID = re.compile(r"(?i)\b(?:(GPU|MIG)-)?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                   r"[0-9a-f]{12})\b")
_NODE_LIST = re.compile(r"(?<![\w.-])([A-Za-z][\w.-]*)\[([\d,\s-]+)\]([\w.-]*)")
"""Slurm's host list syntax, in a value known to name hosts (``--nodelist=gpu-[01-04,7]``)."""
_NODE_LIST_IN_TEXT = re.compile(
    r"(?<![\w.-])([A-Za-z][\w.-]*)\[(\d+-\d+(?:,\d+(?:-\d+)?)*|\d+(?:,\d+(?:-\d+)?)+)\]"
    r"([\w.-]*)")
"""A host list anywhere in a text: a range or several numbers in the brackets, as Slurm writes
one (a single host is never bracketed); ``int[1]`` and ``bool[3]`` of an operator's schema in a
profile trace are no host lists."""
_PUBLIC_FQDN = re.compile(
    r"(?i)(?<![\w.@-])(?<!::)(?:[a-z0-9-]+\.)+(?:com|org|net|edu|gov|mil|int|local|localdomain"
    r"|lan|internal|intranet|intra|corp|cluster|hpc)(?![\w-])")
"""A host of a common domain; not an operator's overload after C++'s ``::``
(``aten::transpose.int`` of a profile trace)."""
_USER_SOURCES = re.compile(
    r"/(?:home|homes|Users|users|u|scratch|work|lustre|gpfs|nfs)/([A-Za-z_][\w.-]*)"
    r"|\b(?:USER|LOGNAME|SLURM_JOB_USER|SUDO_USER)=([A-Za-z_][\w.-]*)")
_HOST_SOURCES = re.compile(
    r"(?i)\b(?:HOSTNAME|SLURMD_NODENAME|SLURM_SUBMIT_HOST|SLURM_\w*NODELIST|MASTER_ADDR"
    r"|SLURM_STEP_NODELIST)=([\w.,\[\]-]+)|--(?:nodelist|rdzv[-_]endpoint)[= ]([\w.,\[\]-]+)")
_ACCOUNT_SOURCES = re.compile(
    r"(?:#SBATCH\s+)?(?:--account[= ]|(?<=#SBATCH )-A\s*)([\w.-]+)|\bSLURM_JOB_ACCOUNT=([\w.-]+)")
_PARTITION_SOURCES = re.compile(
    r"(?:--partition[= ]|(?<=#SBATCH )-p\s*)([\w.,-]+)|\bSLURM_JOB_PARTITION=([\w.,-]+)")
_SERIAL_SOURCES = re.compile(r"(?i)\bserial(?:[ _]?number)?\b[\"']?\s*[:=]\s*[\"']?([\w-]{4,})")
_SERIAL_KEY = re.compile(r"(?i)serial")
_NOT_NAMES = frozenset({"root", "localhost", "node", "none", "null", "true", "false"})

_HINTS: dict[re.Pattern[str], Hint] = {
    _TOKEN_FORMATS: Hint(("hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "akia",
                          "xox", "sk-", "bearer"), crossings=1),
    _SECRET_ASSIGN: Hint(("token", "key", "secret", "pass", "credential", "auth", "cookie"),
                         crossings=2),
    _SECRET_OPTION: Hint(("--",), crossings=1),
    _EMAIL: Hint(("@",)),
    _PUBLIC_FQDN: Hint(tuple(f".{tld}" for tld in ("com", "org", "net", "edu", "gov", "mil",
                                                   "int", "local", "lan", "internal", "intra",
                                                   "corp", "cluster", "hpc"))),
    _USER_SOURCES: Hint(("/home", "/users/", "/u/", "/scratch/", "/work/", "/lustre/", "/gpfs/",
                         "/nfs/", "user=", "logname=")),
    _HOST_SOURCES: Hint(("hostname=", "nodename=", "submit_host=", "nodelist", "master_addr=",
                         "--rdzv")),
    _ACCOUNT_SOURCES: Hint(("--account", "#sbatch", "slurm_job_account="), crossings=2),
    _PARTITION_SOURCES: Hint(("--partition", "#sbatch", "slurm_job_partition="), crossings=1),
    _SERIAL_SOURCES: Hint(("serial",), crossings=2),
    _NODE_LIST_IN_TEXT: Hint(witness=re.compile(r"\[(?<=[\w.-]\[)\d")),
    _UUID: Hint(witness=re.compile(r"-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-")),
    _IPV4: Hint(witness=re.compile(r"\.\d{1,3}\.\d{1,3}\.\d")),
    _IPV6: Hint(witness=re.compile(r":[0-9A-Fa-f]{0,4}:")),
}
"""Per pattern, what every match holds on the line where it starts, and how many line breaks
it can cross (through whitespace): a text without the hint is not searched, and in a large
one only the lines with it are (kit.bundle.redact_scan; a 10 MB host ET took 0.2-2 s per
pattern searched whole, ~25 of them). A witness pattern starts with a fixed character, which
``re`` finds fast."""


def _literal(pattern: re.Pattern[str], text: str) -> re.Pattern[str]:
    """``pattern``, whose every match contains ``text`` (case ignored) on one line."""
    _HINTS[pattern] = Hint((text.lower(),))
    return pattern


def _word(text: str) -> re.Pattern[str]:
    """``text`` standing alone: not inside a longer name of letters and digits (case ignored)."""
    return _literal(re.compile(rf"(?i)(?<![A-Za-z0-9]){re.escape(text)}(?![A-Za-z0-9])"), text)


def expand_node_list(text: str) -> list[str]:
    """Slurm's host list syntax: ``gpu-[01-03,7]`` -> gpu-01, gpu-02, gpu-03, gpu-7."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        match = _NODE_LIST.fullmatch(part.strip())
        if not match:
            names.append(part.strip())
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.replace(" ", "").split(","):
            lo, _, hi = item.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            for n in range(int(lo), min(int(hi or lo), int(lo) + 4096) + 1):
                names.append(f"{prefix}{str(n).zfill(len(lo))}{suffix}")
    return [n for n in names if n]


class Redactor:
    """Replace what a site would not share in strings, by rule, counting per rule."""

    def __init__(self, texts: Iterable[str], inventory_hosts: list[str],
                 inventory_uuids: list[str], partitions: bool = False) -> None:
        """Collect the names ``texts`` reveal and build the patterns.

        Args:
            texts: Every string of the bundle (file texts, JSON dumps).
            inventory_hosts: Host names by node index; node N's becomes ``node<N>``.
            inventory_uuids: The devices' UUIDs in node and device order (pseudonyms in
                that order).
            partitions: Also hide Slurm partition names.
        """
        lined = [LinedText(t) for t in texts]
        self.counts: Counter[str] = Counter()
        self.partitions = partitions
        hosts = self._collect_hosts(lined, inventory_hosts)
        self._hosts = [(self._host_pattern(h), name) for h, name in hosts]
        self._families = self._host_families([h for h, _ in hosts])
        self._users = [_word(u) for u in sorted(self._collect(lined, _USER_SOURCES, True),
                                                key=len, reverse=True)]
        self._accounts = [_word(a) for a in self._collect(lined, _ACCOUNT_SOURCES)]
        self._partitions = ([_word(p) for p in self._collect(lined, _PARTITION_SOURCES,
                                                             split=",")]
                            if partitions else [])
        uuids = [m.group(2).lower() for u in inventory_uuids for m in _UUID.finditer(u)]
        for t in lined:
            uuids += [m.group(2).lower() for _, _, m in t.finditer(_UUID, _HINTS[_UUID])]
        self._uuids = {u: f"uuid-{i}" for i, u in enumerate(dict.fromkeys(uuids))}
        self._serials = {s: f"serial-{i}" for i, s in enumerate(sorted(
            self._collect(lined, _SERIAL_SOURCES)))}
        self._serial_patterns = [(_word(s), p) for s, p in self._serials.items()]

    @staticmethod
    def _collect(lined: list[LinedText], pattern: re.Pattern[str], add_me: bool = False,
                 split: str | None = None) -> set[str]:
        """Names ``pattern``'s groups find in the texts."""
        found = {name for t in lined for _, _, m in t.finditer(pattern, _HINTS[pattern])
                 for name in m.groups() if name}
        if split:
            found = {part for name in found for part in name.split(split) if part}
        if add_me:
            try:
                found.add(getpass.getuser())
            except (KeyError, OSError):  # a container uid with no passwd entry and no $USER
                pass
        return {n for n in found if len(n) > 1 and n.lower() not in _NOT_NAMES}

    @staticmethod
    def _collect_hosts(lined: list[LinedText], inventory: list[str]) -> list[tuple[str, str]]:
        """Every host name seen, with its pseudonym: node<N> for the inventory's, else
        host<K>; a FQDN's first label stands for it too."""
        seen: dict[str, str] = {}
        for n, host in enumerate(inventory):
            if host and host.lower() not in _NOT_NAMES:
                seen.setdefault(host.split(".")[0].lower(), f"node{n}")
        extra: list[str] = []
        for t in lined:
            for _, _, m in t.finditer(_HOST_SOURCES, _HINTS[_HOST_SOURCES]):
                value = (m.group(1) or m.group(2)).rsplit(":", 1)[0]
                extra += expand_node_list(value)
            for _, _, m in t.finditer(_NODE_LIST_IN_TEXT, _HINTS[_NODE_LIST_IN_TEXT]):
                extra += expand_node_list(m.group(0))
        for host in sorted(set(extra)):
            short = host.split(".")[0].lower()
            try:
                ipaddress.ip_address(host)
                continue  # an address: the IP rule has it
            except ValueError:
                pass
            if len(short) > 1 and short not in _NOT_NAMES and not short.isdigit():
                seen.setdefault(short, f"host{len(seen)}")
        return sorted(seen.items(), key=lambda kv: len(kv[0]), reverse=True)

    @staticmethod
    def _host_pattern(short: str) -> re.Pattern[str]:
        return _literal(re.compile(rf"(?i)(?<![\w.-]){re.escape(short)}(?:\.[A-Za-z0-9-]+)*"
                                   r"(?![\w-])"), short)

    @staticmethod
    def _host_families(hosts: list[str]) -> list[re.Pattern[str]]:
        """``gpu-node-17`` known: every ``gpu-node-<digits>`` is a host of the same cluster."""
        families: dict[str, str] = {}
        for host in hosts:
            stem = re.sub(r"\d+", r"\\d+", re.escape(host))
            if (stem != re.escape(host) and len(re.sub(r"\d", "", host)) >= 3
                    and not any(re.fullmatch(stem, own) for own in ("node1", "host1"))):
                families.setdefault(stem, host)
        return [_literal(re.compile(rf"(?i)(?<![\w.-]){stem}(?:\.[A-Za-z0-9-]+)*(?![\w-])"),
                         max(re.split(r"\d+", host), key=len))  # in every name of the family
                for stem, host in sorted(families.items())]

    def _sub(self, rule: str, pattern: re.Pattern[str], repl: Replacement,
             text: LinedText) -> None:
        self.counts[rule] += text.subn(pattern, _HINTS.get(pattern), repl)

    def _ip(self, match: re.Match[str]) -> str:
        try:
            address = ipaddress.ip_address(match.group(0))
        except ValueError:  # a version string, a time, a MAC address: not an IP
            return match.group(0)
        if address.is_loopback or address.is_unspecified:
            return match.group(0)
        self.counts["ip addresses"] += 1
        return "<ip>"

    def _uuid(self, match: re.Match[str]) -> str:
        prefix = f"{match.group(1)}-" if match.group(1) else ""
        return prefix + self._uuids.get(match.group(2).lower(), "uuid")

    def text(self, text: str) -> str:
        """Return ``text`` with every rule applied."""
        lined = LinedText(text)
        self._sub("secrets", _TOKEN_FORMATS, "<secret>", lined)
        self._sub("secrets", _SECRET_ASSIGN, r"\1\2<secret>", lined)
        self._sub("secrets", _SECRET_OPTION, r"\1\2<secret>", lined)
        self._sub("e-mail addresses", _EMAIL, "<email>", lined)
        self._sub("device uuids", _UUID, self._uuid, lined)
        for pattern, serial in self._serial_patterns:
            self._sub("device serials", pattern, serial, lined)
        self._sub("host names", _NODE_LIST_IN_TEXT, "<nodelist>", lined)
        for pattern, name in self._hosts:
            self._sub("host names", pattern, name, lined)
        for pattern in self._families:
            self._sub("host names", pattern, "<host>", lined)
        self._sub("host names", _PUBLIC_FQDN, "<host>", lined)
        for pattern in self._accounts:
            self._sub("accounts", pattern, "<account>", lined)
        for pattern in self._partitions:
            self._sub("partitions", pattern, "<partition>", lined)
        for pattern in self._users:
            self._sub("user names", pattern, "<user>", lined)
        lined.subn(_IPV4, _HINTS[_IPV4], self._ip)  # counted by _ip: not every match is one
        lined.subn(_IPV6, _HINTS[_IPV6], self._ip)
        return lined.text

    def json(self, value: Any, key: str = "") -> Any:
        """A copy of a JSON value with :meth:`text` applied to every string; the value of a key
        named like a secret is hidden whole, and of an option like ``--hf-token`` that stands
        alone in a list, the next item."""
        if isinstance(value, str):
            if key and re.fullmatch(SECRET_NAME, key, re.I):
                self.counts["secrets"] += 1
                return "<secret>"
            if key and _SERIAL_KEY.search(key) and value in self._serials:
                self.counts["device serials"] += 1
                return self._serials[value]
            return self.text(value)
        if isinstance(value, list):
            out = [self.json(v) for v in value]
            for i in range(1, len(out)):
                if isinstance(value[i - 1], str) and _SECRET_OPTION_WORD.fullmatch(value[i - 1]):
                    self.counts["secrets"] += 1
                    out[i] = "<secret>"
            return out
        if isinstance(value, dict):
            return {k: self.json(v, k) for k, v in value.items()}
        return value

    def rules(self) -> list[str]:
        """One line per rule applied, for the bundle's ``redaction.removed``."""
        lines = {
            "secrets": "secrets: values of variables, options and JSON keys named like TOKEN, "
                       "KEY, SECRET, PASSWORD, CREDENTIAL, AUTH, COOKIE, and known token formats "
                       "-> <secret>",
            "accounts": "accounts: Slurm accounts (--account, -A, SLURM_JOB_ACCOUNT) -> <account>",
            "partitions": "partitions: Slurm partitions (--partition, -p, SLURM_JOB_PARTITION) "
                          "-> <partition>",
            "user names": "user names: from home and scratch paths (/home, /Users, /scratch, "
                          "/work, ...), USER/LOGNAME/SLURM_JOB_USER and the redacting user, "
                          "wherever they appear -> <user>",
            "e-mail addresses": "e-mail addresses -> <email>",
            "host names": "host names: the inventory's -> node<N>, others seen (HOSTNAME, "
                          "MASTER_ADDR, node lists, --nodelist) -> host<K>, in any case and with "
                          "any domain; Slurm node lists -> <nodelist>; names of the same family "
                          "and FQDNs of common domains -> <host>",
            "ip addresses": "IP addresses (not loopback) -> <ip>",
            "device uuids": "GPU and other UUIDs -> uuid-<N>, stable within the bundle",
            "device serials": "board and GPU serial numbers -> serial-<N>, stable within the "
                              "bundle",
        }
        applied = [r for r in lines if r != "partitions" or self.partitions]
        return [f"{lines[r]} ({self.counts[r]} replaced)" for r in applied]
