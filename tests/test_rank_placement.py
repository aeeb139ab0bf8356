"""Rank placement from the layout (each EngineSpec.placement) equals the engines' own orders.

Checked against megatron-core's RankGenerator (what parallel_state builds its groups with) and
DeepSpeed's PipeDataParallelTopology, over many layouts, without starting any process; the
end-to-end check against what ranks report is in test_run_cpu.
"""

import itertools

import pytest

from kit.config.run import ParallelConfig
from kit.engines import ENGINES, engine_spec
from kit.errors import KitInputError

ORDER = "tp-cp-ep-dp-pp"  # megatron-core's default


def _position(groups: list[list[int]], rank: int) -> int:
    return next(g.index(rank) for g in groups if rank in g)


LAYOUTS = [
    (tp, cp, dp, pp, ep)
    for tp, cp, dp, pp, ep in itertools.product((1, 2), (1, 2), (1, 2, 4), (1, 2), (1, 2, 4))
    if (dp * cp) % ep == 0
]


@pytest.mark.parametrize(("tp", "cp", "dp", "pp", "ep"), LAYOUTS)
def test_megatron_placement_matches_megatron_core(tp, cp, dp, pp, ep):
    engine_spec("megatron").build()  # imports megatron-core with its compiles deferred
    from megatron.core.parallel_state import RankGenerator

    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=ORDER)
    world = tp * cp * dp * pp
    expert = RankGenerator(tp=tp, ep=ep, dp=world // (tp * ep * pp), pp=pp, cp=1, order=ORDER)
    groups = {k: dense.get_ranks(k) for k in ("tp", "cp", "dp", "pp")}
    ep_groups = expert.get_ranks("ep")
    parallel = ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep)
    for rank in range(world):
        want = {f"{k}_rank": _position(g, rank) for k, g in groups.items()}
        want["ep_rank"] = _position(ep_groups, rank)
        assert engine_spec("megatron").placement(parallel, rank) == want


@pytest.mark.parametrize(("dp", "pp"), [(1, 1), (4, 1), (2, 2), (3, 2), (1, 4)])
def test_deepspeed_placement_matches_its_pipe_topology(dp, pp):
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    topo = PipeDataParallelTopology(num_pp=pp, num_dp=dp)
    parallel = ParallelConfig(dp=dp, pp=pp)
    for rank in range(dp * pp):
        coord = topo.get_coord(rank)
        got = engine_spec("deepspeed").placement(parallel, rank)
        assert (got["dp_rank"], got["pp_rank"]) == (coord.data, coord.pipe)


def test_an_unknown_engine_is_one_line_naming_the_known_ones():
    with pytest.raises(KitInputError, match="unknown engine 'torchtitan'; known: deepspeed, "
                                            "fsdp2, megatron"):
        engine_spec("torchtitan")
    assert set(ENGINES) == {"megatron", "deepspeed", "fsdp2"}
