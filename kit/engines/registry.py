"""The engines the kit trains with, by name: each spec owns what is known before a rank starts.

An :class:`EngineSpec` says which layouts and options its engine refuses, which packages it
needs, what a parameter costs in memory and how it is sharded, where each rank sits in the
layout, and how to build the engine inside a rank. Nothing here imports torch or a framework:
specs are consulted while resolving a run, and only :meth:`EngineSpec.build` (in a rank) loads
the engine. Adding an engine is one module with a spec and one :func:`register_engine` line in
``kit/engines/__init__.py``.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib.util import find_spec
from typing import TYPE_CHECKING, ClassVar

from kit.config.run import ParallelConfig, RunConfig
from kit.config.targets import import_target
from kit.engines.execution import EAGER, Execution
from kit.errors import KitInputError

if TYPE_CHECKING:
    from kit.engines.base import Engine


@dataclass(frozen=True)
class BytesPerParameter:
    """Bytes each parameter costs before sharding."""

    weights: int
    grads: int
    optimizer: int
    """Optimizer states: fp32 master copy (mixed precision only) and AdamW's two fp32 moments."""


@dataclass(frozen=True)
class Sharding:
    """Which model-state parts are divided over the data-parallel group."""

    weights: bool = False
    grads: bool = False
    optimizer: bool = False


class EngineSpec(ABC):
    """What the kit knows about one engine before any rank starts.

    Attributes:
        name: The engine's name (``--engine``).
        requires: Importable module -> how to install it, checked for a real run.
        options: RunRequest fields that only this engine takes, each with the one-line message
            that refuses it when another engine is selected.
        speed_features: The names ``--speed`` takes for this engine.
        packages: The distributions it trains with, as a node's inventory names them
            (``engine_versions``): what a system description names as the run's framework.
    """

    name: ClassVar[str]
    requires: ClassVar[dict[str, str]] = {}
    packages: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[dict[str, str]] = {}
    speed_features: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def violations(self, cfg: RunConfig) -> list[str]:
        """Why this engine cannot run ``cfg`` (empty when it can), one line each."""

    def unknown_speed(self, cfg: RunConfig) -> list[str]:
        """The line refusing ``--speed`` names this engine does not have (empty if none)."""
        unknown = sorted(set(cfg.speed or ()) - set(self.speed_features))
        if not unknown:
            return []
        return [f"--speed: unknown feature(s) {', '.join(unknown)} for the {self.name} engine; "
                f"known: {', '.join(self.speed_features)} (or none)"]

    def missing(self) -> list[str]:
        """Why the engine's packages cannot be imported here (empty when they can)."""
        return [f"{module} is not installed here; {hint}"
                for module, hint in self.requires.items() if find_spec(module) is None]

    @abstractmethod
    def bytes_per_parameter(self, cfg: RunConfig) -> BytesPerParameter:
        """Weights, gradient and optimizer bytes per parameter on GPUs in ``cfg``'s dtype."""

    @abstractmethod
    def sharding(self, cfg: RunConfig, zero_stage: int | None = None) -> Sharding:
        """Which model-state parts ``cfg`` shards over data parallelism.

        ``zero_stage`` overrides a ZeRO-style stage option where the engine has one.
        """

    def unsharded_bytes_per_parameter(self, cfg: RunConfig) -> BytesPerParameter:
        """Bytes per parameter an engine holds whole on every rank beside its sharded states
        for the whole step (e.g. gathered weights it keeps); none by default."""
        return BytesPerParameter(weights=0, grads=0, optimizer=0)

    @abstractmethod
    def placement(self, parallel: ParallelConfig, rank: int) -> dict[str, int]:
        """``tp_rank``, ``cp_rank``, ``dp_rank``, ``pp_rank`` and ``ep_rank`` of ``rank``."""

    engine_class: ClassVar[str]
    """``"module:Class"`` of the :class:`Engine` a rank trains with. A string, as megatron-core's
    ``ModuleSpec`` names its modules: the spec never imports its engine (the engine imports the
    spec's constants), and the framework loads only in a rank, in :meth:`build`."""

    def build(self) -> "Engine":
        """The engine object a rank trains with (imports the framework)."""
        engine: Engine = import_target(self.engine_class)()
        return engine

    def execution(self, cfg: RunConfig) -> Execution:
        """How ``cfg``'s training step executes (:mod:`kit.engines.execution`): eager unless
        the engine captures its step in a CUDA graph."""
        return Execution(EAGER, (f"the {self.name} engine captures no CUDA graph",))

    def options_summary(self, cfg: RunConfig) -> str:
        """The engine's own options in ``cfg``, for the dry-run table ("" when none)."""
        return ""


ENGINES: dict[str, EngineSpec] = {}
"""Registered engines by name."""


def register_engine(spec: EngineSpec) -> None:
    """Make ``spec`` available as ``--engine spec.name``."""
    ENGINES[spec.name] = spec


def engine_packages(engine: str) -> tuple[set[str], set[str]]:
    """The packages ``engine`` trains with, and those only other registered engines use (an
    engine not registered here: nothing known to be unused)."""
    spec = ENGINES.get(engine)
    if spec is None:
        return set(), set()
    used = set(spec.packages)
    return used, {p for s in ENGINES.values() for p in s.packages} - used


def foreign_options(engine: str, given: dict[str, object]) -> list[str]:
    """Messages for options in ``given`` (field -> value, defaults left out) that belong to an
    engine other than ``engine``."""
    return [message for name, spec in ENGINES.items() if name != engine
            for option, message in spec.options.items() if option in given]


def engine_spec(name: str) -> EngineSpec:
    """The registered engine ``name``.

    Raises:
        KitInputError: No engine of that name.
    """
    try:
        return ENGINES[name]
    except KeyError:
        known = ", ".join(sorted(ENGINES))
        raise KitInputError(f"unknown engine {name!r}; known: {known}") from None
