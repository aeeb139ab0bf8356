"""The replay backend: recorded real NVML traces through the sampler and a real multi-rank run."""

import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit.bundle.verify import verify_bundle
from kit.bundle.writer import concat_chunks
from kit.errors import BundleError
from kit.telemetry.replay import ReplaySource
from kit.telemetry.sampler import TelemetrySampler

from .conftest import REPO, why_failed

TRACE = "tests/data/traces/h100-gpt3-1.3b.parquet"


def test_replay_source_emits_the_recorded_rows_on_the_live_clock(tmp_path):
    sampler = TelemetrySampler([("replay", {"node": 0, "trace": TRACE})], interval_ms=20,
                               chunks_dir=tmp_path)
    t0 = time.time()
    sampler.start()
    time.sleep(1.0)
    report = sampler.stop()
    rows = concat_chunks(tmp_path).to_pylist()
    assert report.errors == [] and len(rows) >= 20
    assert all(r["source"] == "gpu" and r["device"] == 0 and r["t"] >= t0 for r in rows)
    recorded = pq.read_table(REPO / TRACE).to_pylist()
    recorded_power = {r["power_w"] for r in recorded if r["source"] == "gpu"}
    assert {r["power_w"] for r in rows} <= recorded_power
    assert report.devices["replay"][0]["power_limit_w"] == 700.0
    assert report.sources["replay"]["power_w"].readable
    assert not report.sources["replay"]["link_tx_bytes"].readable  # one H100: no NVLink


@pytest.mark.parametrize("trace", ["h100-gpt3-1.3b", "h200-gpt3-1.3b"])
def test_recorded_traces_decode_power_cap_throttling(trace):
    rows = pq.read_table(REPO / "tests/data/traces" / f"{trace}.parquet").to_pylist()
    gpu = [r for r in rows if r["source"] == "gpu"]
    assert {r["throttle"] for r in gpu} <= {0, 1}  # 1 = the kit's power_cap bit
    assert any(r["throttle"] == 1 for r in gpu)


H100_WRAPPED = REPO / "tests/data/bundles/20261122T094016Z-gpt3-1.3b-h100-e955a2"
"""An H100 bundle recorded before NVML's 32-bit PCIe counters were unwrapped: its pcie_tx_bytes
drops by 2^32 - 386,552 bytes 32 s into the run (issue 19). Kept unedited as the recorded case
verify must refuse; tests/data/bundles/telemetry/ holds the run that replaced it."""


@pytest.mark.parametrize("bundle", sorted((REPO / "tests/data/bundles/telemetry").iterdir()))
def test_committed_gpu_bundles_verify(bundle):
    verify_bundle(bundle)


def test_a_recorded_counter_that_went_backwards_fails_verification():
    bundle = H100_WRAPPED
    with pytest.raises(BundleError) as err:
        verify_bundle(bundle)
    assert str(err.value) == (
        f"bundle {bundle}: telemetry.parquet: cumulative counter pcie_tx_bytes goes backwards "
        "on node 0 device 0 at t=1795340449.423 (388895440 -> -3905685304)")


def test_replay_loops_keep_cumulative_counters_counting():
    """Past the trace's end, energy and bytes go on from where it ended, never backwards."""
    source = ReplaySource(node=0, trace="tests/data/traces/h200-gpt3-1.3b.parquet", speed=50.0)
    rows = [r for i in range(300) for r in source.sample(1_000.0 + 0.01 * i)]  # 3 loops
    recorded = pq.read_table(REPO / "tests/data/traces/h200-gpt3-1.3b.parquet").to_pylist()
    energy = [r["energy_j"] for r in recorded if r["source"] == "gpu"]
    for name in ("energy_j", "pcie_rx_bytes", "viol_power_s"):
        values = [r[name] for r in rows]
        assert values == sorted(values), name
    assert rows[-1]["energy_j"] > 2 * (energy[-1] - energy[0]) + energy[0]


@pytest.mark.training
def test_multi_rank_run_with_host_and_replay_telemetry(cli, tmp_path):
    r = cli("run", "gpt3-tiny", "--platform", "tests/data/platforms/cpu-replay-h100.yaml",
            "--tp", "2", "--steps", "4", "--warmup", "1", "--out", str(tmp_path))
    assert r.returncode == 0, why_failed(r)
    bundle = Path(r.stdout.strip().splitlines()[-1])
    verify_bundle(bundle)
    tele = pq.read_table(bundle / "telemetry.parquet").to_pylist()
    assert {t["source"] for t in tele} == {"gpu", "host"}
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["telemetry_sources"]["power_w"]["source"] == "replay"
    assert m["telemetry_sources"]["cpu_util_pct"]["source"] == "host"
    assert m["inventory"][0]["gpus"] == []  # a replayed trace does not describe this node
    summary = json.loads((bundle / "metrics.json").read_text())["summary"]
    assert summary["power_w_mean"] > 0 and summary["energy_j_per_token"] > 0


@pytest.mark.training
def test_a_broken_backend_leaves_the_run_and_bundle_intact(cli, tmp_path):
    """A replay backend whose trace is corrupt: host telemetry goes on, the run ends ok."""
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"PAR1 this is not a parquet file")
    platform = tmp_path / "cpu-broken.yaml"
    platform.write_text(
        (REPO / "tests/data/platforms/cpu-replay-h100.yaml").read_text()
        .replace("tests/data/traces/h100-gpt3-1.3b.parquet", str(bad))
    )
    r = cli("run", "gpt3-tiny", "--platform", str(platform), "--steps", "2", "--warmup", "1",
            "--out", str(tmp_path / "out"))
    assert r.returncode == 0, why_failed(r)
    bundle = Path(r.stdout.strip().splitlines()[-1])
    verify_bundle(bundle)
    notes = json.loads((bundle / "metrics.json").read_text())["notes"]
    assert any("replay" in n for n in notes), notes
    tele = pq.read_table(bundle / "telemetry.parquet").to_pylist()
    assert tele and {t["source"] for t in tele} == {"host"}
