"""Wrap-aware accumulation of cumulative counters: synthetic 32-bit and RAPL wraps, resets, and
the 32-bit PCIe wrap recorded in the committed H100 bundle."""

from functools import lru_cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit.telemetry.counters import WrappingCounter, describe_events, modulus_of_bits
from kit.telemetry.host import HostSource

from .conftest import REPO
from .test_telemetry_host import write_rapl_zone

H100_BUNDLE = REPO / "tests/data/bundles/20261122T094016Z-gpt3-1.3b-h100-e955a2"
U32 = 2**32


def feed(counter: WrappingCounter, raws: list[int]) -> list[float | None]:
    return [counter.update(raw, 100.0 + i) for i, raw in enumerate(raws)]


def test_a_32_bit_counter_is_counted_through_each_wrap() -> None:
    step = 1_500_000_000  # bytes per read: the 32-bit register wraps every third read
    raws = [(U32 - 10 + i * step) % U32 for i in range(10)]
    counter = WrappingCounter(modulus_of_bits(32))
    assert feed(counter, raws) == [i * step for i in range(10)]
    assert [e.kind for e in counter.events] == ["wrap"] * 4
    assert counter.events[0].t == 101.0 and counter.events[0].before == U32 - 10


def test_a_drop_that_is_not_a_wrap_is_a_reset_and_not_counted() -> None:
    counter = WrappingCounter(modulus_of_bits(64))
    assert feed(counter, [5_000, 6_000, 100, 400]) == [0, 1_000, None, 1_300]
    [event] = counter.events
    assert (event.kind, event.before, event.after) == ("reset", 6_000, 100)


def test_a_narrow_register_wraps_at_every_drop() -> None:
    # 3e9 -> 1e9 on a 32-bit register: an advance of 2.29e9, over half its range. A register
    # read every 100 ms at 23.8 GB/s advances that much (the H100 copy loop in
    # benchmarks/telemetry/results/nvml-counter-widths-h100.txt did).
    counter = WrappingCounter(modulus_of_bits(32))
    assert feed(counter, [3_000_000_000, 1_000_000_000]) == [0, 1_000_000_000 + U32 - 3_000_000_000]
    assert [e.kind for e in counter.events] == ["wrap"]
    assert modulus_of_bits(64) is None  # too wide to wrap within a run


def test_a_counter_without_modulus_never_wraps() -> None:
    counter = WrappingCounter(None)
    assert feed(counter, [10, 20, 19, 25]) == [0, 10, None, 16]


def test_events_are_described_for_the_bundle() -> None:
    narrow, wide = WrappingCounter(U32), WrappingCounter(None)
    feed(narrow, [U32 - 1, 5, 3, 4])
    feed(wide, [7, 5, 9])
    text = describe_events([narrow, wide], "device 0 link_tx_bytes")
    assert text == (
        "device 0 link_tx_bytes: 2 wraps, the first at t=101.000 (4294967295 -> 5): counted "
        "through the wrap; device 0 link_tx_bytes: 1 reset, the first at t=101.000 (7 -> 5): "
        "went backwards, not a wrap: that interval is not counted"
    )
    assert describe_events([WrappingCounter(U32)], "x") is None


def test_bad_modulus_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        WrappingCounter(0)


RECORDED_WRAP_AT = 1550
"""Index of the sample of the committed H100 bundle at which pcie_tx_bytes wrapped."""


@lru_cache(maxsize=1)
def recorded_h100_pcie_tx() -> tuple[tuple[float, int], ...]:
    """(t, pcie_tx_bytes) of device 0 of the committed H100 bundle, as recorded (read-only)."""
    table = pq.read_table(H100_BUNDLE / "telemetry.parquet",
                          columns=["t", "source", "device", "pcie_tx_bytes"]).to_pylist()
    rows = sorted((r["t"], r["pcie_tx_bytes"]) for r in table
                  if r["source"] == "gpu" and r["device"] == 0)
    return tuple((t, v) for t, v in rows if v is not None)


@pytest.fixture
def recorded_pcie_tx() -> tuple[tuple[float, int], ...]:
    return recorded_h100_pcie_tx()


def test_the_recorded_h100_pcie_wrap_is_unwrapped(recorded_pcie_tx) -> None:
    # The bundle's pcie_tx_bytes is NVML's 32-bit NVML_FI_DEV_PCIE_COUNT_TX_BYTES minus its
    # first reading, written before this kit handled wraps: it drops from 388,895,440 to
    # -3,905,685,304 at sample 1550 and stays negative. Differences modulo 2^32 survive the
    # subtraction, so the recorded values unwrap like the raw ones.
    counter = WrappingCounter(modulus_of_bits(32))
    unwrapped = [counter.update(v, t) for t, v in recorded_pcie_tx]
    [event] = counter.events
    assert event.kind == "wrap"
    assert (event.before, event.after) == (388_895_440, -3_905_685_304)
    wrap_at = next(i for i, (t, _) in enumerate(recorded_pcie_tx) if t == event.t)
    assert wrap_at == RECORDED_WRAP_AT
    first = recorded_pcie_tx[0][1]
    assert unwrapped[:wrap_at] == [v - first for _, v in recorded_pcie_tx[:wrap_at]]
    assert unwrapped[wrap_at:] == [v - first + U32 for _, v in recorded_pcie_tx[wrap_at:]]
    assert all(b >= a for a, b in zip(unwrapped, unwrapped[1:], strict=False))  # type: ignore[operator]
    assert unwrapped[wrap_at] - unwrapped[wrap_at - 1] == 386_552  # bytes in that 20 ms


def rapl_tree(root: Path, energy_uj: int, max_uj: int) -> None:
    write_rapl_zone(root, "intel-rapl:0", "package-0", energy_uj, max_uj)


def test_rapl_wraps_at_max_energy_range_and_the_host_says_so(tmp_path: Path) -> None:
    max_uj = 65_532_610_987  # a real max_energy_range_uj (client CPU package)
    rapl_tree(tmp_path, max_uj - 2_000_000, max_uj)
    source = HostSource(node=0, powercap_root=tmp_path)
    assert source.fields()["cpu_power_w"].reason is None
    powers = []
    for i, uj in enumerate([max_uj - 1_000_000, 9_000_000, 19_000_000]):
        rapl_tree(tmp_path, uj, max_uj)
        [row] = source.sample(10.0 + 0.5 * i)
        powers.append(row["cpu_power_w"])
    # first sample: no interval; then 10 J through the wrap and 10 J, each over 0.5 s
    assert powers == [None, pytest.approx(20.0), pytest.approx(20.0)]
    info = source.fields()["cpu_power_w"]
    assert info.readable and "RAPL energy_uj: 1 wrap, the first at t=10.500" in info.reason
