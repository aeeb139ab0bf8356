"""Training engines behind one interface (see :mod:`kit.engines.base`).

Engines import their frameworks lazily: ``engine_violations`` and ``build_engine`` load
megatron-core or DeepSpeed only when a run really needs them.
"""

from kit.engines.base import Engine
from kit.spec.run import RunConfig


def engine_violations(cfg: RunConfig) -> list[str]:
    """Layout and option choices the selected engine cannot run on the selected platform."""
    if cfg.engine == "megatron":
        from kit.engines.megatron.support import megatron_violations

        return megatron_violations(cfg)
    from kit.engines.deepspeed.support import deepspeed_violations

    return deepspeed_violations(cfg)


def engine_missing(cfg: RunConfig) -> list[str]:
    """Why the selected engine's framework cannot be imported on this host (empty when it can).

    DeepSpeed is an optional extra; megatron-core is a dependency of the kit itself.
    """
    from importlib.util import find_spec

    if cfg.engine == "deepspeed" and find_spec("deepspeed") is None:
        return ["DeepSpeed is not installed here; ./run.sh installs it, or run "
                "DS_BUILD_OPS=0 pip install --no-build-isolation -e '.[deepspeed]'"]
    return []


def build_engine(cfg: RunConfig) -> Engine:
    """Instantiate the engine ``cfg`` selects."""
    if cfg.engine == "megatron":
        from kit.engines.megatron.engine import MegatronEngine

        return MegatronEngine()
    if cfg.engine == "deepspeed":
        from kit.engines.deepspeed.engine import DeepSpeedEngine

        return DeepSpeedEngine()
    raise ValueError(f"unknown engine {cfg.engine}")
