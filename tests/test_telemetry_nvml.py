"""NVML backend and throttle decoding, with nvidia-ml-py's real constants and errors.

On a host without an NVIDIA driver (CI) the backend must refuse to start with a how-to-fix
message; on a GPU host the same tests instead check real rows.
"""

import subprocess
import sys
import time

import pynvml
import pytest

from kit.bundle.telemetry_fields import TELEMETRY_COLUMNS, THROTTLE_BITS
from kit.telemetry import SOURCES, TelemetryNotSupportedError, build_source
from kit.telemetry.base import sample_once
from kit.telemetry.nvidia.throttle import decode_nvml_clocks_event_reasons
from kit.telemetry.throttle import reason_names
from tests.test_telemetry_counters import RECORDED_WRAP_AT, recorded_h100_pcie_tx


def _reason(name: str) -> int:
    """An NVML clocks-event reason bit, by whichever name this pynvml has."""
    for prefix in ("nvmlClocksEventReason", "nvmlClocksThrottleReason"):
        if hasattr(pynvml, prefix + name):
            return getattr(pynvml, prefix + name)
    raise AttributeError(name)


def _nvml_starts() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


HAS_NVML = _nvml_starts()


@pytest.mark.parametrize(
    ("reason", "kit_bit"),
    [
        ("SwPowerCap", "power_cap"),
        ("SwThermalSlowdown", "thermal_sw"),
        ("HwThermalSlowdown", "thermal_hw"),
        ("HwSlowdown", "hw_slowdown"),
        ("HwPowerBrakeSlowdown", "power_brake"),
        ("SyncBoost", "other"),
        ("DisplayClockSetting", "other"),
    ],
)
def test_single_nvml_reason(reason: str, kit_bit: str) -> None:
    bits = decode_nvml_clocks_event_reasons(_reason(reason))
    assert bits == THROTTLE_BITS[kit_bit]
    assert reason_names(bits) == [kit_bit]


@pytest.mark.parametrize("reason", ["None", "GpuIdle", "ApplicationsClocksSetting"])
def test_not_throttling_decodes_to_zero(reason: str) -> None:
    assert decode_nvml_clocks_event_reasons(_reason(reason)) == 0
    assert reason_names(0) == []


def test_combined_mask() -> None:
    mask = (
        _reason("GpuIdle")
        | _reason("SwPowerCap")
        | _reason("HwThermalSlowdown")
        | _reason("HwPowerBrakeSlowdown")
    )
    bits = decode_nvml_clocks_event_reasons(mask)
    assert reason_names(bits) == ["power_cap", "thermal_hw", "power_brake"]


def test_every_known_reason_at_once() -> None:
    assert decode_nvml_clocks_event_reasons(pynvml.nvmlClocksThrottleReasonAll) == sum(
        THROTTLE_BITS.values()
    )


@pytest.mark.parametrize("unknown", [1 << 40, 1 << 63])
def test_unknown_bit_is_other(unknown: int) -> None:
    assert decode_nvml_clocks_event_reasons(unknown) == THROTTLE_BITS["other"]
    mixed = decode_nvml_clocks_event_reasons(unknown | _reason("SwThermalSlowdown"))
    assert reason_names(mixed) == ["thermal_sw", "other"]


def test_old_only_reasons_are_other() -> None:
    # BoardLimit and Reliability exist only under the old "Throttle" prefix and have no kit bit.
    for name in ("nvmlClocksThrottleReasonBoardLimit", "nvmlClocksThrottleReasonReliability"):
        if hasattr(pynvml, name):
            assert decode_nvml_clocks_event_reasons(getattr(pynvml, name)) == THROTTLE_BITS["other"]


@pytest.mark.parametrize("bits", [64, -1])
def test_reason_names_rejects_non_kit_bits(bits: int) -> None:
    with pytest.raises(ValueError, match="not a kit throttle bitmask"):
        reason_names(bits)


def test_registered() -> None:
    assert SOURCES["nvml"] == "kit.telemetry.nvidia.nvml:NvmlSource"


def test_import_does_not_load_pynvml() -> None:
    code = (
        "import sys, kit.telemetry.nvidia.nvml, kit.telemetry.throttle; "
        "assert 'pynvml' not in sys.modules, 'pynvml imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(HAS_NVML, reason="NVML starts on this host")
@pytest.mark.parametrize("how", ["class", "registry"])
def test_refuses_without_driver(how: str) -> None:
    from kit.telemetry.nvidia.nvml import NvmlSource

    with pytest.raises(TelemetryNotSupportedError) as err:
        NvmlSource(node=0) if how == "class" else build_source("nvml", node=0)
    # The real NVML error, converted at the boundary, with what to do about it.
    assert isinstance(err.value.__cause__, pynvml.NVMLError)
    message = str(err.value)
    assert message.startswith("NVML did not start (nvmlInit): ")
    assert "install the NVIDIA driver" in message or "driver is not loaded" in message


@pytest.mark.skipif(not HAS_NVML, reason="no NVIDIA driver on this host")
def test_samples_real_gpus() -> None:
    source = build_source("nvml", node=3)
    try:
        fields = source.fields()
        devices = source.devices()
        rows = sample_once(source, 123.0) + sample_once(source, 124.0)
    finally:
        source.close()
    assert {"power_w", "energy_j", "throttle", "link_tx_bytes"} <= set(fields)
    assert all(info.reason for info in fields.values() if not info.readable)
    assert devices and all(d["power_limit_w"] > 0 for d in devices)
    assert len(rows) == 2 * len(devices)
    for row in rows:
        assert list(row) == list(TELEMETRY_COLUMNS)
        assert (row["node"], row["source"]) == (3, "gpu")
        for name, info in fields.items():
            if not info.readable:
                assert row[name] is None, name
    assert all(r["energy_j"] > 0 and 0 < r["power_w"] < 2000 for r in rows)


@pytest.mark.skipif(not HAS_NVML, reason="no NVIDIA driver on this host")
def test_rejects_missing_device() -> None:
    with pytest.raises(TelemetryNotSupportedError, match="cannot sample devices"):
        build_source("nvml", node=0, devices=[999])


# --- the backend's read path on a fake pynvml (tests/fakes/nvml) --------------------------------
#
# The fake keeps nvidia-ml-py's own constants, structures and errors; only the answers come from
# a scenario. PCIe byte counters answer as NVML_VALUE_TYPE_UNSIGNED_INT (32-bit): that is the
# width the committed H100 bundle shows wrapping (a drop of 2^32 - 386,552 bytes in 20 ms).

U32 = 2**32


def h100(pcie_tx: list[int], **extra_fields) -> dict:
    """One H100 whose PCIe TX counter answers ``pcie_tx`` read after read."""
    return {"devices": [{
        "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-fake-0", "arch": "NVML_DEVICE_ARCH_HOPPER",
        "power_limit_mw": 700_000, "max_sm_mhz": 1980, "memory_total": 85_520_809_984,
        "calls": {
            "nvmlDeviceGetPowerUsage": [650_000],
            "nvmlDeviceGetTotalEnergyConsumption": [7_022_712 + 65 * i for i in range(4000)],
            "nvmlDeviceGetTemperature": [61], "nvmlDeviceGetClockInfo/1": [1755],
            "nvmlDeviceGetClockInfo/2": [2619], "nvmlDeviceGetUtilizationRates": [100],
            "nvmlDeviceGetMemoryInfo": [40 * 2**30],
            "nvmlDeviceGetCurrentClocksEventReasons": [_reason("SwPowerCap")],
            "nvmlDeviceGetViolationStatus": {"0": [3_630_870_400], "1": [0]},
        },
        "fields": {
            "NVML_FI_DEV_POWER_INSTANT": {"type": "NVML_VALUE_TYPE_UNSIGNED_INT",
                                          "values": [655_000]},
            "NVML_FI_DEV_POWER_AVERAGE": {"type": "NVML_VALUE_TYPE_UNSIGNED_INT",
                                          "values": [640_000]},
            "NVML_FI_DEV_MEMORY_TEMP": {"type": "NVML_VALUE_TYPE_UNSIGNED_INT", "values": [70]},
            "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": {"type": "NVML_VALUE_TYPE_UNSIGNED_INT",
                                                "values": pcie_tx},
            "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": {"type": "NVML_VALUE_TYPE_UNSIGNED_INT",
                                                "values": [495_680]},
            **extra_fields,
        },
    }]}


@pytest.fixture
def fake_nvml(monkeypatch, tmp_path):
    from tests.fakes import fake_library

    def install(scenario: dict):
        return stack.enter_context(fake_library(monkeypatch, "pynvml", scenario, tmp_path))

    from contextlib import ExitStack

    with ExitStack() as stack:
        yield install


TICK_S = 0.11
"""Time between two reads of every field (fast and slow) in these tests."""


def sample_slow_every_tick(source, n: int) -> list[dict]:
    """``n`` reads of every field, fast and slow (``sample_once``), ``TICK_S`` apart, from
    t = 1000 s."""
    return [row for i in range(n) for row in sample_once(source, 1_000.0 + TICK_S * i)]


def read_every_field(n: int) -> tuple[list[dict], dict]:
    """A real NVML source on the fake installed: ``n`` reads of every field
    (:func:`sample_slow_every_tick`), then what ``fields()`` says of each."""
    from kit.telemetry.nvidia.nvml import NvmlSource

    source = NvmlSource(node=0)
    try:
        return sample_slow_every_tick(source, n), source.fields()
    finally:
        source.close()


def test_recorded_h100_pcie_wrap_through_the_backend(fake_nvml) -> None:
    # The bundle holds raw - raw0 of a 32-bit register. Any raw0 that puts the last value
    # before the wrap within 386,552 bytes (the advance across it) of 2^32 gives back the raw
    # readings that produced the recorded column, its wrap included.
    recorded = [v for _, v in recorded_h100_pcie_tx()]
    raw0 = U32 - (recorded[RECORDED_WRAP_AT - 1] - recorded[0]) - 200_000
    raw = [(raw0 + v - recorded[0]) % U32 for v in recorded]
    assert raw[RECORDED_WRAP_AT] < raw[RECORDED_WRAP_AT - 1]
    fake_nvml(h100([raw[0], *raw]))  # the first answer is the construction-time reading
    rows, fields = read_every_field(len(raw))
    info = fields["pcie_tx_bytes"]
    written = [r["pcie_tx_bytes"] for r in rows]
    assert written == [v - recorded[0] + (U32 if i >= RECORDED_WRAP_AT else 0)
                       for i, v in enumerate(recorded)]
    assert all(b >= a for a, b in zip(written, written[1:], strict=False))
    wrap_t = 1_000.0 + TICK_S * RECORDED_WRAP_AT
    assert info.readable and (
        f"device 0 pcie_tx_bytes: 1 wrap, the first at t={wrap_t:.3f}" in info.reason)
    assert [r["pcie_rx_bytes"] for r in rows[:2]] == [0, 0]


def test_energy_and_violation_time_stay_absolute(fake_nvml) -> None:
    fake_nvml(h100([0]))
    rows, fields = read_every_field(3)
    # mJ since the driver loaded, read once at construction and then once per tick
    assert [r["energy_j"] for r in rows] == pytest.approx([7022.777, 7022.842, 7022.907])
    assert [r["viol_power_s"] for r in rows] == pytest.approx([3.6308704] * 3)
    assert rows[0]["power_w"] == 655.0 and rows[0]["throttle"] == THROTTLE_BITS["power_cap"]
    assert fields["energy_j"].readable and "wrap" not in str(fields["energy_j"].reason)


def test_a_link_counter_that_goes_backwards_is_a_reset(fake_nvml) -> None:
    # Two NVLink links; link 1's 64-bit counter drops (a reset, not a wrap): that sample is
    # null, the total goes on from the new value (link 0: 30 KiB, link 1: 10 before and 10
    # after the reset), and fields() says when.
    per_link = {"0": {"type": "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "values": [0, 10, 20, 30]},
                "1": {"type": "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG",
                      "values": [5_000, 5_010, 3, 13]}}
    scenario = h100([0], NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX={"scope": per_link})
    scenario["devices"][0]["nvlinks"] = 2
    fake_nvml(scenario)
    rows, fields = read_every_field(3)
    assert [r["link_tx_bytes"] for r in rows] == [20 * 1024, None, 50 * 1024]
    assert ("device 0 link_tx_bytes: 1 reset, the first at t=1000.110 (5010 -> 3)"
            in fields["link_tx_bytes"].reason)
    assert not fields["link_rx_bytes"].readable  # the scenario has no RX counter


def test_nvml_sums_the_links_itself_where_it_can(fake_nvml) -> None:
    # A driver that answers scope UINT_MAX (NVML's own sum over every link) is read through
    # that one entry, and the field says so; the per-link entries are not read at all (the
    # fake would fail a read past its answers). One without it falls back to the links.
    def link(values: list[int]) -> dict:
        return {"type": "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "values": values}

    per_link = {"0": link([0]), "1": link([0])}
    scenario = h100([0], NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX={
        "scope": {**per_link, "4294967295": link([100, 110, 130, 160])}},
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX={"scope": {"0": link([0, 1, 2, 3]),
                                                         "1": link([0, 2, 4, 6])}})
    scenario["devices"][0]["nvlinks"] = 2
    fake_nvml(scenario)
    rows, fields = read_every_field(3)
    assert [r["link_tx_bytes"] for r in rows] == [10 * 1024, 30 * 1024, 60 * 1024]
    assert "every link, summed by NVML" in fields["link_tx_bytes"].reason
    assert [r["link_rx_bytes"] for r in rows] == [3 * 1024, 6 * 1024, 9 * 1024]
    assert "every link, summed by NVML" not in fields["link_rx_bytes"].reason


@pytest.mark.timeout(120)
def test_the_sampler_writes_unwrapped_counters(fake_nvml, tmp_path) -> None:
    """The real sampler process builds the real NVML source on the fake and unwraps it."""
    from kit.bundle.writer import concat_chunks
    from kit.telemetry.sampler import TelemetrySampler

    step = 400_000_000  # bytes per read: the 32-bit register wraps about every 11 reads
    fake_nvml(h100([(U32 - 10 + i * step) % U32 for i in range(400)]))
    sampler = TelemetrySampler([("nvml", {"node": 0}), ("host", {"node": 0})],
                               interval_ms=20, chunks_dir=tmp_path / "chunks")
    sampler.start()
    time.sleep(2.5)
    report = sampler.stop()
    rows = concat_chunks(tmp_path / "chunks").to_pylist()
    tx = [r["pcie_tx_bytes"] for r in rows if r["source"] == "gpu"
          and r["pcie_tx_bytes"] is not None]
    assert report.errors == [] and len(tx) >= 12  # read every 100 ms: past the first wrap
    assert tx == [i * step for i in range(1, len(tx) + 1)]
    assert report.devices["nvml"][0]["uuid"] == "GPU-fake-0"


# --- eight GPUs whose slow queries take 10 ms each (issue 25) -----------------------------------

SLOW_CALL_S = 0.01
"""How long each slow NVML query of the fake takes: H200's energy counter takes about 5 ms per
device, its NVLink per-link counters 13 ms."""

SLOW_QUERIES = ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetViolationStatus",
                "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
                "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")


def eight_slow_h100s() -> dict:
    """Eight H100s with two NVLink links each, every slow query taking ``SLOW_CALL_S``."""
    per_link = {"type": "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG",
                "values": [10 * i for i in range(10**4)]}
    nvlink = {"scope": {"0": per_link, "1": per_link}}
    device = h100([7 * i for i in range(10**4)], NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=nvlink,
                  NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=nvlink)["devices"][0]
    return {"devices": [{**device, "uuid": f"GPU-fake-{i}", "nvlinks": 2,
                         "sleep_s": dict.fromkeys(SLOW_QUERIES, SLOW_CALL_S)} for i in range(8)]}


def gpu_rows(chunks) -> list[dict]:
    from kit.bundle.writer import concat_chunks

    return [r for r in concat_chunks(chunks).to_pylist() if r["source"] == "gpu"]


def wait_for_reads(chunks, devices: set[int], field: str, reads: int, timeout_s: float) -> None:
    """Wait until each of ``devices`` has ``reads`` rows with ``field`` on disk (counts, not
    time: a loaded host only makes it wait longer)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = [r["device"] for r in (gpu_rows(chunks) if chunks.exists() else [])
               if r[field] is not None]
        if all(got.count(d) >= reads for d in devices):
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {reads} {field} rows per device within {timeout_s} s")


def spacing_ms(rows: list[dict], device: int, field: str) -> list[float]:
    """Milliseconds between consecutive rows of ``device`` that hold ``field``."""
    t = sorted(r["t"] for r in rows if r["device"] == device and r[field] is not None)
    return [1e3 * (b - a) for a, b in zip(t, t[1:], strict=False)]


def assert_never_read_early(rows: list[dict], device: int, field: str, period_ms: float) -> None:
    """A slow field is read on a grid of ``period_ms`` from its lane's start (just before the
    first tick): ``n`` reads need ``n - 1`` periods after it, however late any read came. One
    period of slack covers the lane's start."""
    t0 = min(r["t"] for r in rows if r["device"] == device)
    t = sorted(r["t"] for r in rows if r["device"] == device and r[field] is not None)
    assert 1e3 * (t[-1] - t0) >= (len(t) - 2) * period_ms - 1, (field, len(t), t[-1] - t0)


@pytest.mark.timeout(180)
def test_eight_gpus_keep_the_fast_period_while_each_slow_query_takes_10_ms(fake_nvml, tmp_path):
    """Read in the tick, device after device, the 7 slow queries of 8 GPUs would take 560 ms
    per tick (issue 25 saw 114 ms on 4 x H200); off the fast path each device's slow fields are
    read on a thread of their own, each at its own period, and the fast rows keep theirs."""
    import statistics

    from kit.telemetry.nvidia.candidates import SLOW_READ_MS
    from kit.telemetry.sampler import TelemetrySampler

    fake_nvml(eight_slow_h100s())
    chunks = tmp_path / "chunks"
    sampler = TelemetrySampler([("nvml", {"node": 0})], interval_ms=20, chunks_dir=chunks,
                               flush_s=0.2)
    sampler.start()
    try:
        wait_for_reads(chunks, set(range(8)), "link_tx_bytes", reads=5, timeout_s=120)
    finally:
        report = sampler.stop()
    rows = gpu_rows(chunks)
    assert report.errors == []
    # The old structure made every slow query of every device inside the tick: 8 devices x
    # 7 queries (energy, 2 violation times, 2 PCIe and 2 NVLink requests) x 10 ms per tick.
    serial_ms = 8 * 7 * SLOW_CALL_S * 1e3
    for device in range(8):
        mine = [r for r in rows if r["device"] == device]
        fast = [r for r in mine if r["power_w"] is not None]
        slow = [r for r in mine if r["pcie_tx_bytes"] is not None]
        # The slow fields come in rows of their own, never in the fast rows (the old structure
        # wrote them into the tick's rows) ...
        assert all(r["energy_j"] is None and r["link_tx_bytes"] is None for r in fast)
        assert all(r["power_w"] is None for r in slow)
        # ... and the fast rows outnumber them: the tick does not wait for the 10 ms queries
        # (counts, not times; the old structure wrote one row per slow round) ...
        assert len(fast) > len(slow) >= 6
        # ... coming far faster than one serial slow round (a margin for a loaded host).
        assert statistics.median(spacing_ms(rows, device, "power_w")) < serial_ms / 4
        # Each slow field is read at its own period, never more often; the energy counter's
        # last reading is the one the sampler takes as it stops (kit.telemetry.edges), off
        # the schedule, after every scheduled one.
        assert_never_read_early(rows, device, "link_tx_bytes", SLOW_READ_MS["link_tx_bytes"])
        energy = [r for r in rows if r["device"] == device and r["energy_j"] is not None]
        last = max(energy, key=lambda r: r["t"])
        assert_never_read_early([r for r in rows if r is not last], device, "energy_j",
                                SLOW_READ_MS["energy_j"])
    # Each field's period is recorded as read: the slowest device's mean spacing of its values.
    periods = report.field_periods_ms["nvml"]
    for field in ("power_w", "energy_j", "link_rx_bytes"):
        worst = max(statistics.fmean(spacing_ms(rows, d, field)) for d in range(8))
        assert periods[field] == pytest.approx(worst)
    fields = report.sources["nvml"]
    assert fields["energy_j"].read_period_ms == SLOW_READ_MS["energy_j"]
    assert fields["power_w"].read_period_ms is None
    assert "NVML_FI_DEV_POWER_INSTANT (instantaneous)" in fields["power_w"].reason
    assert report.cpu_s > 0 and report.wall_s > 0
