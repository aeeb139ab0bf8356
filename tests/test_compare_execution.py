"""compare keeps graphed and eager runs of one layout apart, from a recorded one-GPU trio.

tests/data/bundles/execution holds gpt3-1.3b (micro-batch 4, global batch 16) run twice graphed
and once with ``--eager`` on one GPU (benchmarks/report/execution_pair_gpu.sh): the same
configuration in every field compare grouped by before, so the three were once one group whose
median mixed two executions.
"""
# ruff: noqa: D103  (test names say what they check)

import json
from pathlib import Path

from kit.analysis.comparability import execution_mode
from kit.analysis.compare import compare_bundles
from kit.bundle.reader import read_bundle

TRIO = sorted((Path(__file__).parent / "data/bundles/execution").iterdir())


def _modes() -> dict[str, str]:
    return {b.name: execution_mode(read_bundle(b)) for b in TRIO}


def test_the_recorded_trio_is_two_graphed_runs_and_one_eager():
    assert sorted(_modes().values()) == ["eager", "graphed", "graphed"]


def test_graphed_repeats_group_together_and_the_eager_run_apart():
    c = compare_bundles(TRIO)
    modes = _modes()
    assert sorted(len(g.bundles) for g in c.groups) == [1, 2]
    for g in c.groups:
        mode = {modes[b.path.name] for b in g.bundles}
        assert len(mode) == 1 and g.label.endswith(mode.pop()), g.label
    [check] = [ch for ch in c.checks if ch.kind == "execution"]
    assert "graphed (2: " in check.message and "eager (1: " in check.message


def test_a_swept_eager_axis_is_said_as_swept_not_flagged():
    c = compare_bundles(TRIO, swept={"eager"})
    assert not [ch for ch in c.checks if ch.kind == "execution"]
    assert len(c.groups) == 2  # still two configurations


def test_the_table_names_each_group_by_its_mode(cli):
    r = cli("compare", *map(str, TRIO), "--format", "json")
    assert r.returncode == 0, r.stderr
    groups = json.loads(r.stdout)["groups"]
    assert sorted(g["label"].rsplit(" ", 1)[-1] for g in groups) == ["eager", "graphed"]
    table = cli("compare", *map(str, TRIO))
    assert table.returncode == 0, table.stderr
    assert "[execution] different execution modes" in table.stdout
