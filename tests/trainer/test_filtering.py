"""StarPO-S variance filtering keeps the right groups."""

from __future__ import annotations

import math

import pytest

from ragen_trainer.filtering import filter_groups, in_group_std, num_kept

GROUPS = {
    0: [0.0, 0.0, 0.0, 0.0],  # std 0: nothing to learn
    1: [1.0, 0.0, 1.0, 0.0],  # the most varied
    2: [0.1, 0.1, 0.1, 1.0],
    3: [0.5, 0.5, 0.5, 0.5],  # std 0 as well
}


def test_in_group_std_is_unbiased():
    assert in_group_std([1.0, 0.0, 1.0, 0.0]) == pytest.approx(math.sqrt(1 / 3))
    assert in_group_std([2.0]) == 0.0


@pytest.mark.parametrize("num,ratio,expected", [(8, 0.25, 2), (10, 0.25, 2), (4, 1.0, 4), (3, 0.1, 1), (4, 0.5, 2)])
def test_num_kept(num, ratio, expected):
    assert num_kept(num, ratio) == expected


def test_std_keeps_the_most_varied_groups():
    res = filter_groups(GROUPS, 0.25, "std")
    assert res.kept == [1]
    res = filter_groups(GROUPS, 0.5, "std")
    assert res.kept == [1, 2]
    assert set(res.dropped) == {0, 3}
    assert res.stats["filter/kept_groups"] == 2
    assert res.stats["filter/zero_std_frac"] == 0.5
    assert res.stats["filter/threshold"] == pytest.approx(in_group_std(GROUPS[2]))
    assert res.stats["filter/std_mean_kept"] > res.stats["filter/std_mean_all"]


def test_std_rev_keeps_the_least_varied_with_id_tiebreak():
    res = filter_groups(GROUPS, 0.25, "std_rev")
    assert res.kept == [0]  # groups 0 and 3 tie at std 0: the lower id wins, on every process alike
    assert filter_groups(GROUPS, 0.5, "std_rev").kept == [0, 3]


def test_keep_all():
    res = filter_groups(GROUPS, 1.0)
    assert sorted(res.kept) == [0, 1, 2, 3] and res.dropped == []


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode"):
        filter_groups(GROUPS, 0.5, "variance")
    with pytest.raises(ValueError, match="keep_ratio"):
        filter_groups(GROUPS, 0.0)
    with pytest.raises(ValueError, match="group_rewards"):
        filter_groups({}, 0.5)
