"""The host-coupling factor of a projection (kit.projection.host) on hand-picked step samples."""

import pytest

from kit.projection.host import coupling, expected_max


def test_expected_max_of_two_draws_is_the_mean_over_every_ordered_pair():
    xs = [0.5, 1.0, 2.0]
    pairs = [max(a, b) for a in xs for b in xs]
    assert expected_max(xs, 2) == pytest.approx(sum(pairs) / len(pairs))
    assert expected_max(xs, 1) == pytest.approx(sum(xs) / len(xs))


def test_coupling_is_one_for_one_rank_and_spans_median_to_slowest_for_more():
    assert coupling([0.5, 1.0, 2.0], 1).as_list() == [1.0, 1.0, 1.0]
    span = coupling([1.0, 1.0, 1.2, 2.0], 2)
    assert span.low == 1.0 and span.high == pytest.approx(2.0 / 1.1)
    assert 1.0 < span.point < span.high


def test_coupling_never_puts_waiting_hosts_below_their_median():
    # most steps fast, the median among the slow ones: E[max of 2] / median is 0.944
    samples = [0.5, 1.0, 1.0]
    assert expected_max(samples, 2) / 1.0 < 1.0
    assert coupling(samples, 2).as_list() == [1.0, 1.0, 1.0]
