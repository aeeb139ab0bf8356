"""AMD SMI backend: its refusal without ROCm, its quirk handling, and its read path on a fake
``amdsmi`` of each supported release.

No AMD GPU is reachable from here, so the backend is not yet verified on hardware. The refusal
tests use the real ``amdsmi`` package failing to load libamd_smi.so on this host; the quirk
tests check pure functions against bit values copied from the kernel headers cited next to
them; the read-path tests drive the real ``AmdSmiSource`` (and the real sampler process) on
``tests/fakes/amdsmi``, which answers with the shapes of amdsmi 6.1.2, 6.3.3 and 7.0.2's own
``amdsmi_interface.py``.
"""

import importlib.util
import inspect
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any

import pytest

import kit.telemetry.amd.amdsmi as amd
import kit.telemetry.amd.device as amd_device
import kit.telemetry.amd.library as amd_library
import kit.telemetry.amd.quirks as quirks
import kit.telemetry.amd.readers as amd_readers
from kit.bundle.telemetry_fields import THROTTLE_BITS
from kit.telemetry import SOURCES, TelemetryNotSupportedError, build_source
from kit.telemetry.amd.amdsmi import AmdSmiSource, load_amdsmi
from kit.telemetry.amd.quirks import (
    EnergyCounterCheck,
    Mi250Die,
    ResidencyThrottle,
    asic_family,
    decode_amd_throttle_status,
    energy_counter_plausible,
    energy_unit_j,
    gfx_target_from_name,
    mi250_dies,
    mi250_is_secondary,
    package_share,
)
from kit.telemetry.base import sample_once
from tests.conftest import REPO
from tests.fakes import fake_library
from tests.test_telemetry_nvml import assert_never_read_early, spacing_ms, wait_for_reads


def _rocm_here() -> bool:
    try:
        load_amdsmi()
    except TelemetryNotSupportedError:
        return False
    return True


without_rocm = pytest.mark.skipif(
    _rocm_here(), reason="libamd_smi.so loads here: the refusal path cannot be seen"
)


# --- the backend on a host without ROCm -----------------------------------------------------------


def test_registered() -> None:
    assert SOURCES["amdsmi"] == "kit.telemetry.amd.amdsmi:AmdSmiSource"


@without_rocm
def test_source_refuses_without_the_library() -> None:
    with pytest.raises(TelemetryNotSupportedError, match=r"AMD SMI library not found \("):
        AmdSmiSource(node=0)


@without_rocm
def test_build_source_refuses_without_the_library() -> None:
    with pytest.raises(TelemetryNotSupportedError, match="install ROCm's amd-smi-lib"):
        build_source("amdsmi", node=0)


@without_rocm
def test_refusal_is_silent_and_the_import_lazy() -> None:
    # amdsmi print()s two lines to stdout when libamd_smi.so is missing, then raises
    # KeyError('libamd_smi.so'); a fresh process sees that first attempt.
    code = (
        "import sys\n"
        "import kit.telemetry.amd.amdsmi\n"
        "assert 'amdsmi' not in sys.modules, 'imported at module import'\n"
        "from kit.telemetry import TelemetryNotSupportedError, build_source\n"
        "try:\n"
        "    build_source('amdsmi', node=0)\n"
        "except TelemetryNotSupportedError as e:\n"
        "    sys.stderr.write(str(e))\n"
        "else:\n"
        "    sys.exit('no error')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("AMD SMI library not found (libamd_smi.so)")
    # with the amdsmi package installed (7.0.2 here) it fails on the library: KeyError
    installed = importlib.util.find_spec("amdsmi") is not None
    assert ("KeyError" if installed else "ImportError") in done.stderr


def test_every_docstring_says_not_verified() -> None:
    documented = []
    for module in (amd, amd_device, amd_library, amd_readers, quirks):
        assert "not yet verified on hardware" in (module.__doc__ or "")
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != module.__name__ or not callable(obj):
                continue
            documented.append((name, obj.__doc__))
            if inspect.isclass(obj):
                documented += [
                    (f"{name}.{n}", m.__doc__)
                    for n, m in vars(obj).items()
                    if inspect.isfunction(m) and not n.startswith("__")
                ]
    assert len(documented) > 40
    unmarked = [
        n for n, doc in documented if "not yet verified on hardware" not in str(doc).lower()
    ]
    assert unmarked == []


# --- quirk (a): MI250 package power ---------------------------------------------------------------
#
# The kernel writes power and energy for the primary GCD only, zero for the other
# (aldebaran_ppt.c), and rocm_smi.py takes an energy counter of 0 for the secondary.


@pytest.mark.parametrize(
    ("energy", "power", "secondary"),
    [(0, None, True), (0, 0.0, True), (123_456, 0.0, False), (123_456, 541.0, False),
     (0, 541.0, False), (None, None, False)],
)
def test_mi250_secondary_is_seen_in_its_counters(energy, power, secondary) -> None:
    assert mi250_is_secondary(energy, power) is secondary


@pytest.mark.parametrize("primary_first", [True, False])
def test_mi250_dies_are_decided_per_package(primary_first: bool) -> None:
    # two packages; in each, the primary is the even GCD or the odd one
    secondary = {0: not primary_first, 1: primary_first, 2: not primary_first, 3: primary_first}
    dies = mi250_dies(secondary)
    assert [(d.package, d.die) for d in dies.values()] == [
        (0, int(not primary_first)), (0, int(primary_first)),
        (1, int(not primary_first)), (1, int(primary_first))]
    primary = dies[0 if primary_first else 1]
    assert package_share(primary) == (True, f"MI250 package 0: {primary.evidence}; covers "
                                            "both GCDs")
    kept, why = package_share(dies[1 if primary_first else 0])
    assert not kept and "reported by the primary GCD" in why


def test_mi250_pair_without_one_secondary_keeps_both_readings() -> None:
    dies = mi250_dies({0: False, 1: False, 5: True})
    assert not dies[0].decided and "both look primary" in dies[0].evidence
    assert package_share(dies[1])[0] and "covers both" not in package_share(dies[1])[1]
    assert dies[5] == Mi250Die(2, 1, "energy counter 0 and no power: secondary")  # alone


@pytest.mark.parametrize(("name", "target"), [
    ("AMD Instinct MI250X/MI250", "gfx90a"), ("AMD Instinct MI210", "gfx90a"),
    ("AMD Instinct MI300X", "gfx942"), ("AMD Instinct MI100", None)])
def test_gfx_target_from_market_name(name: str, target: str | None) -> None:
    assert gfx_target_from_name(name) == target


# --- quirk (b): throttle reasons ------------------------------------------------------------------
#
# MI200 (aldebaran) throttle_status bits, THROTTLER_*_BIT in
# linux drivers/gpu/drm/amd/pm/swsmu/inc/pmfw_if/smu13_driver_if_aldebaran.h:
# PPT0 0, PPT1 1, TDC_GFX 2, TDC_SOC 3, TDC_HBM 4, (spare 5), TEMP_GPU 6, TEMP_MEM 7,
# (spare 8-10), TEMP_VR_GFX 11, TEMP_VR_SOC 12, TEMP_VR_MEM 13, (spare 14-18), APCC 19.


@pytest.mark.parametrize(
    ("bit", "kit_bit"),
    [
        (0, "power_cap"),  # PPT0
        (1, "power_cap"),  # PPT1
        (2, "other"),  # TDC_GFX: a current limit
        (3, "other"),  # TDC_SOC
        (4, "other"),  # TDC_HBM
        (6, "thermal_sw"),  # TEMP_GPU (hotspot)
        (7, "thermal_sw"),  # TEMP_MEM (HBM)
        (11, "thermal_sw"),  # TEMP_VR_GFX
        (12, "thermal_sw"),  # TEMP_VR_SOC
        (13, "thermal_sw"),  # TEMP_VR_MEM
        (19, "other"),  # APCC: peak current control
        (5, "other"),  # spare: unknown bits must not read as "not throttled"
        (18, "other"),  # spare
        (31, "other"),  # beyond the header
    ],
)
def test_mi200_throttle_bits(bit: int, kit_bit: str) -> None:
    assert decode_amd_throttle_status(1 << bit, "mi200") == THROTTLE_BITS[kit_bit]


def test_mi200_combined_and_idle() -> None:
    assert decode_amd_throttle_status(0, "mi200") == 0
    ppt0_temp_gpu = (1 << 0) | (1 << 6)
    assert decode_amd_throttle_status(ppt0_temp_gpu, "mi200") == (
        THROTTLE_BITS["power_cap"] | THROTTLE_BITS["thermal_sw"]
    )


# MI300 (smu_v13_0_6) throttler bits, linux .../pmfw_if/smu_v13_0_6_pmfw.h:
# PROCHOT 0, PPT 1, THERMAL_SOCKET 2, THERMAL_VR 3, THERMAL_HBM 4 -- the same five reasons whose
# gpu_metrics residency counters amdsmi_get_violation_status differences (amd_smi.cc).


@pytest.mark.parametrize(
    ("bit", "kit_bit"),
    [
        (0, "thermal_hw"),  # PROCHOT
        (1, "power_cap"),  # PPT
        (2, "thermal_sw"),  # THERMAL_SOCKET
        (3, "thermal_sw"),  # THERMAL_VR
        (4, "thermal_sw"),  # THERMAL_HBM
        (5, "other"),  # not in the header
    ],
)
def test_mi300_throttle_bits(bit: int, kit_bit: str) -> None:
    assert decode_amd_throttle_status(1 << bit, "mi300") == THROTTLE_BITS[kit_bit]


def test_the_two_layouts_differ() -> None:
    assert decode_amd_throttle_status(1, "mi200") == THROTTLE_BITS["power_cap"]  # PPT0
    assert decode_amd_throttle_status(1, "mi300") == THROTTLE_BITS["thermal_hw"]  # PROCHOT


def test_negative_mask_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_amd_throttle_status(-1, "mi200")


def test_residency_counters_give_mi300_bits() -> None:
    # gpu_metrics of an MI300X power-capped 50% of the time, its HBM hot 0.5% of it: the
    # library's own rule (integer per_* > 0) marks a reason active from 1%.
    residency = ResidencyThrottle()
    def metrics(ms: int) -> dict:
        return {"accumulation_counter": ms, "prochot_residency_acc": 0,
                "ppt_residency_acc": ms // 2, "socket_thm_residency_acc": 0,
                "vr_thm_residency_acc": 0, "hbm_thm_residency_acc": ms // 200}
    assert residency.update(metrics(1_000), 1.0) is None  # no interval yet
    bits = residency.update(metrics(1_100), 1.1)
    assert bits == 1 << 1  # PPT only
    assert decode_amd_throttle_status(bits, "mi300") == THROTTLE_BITS["power_cap"]
    assert residency.update(metrics(1_100), 1.12) == bits  # cached gpu_metrics: the last stands


def test_residency_counters_wrap_at_32_bits() -> None:
    # The kernel's counters are uint32 (AMD SMI widens them): across the wrap the interval's
    # residency still reads 100% PPT.
    residency = ResidencyThrottle()
    top = 2**32 - 50
    before = {"accumulation_counter": top, "ppt_residency_acc": top}
    after = {"accumulation_counter": 50, "ppt_residency_acc": 50}
    zeros = dict.fromkeys(["prochot_residency_acc", "socket_thm_residency_acc",
                           "vr_thm_residency_acc", "hbm_thm_residency_acc"], 7)
    residency.update({**before, **zeros}, 1.0)
    assert residency.update({**after, **zeros}, 1.1) == 1 << 1
    assert "2 wraps" in str(residency.describe_events())


def test_residency_na_on_mi200() -> None:
    # MI200's gpu_metrics v1.3 has no residency counters: AMD SMI 6.3+ gives "N/A".
    na = dict.fromkeys(["accumulation_counter", "prochot_residency_acc", "ppt_residency_acc",
                        "socket_thm_residency_acc", "vr_thm_residency_acc",
                        "hbm_thm_residency_acc"], "N/A")
    assert ResidencyThrottle().update(na, 1.0) is None


@pytest.mark.parametrize(
    ("gfx", "family"),
    [
        ("gfx90a", "mi200"),
        ("gfx942", "mi300"),
        ("gfx950", "mi300"),
        ("gfx908", None),
        ("gfx1100", None),
    ],
)
def test_asic_family(gfx: str, family: str | None) -> None:
    assert asic_family(gfx) == family


# --- quirk (c): energy counter check --------------------------------------------------------------


def _trace(
    energy_per_j: float, seconds: float = 1.2, power_w: float = 500.0, dt_s: float = 0.05
) -> list[tuple[float, float, float]]:
    """(t, power, energy) at constant power; the counter counts energy_per_j per true joule."""
    n = round(seconds / dt_s) + 1
    return [(1e9 + i * dt_s, power_w, 7e6 + energy_per_j * power_w * i * dt_s) for i in range(n)]


def test_good_counter_is_plausible() -> None:
    ok, why = energy_counter_plausible(_trace(1.0))
    assert ok, why
    assert "ratio 1" in why


def test_stuck_counter_is_broken() -> None:
    ok, why = energy_counter_plausible(_trace(0.0))
    assert not ok
    assert "stuck" in why


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_counter_1000x_off_is_broken(scale: float) -> None:
    ok, why = energy_counter_plausible(_trace(scale))
    assert not ok
    assert "outside 0.5..2" in why


def test_backwards_counter_is_broken() -> None:
    ok, _ = energy_counter_plausible(_trace(-1.0))
    assert not ok


def test_no_power_cannot_vouch_for_the_counter() -> None:
    ok, why = energy_counter_plausible(_trace(1.0, power_w=0.0))
    assert not ok
    assert "cannot check" in why


def test_plausibility_needs_two_samples() -> None:
    with pytest.raises(ValueError):
        energy_counter_plausible(_trace(1.0)[:1])


def _feed(check: EnergyCounterCheck, trace: list[tuple[float, float, float]]) -> list:
    return [check.feed(t, p, e) for t, p, e in trace]


def test_check_holds_energy_back_until_validated() -> None:
    trace = _trace(1.0, seconds=2.0)
    recorded = _feed(EnergyCounterCheck(min_span_s=1.0, min_samples=5), trace)
    first = next(i for i, e in enumerate(recorded) if e is not None)
    assert trace[first][0] - trace[0][0] == pytest.approx(1.0)
    assert recorded[:first] == [None] * first
    assert recorded[first:] == [e for _, _, e in trace[first:]]


def test_check_drops_a_stuck_counter_for_the_rest_of_the_run() -> None:
    check = EnergyCounterCheck(min_span_s=1.0, min_samples=5)
    recorded = _feed(check, _trace(0.0, seconds=1.5))
    recorded += _feed(check, [(2e9 + i, 500.0, 1e7 + 500.0 * i) for i in range(5)])
    assert recorded == [None] * len(recorded)
    assert check.ok is False
    assert "stuck" in str(check.reason)


def test_check_drops_a_1000x_counter() -> None:
    check = EnergyCounterCheck(min_span_s=1.0, min_samples=5)
    assert set(_feed(check, _trace(1e-3, seconds=2.0))) == {None}
    assert check.ok is False


def test_check_can_be_dropped_later() -> None:
    check = EnergyCounterCheck(min_span_s=1.0, min_samples=5)
    trace = _trace(1.0, seconds=1.5)
    assert _feed(check, trace)[-1] is not None
    check.drop("energy counter ran backwards")
    t, p, e = trace[-1]
    assert check.feed(t + 0.05, p, e + 50.0) is None
    assert (check.ok, check.reason) == (False, "energy counter ran backwards")


def test_check_ignores_samples_without_power() -> None:
    check = EnergyCounterCheck(min_span_s=1.0, min_samples=5)
    recorded = [check.feed(1e9 + 0.1 * i, None, 7e6 + 50.0 * i) for i in range(30)]
    assert recorded == [None] * 30
    assert check.ok is None


# --- quirk (d): energy unit -----------------------------------------------------------------------


@pytest.mark.parametrize("target", ["gfx90a", "gfx942"])
def test_exact_energy_unit_where_the_kernel_states_it(target: str) -> None:
    unit, note = energy_unit_j(target, 15.300000190734863)  # float32 15.3, as AMD SMI gives it
    assert unit == 2**-16
    assert "2^-16 J" in note and "+0.27%" in note


def test_reported_resolution_elsewhere() -> None:
    unit, note = energy_unit_j("gfx908", 15.300000190734863)
    assert unit == pytest.approx(15.3e-6)
    assert "counter_resolution 15.3 uJ" in note


# --- the read path on a fake amdsmi of each release (tests/fakes/amdsmi) --------------------------

F32_15_3 = 15.300000190734863
"""AMD SMI's counter_resolution: the float32 15.3F of rocm_smi.cc, as ctypes hands it over."""

ENERGY_START = 2**40
"""A raw energy accumulator far from zero: its value in J shows which unit was used."""


def mi300x(index: int = 0, **over: Any) -> dict[str, Any]:
    """An MI300X as AMD SMI's C library reports it (N/A values are 0xFFFF / all ones)."""
    return {"market_name": "AMD Instinct MI300X", "gfx_version": 0x942,
            "uuid": f"mi300x-{index}", "power_cap_uw": 750_000_000, "max_clk": 2100,
            "vram_total": 206_158_430_208, "current_socket_power": 700,
            "average_socket_power": 0xFFFF, "energy_start": ENERGY_START, "energy_w": 700,
            "counter_resolution": F32_15_3, "temps": {"HOTSPOT": 80, "VRAM": 70},
            "clocks": {"GFX": 2100, "MEM": 1300}, "gfx_activity": 100, "vram_used": 10**10,
            "throttle_status": 0xFFFFFFFF, "residency": {"ppt_residency_acc": 0.5},
            "xgmi_kib_per_s": [1e6] * 7, "xgmi_start": [0] * 7, **over}


def mi250_gcd(primary: bool, index: int = 0, **over: Any) -> dict[str, Any]:
    """One MI250X GCD: the primary reports package power and energy, the secondary 0."""
    return {"market_name": "AMD Instinct MI250X/MI250", "gfx_version": 0x90a,
            "uuid": f"mi250-{index}", "power_cap_uw": 560_000_000, "max_clk": 1700,
            "vram_total": 68_702_699_520, "current_socket_power": 0xFFFF,
            "average_socket_power": 541 if primary else 0, "energy_start": ENERGY_START,
            "energy_w": 541 if primary else None, "counter_resolution": F32_15_3,
            "temps": {"HOTSPOT": 70, "VRAM": 65}, "clocks": {"GFX": 1700, "MEM": 1600},
            "gfx_activity": 99, "vram_used": 10**10, "throttle_status": 1 << 0,  # PPT0
            "residency": None, "xgmi_kib_per_s": None, **over}


@pytest.fixture
def fake_amdsmi(monkeypatch, tmp_path):
    """Install the fake for one scenario: ``fake_amdsmi(version, devices, ...)``."""
    with ExitStack() as stack:
        def install(version: str, devices: list[dict[str, Any]], **extra: Any):
            scenario = {"version": version, "devices": devices, **extra}
            return stack.enter_context(fake_library(monkeypatch, "amdsmi", scenario, tmp_path))
        yield install


def sample_ticks(source: AmdSmiSource, ticks: int, period_s: float = 0.02) -> list[dict]:
    """``ticks`` reads of every field, fast and slow, on the live clock, at least ``period_s``
    apart."""
    rows: list[dict] = []
    for _ in range(ticks):
        rows += sample_once(source, time.time())
        time.sleep(period_s)
    return rows


def by_device(rows: list[dict], field: str) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in rows:
        out.setdefault(r["device"], []).append(r[field])
    return out


@pytest.mark.parametrize("primary_first", [True, False])
def test_mi250_die_order_both_ways(fake_amdsmi, primary_first: bool) -> None:
    gcds = [mi250_gcd(primary_first, 0), mi250_gcd(not primary_first, 1),
            mi250_gcd(primary_first, 2), mi250_gcd(not primary_first, 3)]
    fake_amdsmi("7.0", gcds)
    source = AmdSmiSource(node=0)
    try:
        rows = sample_once(source, time.time()) + sample_once(source, time.time() + 0.02)
        facts, fields = source.devices(), source.fields()
    finally:
        source.close()
    primaries = [0, 2] if primary_first else [1, 3]
    power = by_device(rows, "power_avg_w")
    assert {d: set(v) for d, v in power.items()} == {
        d: {541.0} if d in primaries else {None} for d in range(4)}
    assert [(f["package"], f["die"]) for f in facts] == [
        (0, 0 if 0 in primaries else 1), (0, 0 if 1 in primaries else 1),
        (1, 0 if 2 in primaries else 1), (1, 0 if 3 in primaries else 1)]
    assert all("not yet verified on hardware" in f["die_evidence"] for f in facts)
    reason = fields["power_avg_w"].reason
    assert fields["power_avg_w"].readable and "reported by the primary GCD" in reason
    for d in range(4):
        role = "counting: primary; covers both GCDs" if d in primaries else (
            "0 and no power: secondary; its power and energy are reported by the primary GCD")
        assert f"device {d}: " in reason and f"MI250 package {d // 2}: energy counter {role}" in (
            reason.split(f"device {d}: ")[1])
    assert not fields["power_w"].readable  # MI250: current_socket_power is N/A
    assert {r["throttle"] for r in rows} == {THROTTLE_BITS["power_cap"]}  # PPT0, raw bits
    assert {r["link_tx_bytes"] for r in rows} == {None}  # MI200: no xGMI counters


@pytest.mark.parametrize("version", ["6.1", "6.3", "7.0"])
def test_each_release_reads_field_by_field(fake_amdsmi, version: str) -> None:
    fake_amdsmi(version, [mi300x()])
    source = AmdSmiSource(node=3)
    try:  # 50 ms apart: the fake's residency counters advance 1 per ms of wall time
        rows = [r for _ in range(2)
                for r in (time.sleep(0.05), sample_once(source, time.time()))[1]]
        fields, facts = source.fields(), source.devices()
    finally:
        source.close()
    [first, second] = rows
    assert (first["node"], first["device"], first["power_w"]) == (3, 0, 700.0)
    assert (first["temp_gpu_c"], first["temp_mem_c"]) == (80.0, 70.0)
    assert (first["clock_sm_mhz"], first["clock_mem_mhz"]) == (2100.0, 1300.0)  # clk / cur_clk
    assert first["util_gpu_pct"] == 100.0 and first["mem_used_bytes"] == 10**10
    assert 0 <= first["link_tx_bytes"] <= second["link_tx_bytes"]
    assert facts[0]["amdsmi_version"] == {"6.1": "6.1.2", "6.3": "6.3.3", "7.0": "7.0.2"}[version]
    assert facts[0]["power_limit_w"] == 750.0 and facts[0]["clock_sm_max_mhz"] == 2100.0
    if version == "6.1":  # no residency counters, no target_graphics_version
        assert not fields["throttle"].readable
        assert "amdsmi 6.1.2 returns no 'accumulation_counter'" in fields["throttle"].reason
        assert facts[0]["gfx_target"].startswith("gfx942 (from the market name")
    else:
        assert fields["throttle"].readable and second["throttle"] == THROTTLE_BITS["power_cap"]
        assert facts[0]["gfx_target"] == "gfx942 (from amdsmi_get_gpu_asic_info)"
    assert all(info.reason.endswith("not yet verified on hardware") for info in fields.values())


def test_amdsmi_older_than_6_1_is_refused_in_one_line(fake_amdsmi) -> None:
    fake_amdsmi("5.5", [mi300x()])
    with pytest.raises(TelemetryNotSupportedError) as err:
        AmdSmiSource(node=0)
    message = str(err.value)
    assert "\n" not in message and message.startswith("amdsmi (unknown version) lacks ")
    assert message.endswith("needs AMD SMI 6.1 (ROCm 6.1) or newer")


def test_init_failure_says_how_to_fix(fake_amdsmi) -> None:
    fake_amdsmi("7.0", [mi300x()], init_status="AMDSMI_STATUS_DRIVER_NOT_LOADED")
    with pytest.raises(TelemetryNotSupportedError, match="lsmod | grep amdgpu"):
        AmdSmiSource(node=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", ["6.3", "7.0"])
def test_energy_in_the_exact_unit_once_checked(fake_amdsmi, version: str) -> None:
    fake_amdsmi(version, [mi300x()])
    source = AmdSmiSource(node=0)
    try:
        rows = sample_ticks(source, 65)  # over 1.3 s: the check needs 1 s
        info = source.fields()["energy_j"]
    finally:
        source.close()
    energy = [r["energy_j"] for r in rows]
    first = next(i for i, e in enumerate(energy) if e is not None)
    assert rows[first]["t"] - rows[0]["t"] >= 1.0 and energy[:first] == [None] * first
    # 2^40 counts of 2^-16 J, plus < 2 s at 700 W: 16.78 MJ; at 15.3 uJ it would be 0.27% more
    assert energy[first] == pytest.approx(ENERGY_START * 2**-16, abs=1400)
    assert energy[first:] == sorted(energy[first:])
    assert info.readable and "energy unit 2^-16 J" in info.reason
    assert "would be +0.27%" in info.reason and "within 0.5..2" in info.reason


@pytest.mark.timeout(60)
def test_energy_counter_that_runs_backwards_is_dropped(fake_amdsmi) -> None:
    fake_amdsmi("6.1", [mi300x(energy_reset_after=60)])
    source = AmdSmiSource(node=0)
    try:
        rows = sample_ticks(source, 80)  # the check passes within 50 ticks (1 s at >= 20 ms)
        info = source.fields()["energy_j"]
    finally:
        source.close()
    energy = [r["energy_j"] for r in rows]
    assert any(e is not None for e in energy[:59]) and energy[59:] == [None] * len(energy[59:])
    assert info.readable  # it gave values until then
    assert "energy counter ran backwards at t=" in info.reason and "ROCm/amdsmi#115" in info.reason


def test_a_device_that_fails_mid_run_loses_only_that(fake_amdsmi) -> None:
    # Device 1's temperature reads fail for good after 3 calls (2 per tick: hotspot and VRAM),
    # and device 2 falls off entirely: every call fails. Device 0 goes on untouched.
    drm = "AMDSMI_STATUS_DRM_ERROR"
    gone = [{"call": c, "after": 8, "times": None, "status": "AMDSMI_STATUS_NOT_FOUND"}
            for c in ("amdsmi_get_power_info", "amdsmi_get_energy_count",
                      "amdsmi_get_temp_metric", "amdsmi_get_clock_info",
                      "amdsmi_get_gpu_activity", "amdsmi_get_gpu_memory_usage",
                      "amdsmi_get_gpu_metrics_info")]
    fake_amdsmi("7.0", [mi300x(0),
                        mi300x(1, failures=[{"call": "amdsmi_get_temp_metric", "after": 3,
                                             "times": None, "status": drm}]),
                        mi300x(2, failures=gone)])
    source = AmdSmiSource(node=0)
    try:
        rows = [r for i in range(10) for r in source.sample(1_000.0 + 0.02 * i)]
        fields = source.fields()
    finally:
        source.close()
    temps = by_device(rows, "temp_gpu_c")
    assert temps[0] == [80.0] * 10
    assert temps[1] == [80.0] + [None] * 9  # probe + tick 0 use 3 calls; tick 1 fails
    assert len(temps[2]) < 10 and by_device(rows, "clock_sm_mhz")[0] == [2100.0] * 10
    reason = fields["temp_gpu_c"].reason
    assert "device 0: read from amdsmi_get_temp_metric HOTSPOT;" in reason
    assert "lost at t=1000.020: Error code: 6 | AMDSMI_STATUS_DRM_ERROR" in reason
    assert "AMDSMI_STATUS_NOT_FOUND - Device Not found" in reason
    assert fields["temp_gpu_c"].readable


@pytest.mark.parametrize("status", ["AMDSMI_STATUS_RETRY", "AMDSMI_STATUS_BUSY",
                                    "AMDSMI_STATUS_TIMEOUT"])
def test_transient_statuses_are_retried_next_tick(fake_amdsmi, status: str) -> None:
    # the 2nd and 3rd power reads after the probe fail transiently, then it reads again
    fake_amdsmi("6.3", [mi300x(failures=[{"call": "amdsmi_get_power_info", "after": 2,
                                          "times": 2, "status": status}])])
    source = AmdSmiSource(node=0)
    try:
        rows = [r for i in range(5) for r in source.sample(1_000.0 + 0.02 * i)]
        info = source.fields()["power_w"]
    finally:
        source.close()
    assert [r["power_w"] for r in rows] == [700.0, None, None, 700.0, 700.0]
    assert info.readable and "2 transient failure(s), each retried on the next tick; the first " \
        "at t=1000.020" in info.reason and status in info.reason


def test_xgmi_counters_sum_links_and_reset_on_a_drop(fake_amdsmi) -> None:
    # 64-bit KiB counters: link 0 starts just below 2^64, so it drops to near 0 -- too wide to
    # be a wrap within a run, so a reset: that sample is null, the count goes on. It drops 150 ms
    # after amdsmi_init, well after the first read and well before the last (15 ticks, >=300 ms).
    fake_amdsmi("7.0", [mi300x(xgmi_kib_per_s=[1e6, 1e6], xgmi_start=[2**64 - 150_000, 0])])
    source = AmdSmiSource(node=0)
    try:
        rows = sample_ticks(source, 15)
        info = source.fields()["link_tx_bytes"]
    finally:
        source.close()
    tx = [r["link_tx_bytes"] for r in rows]
    assert None in tx
    values = [v for v in tx if v is not None]
    assert values == sorted(values) and values[-1] > 0
    assert "gpu_metrics xgmi_write_data_acc: 1 reset" in info.reason


def test_mi300_never_calls_the_sleeping_violation_api(fake_amdsmi) -> None:
    fake = fake_amdsmi("7.0", [mi300x(i) for i in range(8)])
    source = AmdSmiSource(node=0)
    try:
        t0 = time.monotonic()
        rows = [r for _ in range(5) for r in source.sample(time.time())]
        took = (time.monotonic() - t0) / 5
    finally:
        source.close()
    assert len(rows) == 40 and took < 0.4  # a violation read would take 0.1 s per device
    assert not any(name == "amdsmi_get_violation_status" for _, name in fake._calls)


SLOW_CALL_S = 0.01
"""How long the fake's energy counter read takes, on every device."""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("node", ["8 x MI300X", "4 x MI250X (8 GCDs)"])
def test_eight_devices_keep_the_fast_period_while_each_energy_read_takes_10_ms(
        fake_amdsmi, tmp_path, node: str) -> None:
    """The real sampler process builds the real source on the fake: 8 devices whose energy
    counter takes 10 ms to read, one of them failing mid-run. Each device's slow fields are
    read on a thread of their own at their own period; the fast rows keep theirs, the host
    rows come every tick, and the sleeping violation API is never called."""
    import statistics

    from kit.bundle.writer import concat_chunks
    from kit.telemetry.amd.readers import SLOW_READ_MS
    from kit.telemetry.sampler import TelemetrySampler

    sleeps = {"amdsmi_get_energy_count": SLOW_CALL_S, "amdsmi_get_violation_status": 0.1}
    if node.endswith("MI300X"):
        devices = [mi300x(i, sleep_s=sleeps) for i in range(8)]
        counting = set(range(8))
    else:  # each package's primary GCD reports its power and energy (quirk (a))
        devices = [mi250_gcd(i % 2 == 0, i, sleep_s=sleeps) for i in range(8)]
        counting = {0, 2, 4, 6}
    devices[3]["failures"] = [{"call": "amdsmi_get_gpu_metrics_info", "after": 20, "times": None,
                               "status": "AMDSMI_STATUS_DRM_ERROR"}]
    fake_amdsmi("7.0", devices)
    chunks = tmp_path / "chunks"
    sampler = TelemetrySampler([("amdsmi", {"node": 0}), ("host", {"node": 0})],
                               interval_ms=20, chunks_dir=chunks, flush_s=0.2)
    sampler.start()
    try:  # the counter gives values once checked against power x time over 1 s
        wait_for_reads(chunks, counting, "energy_j", reads=6, timeout_s=120)
    finally:
        report = sampler.stop()
    rows = concat_chunks(chunks).to_pylist()
    gpu = [r for r in rows if r["source"] == "gpu"]
    assert report.errors == []
    assert len([r for r in rows if r["source"] == "host"]) == report.ticks
    for device in range(8):
        mine = [r for r in gpu if r["device"] == device]
        fast = [r for r in mine if r["temp_gpu_c"] is not None]
        slow = [r for r in mine if r["energy_j"] is not None]
        # The energy counter comes in rows of its own (the old structure read it in the tick,
        # into the fast rows), which the fast rows outnumber: counts, not times.
        assert all(r["energy_j"] is None for r in fast)
        assert all(r["temp_gpu_c"] is None for r in slow)
        if device in counting:
            assert len(fast) > len(slow) >= 6
            assert_never_read_early(gpu, device, "energy_j", SLOW_READ_MS["energy_j"])
        else:
            assert not slow
        # On 8 MI300X the old structure's tick read 8 energy counters, one after another: 80 ms.
        assert statistics.median(spacing_ms(gpu, device, "temp_gpu_c")) < 8 * SLOW_CALL_S * 1e3
    last_fast = {d: [r for r in gpu if r["device"] == d and r["temp_gpu_c"] is not None][-1]
                 for d in range(8)}
    assert last_fast[3]["throttle"] is None  # its gpu_metrics failed: lost there only
    assert last_fast[0]["throttle"] == THROTTLE_BITS["power_cap"]
    worst = max(statistics.fmean(spacing_ms(gpu, d, "energy_j")) for d in counting)
    assert report.field_periods_ms["amdsmi"]["energy_j"] == pytest.approx(worst)
    info = report.sources["amdsmi"]
    assert info["energy_j"].read_period_ms == SLOW_READ_MS["energy_j"]
    assert "device 3: " in info["throttle"].reason and "AMDSMI_STATUS_DRM_ERROR" in (
        info["throttle"].reason)
    assert report.devices["amdsmi"][7]["uuid"].endswith("-7")
