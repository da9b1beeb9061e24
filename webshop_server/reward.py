"""The original WebShop reward (``web_agent_site/engine/goal.py``), term by term.

    R = r_type * (n_attr_matches + n_option_matches + r_price) / (n_goal_attrs + n_goal_options + 1)

* attributes: a goal attribute matches when thefuzz's ``token_set_ratio`` against one of the product's attributes is
  > 85, else when it is a substring of the title, the bullet points or the description (lower-cased);
* options: a goal option (colour-normalised) matches when a purchased ``size`` equals it or another purchased option
  has ``token_set_ratio`` > 85 with it, else when it is a substring of title / bullets / description; each goal
  option counts once, so the option count never exceeds the goal's options and R stays in [0, 1];
* price: ``price <= price_upper``;
* type: ``r_type`` = 1, 0.5 when neither the query, nor >= 2 category levels, nor title-noun overlap > 0.2 match,
  0.1 when the overlap < 0.1, 0 when it is 0.

Fuzzy matching uses rapidfuzz with thefuzz's preprocessing (drop code points 128-255, keep letters and digits,
lower-case) and thefuzz's integer rounding, so scores equal thefuzz's. Nouns come from
:func:`webshop_server.text.nouns` instead of spaCy (the one documented difference).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from webshop_server.text import nouns

#: ``web_agent_site/engine/normalize.py`` COLOR_SET, in its order (the first contained colour wins).
COLOR_SET: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream", "crystal",
    "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite", "grass",
    "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light",
    "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom",
    "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow",
    "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull", "slate", "steel", "stone",
    "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise", "violet", "walnut", "wheat", "white",
    "wine", "yellow",
)  # fmt: skip

_ASCII_ONLY = {i: None for i in range(128, 256)}


def normalize_color(value: str) -> str:
    """The first colour of :data:`COLOR_SET` contained in ``value``, else ``value`` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's ``fuzz.token_set_ratio`` (force_ascii, full_process, rounded), computed by rapidfuzz."""
    a = default_process(str(a).translate(_ASCII_ONLY))
    b = default_process(str(b).translate(_ASCII_ONLY))
    return int(round(fuzz.token_set_ratio(a, b)))


def get_type_reward(product: Mapping[str, Any], goal: Mapping[str, Any]) -> dict[str, Any]:
    """``r_type`` and its inputs: query match, shared category levels, title-noun overlap."""
    query_match = product["query"] == goal["query"]
    purchased_cats = {x.strip() for x in product["product_category"].split("›")}
    goal_cats = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(purchased_cats & goal_cats) >= 2

    purchased_nouns = nouns(product["name"])
    desired_nouns = nouns(goal["name"])
    n_intersect = len(set(purchased_nouns) & set(desired_nouns))
    title_score = 0.2 if not desired_nouns else n_intersect / len(desired_nouns)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def _in_text(value: str, product: Mapping[str, Any]) -> bool:
    return (
        value in product["Title"].lower()
        or value in " ".join(product["BulletPoints"]).lower()
        or value in product["Description"].lower()
    )


def get_attribute_reward(product: Mapping[str, Any], goal: Mapping[str, Any]) -> tuple[float, int]:
    """Share and count of goal attributes the product has (fuzzy, then substring of its text)."""
    goal_attrs = goal["attributes"]
    matches = 0
    for g_attr in goal_attrs:
        matched = any(token_set_ratio(p_attr, g_attr) > 85 for p_attr in product["Attributes"])
        if matched or _in_text(g_attr, product):
            matches += 1
    return (matches / len(goal_attrs) if goal_attrs else 0.0), matches


def get_option_reward(
    product: Mapping[str, Any], goal_options: Sequence[str], purchased_options: Mapping[str, str]
) -> tuple[float | None, int]:
    """Share and count of the goal's options that the purchase matches, exactly as the original computes it.

    Colours are normalised first; a goal option is matched when any purchased option value has
    ``token_set_ratio`` > 85 with it. Each goal option counts at most once, so the count never exceeds the number of
    goal options and R stays in [0, 1]. ``product`` is unused (kept so every part has the same signature); the
    original does not look for options in the product's text.
    """
    purchased = [normalize_color(v) for v in purchased_options.values()]
    goals = [normalize_color(o) for o in goal_options]
    matches = 0
    for g_option in goals:
        if any(token_set_ratio(p_option, g_option) > 85 for p_option in purchased):
            matches += 1
    return (matches / len(goals) if goals else None), matches


def get_reward(
    product: Mapping[str, Any], goal: Mapping[str, Any], price: float, options: Mapping[str, str]
) -> tuple[float, dict[str, Any]]:
    """The reward of buying ``product`` at ``price`` with ``options`` for ``goal``, and its parts.

    ``product`` has the original's keys (``name``/``Title``, ``query``, ``product_category``, ``Attributes``,
    ``BulletPoints``, ``Description``); ``goal`` has ``query``, ``product_category``, ``name``, ``attributes``,
    ``goal_options`` (dict or list) and ``price_upper``.
    """
    type_info = get_type_reward(product, goal)
    r_price = price <= goal["price_upper"]
    r_att, n_attr = get_attribute_reward(product, goal)
    goal_options = goal["goal_options"]
    goal_option_values = list(goal_options.values()) if isinstance(goal_options, dict) else list(goal_options)
    r_option, n_opt = get_option_reward(product, goal_option_values, options)

    denom = len(goal["attributes"]) + len(goal_options) + 1
    total = (n_attr + n_opt + int(r_price)) / denom * type_info["r_type"]
    info: dict[str, Any] = {
        "r_type": type_info["r_type"],
        "r_att": r_att,
        "w_att": len(goal["attributes"]) / denom,
        "query_match": type_info["query_match"],
        "category_match": type_info["category_match"],
        "title_score": type_info["title_score"],
        "r_price": bool(r_price),
        "w_price": 1 / denom,
        "n_attr_matches": n_attr,
        "n_option_matches": n_opt,
    }
    if r_option is not None:
        info["r_option"] = r_option
        info["w_option"] = len(goal_options) / denom
    return float(total), info
