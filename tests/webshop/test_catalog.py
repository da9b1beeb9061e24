"""The procedural catalog, the original-data loader, goals and splits, and the search engine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from webshop_server.catalog import GeneratedCatalog, OriginalCatalog, split_sizes
from webshop_server.search import SearchEngine
from webshop_server.text import analyze, nouns, s_stem


def test_generated_catalog_is_deterministic_per_seed():
    a, b, c = GeneratedCatalog(200, seed=3), GeneratedCatalog(200, seed=3), GeneratedCatalog(200, seed=4)
    assert [a.product(i) for i in range(50)] == [b.product(i) for i in range(50)]
    assert [a.goal(j).as_dict() for j in range(50)] == [b.goal(j).as_dict() for j in range(50)]
    assert [a.product(i).title for i in range(50)] != [c.product(i).title for i in range(50)]
    assert a.price(7) == b.price(7)


def test_products_are_realistic_and_consistent():
    cat = GeneratedCatalog(300)
    categories, with_options, ranges = set(), 0, 0
    for i in range(300):
        p = cat.product(i)
        categories.add(p.category)
        assert p.asin.startswith("B0") and len(p.asin) == 10 and cat.index_of(p.asin) == i
        assert p.title and p.description and p.bullet_points and 3 <= len(p.attributes) <= 5
        assert " › " in p.product_category and p.query
        assert all(v == v.lower() for vs in p.options.values() for v in vs)
        with_options += bool(p.options)
        ranges += len(p.pricing) == 2
        lo, hi = p.pricing[0], p.pricing[-1]
        assert 0 < lo <= hi and lo <= cat.price(i) <= hi
        assert p.price_tag.startswith("$")
    assert categories == {"beauty", "electronics", "fashion", "food", "furniture"}
    assert with_options > 200 and ranges > 20


def test_asin_codec_rejects_unknown():
    cat = GeneratedCatalog(100)
    assert cat.index_of(cat.asin(99)) == 99
    assert cat.index_of(cat.asin(99).lower()) == 99
    assert cat.index_of(GeneratedCatalog(1000).asin(500)) is None  # valid form, beyond this catalog
    for bad in ["", "B0", "XYZ", "B0!!!!!!!!", "B0ZZZZZZZZZ", "\u00e9" * 10, None, 12]:
        assert cat.index_of(bad) is None


def test_goals_match_their_product():
    cat = GeneratedCatalog(300)
    for j in range(0, cat.n_goals, 7):
        g = cat.goal(j)
        p = cat.product_by_asin(g.asin)
        assert set(g.attributes) <= set(p.attributes) and 1 <= len(g.attributes) <= 3
        assert all(p.options[k] and v in p.options[k] for k, v in g.goal_options.items())
        assert set(g.goal_options) == set(p.options)
        assert g.name == p.title and g.query == p.query
        price = cat.price(cat.index_of(g.asin))
        if g.price_upper < 1000000:
            assert price < g.price_upper and f"price lower than {g.price_upper:.2f} dollars" in g.instruction_text
        assert g.instruction_text == g.instruction_text.lower() or ":" in g.instruction_text


def test_splits_follow_the_original():
    assert split_sizes(12087) == (500, 1000)  # the original's human goals
    assert split_sizes(6000) == (500, 1000)
    assert split_sizes(200) == (20, 20)
    assert split_sizes(1) == (1, 0)
    cat = GeneratedCatalog(100)
    s = cat.splits
    assert (len(s["test"]), len(s["eval"]), len(s["train"])) == (20, 20, 160)
    assert s["test"].stop == s["eval"].start and s["eval"].stop == s["train"].start == 40


def test_large_catalog_is_lazy():
    t0 = time.perf_counter()
    cat = GeneratedCatalog(100_000)
    p = cat.product(99_999)
    assert cat.index_of(p.asin) == 99_999
    assert len(cat.splits["test"]) == 500 and len(cat.splits["eval"]) == 1000
    assert cat.goal(123).asin  # shuffling 200k goal ids is the only up-front cost
    assert time.perf_counter() - t0 < 30  # generous: no eager generation of 100k products


def test_bad_catalog_arguments():
    for kwargs in ({"n_products": 0}, {"n_products": "10"}, {"seed": -1}, {"goals_per_product": 0}):
        with pytest.raises(ValueError, match="invalid argument"):
            GeneratedCatalog(**{"n_products": 10, **kwargs})


def _write_original(tmp: Path) -> dict[str, str]:
    items = [
        {"asin": "B000000001", "name": "Nautica Men's Crew Neck T-Shirt", "category": "fashion",
         "query": "Men's T-Shirts ", "product_category": "Clothing › Men › Shirts",
         "full_description": "A soft cotton tee.", "small_description": ["Machine wash", "100% cotton"],
         "pricing": "$16.05 - $40.98", "images": ["x.jpg"],
         "customization_options": {"Color": [{"value": "Navy/White"}, {"value": "Black"}],
                                   "Size": [{"value": "Small"}, {"value": "Large"}]}},
        {"asin": "B000000002", "name": "Earth Mama Deodorant", "category": "beauty", "query": "deodorant",
         "product_category": "Beauty › Deodorant", "full_description": "Natural.", "small_description": "Fresh",
         "pricing": "", "images": ["y.jpg"], "customization_options": None},
        {"asin": "nan", "name": "skipped"},
        {"asin": "B000000001", "name": "duplicate, skipped"},
    ]  # fmt: skip
    attrs = {
        "B000000001": {"attributes": ["machine wash", "cotton"], "instruction": "i want a men's crew neck t-shirt",
                       "instruction_attributes": ["machine wash"]},
        "B000000002": {"attributes": ["aluminum free"], "instruction": "i need a natural deodorant",
                       "instruction_attributes": ["aluminum free"]},
    }  # fmt: skip
    human = {
        "B000000001": [
            {"instruction": "i want a navy crew neck t-shirt that is machine wash.",
             "instruction_attributes": ["machine wash"], "instruction_options": ["navy | white", "large"]},
            {"instruction": "no attributes, skipped", "instruction_attributes": [], "instruction_options": []},
        ],
    }  # fmt: skip
    paths = {}
    for name, data in (("items", items), ("attrs", attrs), ("human", human)):
        paths[name] = str(tmp / f"{name}.json")
        Path(paths[name]).write_text(json.dumps(data))
    return paths


def test_original_loader_human_and_synthetic_goals(tmp_path):
    paths = _write_original(tmp_path)
    cat = OriginalCatalog(paths["items"], paths["attrs"], paths["human"])
    assert len(cat) == 2
    tee = cat.product_by_asin("B000000001")
    assert tee.pricing == [16.05, 40.98] and tee.price_tag == "$16.05 to $40.98"
    assert tee.options == {"color": ["navy | white", "black"], "size": ["small", "large"]}
    assert tee.query == "men's t-shirts" and tee.attributes == ["machine wash", "cotton"]
    assert 16.05 <= cat.price(0) <= 40.98
    deo = cat.product_by_asin("B000000002")
    assert deo.pricing == [100.0] and deo.bullet_points == ["Fresh"] and deo.options == {}
    assert cat.n_goals == 1  # one human instruction with attributes
    g = cat.goal(0)
    assert g.instruction_text.startswith("i want a navy crew neck t-shirt that is machine wash,")
    assert g.goal_options == ["navy | white", "large"] and g.price_upper in (50.0, 60.0, 70.0, 80.0)
    synthetic = OriginalCatalog(paths["items"], paths["attrs"])
    # one goal per option combination of the tee (2 x 2) + one for the deodorant
    assert synthetic.n_goals == 5
    texts = sorted(synthetic.goal(j).instruction_text for j in range(5))
    assert any("with color: black, and size: large" in t for t in texts)
    with pytest.raises(ValueError, match="items_path"):
        OriginalCatalog(tmp_path / "missing.json", paths["attrs"])


def test_analyzer_and_nouns():
    assert s_stem("batteries") == "battery" and s_stem("shoes") == "shoe" and s_stem("glass") == "glass"
    assert analyze("The Running SHOES, for Men!") == ["running", "shoe", "men"]
    assert analyze("") == [] and analyze("\u2603\u0000") == []
    assert nouns("Men's Slim Fit Cotton Dress Shirt - Machine Washable") == [
        "men",
        "fit",
        "cotton",
        "dress",
        "shirt",
        "machine",
    ]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    cat = GeneratedCatalog(300)
    return cat, SearchEngine.for_catalog(cat, cache_dir=tmp_path_factory.mktemp("idx"))


def test_own_title_finds_the_product_first(engine):
    cat, eng = engine
    for i in range(len(cat)):
        assert eng.search(cat.product(i).title)[:1] == [i], cat.product(i).title


def test_search_relevance_and_limits(engine):
    cat, eng = engine
    hits = eng.search("hair extensions")
    assert 0 < len(hits) <= 50
    assert all(cat.product(i).query == "hair extensions" for i in hits[:5])
    assert eng.search("the of and") == [] and eng.search("") == [] and eng.search("qqqzzzxxy") == []
    assert len(eng.search("shoes " * 100_000)) <= 50  # a huge query costs like a short one
    assert eng.search("\U0001f600 \u00e9t\u00e9 \u0000 <script>") == eng.search(
        "\U0001f600 \u00e9t\u00e9 \u0000 <script>"
    )


def test_index_is_cached_and_reloaded(tmp_path):
    cat = GeneratedCatalog(120, seed=9)
    first = SearchEngine.for_catalog(cat, cache_dir=tmp_path)
    assert (tmp_path / cat.fingerprint() / "bm25s-v1" / "ready.json").is_file()
    again = SearchEngine.for_catalog(cat, cache_dir=tmp_path)
    for q in ("coffee table", "wireless earbuds black", "gluten free protein bars"):
        assert first.search(q) == again.search(q)
