"""Before any rank starts: a run request resolved, validated and its memory estimated.

``charllm-kit run`` and every sweep point go through :func:`plan_run`, so a point a sweep
accepts is one ``run`` accepts, for the same reasons in the same words.
"""

from dataclasses import dataclass

from kit.config.run import RunConfig
from kit.plan.memory import MemoryEstimate, estimate_memory, fit_refusal, fit_warning
from kit.plan.resolve import RunRequest, resolve


@dataclass(frozen=True)
class RunPlan:
    """A resolved run and its predicted memory.

    Attributes:
        cfg: The resolved, validated config.
        memory: The per-device memory estimate.
        refusal: Why it is predicted not to fit (one line), or None.
        warning: Why it may run out of memory though it fits (one line), or None.
    """

    cfg: RunConfig
    memory: MemoryEstimate
    refusal: str | None
    warning: str | None = None


def plan_run(req: RunRequest, require_present: bool) -> RunPlan:
    """Resolve ``req`` (its platform present here when ``require_present``) and estimate it.

    Raises:
        KitInputError: Unknown names, impossible layout, refused options, absent platform.
    """
    cfg = resolve(req, require_present=require_present)
    memory = estimate_memory(cfg)
    return RunPlan(cfg, memory, fit_refusal(memory), fit_warning(memory))
