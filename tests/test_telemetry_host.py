"""Host telemetry and the sampler process, run for real (spawned processes, real files)."""

import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from kit.bundle.telemetry_fields import TELEMETRY_ARROW_SCHEMA, TELEMETRY_COLUMNS, make_row
from kit.bundle.writer import concat_chunks as read_chunks
from kit.errors import KitInputError
from kit.telemetry import (
    SOURCES,
    TelemetryError,
    TelemetryNotSupportedError,
    TelemetrySource,
    build_source,
    register_source,
)
from kit.telemetry.base import FieldInfo
from kit.telemetry.host import HostSource, RaplPackagePower
from kit.telemetry.sampler import SamplerReport, TelemetrySampler


class FlakySource(TelemetrySource):
    """A GPU-like source whose reads fail after ``ok_samples`` of them, like a lost device."""

    name = "flaky"

    def __init__(self, node: int, ok_samples: int) -> None:
        self._node = node
        self._left = ok_samples

    def fields(self) -> dict[str, FieldInfo]:
        """Power only."""
        return {"power_w": FieldInfo(True)}

    def sample(self, t: float) -> list[dict[str, Any]]:
        """One GPU row, or the error once the good samples are used up."""
        if self._left == 0:
            raise TelemetryError("GPU 0 fell off the bus")
        self._left -= 1
        return [make_row(t, self._node, 0, "gpu", power_w=300.0)]

    def close(self) -> None:
        """Nothing to release."""


class UnsupportedSource(TelemetrySource):
    """A source that cannot run on this host, as NVML on a CPU machine."""

    name = "unsupported"

    def __init__(self) -> None:
        raise TelemetryNotSupportedError("no such driver on this host")

    def fields(self) -> dict[str, FieldInfo]:
        """Never reached: the constructor raises."""
        return {}

    def sample(self, t: float) -> list[dict[str, Any]]:
        """Never reached: the constructor raises."""
        return []

    def close(self) -> None:
        """Nothing to release."""


def run_sampler(
    chunks_dir: Path, sources: list, seconds: float, **kw: Any
) -> tuple[SamplerReport, list[dict[str, Any]]]:
    """Sample for ``seconds`` and return the report and every row written."""
    sampler = TelemetrySampler(sources, chunks_dir=chunks_dir, **kw)
    sampler.start()
    time.sleep(seconds)
    report = sampler.stop()
    return report, read_chunks(chunks_dir).to_pylist()


def test_host_sampler_rows_columns_and_period(tmp_path: Path) -> None:
    """Host rows at 20 ms have every column, the measured fields, and a period on the 20 ms
    grid: each tick of the time sampled taken or counted as missed (a loaded host misses some;
    how many is not this test's business)."""
    report, rows = run_sampler(tmp_path, [("host", {"node": 3})], 1.0, interval_ms=20)

    assert read_chunks(tmp_path).schema == TELEMETRY_ARROW_SCHEMA
    assert list(rows[0]) == list(TELEMETRY_COLUMNS)
    assert 5 <= len(rows) == report.rows_written == report.ticks
    span_s = rows[-1]["t"] - rows[0]["t"]
    assert report.mean_period_ms == pytest.approx(1000 * span_s / (len(rows) - 1), rel=1e-3)
    assert report.mean_period_ms >= 19.0  # never faster than asked
    # Periods of the grid between the first and the last tick: a tick is never early, and one
    # taken late (a descheduled sampler) is late by a few ms, not by the ticks it missed.
    grid = report.ticks - 1 + report.missed_ticks
    assert grid >= 35 and grid * 0.020 - 0.001 <= span_s <= (grid + 3) * 0.020, (grid, span_s)
    assert all(r["node"] == 3 and r["device"] is None and r["source"] == "host" for r in rows)
    # None means the kernel's CPU counters (10 ms ticks) did not advance since the last row: so
    # always for the first row, which follows the source's construction by microseconds, and
    # now and then under load, when a late tick is followed closely by the next.
    util = [r["cpu_util_pct"] for r in rows[1:] if r["cpu_util_pct"] is not None]
    assert len(util) >= 0.8 * len(rows[1:]) and all(0 <= u <= 100 for u in util)
    assert all(r["host_mem_used_bytes"] > 0 for r in rows)
    assert all(r["power_w"] is None and r["temp_gpu_c"] is None for r in rows)
    assert report.errors == []
    power = report.sources["host"]["cpu_power_w"]
    if power.readable:  # A host with readable RAPL: every row after the first has a power.
        assert all(r["cpu_power_w"] > 0 for r in rows[1:])
    else:
        assert all(r["cpu_power_w"] is None for r in rows)
        assert power.reason


def test_chunks_hold_all_rows_in_time_order(tmp_path: Path) -> None:
    """Full chunks of chunk_rows rows, a shorter last one, together all rows in order."""
    report, rows = run_sampler(
        tmp_path, [("host", {"node": 0})], 1.0, interval_ms=20, chunk_rows=10
    )

    chunk_files = sorted(tmp_path.glob("chunk-*.parquet"))
    assert [p.name for p in chunk_files[:2]] == ["chunk-000000.parquet", "chunk-000001.parquet"]
    # every 10 rows a chunk (how many rows 1 s gives depends on the host's load)
    assert len(chunk_files) == report.chunks == -(-report.rows_written // 10) >= 2
    sizes = [pq.read_metadata(p).num_rows for p in chunk_files]
    assert all(n == 10 for n in sizes[:-1]) and 1 <= sizes[-1] <= 10
    assert sum(sizes) == len(rows) == report.rows_written
    times = [r["t"] for r in rows]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert abs(times[0] - time.time()) < 30
    assert not list(tmp_path.glob("*.tmp"))


def register_for_this_test(monkeypatch: pytest.MonkeyPatch, name: str,
                           cls: type[TelemetrySource]) -> None:
    """``register_source``, undone when the test ends: the registry is the process's, and a
    name left behind would show up in other tests' lists of known sources."""
    monkeypatch.setitem(SOURCES, name, f"{cls.__module__}:{cls.__qualname__}")
    register_source(name, cls)


def test_failing_source_is_dropped_and_host_keeps_sampling(tmp_path: Path, monkeypatch) -> None:
    """A source that raises mid-run is recorded and dropped; the host goes on."""
    register_for_this_test(monkeypatch, "flaky", FlakySource)
    report, rows = run_sampler(
        tmp_path,
        [("flaky", {"node": 0, "ok_samples": 5}), ("host", {"node": 0})],
        1.0,
        interval_ms=20,
    )

    [error] = report.errors
    assert error.source == "flaky"
    assert error.message == "TelemetryError: GPU 0 fell off the bus"
    gpu_rows = [r for r in rows if r["source"] == "gpu"]
    host_rows = [r for r in rows if r["source"] == "host"]
    assert len(gpu_rows) == 5 and all(r["power_w"] == 300.0 for r in gpu_rows)
    assert len(host_rows) == report.ticks > 6  # the flaky source failed on the sixth tick
    assert sum(r["t"] > error.t for r in host_rows) >= 3
    assert report.sources["flaky"] == {"power_w": FieldInfo(True)}


def test_start_fails_when_no_source_can_run(tmp_path: Path, monkeypatch) -> None:
    """start() raises with the reason when no source can be built."""
    register_for_this_test(monkeypatch, "unsupported", UnsupportedSource)
    sampler = TelemetrySampler([("unsupported", {})], interval_ms=20, chunks_dir=tmp_path)
    with pytest.raises(TelemetryError, match="no such driver on this host"):
        sampler.start()


def test_bad_sampler_input_fails_loudly(tmp_path: Path) -> None:
    """Unknown names, bad periods and a used directory fail before sampling."""
    with pytest.raises(KitInputError, match="unknown telemetry source 'nvml-typo'"):
        TelemetrySampler([("nvml-typo", {})], interval_ms=20, chunks_dir=tmp_path)
    with pytest.raises(KitInputError, match="> 0"):
        TelemetrySampler([("host", {"node": 0})], interval_ms=0, chunks_dir=tmp_path)
    (tmp_path / "chunk-000000.parquet").write_bytes(b"")
    with pytest.raises(TelemetryError, match="already holds telemetry"):
        TelemetrySampler([("host", {"node": 0})], interval_ms=20, chunks_dir=tmp_path).start()


def test_sampler_ignores_ctrl_c(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C reaches the whole process group) leaves the sampler running."""
    sampler = TelemetrySampler([("host", {"node": 0})], interval_ms=20, chunks_dir=tmp_path)
    sampler.start()
    assert sampler.pid is not None
    signalled = time.time()
    os.kill(sampler.pid, signal.SIGINT)
    time.sleep(0.5)
    report = sampler.stop()
    assert report.errors == [] and report.complete and report.ended_by == "stop"
    rows = read_chunks(tmp_path).to_pylist()
    assert len(rows) == report.ticks and rows[-1]["t"] > signalled  # it sampled on after it


def test_sampler_memory_stays_flat_at_1ms(tmp_path: Path) -> None:
    """At 1 ms with 500-row chunks the sampler's peak RSS barely grows over 3000 rows (3 s on
    an idle host; it samples until then, however long a busy host takes)."""
    def written() -> int:
        return sum(pq.read_metadata(p).num_rows for p in tmp_path.glob("chunk-*.parquet"))

    sampler = TelemetrySampler([("host", {"node": 0})], interval_ms=1, chunk_rows=500,
                               chunks_dir=tmp_path)
    sampler.start()
    deadline = time.monotonic() + 120
    while written() < 3000 and time.monotonic() < deadline:
        time.sleep(0.2)
    report = sampler.stop()
    rows = read_chunks(tmp_path).to_pylist()

    assert len(rows) == report.rows_written >= 3000
    assert report.chunks >= -(-len(rows) // 500) >= 6  # also a chunk at least every 2 s
    assert 0 < report.rss_start_bytes <= report.rss_first_chunk_bytes <= report.rss_peak_bytes
    # After the first chunk (Parquet writer warm-up, 10-50 MiB depending on the pyarrow build)
    # memory must not grow with the rows written: 5+ more chunks add well under 16 MiB.
    assert report.rss_peak_bytes - report.rss_first_chunk_bytes < 16 * 2**20


def write_rapl_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int) -> None:
    """Write one powercap zone directory the way the kernel lays it out."""
    (root / zone).mkdir(parents=True, exist_ok=True)
    (root / zone / "name").write_text(f"{name}\n")
    (root / zone / "energy_uj").write_text(f"{energy_uj}\n")
    (root / zone / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_power_from_two_readings_with_wraparound(tmp_path: Path) -> None:
    """Package power sums packages only and handles a counter wrap."""
    max_uj = 262_143_328_850  # A real max_energy_range_uj value (Xeon package).
    write_rapl_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000, max_uj)
    write_rapl_zone(tmp_path, "intel-rapl:1", "package-1", max_uj - 328_850, max_uj)
    write_rapl_zone(tmp_path, "intel-rapl:0:0", "core", 0, max_uj)  # Inside package-0.
    write_rapl_zone(tmp_path, "intel-rapl-mmio:0", "package-0", 0, max_uj)  # Duplicate view.
    rapl = RaplPackagePower(tmp_path)
    assert rapl.power_w(100.0) is None  # No interval yet.

    write_rapl_zone(tmp_path, "intel-rapl:0", "package-0", 51_000_000, max_uj)  # +50 J
    write_rapl_zone(tmp_path, "intel-rapl:1", "package-1", 4_671_150, max_uj)  # wraps: +5 J
    write_rapl_zone(tmp_path, "intel-rapl:0:0", "core", 900_000_000, max_uj)
    write_rapl_zone(tmp_path, "intel-rapl-mmio:0", "package-0", 900_000_000, max_uj)
    # (50 J + (328_850 + 4_671_150) uJ) / 0.5 s = 55 J / 0.5 s
    assert rapl.power_w(100.5) == pytest.approx(110.0)


def test_host_source_reports_why_rapl_is_missing(tmp_path: Path) -> None:
    """Without powercap, cpu_power_w is null and the reason names the path."""
    source = build_source("host", node=1, powercap_root=tmp_path / "powercap")
    info = source.fields()["cpu_power_w"]
    assert not info.readable
    assert info.reason == f"RAPL not exposed ({tmp_path / 'powercap'} absent)"
    [row] = source.sample(time.time())
    assert row["cpu_power_w"] is None and row["node"] == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads energy_uj whatever its mode")
def test_host_source_reports_rapl_permission_denied(tmp_path: Path) -> None:
    """A root-only energy_uj gives an unreadable field with the reason."""
    write_rapl_zone(tmp_path, "intel-rapl:0", "package-0", 1, 10)
    (tmp_path / "intel-rapl:0" / "energy_uj").chmod(0)
    info = HostSource(node=0, powercap_root=tmp_path).fields()["cpu_power_w"]
    assert not info.readable
    assert info.reason.startswith("permission denied reading")
