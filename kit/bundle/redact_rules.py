"""The rules ``bundle pack --redact`` applies to every string of a bundle, and what they find.

Each rule is data (:class:`Rule`): the kind it is counted under (a line of the bundle's
``redaction.removed``), what it protects, its pattern, its replacement, its :class:`Hint` (what
every match holds on the line where it starts, so a large text is searched only from those
lines) and the cases it was written for, each with what the rule alone makes of it
(``tests/test_bundle_redact.py`` checks every case and that the hint is inside every match).

The names a bundle reveals (hosts, users, accounts, partitions, device serials) are collected
from all its text first by the :data:`SOURCES`, so each is replaced wherever it appears, in
every file, by the same stable pseudonym; device UUIDs, MAC addresses and InfiniBand GUIDs get
stable pseudonyms too (devices stay distinguishable: ``GPU-uuid-0``, ``serial-1``, ``mac-0``).
Over-redaction is possible (a user called ``gpu`` also hides the word in logs); under-redaction
of a listed kind is a bug.
"""

import getpass
import ipaddress
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import packages_distributions
from typing import Any

from kit.bundle.redact_scan import Hint, LinedText

Replace = str | Callable[["Redactor", re.Match[str]], str]
"""A rule's replacement: a template (``\\1<secret>``) or a function of the redactor and match."""


@dataclass(frozen=True)
class Rule:
    """One thing a site would not share: how it is found and what replaces it.

    Attributes:
        kind: What it is counted under: a key of :data:`KINDS`.
        protects: What it finds, in words.
        pattern: Finds it.
        replacement: What a match becomes.
        hint: What every match holds on the line where it starts (None: search texts whole).
        cases: Texts it was written for, each with what this rule alone makes of it.
    """

    kind: str
    protects: str
    pattern: re.Pattern[str]
    replacement: Replace
    hint: Hint | None
    cases: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Source:
    """Where the names of one kind are found, to be replaced wherever they appear.

    Attributes:
        kind: ``hosts``, ``users``, ``accounts``, ``partitions`` or ``serials``.
        protects: Where it looks, in words.
        pattern: Its non-empty groups are the names.
        hint: As :attr:`Rule.hint`.
        cases: Texts it was written for, each with the names it finds there.
    """

    kind: str
    protects: str
    pattern: re.Pattern[str]
    hint: Hint
    cases: tuple[tuple[str, tuple[str, ...]], ...] = ()


KINDS = {
    "secrets": "secrets: private keys, JWTs and known token formats (hf_, api_org_, ghp_, AKIA/"
               "ASIA, sk-, Bearer), passwords in URLs, authorization and cookie headers, values "
               "of variables, options and JSON keys named like TOKEN, KEY, SECRET, PASSWORD, "
               "CREDENTIAL, AUTH, COOKIE -> <secret>",
    "accounts": "accounts: Slurm accounts (--account, -A, SLURM_JOB_ACCOUNT) -> <account>",
    "partitions": "partitions: Slurm partitions (--partition, -p, SLURM_JOB_PARTITION) "
                  "-> <partition>",
    "user names": "user names: from home and scratch paths (/home, /Users, C:\\Users, /scratch, "
                  "/pscratch/sd/X, /global/homes/X, ...), ~NAME, uid=N(NAME), NAME@host, "
                  "USER/LOGNAME/SLURM_JOB_USER and the redacting user, wherever they appear "
                  "-> <user>",
    "e-mail addresses": "e-mail addresses -> <email>",
    "host names": "host names: the inventory's -> node<N>, others seen (HOSTNAME, MASTER_ADDR, "
                  "node lists, --nodelist, NCCL log prefixes, user@host) -> host<K>, in any case "
                  "and with any domain; Slurm node lists -> <nodelist>; names of the same family, "
                  "ip-A-B-C-D and FQDNs under country-code and common domains -> <host>",
    "ip addresses": "IP addresses (not loopback) -> <ip>",
    "device uuids": "GPU and other UUIDs -> uuid-<N>, stable within the bundle",
    "hardware addresses": "MAC addresses -> mac-<N>, InfiniBand GUIDs -> guid-<N>, stable "
                          "within the bundle",
    "device serials": "board and GPU serial numbers -> serial-<N>, stable within the bundle",
}
"""Each kind of rule, as the bundle's ``redaction.removed`` describes it (in this order)."""


def _rule(kind: str, protects: str, pattern: str, replacement: Replace, literals: tuple = (),
          witness: str | None = None, crossings: int = 0,
          cases: tuple[tuple[str, str], ...] = ()) -> Rule:
    hint = (Hint(literals, re.compile(witness) if witness else None, crossings)
            if literals or witness else None)
    return Rule(kind, protects, re.compile(pattern), replacement, hint, cases)


def _source(kind: str, protects: str, pattern: str, literals: tuple = (),
            witness: str | None = None, crossings: int = 0,
            cases: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> Source:
    return Source(kind, protects, re.compile(pattern),
                  Hint(literals, re.compile(witness) if witness else None, crossings), cases)


SECRET_NAME = (r"[A-Za-z0-9_]*(?:(?<!PER_)TOKEN(?!S|IZER)|KEY(?!S)|SECRET|PASSWORD|PASSWD"
               r"|PASSPHRASE|CREDENTIAL|AUTH|COOKIE)[A-Za-z0-9_]*")
"""An environment variable or option that holds a secret (case ignored)."""
_SECRET_VALUE = r"(\"[^\"\n]*\"|'[^'\n]*'|\\\"[^\"\\\n]*\\\"|[^\s\"'\\]+)"
"""A value: quoted, quoted inside a JSON string (``\\"...\\"``), or up to a space or quote
(``;`` and ``,`` are part of it: ``DB_PASSWORD=a;b``)."""
_SECRET_OPTION_NAME = (r"--[\w-]*(?:token(?!s|izer)|key(?!s)|secret|password|passwd|auth)"
                       r"[\w-]*")
"""A command-line option that takes a secret (case ignored; not ``--tokenizer-type``)."""
_SECRET_OPTION_WORD = re.compile(rf"(?i){_SECRET_OPTION_NAME}")
_TLDS = ("com", "org", "net", "edu", "gov", "mil", "int", "info", "biz", "dev", "app", "cloud",
         "arpa", "local", "localdomain", "lan", "internal", "intranet", "intra", "corp",
         "cluster", "hpc", "home")
"""Domains of three letters or more whose hosts are hidden; every two-letter one (a country
code: ``.de``, ``.ch``, ``.io``) is too, unless it is a file type of :data:`_FILE_TYPES`."""
_FILE_TYPES = frozenset({"py", "sh", "md", "js", "ts", "gz", "xz", "so", "cc", "hh", "cu", "pt",
                         "pl", "pm", "rs", "rb", "go", "db", "ps", "h5", "el", "jl", "ml", "mk",
                         "ko", "in", "rc"})
"""Two-letter file extensions: ``setup.py`` and ``train.sh`` are no hosts."""
_SECOND_LEVEL = frozenset({"ac", "co", "com", "edu", "gov", "net", "org", "res", "nic"})
"""Second-level domains under a country code: ``cse.iitb.ac.in`` is a host, though ``.in`` is
also a file type."""
_ENGINES = frozenset({"kit", "torch", "megatron", "deepspeed", "transformer_engine", "apex",
                      "triton", "numpy", "np", "nn", "jax"})
"""Modules a bundle names that may not be installed where it is redacted."""
_HOME = (r"(?:/(?:global/(?:homes|u\d|cscratch\d*)|p?scratch\d*/sd)/[A-Za-z0-9]"
         r"|/(?:home\d*|homes|Users|users|u|p?scratch\d*|work\d*|lustre|gpfs|nfs)"
         r"|(?i:\b[a-z]:(?:\\\\?|/)(?:Users|Documents and Settings)))(?:\\\\?|/)")
"""A home or scratch folder's parent: the user's name follows (``/home/``, ``/pscratch/sd/e/``,
``/global/homes/f/``, ``C:\\Users\\``, also with JSON's doubled backslashes)."""
_USER = r"[A-Za-z_][\w.-]*"
_HOME_HINT = ("/home", "/users/", "/u/", "scratch/", "/work", "/lustre/", "/gpfs/", "/nfs/",
              "/global/", ":\\", ":/users", ":/documents")

SECRET_RULES = (
    _rule("secrets", "private keys (PEM, OpenSSH), header to footer or to the end of the key's "
          "characters",
          r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[A-Za-z0-9+/=\s\\:,.-]*?"
          r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|(?=[^A-Za-z0-9+/=\s\\:,.-])|\Z)",
          "<secret>", cases=(
              ("k: -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU=\n"
               "QyNTUxOQAAACB\n-----END OPENSSH PRIVATE KEY-----\nnext",
               "k: <secret>\nnext"),
              ('{"key": "-----BEGIN RSA PRIVATE KEY-----\\nMIIEpAIBAAKCAQEA\\n"}',
               '{"key": "<secret>"}'))),
    _rule("secrets", "JSON web tokens, in any header or line",
          r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*", "<secret>", ("eyj",),
          cases=(("X-Session: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl ok",
                  "X-Session: <secret> ok"),)),
    _rule("secrets", "Hugging Face, GitHub, Slack and OpenAI token formats",
          r"\b(?:hf_[A-Za-z0-9]{20,}|api_org_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
          r"|github_pat_\w{20,}|xox[abpr]-[\w-]{10,}|sk-[A-Za-z0-9_-]{20,})", "<secret>",
          ("hf_", "api_org_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox",
           "sk-"), cases=(("t hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123", "t <secret>"),
                          ("org api_org_AbCdEfGhIjKlMnOpQrStUvWx!", "org <secret>!"))),
    _rule("secrets", "AWS access key ids (long-term AKIA, temporary ASIA, and the other "
          "four-letter prefixes)",
          r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|AROA|ANPA|ANVA|APKA|A3T[A-Z0-9])"
          r"[A-Z0-9]{16}\b", "<secret>",
          ("akia", "asia", "abia", "acca", "agpa", "aida", "aipa", "aroa", "anpa", "anva",
           "apka", "a3t"), cases=(("id ASIAY34FZKBOKMUTVV7A,", "id <secret>,"),
                                  ("AKIAIOSFODNN7EXAMPLE", "<secret>"))),
    _rule("secrets", "bearer tokens", r"(?i:bearer\s+)[\w.~+/-]{8,}=*", "<secret>",
          ("bearer",), crossings=1,
          cases=(("Authorization: Bearer\n abcdefgh12345678", "Authorization: <secret>"),)),
    _rule("secrets", "user and password in a URL (both hidden)",
          r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s:/@\"'<>]+:[^\s/@\"'<>]+@", r"\1<user>:<secret>@",
          ("://",), cases=(
              ("postgres://app:S3cr3tPW@db01:5432/x", "postgres://<user>:<secret>@db01:5432/x"),
              ("https://erin:pa!ss@hub.example.de/", "https://<user>:<secret>@hub.example.de/"))),
    _rule("secrets", "authorization, cookie and X-...-token/key/secret header values, to the "
          "end of the line",
          r"(?i)\b((?:proxy-)?authorization|(?:set-)?cookie|x-[\w-]*(?:token|key|secret|auth)"
          r"[\w-]*)(\s*:[ \t]*)[^\s\"'\\][^\r\n\"'\\]*", r"\1\2<secret>",
          ("authorization", "cookie", "x-"), cases=(
              ("Authorization: Basic dXNlcjpwYXNz", "Authorization: <secret>"),
              ("-H 'X-Api-Key: abc def'", "-H 'X-Api-Key: <secret>'"))),
    _rule("secrets", "values of variables and JSON keys named like a secret",
          rf"(?i)\b({SECRET_NAME})([\"']?\s*[=:]\s*){_SECRET_VALUE}", r"\1\2<secret>",
          ("token", "key", "secret", "pass", "credential", "auth", "cookie"), crossings=2,
          cases=(("export DB_PASSWORD=a;b c", "export DB_PASSWORD=<secret> c"),
                 ('"cmd": "WANDB_API_KEY=\\"0f9e\\" run"',
                  '"cmd": "WANDB_API_KEY=<secret> run"'),
                 ("api_key:\n\n   0f9e8d7c", "api_key:\n\n   <secret>"))),
    _rule("secrets", "values of options named like a secret (--api-key -Xsecret too; not a "
          "following option)",
          rf"(?i)({_SECRET_OPTION_NAME})(=|\s+)(\"[^\"\n]*\"|'[^'\n]*'|(?<==)\S+"
          r"|(?!--|-[A-Za-z]?(?:\s|$))\S+)", r"\1\2<secret>", ("--",), crossings=1,
          cases=(("--api-key -Xsecret --v", "--api-key <secret> --v"),
                 ("--hf-token\n  zz-77", "--hf-token\n  <secret>"),
                 ("--use-auth --verbose", "--use-auth --verbose"),
                 ("--tokenizer-type GPT2BPETokenizer", "--tokenizer-type GPT2BPETokenizer"))),
)
"""Secrets, first: a later rule must not take part of one for a name."""


def _fqdn(redactor: "Redactor", match: re.Match[str]) -> str:
    """A host, unless a file name (``setup.py``; but ``iitb.ac.in`` is a host) or a module of
    two labels (``torch.nn``)."""
    labels = match.group(0).lower().split(".")
    if labels[-1] in _FILE_TYPES and not (len(labels) > 2 and labels[-2] in _SECOND_LEVEL):
        return match.group(0)
    if len(labels) == 2 and labels[0] in _modules():
        return match.group(0)
    return "<host>"


@cache
def _modules() -> frozenset[str]:
    """Top-level modules installed here, of the standard library, and :data:`_ENGINES`."""
    return _ENGINES | {m.lower() for m in (*sys.stdlib_module_names, *packages_distributions())}


def _ip(redactor: "Redactor", match: re.Match[str]) -> str:
    try:
        address = ipaddress.ip_address(match.group(0))
    except ValueError:  # a version string, a time, a MAC address: not an IP
        return match.group(0)
    return match.group(0) if address.is_loopback or address.is_unspecified else "<ip>"


def _uuid(redactor: "Redactor", match: re.Match[str]) -> str:
    prefix = f"{match.group(1)}-" if match.group(1) else ""
    return prefix + redactor.uuids.get(match.group(2).lower(), "uuid")


def _pseudonym(prefix: str) -> Callable[["Redactor", re.Match[str]], str]:
    """The next ``prefix-<N>`` for each new value (hex digits, any case or separators); all
    zeros or all ones (broadcast) are kept."""
    def name(redactor: "Redactor", match: re.Match[str]) -> str:
        group = "value" if match.groupdict().get("value") else "value2"
        value = re.sub(r"(?i)0x|[:.-]", "", match.group(group)).lower()
        if set(value) <= {"0"} or set(value) <= {"f"}:  # broadcast or none: no device
            return match.group(0)
        seen = redactor.addresses.setdefault(prefix, {})
        start = match.group(0)[:match.start(group) - match.start()]
        return start + seen.setdefault(value, f"{prefix}-{len(seen)}")
    return name


_UUID_PATTERN = (r"(?i)\b(?:(GPU|MIG)-)?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-"
                 r"[0-9a-f]{12})\b")
UUIDS = _rule("device uuids", "GPU, MIG and bare UUIDs", _UUID_PATTERN, _uuid,
              witness=r"-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-",
              cases=(("d GPU-618c5ede-81ec-b472-43ee-23bfe3919b57.", "d GPU-uuid-0."),))
DEVICE_RULES = (
    UUIDS,
    _rule("hardware addresses", "MAC addresses (6 octets, and IPoIB's 20), with : or -",
          r"(?i)(?<![\w:-])(?P<value>[0-9a-f]{2}([:-])(?:[0-9a-f]{2}\2){4}"
          r"(?:(?:[0-9a-f]{2}\2){14})?[0-9a-f]{2})(?![\w:-])", _pseudonym("mac"),
          witness=r"[:-][0-9A-Fa-f]{2}[:-][0-9A-Fa-f]{2}[:-]",
          cases=(("ether 0C:42:A1:12:34:56 brd ff:ff:ff:ff:ff:ff",
                  "ether mac-0 brd ff:ff:ff:ff:ff:ff"),
                 ("a 0c-42-a1-12-34-56 0c:42:a1:12:34:56", "a mac-0 mac-0"),
                 ("at 12:34:56", "at 12:34:56"))),
    _rule("hardware addresses", "InfiniBand GUIDs: four groups of four hex digits, or 16 after "
          "the word GUID",
          r"(?i)(?<![\w:])(?P<value>[0-9a-f]{4}(?::[0-9a-f]{4}){3})(?![\w:])"
          r"|guid[\"']?\s*[:=]?\s*[\"']?(?P<value2>0x[0-9a-f]{16})\b", _pseudonym("guid"),
          ("guid",), witness=r":[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}:",
          cases=(("node_guid: 248a:0703:00a1:b2c3", "node_guid: guid-0"),
                 ("Port GUID: 0x248a070300a1b2c3 x", "Port GUID: guid-0 x"))),
)
"""Device identities with pseudonyms, so devices stay distinguishable."""

_NODE_LIST = (r"(?<![\w.-])[A-Za-z][\w.-]*\[(?:\d+-\d+(?:,\d+(?:-\d+)?)*|\d+(?:,\d+(?:-\d+)?)+"
              r"|0\d+)\][\w.-]*")
"""A Slurm node list in any text: a range or several numbers in the brackets, or one
zero-padded (``nid[001240]``), as Slurm writes one; ``int[1]`` of an operator's schema in a
profile trace is none."""
_NODE_LIST_WITNESS = r"\[(?<=[\w.-]\[)\d"
NODE_LIST = _rule(
    "host names", "Slurm node lists in any text: a range or several numbers in the brackets, or "
    "one zero-padded (nid[001240]); not int[1] of an operator's schema",
    _NODE_LIST, "<nodelist>", witness=_NODE_LIST_WITNESS,
    cases=(("on nid[001240] and gpu-node-[17-20]", "on <nodelist> and <nodelist>"),
           ("schema int[1] x", "schema int[1] x")))
HOST_RULES = (
    _rule("host names", "cloud hosts named by their address (ip-10-0-0-5)",
          r"(?i)(?<![\w.-])ip-\d{1,3}(?:-\d{1,3}){3}(?:\.[a-z0-9-]+)*(?![\w-])", "<host>",
          ("ip-",), cases=(("from ip-10-0-0-5.ec2.internal:", "from <host>:"),)),
    _rule("host names", "FQDNs under a two-letter (country) domain or a common one, in any case; "
          "not file names (setup.py), modules of two labels (torch.nn), or an operator's "
          "overload after :: (aten::transpose.int)",
          r"(?i)(?:(?<=\\[nrt])|(?<![\w.@-]))(?<!::)(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+"
          rf"(?:[a-z]{{2}}|{'|'.join(_TLDS)})(?![\w-]|\.\w|\()", _fqdn,
          witness=rf"(?i)\.(?:[a-z]{{2}}|{'|'.join(_TLDS)})(?![\w-]|\.\w|\()",
          cases=(("at login2.uni-example.de and db.EXAMPLE.CH.", "at <host> and <host>."),
                 ("kit.engines.megatron steps.parquet setup.py torch.nn x.to(y)",
                  "kit.engines.megatron steps.parquet setup.py torch.nn x.to(y)"),
                 ("hpc.example.edu aten::transpose.int", "<host> aten::transpose.int"),
                 ("MANIFEST.in steps.tar.gz cse.iitb.ac.in", "MANIFEST.in steps.tar.gz <host>"))),
)
"""Hosts not collected by name (:data:`SOURCES`)."""

PERSON_RULES = (
    _rule("e-mail addresses", "e-mail addresses", r"[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+",
          "<email>", ("@",), cases=(("to carol.jones@uni-example.de.", "to <email>."),)),
    _rule("user names", "user@host without a domain (not image@sha256)",
          r"(?<![\w.+-])[A-Za-z_][\w.+-]*@(?!sha\d|md5)[A-Za-z][A-Za-z0-9-]*(?![\w@-]|\.\w)",
          "<user>@<host>", ("@",), cases=(("ssh erin@login07 ok", "ssh <user>@<host> ok"),
                                          ("img@sha256:ab", "img@sha256:ab"))),
    _rule("user names", "the user in a home or scratch path (of one letter too), ~NAME, "
          "uid=N(NAME)",
          rf"({_HOME}){_USER}|(?<![\w~:\\])(~){_USER}(?=[/\s\"',;:)]|$)|(\buid=\d+\()[\w.-]+\)",
          lambda r, m: f"{m.group(1) or m.group(2) or m.group(3)}<user>"
                       f"{')' if m.group(3) else ''}",
          (*_HOME_HINT, "~", "uid="), cases=(
              ("C:\\Users\\x\\a /global/homes/f/frank",
               "C:\\Users\\<user>\\a /global/homes/f/<user>"),
              ("/pscratch/sd/e/erin/r ~harry/x uid=1001(gina)",
               "/pscratch/sd/e/<user>/r ~<user>/x uid=1001(<user>)"),
              ("c10::~TensorImpl", "c10::~TensorImpl"))),
)
"""People: e-mail addresses and user names where the text shows they are one."""

IP_RULES = (
    _rule("ip addresses", "IPv4 addresses (not loopback), also before a full stop",
          r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\w|\.\d)", _ip,
          witness=r"\.\d{1,3}\.\d{1,3}\.\d",
          cases=(("peer 10.20.30.40. and 127.0.0.1 v1.2.3.4.5", "peer <ip>. and 127.0.0.1 "
                  "v1.2.3.4.5"),)),
    _rule("ip addresses", "IPv6 addresses (not loopback)",
          r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:.])", _ip,
          witness=r":[0-9A-Fa-f]{0,4}:",
          cases=(("via fd00::1234 and ::1", "via <ip> and ::1"),)),
)

SOURCES = (
    _source("users", "home and scratch paths", rf"{_HOME}({_USER})", _HOME_HINT,
            cases=(("/home/alicew/x /pscratch/sd/e/erin", ("alicew", "erin")),
                   ("C:\\\\Users\\\\bob\\\\x", ("bob",)))),
    _source("users", "login variables, ~NAME, uid=N(NAME), NAME@host",
            r"\b(?:USER|LOGNAME|SLURM_JOB_USER|SUDO_USER)=([A-Za-z_][\w.-]*)"
            rf"|(?<![\w~:\\])~({_USER})(?=[/\s\"',;:)]|$)|\buid=\d+\(([\w.-]+)\)"
            r"|(?<![\w.+-])([A-Za-z_][\w.+-]*)@(?!sha\d|md5)[A-Za-z][A-Za-z0-9-]*(?![\w@-]|\.\w)",
            ("user=", "logname=", "~", "uid=", "@"),
            cases=(("USER=bob ~harry/x uid=1001(gina) erin@login07", ("bob", "harry", "gina",
                                                                     "erin")),)),
    _source("hosts", "host variables and options",
            r"(?i)\b(?:HOSTNAME|SLURMD_NODENAME|SLURM_SUBMIT_HOST|SLURM_\w*NODELIST|MASTER_ADDR"
            r"|SLURM_STEP_NODELIST)=([\w.,\[\]-]+)|--(?:nodelist|rdzv[-_]endpoint)[= ]"
            r"([\w.,\[\]-]+)",
            ("hostname=", "nodename=", "submit_host=", "nodelist", "master_addr=", "--rdzv"),
            cases=(("SLURMD_NODENAME=login07", ("login07",)),)),
    _source("hosts", "NCCL log prefixes (host:pid:tid [dev] NCCL) and user@host",
            r"(?<![\w.-])([A-Za-z][\w-]*)(?:\.[\w.-]+)?:\d+:\d+ \[\d+\] NCCL"
            r"|(?<![\w.+-])[A-Za-z_][\w.+-]*@(?!sha\d|md5)([A-Za-z][A-Za-z0-9-]*)(?![\w@-]|\.\w)",
            ("nccl", "@"),
            cases=(("frontier07:1234:1234 [0] NCCL INFO x", ("frontier07",)),
                   ("ssh erin@login07", ("login07",)))),
    _source("hosts", "Slurm node lists in any text (each host of the list)", f"({_NODE_LIST})",
            witness=_NODE_LIST_WITNESS, cases=(("on nid[001240] and gpu-[1-2]",
                                                ("nid[001240]", "gpu-[1-2]")),)),
    _source("accounts", "Slurm accounts",
            r"(?:#SBATCH\s+)?(?:--account[= ]|(?<=#SBATCH )-A\s*)([\w.-]+)"
            r"|\bSLURM_JOB_ACCOUNT=([\w.-]+)",
            ("--account", "#sbatch", "slurm_job_account="), crossings=2,
            cases=(("#SBATCH -A\nproj-x", ("proj-x",)),)),
    _source("partitions", "Slurm partitions",
            r"(?:--partition[= ]|(?<=#SBATCH )-p\s*)([\w.,-]+)|\bSLURM_JOB_PARTITION=([\w.,-]+)",
            ("--partition", "#sbatch", "slurm_job_partition="), crossings=1,
            cases=(("SLURM_JOB_PARTITION=gpu-q", ("gpu-q",)),)),
    _source("serials", "serial numbers: keys named like serial (board_serial, SerialNumber) or "
            "S/N, SN; a value of six characters or more with a digit (not a small number, which "
            "would be replaced wherever it appears)",
            r"(?i)(?:serial(?:[ _-]?(?:number|no|num))?|(?<![A-Za-z0-9])S/?N)[\"']?\s*[:=#]\s*"
            r"[\"']?(?=[\w-]*\d)([\w-]{6,})", ("serial",), witness=r"(?i)\bS/?N[\"']?\s*[:=#]",
            crossings=2, cases=(('"board_serial": "ABC12345"', ("ABC12345",)),
                                ("SN: 99887766", ("99887766",)),
                                ("Serial Number :\n 1652422012345", ("1652422012345",)))),
)
"""Where the names replaced everywhere are collected from."""

_SERIAL_KEY = re.compile(r"(?i)serial")
_NOT_NAMES = frozenset({"root", "localhost", "node", "none", "null", "true", "false"})


def _word(kind: str, text: str, replacement: str) -> Rule:
    """``text`` standing alone: not inside a longer name of letters and digits, nor a Python
    dunder name (a user ``main`` leaves ``__main__.py``; case ignored)."""
    return Rule(kind, f"a collected name ({kind})",
                re.compile(rf"(?i)(?<![A-Za-z0-9])(?<!__){re.escape(text)}(?![A-Za-z0-9]|__)"),
                replacement, Hint((text.lower(),)))


def expand_node_list(text: str) -> list[str]:
    """Slurm's host list syntax: ``gpu-[01-03,7]`` -> gpu-01, gpu-02, gpu-03, gpu-7."""
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        match = re.fullmatch(r"([A-Za-z][\w.-]*)\[([\d,\s-]+)\]([\w.-]*)", part.strip())
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


def apply_rule(rule: Rule, text: str) -> str:
    """``text`` with ``rule`` alone applied, as the redactor of a bundle of that text would."""
    redactor = Redactor([text], [], [])
    lined = LinedText(text)
    redactor.apply(rule, lined)
    return lined.text


class Redactor:
    """Replace what a site would not share in strings, by rule, counting per kind."""

    def __init__(self, texts: Iterable[str], inventory_hosts: list[str],
                 inventory_uuids: list[str], partitions: bool = False) -> None:
        """Collect the names ``texts`` reveal and build the rules that replace them.

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
        self.addresses: dict[str, dict[str, str]] = {}
        found = self._collect(lined)
        hosts = self._hosts(found["hosts"], inventory_hosts)
        uuids = [m.group(2).lower() for u in inventory_uuids for m in UUIDS.pattern.finditer(u)]
        for t in lined:
            uuids += [m.group(2).lower() for _, _, m in t.finditer(UUIDS.pattern, UUIDS.hint)]
        self.uuids = {u: f"uuid-{i}" for i, u in enumerate(dict.fromkeys(uuids))}
        self.serials = {s: f"serial-{i}" for i, s in enumerate(sorted(found["serials"]))}
        users = sorted(found["users"] | self._me(), key=len, reverse=True)
        self._rules = [
            *SECRET_RULES, *PERSON_RULES, *DEVICE_RULES,
            *(_word("device serials", s, p) for s, p in self.serials.items()),
            NODE_LIST,
            *(self._host_rule(h, name) for h, name in hosts),
            *self._host_families([h for h, _ in hosts]),
            *HOST_RULES,
            *(_word("accounts", a, "<account>") for a in found["accounts"]),
            *(_word("partitions", p, "<partition>") for p in found["partitions"] if partitions),
            *(_word("user names", u, "<user>") for u in users),
            *IP_RULES,
        ]

    @staticmethod
    def _collect(lined: list[LinedText]) -> dict[str, set[str]]:
        """The names each kind of :data:`SOURCES` finds in the texts."""
        found: dict[str, set[str]] = {s.kind: set() for s in SOURCES}
        for source in SOURCES:
            for t in lined:
                for _, _, m in t.finditer(source.pattern, source.hint):
                    found[source.kind].update(name for name in m.groups() if name)
        found["partitions"] = {p for name in found["partitions"] for p in name.split(",") if p}
        return {kind: {n for n in names if len(n) > 1 and n.lower() not in _NOT_NAMES}
                for kind, names in found.items()}

    @staticmethod
    def _me() -> set[str]:
        """The user redacting, unless root or unknown."""
        try:
            me = getpass.getuser()
        except (KeyError, OSError):  # a container uid with no passwd entry and no $USER
            return set()
        return {me} if len(me) > 1 and me.lower() not in _NOT_NAMES else set()

    @staticmethod
    def _hosts(seen_hosts: set[str], inventory: list[str]) -> list[tuple[str, str]]:
        """Every host name seen, with its pseudonym: node<N> for the inventory's, else
        host<K>; a FQDN's first label stands for it too."""
        seen: dict[str, str] = {}
        for n, host in enumerate(inventory):
            if host and host.lower() not in _NOT_NAMES:
                seen.setdefault(host.split(".")[0].lower(), f"node{n}")
        extra = [name for value in seen_hosts
                 for name in expand_node_list(value.rsplit(":", 1)[0])]
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
    def _host_rule(short: str, name: str) -> Rule:
        return Rule("host names", "a collected host, with any domain",
                    re.compile(rf"(?i)(?<![\w.-]){re.escape(short)}(?:\.[A-Za-z0-9-]+)*"
                               r"(?![\w-])"), name, Hint((short,)))

    @staticmethod
    def _host_families(hosts: list[str]) -> list[Rule]:
        """``gpu-node-17`` known: every ``gpu-node-<digits>`` is a host of the same cluster."""
        families: dict[str, str] = {}
        for host in hosts:
            stem = re.sub(r"\d+", r"\\d+", re.escape(host))
            if (stem != re.escape(host) and len(re.sub(r"\d", "", host)) >= 3
                    and not any(re.fullmatch(stem, own) for own in ("node1", "host1"))):
                families.setdefault(stem, host)
        return [Rule("host names", "a host of a collected host's family",
                     re.compile(rf"(?i)(?<![\w.-]){stem}(?:\.[A-Za-z0-9-]+)*(?![\w-])"), "<host>",
                     Hint((max(re.split(r"\d+", host), key=len),)))  # in every name of it
                for stem, host in sorted(families.items())]

    def apply(self, rule: Rule, text: LinedText) -> None:
        """Apply one rule to ``text``, counting the matches it changed."""
        def counted(match: re.Match[str]) -> str:
            new = (rule.replacement(self, match) if callable(rule.replacement)
                   else match.expand(rule.replacement))
            if new != match.group(0):
                self.counts[rule.kind] += 1
            return new
        text.subn(rule.pattern, rule.hint, counted)

    def text(self, text: str) -> str:
        """Return ``text`` with every rule applied."""
        lined = LinedText(text)
        for rule in self._rules:
            self.apply(rule, lined)
        return lined.text

    def json(self, value: Any, key: str = "") -> Any:
        """A copy of a JSON value with :meth:`text` applied to every string; the value of a key
        named like a secret is hidden whole, and of an option like ``--hf-token`` that stands
        alone in a list, the next item."""
        if isinstance(value, str):
            if key and re.fullmatch(SECRET_NAME, key, re.I):
                self.counts["secrets"] += 1
                return "<secret>"
            if key and _SERIAL_KEY.search(key) and value in self.serials:
                self.counts["device serials"] += 1
                return self.serials[value]
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
        """One line per kind of rule applied, for the bundle's ``redaction.removed``."""
        return [f"{line} ({self.counts[kind]} replaced)" for kind, line in KINDS.items()
                if kind != "partitions" or self.partitions]
