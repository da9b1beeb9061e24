"""WebShop's option reward: only the goal's options count, each matched at most once, so a perfect purchase scores 1."""

from __future__ import annotations

from webshop_server.reward import get_option_reward, get_reward

TEXT = {"Title": "Cotton Shirt in Burgundy, size XL", "BulletPoints": [], "Description": ""}


def _bought(**kw):
    bought = {
        "query": "q", "product_category": "a › b › c", "name": "Cotton Shirt",
        "Attributes": ["machine wash"], "Title": "Cotton Shirt in Burgundy, size XL", "BulletPoints": [],
        "Description": "",
    }  # fmt: skip
    bought.update(kw)
    return bought


def _goal(**kw):
    goal = {
        "query": "q", "product_category": "a › b › c", "name": "Cotton Shirt", "attributes": ["machine wash"],
        "goal_options": {"color": "grey"}, "price_upper": 40.0,
    }  # fmt: skip
    goal.update(kw)
    return goal


def test_option_reward_counts_goal_options_not_purchased_text():
    # A purchased option that is NOT what the goal asked for must not count, even when its value appears in the
    # product's own text (buying "burgundy" for a "grey" goal once scored the option part in full).
    assert get_option_reward(TEXT, ["grey"], {"color": "burgundy"}) == (0, 0)
    # the original matches goal options against purchased options only
    assert get_option_reward(TEXT, ["burgundy"], {}) == (0, 0)


def test_option_matches_never_exceed_the_goal_options():
    # Each goal option is matched at most once, so R stays in [0, 1] and a perfect purchase has R == 1 (success).
    # Before: the extra purchased size (in the title) counted as a second match, R = 4/3 and success was False.
    r_option, n = get_option_reward(TEXT, ["grey"], {"color": "grey", "size": "xl"})
    assert (r_option, n) == (1, 1)
    r_option, n = get_option_reward(TEXT, ["grey"], {"color": "grey", "shade": "grey melange"})
    assert (r_option, n) == (1, 1)
    reward, info = get_reward(_bought(), _goal(), 35.0, {"color": "grey", "size": "xl"})
    assert reward == 1.0 and info["n_option_matches"] == 1
