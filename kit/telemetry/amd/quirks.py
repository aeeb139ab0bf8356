"""AMD Instinct hardware quirks, as small pure functions: not yet verified on hardware.

The AMD SMI backend (:mod:`kit.telemetry.amd.amdsmi`) reads the library; what its numbers mean on
each GPU generation is decided here, from AMD's own sources (each function cites them) and
checked in CI without a GPU (``tests/test_telemetry_amdsmi.py``). No AMD GPU has run this code.

(a) MI250 package power: two GCDs per package, and only the primary reports power and energy,
    for the whole package (:func:`mi250_is_secondary`, :func:`mi250_dies`,
    :func:`package_share`).
(b) Throttle reasons: MI200 reports ASIC bits in gpu_metrics ``throttle_status``; MI300+
    accumulates per-reason residency counters instead (:func:`decode_amd_throttle_status`,
    :class:`ResidencyThrottle`).
(c) The energy counter is known to stall or run backwards (ROCm/amdsmi#38, #115): it is
    checked against power x time before it is trusted (:func:`energy_counter_plausible`,
    :class:`EnergyCounterCheck`).
(d) Energy unit: AMD SMI reports 15.3 uJ per count; the kernel's unit is 2^-16 J
    (:func:`energy_unit_j`).
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

from kit.bundle.telemetry_fields import THROTTLE_BITS
from kit.telemetry.counters import WrappingCounter, describe_events, modulus_of_bits

AsicFamily = Literal["mi200", "mi300"]
"""Which throttle-reason bit layout a device uses (quirk (b))."""

ENERGY_CHECK_MIN_S = 1.0
"""Quirk (c): seconds of samples compared before the energy counter is trusted."""

ENERGY_CHECK_MIN_SAMPLES = 5
"""Quirk (c): samples compared, at least, before the energy counter is trusted."""

ENERGY_RATIO_RANGE = (0.5, 2.0)
"""Quirk (c): counter / (power x time) outside this range means the counter is broken."""

KERNEL_ENERGY_UNIT_J = 2.0**-16
"""Quirk (d): the energy accumulator's unit, 15.2587890625 uJ: amdgpu's kgd_pp_interface.h
("Energy (15.259uJ (2^-16) units)") and smu_v13_0_6_ppt.c ("Energy counter reported in
15.259uJ (2^-16) units"); aldebaran's SMU metrics table says "15.259uJ resolution"."""

EXACT_UNIT_TARGETS = ("gfx90a", "gfx940", "gfx941", "gfx942")
"""Quirk (d): gfx targets whose energy unit the kernel sources above state: aldebaran (MI200)
and smu_v13_0_6 (MI300)."""

# --- quirk (a): MI250 package power -----------------------------------------------------------


@dataclass(frozen=True)
class Mi250Die:
    """Where one MI250 GCD sits, as observed: its package and which die of it.

    Not yet verified on hardware.

    Attributes:
        package: Package index, counting packages in AMD SMI device order (devices ``2k`` and
            ``2k+1``).
        die: 0 for the primary GCD (it reports the package's power), 1 for the secondary.
        evidence: What the counters said, for the manifest.
        decided: Whether the counters told the role; when not, ``die`` is 0 and the GCD keeps
            its own readings.
    """

    package: int
    die: int
    evidence: str
    decided: bool = True


def is_mi250(market_name: str) -> bool:
    """Whether a device is an MI250/MI250X GCD (MI210 is a single-GCD MI200).

    Not yet verified on hardware.
    """
    return "MI250" in market_name


def mi250_is_secondary(energy_count: float | None, power_w: float | None) -> bool:
    """Whether an MI250 GCD is its package's secondary die, from what it reports.

    Not yet verified on hardware. The kernel writes power and energy only for the primary die
    and zero for the other (aldebaran_ppt.c ``aldebaran_get_gpu_metrics``: "Valid power data is
    available only from primary die"), and ROCm's ``rocm_smi.py`` (``checkIfSecondaryDie``)
    takes an energy counter of 0 for the secondary; which of the pair is primary is not fixed
    ("usually one above or below", ``showPower``).

    Args:
        energy_count: The energy accumulator, raw; ``None`` when N/A.
        power_w: Socket power (current or average, whichever the GCD reports); ``None`` when
            N/A.
    """
    return energy_count == 0 and (power_w is None or power_w == 0)


def mi250_dies(secondary: Mapping[int, bool]) -> dict[int, Mi250Die]:
    """Package and die of every MI250 GCD, decided per package from the counters.

    Not yet verified on hardware. AMD SMI lists GCDs in PCI bus order, both GCDs of a package
    next to each other, so devices ``2k`` and ``2k+1`` are package ``k`` (Zeus's
    ``zeus/device/gpu/amd.py`` pairs them the same way); which of them is primary is observed,
    not assumed.

    Args:
        secondary: AMD SMI device index -> :func:`mi250_is_secondary` for each MI250 GCD sampled.

    Returns:
        Index -> :class:`Mi250Die`. A pair whose GCDs do not show exactly one secondary keeps
        each GCD's own reading (die 0) and says so in ``evidence``.
    """
    out: dict[int, Mi250Die] = {}
    for index, is_secondary in secondary.items():
        package = index // 2
        partner = package * 2 + (1 - index % 2)
        seen = f"energy counter {'0 and no power' if is_secondary else 'counting'}"
        if partner in secondary and secondary[partner] == is_secondary:
            both = "secondary" if is_secondary else "primary"
            out[index] = Mi250Die(package, 0, f"{seen}, as is its partner device {partner}: "
                                  f"both look {both}, so each keeps its own reading",
                                  decided=False)
        else:
            role = "secondary" if is_secondary else "primary"
            out[index] = Mi250Die(package, int(is_secondary), f"{seen}: {role}")
    return out


def package_share(die: Mi250Die) -> tuple[bool, str]:
    """Whether an MI250 GCD's own power and energy are recorded, and a note on what they cover.

    Not yet verified on hardware. The primary GCD reports the power of the whole package and
    the secondary 0 W (ROCm/rocm_smi_lib#160, mlco2/codecarbon#1097): recording that 0 would be
    a made-up reading, so the secondary's power and energy are null.

    Args:
        die: The GCD's :class:`Mi250Die`.

    Returns:
        ``(True, note)`` for a primary (its readings cover both GCDs) or a GCD whose role was
        not decided (its own readings); ``(False, reason)`` for a secondary.
    """
    where = f"MI250 package {die.package}: {die.evidence}"
    if die.die == 1:
        return False, f"{where}; its power and energy are reported by the primary GCD"
    return True, f"{where}; covers both GCDs" if die.decided else where


# --- quirk (b): throttle reasons ----------------------------------------------------------------
#
# MI200 (aldebaran) throttle_status: the PMFW's ASIC-specific bits, THROTTLER_*_BIT in
# drivers/gpu/drm/amd/pm/swsmu/inc/pmfw_if/smu13_driver_if_aldebaran.h; bits 5, 8-10 and
# 14-18 are spare. aldebaran_ppt.c copies them into gpu_metrics v1.3 unchanged.
# MI300+ (smu_v13_0_6): gpu_metrics throttle_status is no longer filled; the reasons are the
# five THROTTLER_*_BIT of smu_v13_0_6_pmfw.h, accumulated as residency counters (gpu_metrics
# v1.4+: accumulation_counter, prochot/ppt/socket_thm/vr_thm/hbm_thm_residency_acc).
# Mapping to the kit's bits: PPT (package power tracking) is the power cap; the SMU's own
# temperature loops (GPU hotspot, memory, VR, socket) are software thermal throttling; PROCHOT
# is the hardware "processor hot" signal. TDC (current limits) and APCC (peak current
# control) limit current, not power or temperature, and have no kit bit: "other".

_MI200_THROTTLER: dict[int, tuple[str, str]] = {
    0: ("PPT0", "power_cap"),
    1: ("PPT1", "power_cap"),
    2: ("TDC_GFX", "other"),
    3: ("TDC_SOC", "other"),
    4: ("TDC_HBM", "other"),
    6: ("TEMP_GPU", "thermal_sw"),  # hotspot, against ThotspotLimit
    7: ("TEMP_MEM", "thermal_sw"),  # HBM, against TmemLimit
    11: ("TEMP_VR_GFX", "thermal_sw"),
    12: ("TEMP_VR_SOC", "thermal_sw"),
    13: ("TEMP_VR_MEM", "thermal_sw"),
    19: ("APCC", "other"),
}
_MI300_THROTTLER: dict[int, tuple[str, str]] = {
    0: ("PROCHOT", "thermal_hw"),
    1: ("PPT", "power_cap"),
    2: ("THERMAL_SOCKET", "thermal_sw"),  # AID, XCD or CCD temperature
    3: ("THERMAL_VR", "thermal_sw"),
    4: ("THERMAL_HBM", "thermal_sw"),
}
_THROTTLERS: dict[str, dict[int, tuple[str, str]]] = {
    "mi200": _MI200_THROTTLER,
    "mi300": _MI300_THROTTLER,
}

RESIDENCY_BITS: dict[str, int] = {
    "prochot_residency_acc": 0,
    "ppt_residency_acc": 1,
    "socket_thm_residency_acc": 2,
    "vr_thm_residency_acc": 3,
    "hbm_thm_residency_acc": 4,
}
"""gpu_metrics residency counter -> its MI300 throttler bit (smu_v13_0_6_pmfw.h): the counters
behind ``amdsmi_get_violation_status``'s ``acc_*`` and ``active_*`` fields (amd_smi.cc)."""

RESIDENCY_COUNTER_BITS = 32
"""Width of gpu_metrics' accumulation and residency counters in the kernel (gpu_metrics v1.6,
rocm_smi_gpu_metrics.h: ``uint32_t m_accumulation_counter``; AMD SMI widens them to 64 bits,
"bumped up public to uint64_t"), so they wrap at 2^32."""


def asic_family(gfx_target: str) -> AsicFamily | None:
    """Return the throttle bit layout of a GPU from its gfx target, ``None`` if unknown here.

    Not yet verified on hardware.

    Args:
        gfx_target: e.g. ``"gfx90a"`` (MI200), ``"gfx942"`` (MI300), ``"gfx950"`` (MI350).
    """
    if gfx_target == "gfx90a":
        return "mi200"
    if gfx_target.startswith(("gfx94", "gfx95")):
        return "mi300"
    return None


def gfx_target_from_name(market_name: str) -> str | None:
    """The gfx target of an Instinct GPU by its market name, for AMD SMI 6.1.

    Not yet verified on hardware. AMD SMI 6.1's ``amdsmi_get_gpu_asic_info`` has no
    ``target_graphics_version`` (added in 6.2); MI210/MI250/MI250X are all gfx90a (aldebaran)
    and the MI300 series gfx942 (ROCm's GPU support tables).
    """
    if re.search(r"MI2(10|50)", market_name):
        return "gfx90a"
    if re.search(r"MI3[0-2]\d", market_name):
        return "gfx942"
    return None


def decode_amd_throttle_status(bits: int, asic_family: AsicFamily) -> int:
    """Map an AMD throttler bitmask to the kit's throttle bits.

    Not yet verified on hardware.

    Args:
        bits: MI200: gpu_metrics ``throttle_status``; MI300: :class:`ResidencyThrottle` bits.
        asic_family: Which layout ``bits`` uses (:func:`asic_family`).

    Returns:
        An OR of :data:`~kit.bundle.schema.THROTTLE_BITS`; any bit not known here (a spare or
        a newer firmware's) sets ``other`` rather than reading as "not throttled".

    Raises:
        ValueError: ``bits`` is negative.
    """
    if bits < 0:
        raise ValueError(f"not a throttler bitmask: {bits}")
    out = 0
    for position, (_, kit_name) in _THROTTLERS[asic_family].items():
        if bits >> position & 1:
            out |= THROTTLE_BITS[kit_name]
            bits &= ~(1 << position)
    return out | (THROTTLE_BITS["other"] if bits else 0)


class ResidencyThrottle:
    """MI300+ throttle reasons from gpu_metrics' residency counters, differenced between ticks.

    Not yet verified on hardware. ``amdsmi_get_violation_status`` reads gpu_metrics, sleeps
    100 ms inside the library and reads again (amd_smi.cc, ``kFASTEST_POLL_TIME_MS``), which
    would stall every sampler tick; this computes the same thing from two ticks' readings. Like
    the library, a reason is active when its residency grew by at least 1% of the accumulation
    counter's advance (the library's integer ``per_*`` > 0). When the accumulation counter did
    not advance (AMD SMI caches gpu_metrics for 100 ms), the last interval's reasons stand.
    """

    def __init__(self) -> None:
        modulus = modulus_of_bits(RESIDENCY_COUNTER_BITS)
        self._counters = {k: WrappingCounter(modulus)
                          for k in ("accumulation_counter", *RESIDENCY_BITS)}
        self._last: dict[str, float] | None = None
        self._bits: int | None = None

    def update(self, metrics: Mapping[str, Any], t: float) -> int | None:
        """Take one gpu_metrics reading; return the MI300 throttler bits of the last interval.

        Not yet verified on hardware.

        Args:
            metrics: ``amdsmi_get_gpu_metrics_info``'s dict (AMD SMI 6.3+), with
                ``accumulation_counter`` and the ``*_residency_acc`` counters.
            t: When it was read, unix seconds.

        Returns:
            Bits for :func:`decode_amd_throttle_status` (``"mi300"``); ``None`` before the
            first interval, or when the counters read N/A.

        Raises:
            KeyError: The dict has no such counters (AMD SMI older than 6.3).
        """
        now: dict[str, float] = {}
        for key, counter in self._counters.items():
            raw = metrics[key]
            if not isinstance(raw, int) or isinstance(raw, bool):  # "N/A"
                return None
            counter.update(raw, t)  # a narrow register: a drop is a wrap, never a reset
            now[key] = counter.advance
        last, self._last = self._last, now
        if last is None:
            return None
        acc = now["accumulation_counter"] - last["accumulation_counter"]
        if acc > 0:
            self._bits = sum(1 << bit for key, bit in RESIDENCY_BITS.items()
                             if (now[key] - last[key]) * 100 >= acc)
        return self._bits

    def describe_events(self) -> str | None:
        """The residency counters' wraps, in one sentence; ``None`` if none.

        Not yet verified on hardware.
        """
        return describe_events(list(self._counters.values()), "gpu_metrics residency counters")


# --- quirk (c): energy counter check ------------------------------------------------------------


def energy_counter_plausible(samples: Sequence[tuple[float, float, float]]) -> tuple[bool, str]:
    """Compare the energy counter's advance with power integrated over the same samples.

    Not yet verified on hardware. A healthy counter advances by about power x time; one that
    is stuck (ROCm/amdsmi#38), runs backwards (ROCm/amdsmi#115) or is scaled wrongly falls
    outside :data:`ENERGY_RATIO_RANGE`.

    Args:
        samples: ``(t_s, power_w, energy_j)`` in time order, at least two.

    Returns:
        ``(plausible, reason)``; the reason states both energies and their ratio.

    Raises:
        ValueError: Fewer than two samples.
    """
    if len(samples) < 2:
        raise ValueError("need at least two samples")
    span_s = samples[-1][0] - samples[0][0]
    expected_j = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0, _), (t1, p1, _) in pairwise(samples))
    counted_j = samples[-1][2] - samples[0][2]
    where = f"over {span_s:.3g} s ({len(samples)} samples)"
    if expected_j <= 0:
        return False, f"cannot check the energy counter: power x time is {expected_j:.3g} J {where}"
    if counted_j == 0:
        return False, (
            f"energy counter stuck: it did not advance while power x time gave "
            f"{expected_j:.3g} J {where}"
        )
    ratio = counted_j / expected_j
    lo, hi = ENERGY_RATIO_RANGE
    verdict = (
        f"energy counter advanced {counted_j:.3g} J, power x time gave {expected_j:.3g} J "
        f"{where}: ratio {ratio:.3g}"
    )
    if lo <= ratio <= hi:
        return True, f"{verdict}, within {lo}..{hi}"
    return False, f"{verdict}, outside {lo}..{hi}"


class EnergyCounterCheck:
    """Quirk (c) for one device: hold the energy counter back until it has been checked.

    Not yet verified on hardware. The first samples (at least ``min_samples`` over at least
    ``min_span_s``) are compared by :func:`energy_counter_plausible`; until then, and for the
    rest of the run if the check fails or :meth:`drop` is called, the energy to record is
    ``None`` and :attr:`reason` says why.

    Args:
        min_span_s: Seconds of samples to compare.
        min_samples: Samples to compare, at least 2.

    Attributes:
        ok: ``None`` while checking, then whether the counter is trusted.
        reason: The check's verdict, or why the counter was dropped.
    """

    def __init__(
        self, min_span_s: float = ENERGY_CHECK_MIN_S, min_samples: int = ENERGY_CHECK_MIN_SAMPLES
    ) -> None:
        if min_samples < 2:
            raise ValueError("min_samples must be at least 2")
        self._min_span_s = min_span_s
        self._min_samples = min_samples
        self._window: list[tuple[float, float, float]] = []
        self.ok: bool | None = None
        self.reason: str | None = None

    def feed(self, t: float, power_w: float | None, energy_j: float) -> float | None:
        """Take one sample; return the energy to record for it (``None`` when not trusted).

        Not yet verified on hardware.

        Args:
            t: Sample time, seconds.
            power_w: Power read in the same sample; samples without it are not compared.
            energy_j: The counter, joules, never decreasing (see
                :class:`~kit.telemetry.counters.WrappingCounter`).
        """
        if self.ok is None:
            if power_w is not None:
                self._window.append((t, power_w, energy_j))
            w = self._window
            if len(w) < self._min_samples or w[-1][0] - w[0][0] < self._min_span_s:
                return None
            self.ok, self.reason = energy_counter_plausible(w)
            self._window = []
        return energy_j if self.ok else None

    def drop(self, reason: str) -> None:
        """Stop trusting the counter for the rest of the run. Not yet verified on hardware."""
        self.ok = False
        self.reason = reason


# --- quirk (d): energy unit ---------------------------------------------------------------------


def energy_unit_j(gfx_target: str | None, counter_resolution_uj: float) -> tuple[float, str]:
    """The energy accumulator's unit in joules, and a note on where it came from.

    Not yet verified on hardware. AMD SMI reports ``counter_resolution`` 15.3 uJ, hard-coded
    for every ASIC (rocm_smi.cc ``kEnergyCounterResolution = 15.3F``, "hard-coded for now since
    all ASICs have same resolution"), while the kernel's unit is 2^-16 J = 15.2588 uJ: using
    15.3 overstates energy by 0.27%. Where the ASIC is one whose unit the kernel states
    (:data:`EXACT_UNIT_TARGETS`), the exact unit is used.

    Args:
        gfx_target: The device's gfx target, when known.
        counter_resolution_uj: What ``amdsmi_get_energy_count`` reported.
    """
    reported = f"AMD SMI's counter_resolution {counter_resolution_uj:.6g} uJ"
    if gfx_target in EXACT_UNIT_TARGETS:
        off = counter_resolution_uj * 1e-6 / KERNEL_ENERGY_UNIT_J - 1
        return KERNEL_ENERGY_UNIT_J, (
            f"energy unit 2^-16 J (15.2588 uJ, the amdgpu kernel's for {gfx_target}); "
            f"{reported} would be {off:+.2%}"
        )
    return counter_resolution_uj * 1e-6, (
        f"energy unit {reported} (the kernel's exact unit is known here for "
        f"{', '.join(EXACT_UNIT_TARGETS)} only)"
    )
