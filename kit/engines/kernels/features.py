"""Which of an engine's speed features a run gets: the one rule both engines start from."""

from kit.config.run import RunConfig


def chosen_features(cfg: RunConfig, nvidia: frozenset[str], amd: frozenset[str]) -> frozenset[str]:
    """The run's ``--speed`` (checked by the engine's spec), else the platform's default set
    (``amd`` on AMD, ``nvidia`` elsewhere); none on CPU, where the speed paths do not apply.
    Each engine then drops what a layout cannot use."""
    if cfg.platform.is_cpu:
        return frozenset()
    if cfg.speed is not None:
        return frozenset(cfg.speed)
    return amd if cfg.platform.vendor == "amd" else nvidia
