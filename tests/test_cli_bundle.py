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


def test_compare_of_a_results_folder_reads_the_bundles_in_it(cli, copy, tmp_path):
    """``compare results`` (the folder, not results/*): its bundles, said in a note; a folder
    with none is one line, exit 2."""
    (tmp_path / f".{copy.name}.partial").mkdir()  # a staging folder is no bundle
    r = cli("compare", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [[Path(b).name for b in g["bundles"]] for g in out["groups"]] == [[copy.name]]
    assert any(f"folder {tmp_path}: its 1 bundles" in c["message"] for c in out["checks"])
    (tmp_path / "empty").mkdir()
    r = cli("compare", str(tmp_path / "empty"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "neither a bundle nor a folder of bundles" in r.stderr


def test_show_compare_and_report_show_the_host_cpu_and_memory(cli, real_bundle, tmp_path):
    """A CPU run has no device figures: its host CPU share and memory are shown instead of
    nothing, as telemetry.parquet's host rows give them over the measured steps."""
    import pyarrow.parquet as pq

    host = pq.read_table(real_bundle / "telemetry.parquet").to_pandas()
    host = host[host["source"] == "host"]
    r = cli("bundle", "show", str(real_bundle))
    shown = dict(line.split() for line in r.stdout.splitlines()
                 if line.startswith("host_") and len(line.split()) == 2)
    assert 0 < float(shown["host_cpu_util_pct_mean"]) <= 100, r.stdout
    peak_gib = host["host_mem_used_bytes"].max() / 2**30
    assert 0 < float(shown["host_mem_used_gib_peak"]) <= peak_gib * 1.001
    r = cli("compare", str(real_bundle), "--format", "json")
    metrics = json.loads(r.stdout)["groups"][0]["metrics"]
    assert metrics["host.cpu_util_pct_mean"]["median"] == pytest.approx(
        float(shown["host_cpu_util_pct_mean"]), rel=1e-3)
    assert metrics["host.mem_used_gib_peak"]["median"] > 0
    r = cli("report", str(real_bundle), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert "host CPU busy, mean" in html and "host memory used, peak" in html


def test_bare_command_shows_the_help_and_exits_0(cli):
    r = cli()
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("Usage: charllm-kit") and "Commands:" in r.stdout


def test_verify_decodes_the_data_pages_that_compare_and_report_read(cli, copy):
    """Bytes flipped inside a steps.parquet data page, SHA256SUMS re-hashed: the footer and
    schema still read, only decoding the pages notices; verify says so before report does."""
    import hashlib

    import pyarrow.parquet as pq

    steps = copy / "steps.parquet"
    column = pq.ParquetFile(steps).metadata.row_group(0).column(2)
    data = bytearray(steps.read_bytes())
    middle = column.data_page_offset + column.total_compressed_size // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    steps.write_bytes(bytes(data))
    digest = hashlib.sha256(bytes(data)).hexdigest()
    sums = [ln if not ln.endswith("  steps.parquet") else f"{digest}  steps.parquet"
            for ln in (copy / "SHA256SUMS").read_text().splitlines()]
    (copy / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    r = cli("bundle", "verify", str(copy))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "steps.parquet is not readable parquet" in r.stderr


def test_listing_commands(cli):
    r = cli("workloads", "list")
    assert r.returncode == 0 and "mixtral-8x22b" in r.stdout and "gpt3-tiny" in r.stdout
    sizes = {line.split()[0]: line.split()[2] for line in r.stdout.splitlines()[2:]}
    assert (sizes["gpt3-tiny"], sizes["mixtral-tiny"], sizes["gpt3-small"],
            sizes["gpt3-175b"]) == ("941K", "1.15M", "125M", "175B")
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
