"""``bundle pack --redact``: a bundle seeded with everything a site would not share, packed, and
the archive searched for each seed in every form; the redacted bundle still verifies. Each rule
of kit.bundle.redact_rules does what its cases say, and its hint is in every match."""

import gzip
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kit.bundle import redact_scan
from kit.bundle.redact_parquet import redact_parquet
from kit.bundle.redact_rules import (
    DEVICE_RULES,
    HOST_RULES,
    IP_RULES,
    NODE_LIST,
    PERSON_RULES,
    SECRET_RULES,
    SOURCES,
    Redactor,
    apply_rule,
)
from kit.bundle.redact_scan import Hint, LinedText
from tests.conftest import why_failed
from tests.hostile_bundles import copy_bundle, edit_json, reseal

INVENTORY_UUID = "GPU-618c5ede-81ec-b472-43ee-23bfe3919b57"
OTHER_UUID = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
SEEDS = {
    "hf token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    "api key": "0f9e8d7c6b5a4f3e2d1c",
    "password": "hunter2pass",
    "option token": "zz-token-value-77",
    "account": "proj-secret42",
    "partition": "gpu-special",
    "scratch user": "bobsmith",
    "work user": "dave7x",
    "home user": "alicew",
    "e-mail": "carol.jones@uni-example.de",
    "e-mail domain": "uni-example.de",
    "extra host": "login07",
    "domain": "hpc.example.edu",
    "inventory host": "gpu-node-17",
    "node list member": "gpu-node-19",
    "family member": "gpu-node-42",
    "node list": "gpu-node-[17-20]",
    "inventory domain": "cluster.example.org",
    "ipv4": "10.20.30.40",
    "ipv6": "fd00::1234",
    "inventory uuid": "618c5ede-81ec-b472-43ee-23bfe3919b57",
    "other uuid": "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
    "serial": "1652422012345",
    # issue 60, item 8
    "aws temporary key": "ASIAY34FZKBOKMUTVV7A",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
    "hf org token": "api_org_AbCdEfGhIjKlMnOpQrStUvWx",
    "postgres password": "Pg5ecretPW",
    "url password": "pa!ss9Tail",
    "url password tail": "ss9Tail",
    "password after ;": "b2Tail",
    "option -X value": "Xsecret9",
    "openssh key body": "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ",
    "user at host": "gwenq@",
    "host after user": "dtn03",
    "ip before a full stop": "10.9.8.7",
    "aws host": "ip-10-0-0-5",
    ".de host": "rz-muster.de",
    ".ch host": "hpc-lab.ch",
    "nccl prefix host": "frontier07",
    "nccl host family": "frontier11",
    "single node list": "nid[001240]",
    "cray node": "nid001240",
    "windows user": "\\users\\x\\",
    "pscratch user": "erinys",
    "global homes user": "frankz",
    "uid user": "ginah",
    "tilde user": "harryp",
    "board serial": "PKG1234567",
    "SN serial": "99887766",
    "mac": "0c:42:a1:12:34:56",
    "ib guid": "248a:0703:00a1:b2c3",
    "ib guid 0x": "248a070300a1b2c4",
}
SBATCH = f"""#!/bin/bash
#SBATCH --account={SEEDS['account']}
#SBATCH --partition={SEEDS['partition']}
#SBATCH --nodelist={SEEDS['node list']}
#SBATCH --chdir=/scratch/{SEEDS['scratch user']}/runs
export HF_TOKEN={SEEDS['hf token']}
export WANDB_API_KEY="{SEEDS['api key']}"
export DB_PASSWORD='{SEEDS['password']}'
srun charllm-kit run gpt3-tiny --out /home/{SEEDS['home user']}/out
"""
LOG = f"""mail to {SEEDS['e-mail']} when done
SLURMD_NODENAME={SEEDS['extra host']}
SLURM_SUBMIT_HOST={SEEDS['extra host'].upper()}.{SEEDS['domain']}
rendezvous {SEEDS['inventory host'].upper()}.{SEEDS['inventory domain']} {SEEDS['ipv4']}:29500
peer {SEEDS['node list member']} and {SEEDS['family member']} via {SEEDS['ipv6']}
devices {INVENTORY_UUID} {OTHER_UUID.lower()} {OTHER_UUID.upper()}
Serial Number : {SEEDS['serial']}
cache /work/{SEEDS['work user']}/cache
sts {SEEDS['aws temporary key']} {SEEDS['hf org token']}
X-Session: {SEEDS['jwt']}
db postgres://app:{SEEDS['postgres password']}@db01:5432/runs
hub https://erin:{SEEDS['url password']}@hub.example.de/x
DB_PASSWORD=a1x;{SEEDS['password after ;']} and
trainer --api-key -{SEEDS['option -X value']} --v
-----BEGIN OPENSSH PRIVATE KEY-----
{SEEDS['openssh key body']}
-----END OPENSSH PRIVATE KEY-----
ssh {SEEDS['user at host']}{SEEDS['host after user']}
connected to {SEEDS['ip before a full stop']}.
from {SEEDS['aws host']} via login2.{SEEDS['.de host']} and gw.{SEEDS['.ch host'].upper()}
{SEEDS['nccl prefix host']}:2841:2841 [0] NCCL INFO Bootstrap : Using ib0
NCCL peer {SEEDS['nccl host family']}
on {SEEDS['single node list']} ({SEEDS['cray node']})
C:\\Users\\x\\proj /pscratch/sd/e/{SEEDS['pscratch user']}/r
/global/homes/f/{SEEDS['global homes user']}
id: uid=1001({SEEDS['uid user']}) gid=1001 and ~{SEEDS['tilde user']}/data
{{"board_serial": "{SEEDS['board serial']}"}} SN: {SEEDS['SN serial']}
link/ether {SEEDS['mac'].upper()} brd ff:ff:ff:ff:ff:ff node_guid {SEEDS['ib guid']}
Port GUID: 0x{SEEDS['ib guid 0x']}
kept: kit.engines.megatron steps.parquet torch.nn tokens_per_s
"""


def _seed(manifest: dict) -> None:
    node = manifest["inventory"][0]
    node["host"] = f"{SEEDS['inventory host']}.{SEEDS['inventory domain']}"
    node["gpus"][0]["serial"] = SEEDS["serial"]
    node["gpus"][0]["board_serial"] = SEEDS["board serial"]
    manifest["command"] += ["--hf-token", SEEDS["option token"]]


PARQUET_SEEDS = ("gpu-node-42", "alicew", "10.20.30.40", "rz-muster.de", "0c:42:a1:12:34:56")


def _seed_parquet(bundle: Path) -> None:
    """Names in steps.parquet's key-value metadata (the footer's and a column's)."""
    table = pq.read_table(bundle / "steps.parquet")
    field = table.schema.field(0)
    field = field.with_metadata({**(field.metadata or {}), b"origin": b"/home/alicew/x.py"})
    schema = table.schema.set(0, field).with_metadata({
        "written_on": "gpu-node-42 (10.20.30.40), mail alicew@rz-muster.de",
        "nic": "0c:42:a1:12:34:56"})
    with pq.ParquetWriter(bundle / "steps.parquet", schema) as writer:
        writer.write_table(table.cast(schema))
        writer.add_key_value_metadata({"footer_only": "ssh alicew@gpu-node-42"})
    reseal(bundle)


def _parquet_words(path: Path) -> str:
    """Every key and value of a parquet file's metadata, the footer's (in the Arrow schema and
    beside it) and each column's."""
    schema = pq.read_schema(path)
    metas = [pq.read_metadata(path).metadata, schema.metadata or {},
             *(f.metadata or {} for f in schema)]
    return " ".join(b.decode() for meta in metas for kv in meta.items() for b in kv)


def test_redacted_pack_removes_every_seeded_secret_and_still_verifies(cli, tmp_path):
    bundle = copy_bundle(tmp_path / "src")
    (bundle / "job").mkdir()
    (bundle / "job" / "sbatch.sh").write_text(SBATCH)
    with (bundle / "logs" / "rank0.log").open("a") as log:
        log.write(LOG)
    edit_json(bundle, "manifest.json", _seed)
    _seed_parquet(bundle)
    assert cli("bundle", "verify", str(bundle)).returncode == 0

    archive = tmp_path / "r.tar.gz"
    r = cli("bundle", "pack", str(bundle), "--redact", "--redact-partitions", "-o", str(archive))
    assert r.returncode == 0, why_failed(r)
    data = gzip.decompress(archive.read_bytes()).lower()
    left = [kind for kind, seed in SEEDS.items() if seed.lower().encode() in data]
    assert not left, left

    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))  # verifies it
    assert r.returncode == 0, why_failed(r)
    redacted = Path(r.stdout.strip())
    manifest = json.loads((redacted / "manifest.json").read_text())
    assert manifest["inventory"][0]["host"] == "node0"
    assert manifest["inventory"][0]["gpus"][0]["uuid"] == "GPU-uuid-0"
    assert manifest["inventory"][0]["gpus"][0]["serial"] == "serial-0"
    log = (redacted / "logs" / "rank0.log").read_text()
    assert "devices gpu-uuid-0 gpu-uuid-1 gpu-uuid-1" in log.lower()  # devices stay distinct
    script = (redacted / "job" / "sbatch.sh").read_text()
    assert "export HF_TOKEN=<secret>" in script and "#SBATCH --account=<account>" in script
    assert "kept: kit.engines.megatron steps.parquet torch.nn tokens_per_s" in log
    assert "link/ether mac-0 brd ff:ff:ff:ff:ff:ff node_guid guid-0\nPort GUID: guid-1" in log
    words = _parquet_words(redacted / "steps.parquet")
    assert "written_on" in words and "origin" in words and "footer_only" in words
    assert not [seed for seed in PARQUET_SEEDS if seed in words], words
    assert pq.read_table(redacted / "steps.parquet").equals(pq.read_table(bundle / "steps.parquet"))
    rules = manifest["redaction"]["removed"]
    assert len(rules) == 10 and rules[2].startswith("partitions: "), rules
    assert all(not r.endswith("(0 replaced)") for r in rules), rules


def test_a_real_cpu_run_packed_redacted_still_verifies_and_keeps_its_metrics(cli, cpu_bundle,
                                                                           tmp_path):
    archive = tmp_path / "r.tar.gz"
    r = cli("bundle", "pack", str(cpu_bundle), "--redact", "-o", str(archive))
    assert r.returncode == 0, why_failed(r)
    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))  # verifies it
    assert r.returncode == 0, why_failed(r)
    redacted = Path(r.stdout.strip())
    assert cli("bundle", "verify", str(redacted)).returncode == 0
    assert (json.loads((redacted / "metrics.json").read_text())
            == json.loads((cpu_bundle / "metrics.json").read_text()))
    for table in ("steps.parquet", "telemetry.parquet"):  # the kit's own: copied as they are
        assert (redacted / table).read_bytes() == (cpu_bundle / table).read_bytes(), table
    manifest = json.loads((redacted / "manifest.json").read_text())
    assert manifest["redaction"]["replacements"] > 0
    assert manifest["command"][0].endswith("/kit/__main__.py"), manifest["command"]
    shown = [cli("bundle", "show", str(b)) for b in (cpu_bundle, redacted)]
    assert all(r.returncode == 0 for r in shown), [why_failed(r) for r in shown]
    metrics = [r.stdout[r.stdout.index("\nmetric "):] for r in shown]
    assert "tokens_per_s" in metrics[0] and metrics[1] == metrics[0]


def test_parquet_strings_are_redacted_row_group_by_row_group_and_the_kits_words_kept(tmp_path):
    src, dest = tmp_path / "a.parquet", tmp_path / "b.parquet"
    with pq.ParquetWriter(src, pa.schema([("source", pa.string()), ("x", pa.int64())])) as w:
        w.write_table(pa.table({"source": ["gpu", "on gpu-node-42", None], "x": [1, 2, 3]}))
        w.write_table(pa.table({"source": ["host", "gpu-node-42"], "x": [4, 5]}))
    redactor = Redactor([], ["gpu-node-42"], [])
    assert redact_parquet(src, dest, redactor.text)
    assert pq.ParquetFile(dest).num_row_groups == 2
    assert pq.read_table(dest).to_pydict() == {
        "source": ["gpu", "on node0", None, "host", "node0"], "x": [1, 2, 3, 4, 5]}
    assert not redact_parquet(dest, tmp_path / "c.parquet", redactor.text)  # nothing left
    assert (tmp_path / "c.parquet").read_bytes() == dest.read_bytes()


RULES = [*SECRET_RULES, *PERSON_RULES, *DEVICE_RULES, NODE_LIST, *HOST_RULES, *IP_RULES]
CASES = [(rule, text, want) for rule in RULES for text, want in rule.cases]


def _holds_hint(hint: Hint | None, text: str, match: re.Match[str]) -> bool:
    """Whether the hint is inside the match's first line, as kit.bundle.redact_scan needs."""
    if hint is None:
        return True
    first = text[match.start():match.end()].split("\n")[0]
    return (any(word in first.lower() for word in hint.literals)
            or (hint.witness is not None and any(
                match.start() <= w.start() < match.start() + len(first)
                for w in hint.witness.finditer(text))))


@pytest.mark.parametrize(("rule", "text", "want"), CASES,
                         ids=[f"{r.kind}: {t[:30]}" for r, t, _ in CASES])
def test_each_rule_redacts_its_cases_and_its_hint_is_in_every_match(rule, text, want):
    assert apply_rule(rule, text) == want
    for match in rule.pattern.finditer(text):
        assert _holds_hint(rule.hint, text, match), (rule.protects, match.group(0))


def test_every_rule_has_cases_and_a_hint_or_a_literal_start():
    for rule in RULES:
        assert rule.cases, rule.protects
        assert rule.hint is not None or rule.pattern.pattern.startswith("-----BEGIN"), rule.protects
    for source in SOURCES:
        assert source.cases and (source.hint.literals or source.hint.witness), source.protects


@pytest.mark.parametrize("source", SOURCES, ids=[s.protects[:30] for s in SOURCES])
def test_each_source_collects_the_names_of_its_cases_and_its_hint_is_in_every_match(source):
    for text, names in source.cases:
        lined = LinedText(text)
        assert {n for _, _, m in lined.finditer(source.pattern, source.hint)
                for n in m.groups() if n} >= set(names), text
        for match in source.pattern.finditer(text):
            assert _holds_hint(source.hint, text, match), (source.protects, match.group(0))


def test_a_large_text_searched_by_hinted_lines_is_redacted_as_if_searched_whole(monkeypatch):
    """Every rule's cases spread over a text larger than redact_scan.LARGE, among lines of a
    profile trace's kind, come out as a search of the whole text makes them."""
    seeds = [text for _, text, _ in CASES] + [text for s in SOURCES for text, _ in s.cases]
    filler = ['  "name": "aten::transpose.int", "args": {"Input Dims": [[2, 8]]},',
              '  "name": "model.py(123): forward", "ts": 1765001240.5, "dur": 12.25,']
    lines = []
    for i in range(4000):
        lines.append(filler[i % 2])
        if i % 50 == 0 and seeds:
            lines.append(seeds.pop())
    text = "\n".join(lines)
    assert not seeds and len(text) > redact_scan.LARGE

    def redact() -> tuple[str, dict]:
        redactor = Redactor([text], ["gpu-node-17"], [], partitions=True)
        return redactor.text(text), dict(redactor.counts)

    hinted = redact()
    monkeypatch.setattr(redact_scan, "LARGE", len(text) + 1)
    assert hinted == redact()
    assert 'aten::transpose.int' in hinted[0] and "model.py(123)" in hinted[0]
