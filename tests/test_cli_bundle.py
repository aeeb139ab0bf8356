"""`bundle show|verify`, `workloads` and `platforms` through the CLI, on a real CPU run's bundle."""

import json
import shutil
from pathlib import Path

import pytest


@pytest.fixture
def real_bundle(cpu_bundle) -> Path:
    return cpu_bundle


@pytest.fixture
def copy(real_bundle, tmp_path) -> Path:
    dest = tmp_path / real_bundle.name
    shutil.copytree(real_bundle, dest)
    return dest


def test_verify_and_show_a_good_bundle(cli, real_bundle):
    r = cli("bundle", "verify", str(real_bundle))
    assert r.returncode == 0 and r.stdout.startswith("ok  ")
    r = cli("bundle", "show", str(real_bundle))
    assert r.returncode == 0 and "gpt3-tiny" in r.stdout and "n/a" in r.stdout


@pytest.mark.parametrize(
    "tamper, needle",
    [
        (lambda b: (b / "metrics.json").write_text((b / "metrics.json").read_text() + " "),
         "metrics.json"),
        (lambda b: (b / "logs" / "rank0.log").unlink(), "logs/rank0.log"),
        (lambda b: (b / "notes.txt").write_text("added"), "notes.txt"),
        (lambda b: (b / "steps.parquet").write_bytes(b"not parquet"), "steps.parquet"),
    ],
)
def test_verify_names_the_tampered_file(cli, copy, tamper, needle):
    tamper(copy)
    r = cli("bundle", "verify", str(copy))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_show_refuses_a_truncated_bundle_in_verify_s_words(cli, copy):
    """A steps.parquet cut short (a copy that stopped): show says what verify says, or, asked
    to show it anyway, shows it under a warning."""
    steps = copy / "steps.parquet"
    steps.write_bytes(steps.read_bytes()[: steps.stat().st_size // 2])
    verify = cli("bundle", "verify", str(copy))
    r = cli("bundle", "show", str(copy))
    assert r.returncode == verify.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(verify.stderr.rstrip("\n") + "; ")
    assert "steps.parquet" in r.stderr and "--allow-unverified" in r.stderr
    r = cli("bundle", "show", str(copy), "--allow-unverified")
    assert r.returncode == 0 and "gpt3-tiny" in r.stdout
    assert r.stderr == f"warning: unverified: bundle {copy}: checksum mismatch: steps.parquet\n"


def test_verify_catches_a_manifest_that_fails_the_schema(cli, copy):
    """Edit the manifest and re-hash it, so only the schema check can notice."""
    import hashlib

    m = json.loads((copy / "manifest.json").read_text())
    m["status"] = "mostly fine"
    (copy / "manifest.json").write_text(json.dumps(m))
    digest = hashlib.sha256((copy / "manifest.json").read_bytes()).hexdigest()
    sums = [ln if not ln.endswith("  manifest.json") else f"{digest}  manifest.json"
            for ln in (copy / "SHA256SUMS").read_text().splitlines()]
    (copy / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    r = cli("bundle", "verify", str(copy))
    assert r.returncode == 2 and "manifest.json" in r.stderr and "status" in r.stderr


def test_listing_commands(cli):
    r = cli("workloads", "list")
    assert r.returncode == 0 and "mixtral-8x22b" in r.stdout and "gpt3-tiny" in r.stdout
    r = cli("workloads", "show", "llama3-70b")
    assert r.returncode == 0 and "28672" in r.stdout
    fields = {line.split()[0] for line in r.stdout.splitlines()}
    assert "rope_theta" in fields and not fields & {"num_experts", "moe_top_k"}  # dense, RoPE
    r = cli("workloads", "show", "gpt3-tiny")
    fields = {line.split()[0] for line in r.stdout.splitlines()}
    assert r.returncode == 0 and not fields & {"num_experts", "moe_top_k", "rope_theta"}
    r = cli("workloads", "show", "mixtral-8x7b")
    assert r.returncode == 0 and {"num_experts", "moe_top_k"} <= {
        line.split()[0] for line in r.stdout.splitlines()}
    r = cli("platforms", "list")
    assert r.returncode == 0 and "989" in r.stdout
    r = cli("platforms", "show", "mi250")
    assert r.returncode == 0 and "scaling" in r.stdout
    r = cli("platforms", "detect")
    assert r.returncode == 0 and r.stdout.startswith("cpu")
