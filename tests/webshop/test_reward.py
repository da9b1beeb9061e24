"""The reward formula, part by part, on hand-built cases (the original's own test cases are ported here with their
expected values; the type-reward cases were computed with spaCy by the original and hold with our noun heuristic)."""

from __future__ import annotations

from math import isclose

import pytest

from webshop_server.reward import (
    get_attribute_reward,
    get_option_reward,
    get_reward,
    get_type_reward,
    normalize_color,
    token_set_ratio,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", ""), ("black forest", "black"), ("violet lavender", "lavender"), ("steelivy fuchsia", "fuchsia"),
     ("123alabaster", "alabaster"), ("webshop", "webshop"), ("light blue", "blue")],
)  # fmt: skip
def test_normalize_color(value, expected):
    assert normalize_color(value) == expected


def test_token_set_ratio_matches_thefuzz_preprocessing():
    assert token_set_ratio("Machine Wash!", "machine wash") == 100  # case and punctuation ignored
    assert token_set_ratio("powder snow", "cool powder snow") == 100  # subset of tokens
    assert token_set_ratio("caf\u00e9 latte", "caf latte") == 100  # code points 128-255 dropped (force_ascii)
    assert token_set_ratio("tea bag", "essential oils") < 50
    assert isinstance(token_set_ratio("a", "b"), int)


def test_type_reward_query_and_category():
    goal = {"query": "Query 1", "product_category": "a › b › c", "name": "Name 1"}
    bought = dict(goal)
    r = get_type_reward(bought, goal)
    assert (r["r_type"], r["query_match"], r["category_match"], r["title_score"]) == (1.0, True, True, 1)
    bought["query"] = "Query 2"
    assert get_type_reward(bought, goal)["query_match"] is False
    for cats, match in [("b › c › a", True), ("d › e › f", False), ("a › d › b", True), ("a › a › b", True),
                        ("a › a › d", False)]:  # fmt: skip
        bought["product_category"] = cats
        assert get_type_reward(bought, goal)["category_match"] is match, cats


@pytest.mark.parametrize(
    ("goal_name", "bought_name", "expected"),
    [
        ("adidas Unisex-Adult D.o.n. Issue 2 Basketball Shoe", "adidas Unisex-Adult D.o.n. Issue 2 Indoor Court Shoe", 0.85),
        ("Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar Home Theater "
         "System Subwoofer",
         "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System", 0.31),
        ("Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar",
         "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System", 0.17),
    ],
)  # fmt: skip
def test_type_reward_title_noun_overlap_matches_the_original(goal_name, bought_name, expected):
    goal = {"query": "q", "product_category": "a › b › c", "name": goal_name}
    bought = {"query": "q", "product_category": "a › b › c", "name": bought_name}
    assert isclose(get_type_reward(bought, goal)["title_score"], expected, abs_tol=1e-2)


def test_type_reward_levels():
    goal = {"query": "q1", "product_category": "a › b", "name": "Rusticware 921ORB Kitchen and Bath Cabinet Knob"}
    far = {"query": "q2", "product_category": "x › y", "name": "Minkissy Stainless Steel Eyebrow Tweezers Remover"}
    r = get_type_reward(far, goal)
    assert r["title_score"] == 0.0 and r["r_type"] == 0.0  # nothing shared: 0
    # 1 of 5 goal nouns shared (0.2, not > 0.2) and no query/category match: 0.5
    goal["name"] = "Oak Cabinet Knob Handle Screw"
    mid = {"query": "q2", "product_category": "x › y", "name": "Steel Knob Set"}
    r = get_type_reward(mid, goal)
    assert r["title_score"] == pytest.approx(0.2) and r["r_type"] == 0.5
    # the same overlap with a query match: 1.0
    mid["query"] = "q1"
    assert get_type_reward(mid, goal)["r_type"] == 1.0
    # overlap below 0.1 caps at 0.1 even when the query matches
    goal["name"] = "Oak Cabinet Knob Handle Screw Plate Bracket Hinge Drawer Door Pull"
    r = get_type_reward(mid, goal)
    assert 0 < r["title_score"] < 0.1 and r["r_type"] == 0.1
    # a goal name with no nouns counts as 0.2
    goal["name"] = "2 3.5 100"
    assert get_type_reward(mid, goal)["title_score"] == 0.2


def test_attribute_reward():
    goal = {"attributes": ["tea tree", "essential oils", "natural ingredients"]}
    assert get_attribute_reward({"Attributes": ["tea tree", "essential oil", "natural ingredients"]}, goal) == (1, 3)
    partial = {
        "Attributes": ["essential oil", "natural ingredients"],
        "Title": "",
        "BulletPoints": [],
        "Description": "",
    }
    assert get_attribute_reward(partial, goal) == (2 / 3, 2)
    in_text = {
        "Attributes": [], "Title": "",
        "BulletPoints": ["This shampoo has essential oils and smells like lemons"],
        "Description": "Best shampoo on the market, made with natural ingredients",
    }  # fmt: skip
    assert get_attribute_reward(in_text, goal) == (2 / 3, 2)
    none = {
        "Attributes": ["tea bag", "earl gray", "lipton"], "Title": "English tea for breakfast",
        "BulletPoints": ["Soothing aroma", "Calming, great feeling"],
        "Description": "Best tea made by Lipton, great to pair with breakfast",
    }  # fmt: skip
    assert get_attribute_reward(none, goal) == (0, 0)


EMPTY = {"Title": "", "BulletPoints": [], "Description": ""}


def test_option_reward():
    goal = ["grey", "XL", "pack of 12"]
    assert get_option_reward(EMPTY, goal, {"amount": "pack of 12", "color": "grey", "size": "XL"}) == (1, 3)
    assert get_option_reward(EMPTY, goal, {"amount": "pack of 12", "color": "blue", "size": "XL"}) == (2 / 3, 2)
    fuzzy = ["cool powder snow", "XL", "pack of 12"]
    assert get_option_reward(EMPTY, fuzzy, {"amount": "pack of 12", "color": "powder snow", "size": "XL"}) == (1, 3)
    assert get_option_reward(EMPTY, [], {"a": "goal 1", "b": "goal 2"}) == (None, 0)
    assert get_option_reward(EMPTY, ["goal 1", "goal 2"], {}) == (0, 0)
    # as in the original, every option is fuzzy-matched (thefuzz's processing), size included: "large" and
    # "x-large" share the token "large", so token_set_ratio is 100 and the goal option counts as matched
    assert get_option_reward(EMPTY, ["x-large"], {"size": "large"}) == (1, 1)
    # colours are normalised first: "navy blue" and "light blue" are both "blue"
    assert get_option_reward(EMPTY, ["light blue"], {"color": "navy blue"}) == (1, 1)
    # options are matched against the purchased options only, never against the product's text
    titled = {"Title": "Cotton Shirt in Burgundy", "BulletPoints": [], "Description": ""}
    assert get_option_reward(titled, ["burgundy"], {}) == (0, 0)
    assert get_option_reward(titled, ["grey"], {"color": "burgundy"}) == (0, 0)


def _goal(**kw):
    goal = {
        "query": "Query 1", "product_category": "a › b › c",
        "name": "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
        "attributes": ["tea tree", "essential oils", "natural ingredients"],
        "goal_options": {"color": "grey", "size": "XL"}, "price_upper": 40.00,
    }  # fmt: skip
    goal.update(kw)
    return goal


def _bought(**kw):
    bought = {
        "query": "Query 1", "product_category": "a › b › c",
        "name": "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
        "Attributes": ["tea tree", "essential oil", "natural ingredients"], "Title": "", "BulletPoints": [],
        "Description": "",
    }  # fmt: skip
    bought.update(kw)
    return bought


def test_reward_total_formula_original_cases():
    opts = {"color": "grey", "size": "XL"}
    assert get_reward(_bought(), _goal(), 35, opts)[0] == 1
    # attributes from the text (a bullet string, joined char by char as the original does): 1 of 3
    bought = _bought(Attributes=[], BulletPoints="This shampoo has essential oils and smells like lemons",
                     Description="Best shampoo on the market, made with natural ingredients")  # fmt: skip
    assert isclose(get_reward(bought, _goal(), 35, opts)[0], 2 / 3, abs_tol=1e-2)
    goal = _goal(goal_options={"color": "grey", "size": "XL", "amount": "pack of 12"})
    assert isclose(get_reward(bought, goal, 35, opts)[0], 0.5714, abs_tol=1e-2)
    goal["name"] = "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar"
    bought.update(name="BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home "
                  "Theater System", query="Query 2", product_category="a › d › e")  # fmt: skip
    assert isclose(get_reward(bought, goal, 35, opts)[0], 0.2857, abs_tol=1e-2)


def test_reward_price_part_and_info():
    opts = {"color": "grey", "size": "XL"}
    r, info = get_reward(_bought(), _goal(), 45.0, opts)  # over budget: 5 of 6 parts
    assert r == pytest.approx(5 / 6)
    assert info["r_price"] is False and info["w_price"] == pytest.approx(1 / 6)
    assert info["r_att"] == 1 and info["r_option"] == 1 and info["r_type"] == 1
    assert info["w_att"] == pytest.approx(3 / 6) and info["w_option"] == pytest.approx(2 / 6)
    r, _ = get_reward(_bought(), _goal(), 40.0, opts)  # price <= price_upper is inclusive
    assert r == 1
    r, info = get_reward(_bought(), _goal(goal_options={}), 35, {})
    assert r == 1 and "r_option" not in info
