"""Where each rank sits in the parallel layout, computed from the layout alone.

The bundle records every rank's tp/pp/dp/cp/ep rank from here, not from what the rank managed
to write before it died: a rank killed at start-up still has its place. The orders are the
engines' own (a test checks them against what the engines report):

- megatron-core's default ``order="tp-cp-ep-dp-pp"``: tensor-parallel ranks are adjacent, then
  context, then data, with pipeline stages slowest; expert groups use the same order with the
  expert tensor-parallel size (= tp by default) and no context parallelism.
- DeepSpeed's ``PipeDataParallelTopology`` (axes pipe, data; data fastest); without a pipeline
  every rank is a data-parallel rank.
"""

from collections.abc import Callable

from kit.spec.run import ParallelConfig, RunConfig


def _megatron(p: ParallelConfig, rank: int) -> dict[str, int]:
    return {
        "tp_rank": rank % p.tp,
        "cp_rank": (rank // p.tp) % p.cp,
        "dp_rank": (rank // (p.tp * p.cp)) % p.dp,
        "pp_rank": rank // (p.tp * p.cp * p.dp),
        "ep_rank": (rank // p.tp) % p.ep,
    }


def _deepspeed(p: ParallelConfig, rank: int) -> dict[str, int]:
    return {"tp_rank": 0, "cp_rank": 0, "dp_rank": rank % p.dp, "pp_rank": rank // p.dp,
            "ep_rank": 0}


LAYOUTS: dict[str, Callable[[ParallelConfig, int], dict[str, int]]] = {
    "megatron": _megatron,
    "deepspeed": _deepspeed,
}
"""Per engine name, its rank -> placement function."""


def rank_placement(cfg: RunConfig, rank: int) -> dict[str, int]:
    """``tp_rank``, ``cp_rank``, ``dp_rank``, ``pp_rank`` and ``ep_rank`` of ``rank``."""
    if not 0 <= rank < cfg.world_size:
        raise ValueError(f"rank {rank} is outside a world of {cfg.world_size}")
    return LAYOUTS[cfg.engine](cfg.parallel, rank)
