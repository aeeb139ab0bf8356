"""AMD SMI backend: its refusal on a host without ROCm, and its pure quirk handling.

No AMD GPU is reachable from here, so the backend is not yet verified on hardware. These tests
run real code only: the real ``amdsmi`` package failing to load libamd_smi.so on this host,
and the functions that handle the MI250, MI200 and MI300 quirks, checked against bit values
copied from the kernel headers cited next to them (not from the module under test).
"""

import inspect
import subprocess
import sys

import pytest

import kit.telemetry.amdsmi as amd
from kit.bundle.schema import THROTTLE_BITS
from kit.telemetry import SOURCES, TelemetryNotSupportedError, build_source
from kit.telemetry.amdsmi import (
    MI250_ODD_DIE_REASON,
    AmdSmiSource,
    EnergyCounterCheck,
    Mi250Die,
    asic_family,
    attribute_package_power,
    decode_amd_throttle_status,
    energy_counter_plausible,
    load_amdsmi,
    mi250_die,
    violation_throttle_bits,
)
from tests.conftest import REPO


def _rocm_here() -> bool:
    try:
        load_amdsmi()
    except TelemetryNotSupportedError:
        return False
    return True


without_rocm = pytest.mark.skipif(
    _rocm_here(), reason="libamd_smi.so loads here: the refusal path cannot be seen"
)


# --- the backend on a host without ROCm ---------------------------------------------------------


def test_registered() -> None:
    assert SOURCES["amdsmi"] == "kit.telemetry.amdsmi:AmdSmiSource"


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
        "import kit.telemetry.amdsmi\n"
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
    assert "KeyError" in done.stderr  # what amdsmi 7.0.2 raises without ROCm


def test_every_docstring_says_not_verified() -> None:
    assert "not yet verified on hardware" in (amd.__doc__ or "")
    documented = []
    for name, obj in vars(amd).items():
        if getattr(obj, "__module__", None) != amd.__name__ or not callable(obj):
            continue
        documented.append((name, obj.__doc__))
        if inspect.isclass(obj):
            documented += [
                (f"{name}.{n}", m.__doc__)
                for n, m in vars(obj).items()
                if inspect.isfunction(m) and not n.startswith("__")
            ]
    assert len(documented) > 20
    unmarked = [
        n for n, doc in documented if "not yet verified on hardware" not in str(doc).lower()
    ]
    assert unmarked == []


# --- quirk (a): MI250 package power -------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "name", "expected"),
    [
        (0, "AMD Instinct MI250X/MI250", Mi250Die(0, 0)),
        (1, "AMD Instinct MI250X/MI250", Mi250Die(0, 1)),
        (6, "AMD Instinct MI250X", Mi250Die(3, 0)),
        (7, "AMD Instinct MI250", Mi250Die(3, 1)),
        (1, "AMD Instinct MI210", None),  # single-GCD MI200
        (1, "AMD Instinct MI300X", None),
    ],
)
def test_mi250_die_pairing(index: int, name: str, expected: Mi250Die | None) -> None:
    assert mi250_die(index, name) == expected


def test_mi250_package_power_goes_to_the_primary_die() -> None:
    # A node of four MI250X packages: AMD SMI shows eight GCDs; the even one of each pair
    # reports the package's power, the odd one reports 0 W (ROCm/rocm_smi_lib#160).
    reported_w = [541.0, 0.0, 498.0, 0.0, 560.0, 0.0, 87.0, 0.0]
    recorded = [
        attribute_package_power(mi250_die(i, "AMD Instinct MI250X/MI250"), w)
        for i, w in enumerate(reported_w)
    ]
    assert [w for w, _ in recorded] == [541.0, None, 498.0, None, 560.0, None, 87.0, None]
    assert [why for _, why in recorded[1::2]] == [MI250_ODD_DIE_REASON] * 4
    assert all("package power" in str(why) for _, why in recorded[::2])
    assert sum(w for w, _ in recorded if w is not None) == sum(reported_w)


def test_other_gpus_keep_their_own_power() -> None:
    assert attribute_package_power(mi250_die(1, "AMD Instinct MI300X"), 712.0) == (712.0, None)


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
# PROCHOT 0, PPT 1, THERMAL_SOCKET 2, THERMAL_VR 3, THERMAL_HBM 4 -- the same five reasons
# amdsmi_get_violation_status reports as active_prochot_thrm, active_ppt_pwr,
# active_socket_thrm, active_vr_thrm and active_hbm_thrm (AMD SMI docs, "GPU violations").


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


def test_violation_flags_to_mi300_bits() -> None:
    # Shaped like amdsmi.amdsmi_get_violation_status()'s result on an MI300X that is
    # power-capped with hot HBM.
    status = {
        "acc_counter": 123456,
        "active_prochot_thrm": False,
        "active_ppt_pwr": True,
        "active_socket_thrm": False,
        "active_vr_thrm": False,
        "active_hbm_thrm": True,
        "per_ppt_pwr": 42,
    }
    bits = violation_throttle_bits(status)
    assert bits == (1 << 1) | (1 << 4)
    assert decode_amd_throttle_status(bits, "mi300") == (
        THROTTLE_BITS["power_cap"] | THROTTLE_BITS["thermal_sw"]
    )


def test_violation_api_unsupported_on_mi200() -> None:
    # MI200 and older answer N/A (max uint) for every violation field.
    status = dict.fromkeys(
        [
            "active_prochot_thrm",
            "active_ppt_pwr",
            "active_socket_thrm",
            "active_vr_thrm",
            "active_hbm_thrm",
        ],
        "N/A",
    )
    assert violation_throttle_bits(status) is None


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


def test_check_drops_a_counter_that_later_runs_backwards() -> None:
    check = EnergyCounterCheck(min_span_s=1.0, min_samples=5)
    trace = _trace(1.0, seconds=1.5)
    assert _feed(check, trace)[-1] is not None
    t, p, e = trace[-1]
    assert check.feed(t + 0.05, p, e - 10.0) is None
    assert check.feed(t + 0.10, p, e + 50.0) is None
    assert check.ok is False
    assert "ran backwards" in str(check.reason)


def test_check_ignores_samples_without_power() -> None:
    check = EnergyCounterCheck(min_span_s=1.0, min_samples=5)
    recorded = [check.feed(1e9 + 0.1 * i, None, 7e6 + 50.0 * i) for i in range(30)]
    assert recorded == [None] * 30
    assert check.ok is None
