"""Training engines behind one interface (see :mod:`kit.engines.base`), registered by name.

Each engine has an :class:`~kit.engines.registry.EngineSpec` (its checks, packages, memory
terms and rank placement) registered below; a rank builds its engine through the spec, which
is when the framework is imported. Importing this package imports no framework and no torch.
"""

from kit.engines.deepspeed.spec import DeepSpeedSpec
from kit.engines.fsdp2.spec import FSDP2Spec
from kit.engines.megatron.spec import MegatronSpec
from kit.engines.registry import (
    ENGINES,
    engine_packages,
    engine_spec,
    foreign_options,
    register_engine,
)

register_engine(MegatronSpec())
register_engine(DeepSpeedSpec())
register_engine(FSDP2Spec())

__all__ = ["ENGINES", "engine_packages", "engine_spec", "foreign_options", "register_engine"]
