"""The suite's own scheduling order (tests/xdist_order.py) names files that exist, once each."""

from pathlib import Path

from tests.xdist_order import SLOWEST_FIRST


def test_the_slowest_first_list_names_each_test_file_once():
    here = {p.name for p in Path(__file__).parent.glob("test_*.py")}
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    assert set(SLOWEST_FIRST) <= here, set(SLOWEST_FIRST) - here
