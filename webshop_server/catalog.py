"""Products and goals: the procedural catalog (ships with the package, no download) and a loader for the original
WebShop data files.

A :class:`Catalog` answers ``product(i)``, ``index_of(asin)``, ``price(i)`` (the price the reward uses), ``goal(j)``
for a goal in the shuffled goal order, and the goal ``splits`` (test = first 500, eval = next 1000, train = rest, as
the original; scaled to 10 % / 10 % / 80 % when there are fewer than 5,000 goals).

:class:`GeneratedCatalog` is a pure function of ``(seed, i)``: a product is generated on demand (and kept in a small
LRU cache), so a 100,000-product catalog costs almost no memory and two servers with the same seed agree on every
page. ASINs are a bijection of the index (``B0`` + 8 base-36 characters), so ``index_of`` needs no table.

:class:`OriginalCatalog` reads ``items_shuffle*.json`` (products), ``items_ins_v2*.json`` (synthetic instructions and
attributes), ``items_human_ins.json`` (human instructions) and optionally ``reviews.json`` from paths the user gives,
and builds products and goals as ``web_agent_site/engine/engine.py`` and ``goal.py`` do (the random prices of range
products and goal price caps are drawn from a seeded generator instead of the unseeded global one).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Iterator

from webshop_server import taxonomy as tx

PRICE_RANGE: tuple[float, ...] = tuple(10.0 * i for i in range(1, 100))
SPLIT_NAMES = ("test", "eval", "train")
GOAL_SHUFFLE_SEED = 233  # the original's random.seed(233) before random.shuffle(goals)


@dataclass(slots=True)
class Product:
    """One product, with the fields the original's pages and reward use."""

    asin: str
    title: str
    category: str
    query: str
    product_category: str
    description: str
    bullet_points: list[str]
    pricing: list[float]  # [price] or [low, high]
    options: dict[str, list[str]]
    attributes: list[str]
    rating: str = "N.A."
    reviews: list[dict[str, Any]] = field(default_factory=list)

    @property
    def price_tag(self) -> str:
        if len(self.pricing) == 1:
            return f"${self.pricing[0]}"
        return f"${self.pricing[0]} to ${self.pricing[1]}"

    def reward_view(self) -> dict[str, Any]:
        """The product as the original's reward code sees it (its key names)."""
        return {
            "name": self.title,
            "Title": self.title,
            "query": self.query,
            "product_category": self.product_category,
            "Attributes": self.attributes,
            "BulletPoints": self.bullet_points,
            "Description": self.description,
        }

    def search_text(self) -> str:
        """What the original indexes: title, description, first bullet point and the option text, lower-cased."""
        option_text = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first_bullet, option_text]).lower()


@dataclass(slots=True)
class Goal:
    """A shopping goal: the instruction and what the reward compares the purchase with."""

    asin: str
    category: str
    query: str
    name: str
    product_category: str
    instruction_text: str
    attributes: list[str]
    price_upper: float
    goal_options: dict[str, str] | list[str]
    weight: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "asin": self.asin,
            "category": self.category,
            "query": self.query,
            "name": self.name,
            "product_category": self.product_category,
            "instruction_text": self.instruction_text,
            "attributes": list(self.attributes),
            "price_upper": self.price_upper,
            "goal_options": dict(self.goal_options) if isinstance(self.goal_options, dict) else list(self.goal_options),
        }


def split_sizes(n_goals: int) -> tuple[int, int]:
    """(n_test, n_eval): the original's 500 / 1000, scaled to 10 % each for small goal sets."""
    if n_goals >= 5000:
        return 500, 1000
    n_test = max(1, n_goals // 10) if n_goals >= 3 else min(1, n_goals)
    n_eval = max(1, n_goals // 10) if n_goals >= 3 else 0
    return n_test, n_eval


def price_cap(price: float, rng: random.Random) -> tuple[float, str]:
    """The goal's ``price_upper`` and instruction suffix, as the original draws them."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return 1000000.0, ""


class Catalog:
    """Common interface of the generated and the loaded catalogs."""

    name: str = "catalog"

    def __len__(self) -> int:
        raise NotImplementedError

    def product(self, i: int) -> Product:
        raise NotImplementedError

    def index_of(self, asin: str) -> int | None:
        raise NotImplementedError

    def price(self, i: int) -> float:
        raise NotImplementedError

    @property
    def n_goals(self) -> int:
        raise NotImplementedError

    def goal(self, j: int) -> Goal:
        """Goal ``j`` of the shuffled goal list (``fixed_<j>`` in the original's session names)."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """A short id of the catalog's content, for cache file names."""
        raise NotImplementedError

    # -------------------------------------------------------------- shared
    def product_by_asin(self, asin: str) -> Product | None:
        i = self.index_of(asin)
        return None if i is None else self.product(i)

    @property
    def splits(self) -> dict[str, range]:
        n_test, n_eval = split_sizes(self.n_goals)
        return {
            "test": range(0, n_test),
            "eval": range(n_test, n_test + n_eval),
            "train": range(n_test + n_eval, self.n_goals),
        }

    def documents(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self.product(i).search_text()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "products": len(self),
            "goals": self.n_goals,
            "splits": {k: len(v) for k, v in self.splits.items()},
            "fingerprint": self.fingerprint(),
        }


# =============================================================================================== generated catalog
_ASIN_MOD = 36**8
_ASIN_MUL = 2654435761  # odd and not a multiple of 3: invertible modulo 36**8
_ASIN_INV = pow(_ASIN_MUL, -1, _ASIN_MOD)
_B36 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASIN_RE = re.compile(r"^B0[0-9A-Z]{8}$")


def _b36(x: int) -> str:
    out = []
    for _ in range(8):
        x, r = divmod(x, 36)
        out.append(_B36[r])
    return "".join(reversed(out))


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


class GeneratedCatalog(Catalog):
    """A deterministic procedural catalog of ``n_products`` products (see the module docstring).

    Args:
        n_products: number of products (>= 1).
        seed: catalog seed; the same seed gives the same products, prices, goals and ASINs everywhere.
        goals_per_product: goals made from each product (different option choices and attribute subsets).
    """

    name = "generated"

    def __init__(self, n_products: int = 1000, seed: int = 0, goals_per_product: int = 2) -> None:
        if not isinstance(n_products, int) or isinstance(n_products, bool) or not 1 <= n_products < _ASIN_MOD:
            raise ValueError(f"invalid argument n_products={n_products!r}: expected an int >= 1")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"invalid argument seed={seed!r}: expected an int >= 0")
        if not isinstance(goals_per_product, int) or not 1 <= goals_per_product <= 16:
            raise ValueError(f"invalid argument goals_per_product={goals_per_product!r}: expected an int in 1..16")
        self.n_products = n_products
        self.seed = seed
        self.goals_per_product = goals_per_product
        self._asin_offset = (seed * 7919 + 104729) % _ASIN_MOD
        self._goal_order: list[int] | None = None
        self._product_cached = functools.lru_cache(maxsize=8192)(self._make_product)

    def __len__(self) -> int:
        return self.n_products

    def fingerprint(self) -> str:
        return f"gen-v2-n{self.n_products}-s{self.seed}-g{self.goals_per_product}"

    # -------------------------------------------------------------- asin codec
    def asin(self, i: int) -> str:
        return "B0" + _b36((i * _ASIN_MUL + self._asin_offset) % _ASIN_MOD)

    def index_of(self, asin: str) -> int | None:
        if not isinstance(asin, str):
            return None
        asin = asin.upper()
        if not _ASIN_RE.match(asin):
            return None
        x = int(asin[2:], 36)
        i = ((x - self._asin_offset) * _ASIN_INV) % _ASIN_MOD
        return i if i < self.n_products else None

    # -------------------------------------------------------------- products
    def product(self, i: int) -> Product:
        if not 0 <= i < self.n_products:
            raise IndexError(f"product index {i} out of range 0..{self.n_products - 1}")
        return self._product_cached(i)

    def _rng(self, *key: Any) -> random.Random:
        return random.Random(":".join(str(k) for k in (self.seed, *key)))

    def _make_product(self, i: int) -> Product:
        rng = self._rng("p", i)
        ptype = tx.PRODUCT_TYPES[rng.randrange(len(tx.PRODUCT_TYPES))]
        brand = rng.choice(tx.BRAND_STEMS) + rng.choice(tx.BRAND_ENDS)
        noun = rng.choice(ptype.nouns)
        attrs = rng.sample(ptype.attributes, k=min(len(ptype.attributes), rng.randint(3, 5)))
        mods = rng.sample(ptype.modifiers, k=min(len(ptype.modifiers), rng.randint(1, 3)))
        model = f"{brand[:2].upper()}{rng.randint(100, 999)}{_B36[i % 36]}{_B36[(i // 36) % 36]}"
        extra = rng.choice(attrs).title()
        title_forms = (
            f"{brand} {' '.join(mods)} {noun}, {extra} - {model}",
            f"{brand} {noun} {' '.join(mods)} {extra} ({model})",
            f"{' '.join(mods)} {noun} by {brand}, {extra}, Model {model}",
        )
        title = rng.choice(title_forms)

        options: dict[str, list[str]] = {}
        if rng.random() < 0.9:
            for opt_name, pool in ptype.options:
                k = min(len(pool), rng.randint(2, 6))
                idx = sorted(rng.sample(range(len(pool)), k))
                options[opt_name] = [pool[j] for j in idx]

        lo, hi = ptype.price
        base = round(lo * (hi / lo) ** rng.random(), 2)
        if options and rng.random() < 0.3:
            pricing = [base, round(base * rng.uniform(1.1, 1.8), 2)]
        else:
            pricing = [base]

        material = rng.choice(ptype.materials) if ptype.materials else "quality materials"
        uses = list(ptype.uses) or ["everyday use"]
        use, use2 = rng.choice(uses), rng.choice(uses)
        fill = {
            "brand": brand, "noun": noun.lower(), "material": material, "use": use, "use2": use2,
            "attr1": attrs[0], "attr2": attrs[1 % len(attrs)], "attr3": attrs[2 % len(attrs)],
            "ATTR1": attrs[0].upper(), "ATTR3": attrs[2 % len(attrs)].upper(), "USE": use.upper(),
        }  # fmt: skip
        n_desc = rng.randint(2, 4)
        description = " ".join(t.format(**fill) for t in rng.sample(tx.DESCRIPTION_TEMPLATES, n_desc))
        bullets = [t.format(**fill) for t in rng.sample(tx.BULLET_TEMPLATES, rng.randint(3, 5))]

        reviews = []
        rating = "N.A."
        n_reviews = rng.choice((0, 0, 1, 2, 3))
        for _ in range(n_reviews):
            reviews.append(
                {
                    "title": rng.choice(tx.REVIEW_TITLES),
                    "score": rng.randint(2, 5),
                    "body": rng.choice(tx.REVIEW_BODIES).format(**fill),
                }
            )
        if reviews:
            rating = f"{sum(r['score'] for r in reviews) / len(reviews):.1f}"
        return Product(
            asin=self.asin(i),
            title=title,
            category=ptype.category,
            query=ptype.query,
            product_category=ptype.path,
            description=description,
            bullet_points=bullets,
            pricing=pricing,
            options=options,
            attributes=attrs,
            rating=rating,
            reviews=reviews,
        )

    def price(self, i: int) -> float:
        pricing = self.product(i).pricing
        if len(pricing) == 1:
            return pricing[0]
        return self._rng("price", i).uniform(pricing[0], pricing[1])  # the original: random.uniform(*pricing[:2])

    # -------------------------------------------------------------- goals
    @property
    def n_goals(self) -> int:
        return self.n_products * self.goals_per_product

    def _order(self) -> list[int]:
        if self._goal_order is None:
            order = list(range(self.n_goals))
            random.Random(GOAL_SHUFFLE_SEED).shuffle(order)
            self._goal_order = order
        return self._goal_order

    def goal(self, j: int) -> Goal:
        if not 0 <= j < self.n_goals:
            raise IndexError(f"goal index {j} out of range 0..{self.n_goals - 1}")
        raw = self._order()[j]
        i, variant = divmod(raw, self.goals_per_product)
        product = self.product(i)
        rng = self._rng("g", i, variant)
        k = rng.randint(1, min(3, len(product.attributes)))
        attributes = rng.sample(product.attributes, k)
        goal_options = {name: rng.choice(values) for name, values in product.options.items()}
        upper, price_text = price_cap(self.price(i), rng)
        noun = product.title  # fallback, replaced below by the type noun
        for ptype in tx.PRODUCT_TYPES:
            if ptype.query == product.query:
                noun = next((n for n in ptype.nouns if n in product.title), ptype.nouns[0]).lower()
                break
        text = _instruction(rng, noun, attributes, goal_options) + price_text
        return Goal(
            asin=product.asin,
            category=product.category,
            query=product.query,
            name=product.title,
            product_category=product.product_category,
            instruction_text=text,
            attributes=attributes,
            price_upper=upper,
            goal_options=goal_options,
        )


def _instruction(rng: random.Random, noun: str, attributes: list[str], options: dict[str, str]) -> str:
    """An instruction in the style of the original's human and synthetic goals."""
    attrs = " and ".join(attributes)
    if options and rng.random() < 0.5:  # synthetic style: "with color: navy, and size: large"
        opt_text = " with " + ", and ".join(f"{k}: {v}" for k, v in options.items())
    elif options:  # human style: "in navy color and large size"
        opt_text = " in " + " and ".join(f"{v} {k}" for k, v in options.items())
    else:
        opt_text = ""
    form = rng.randrange(4)
    if form == 0:
        return f"i am looking for {_article(noun)} {noun} that is {attrs}{opt_text}"
    if form == 1:
        return f"i need {_article(attributes[0])} {attrs} {noun}{opt_text}"
    if form == 2:
        return f"find me {attrs} {noun}{opt_text}"
    return f"i want to buy {_article(noun)} {noun} which is {attrs}{opt_text}"


# =============================================================================================== original data
def _load_json(path: str | Path, what: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"invalid argument {what}={str(path)!r}: expected an existing JSON file")
    with p.open(encoding="utf-8") as f:
        return json.load(f)


def _parse_pricing(raw: Any) -> list[float]:
    """The original's price parsing: the ``$``-separated amounts of the pricing string, or [100.0]."""
    if not raw or not isinstance(raw, str):
        return [100.0]
    out = []
    for part in raw.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            out.append(float(Decimal(digits)))
        except (InvalidOperation, ValueError):
            continue
    return out[:2] or [100.0]


class OriginalCatalog(Catalog):
    """Products and goals from the original WebShop data files (see the module docstring).

    Args:
        items_path: ``items_shuffle_1000.json`` or ``items_shuffle.json``.
        attrs_path: ``items_ins_v2_1000.json`` / ``items_ins_v2.json`` (product attributes, synthetic instructions).
        human_goals_path: ``items_human_ins.json``; when given, goals are the human instructions (as the original's
            default), otherwise synthetic goals are built from ``attrs_path``.
        reviews_path: optional ``reviews.json``.
        num_products: keep only the first N products (the file is already shuffled).
        seed: seed for the random prices of range products and the goal price caps.
    """

    name = "original"

    def __init__(
        self,
        items_path: str | Path,
        attrs_path: str | Path,
        human_goals_path: str | Path | None = None,
        reviews_path: str | Path | None = None,
        num_products: int | None = None,
        seed: int = 0,
    ) -> None:
        raw_products = _load_json(items_path, "items_path")
        if not isinstance(raw_products, list):
            raise ValueError(f"invalid argument items_path={str(items_path)!r}: expected a JSON list of products")
        attributes = _load_json(attrs_path, "attrs_path")
        human = _load_json(human_goals_path, "human_goals_path") if human_goals_path else None
        reviews_raw = _load_json(reviews_path, "reviews_path") if reviews_path else []
        if num_products is not None:
            raw_products = raw_products[:num_products]
        all_reviews = {r.get("asin"): r for r in reviews_raw if isinstance(r, dict)}
        rng = random.Random(seed)
        digest = hashlib.sha1()
        self.products: list[Product] = []
        self._index: dict[str, int] = {}
        self._prices: list[float] = []
        instructions: list[tuple[int, Any]] = []
        for p in raw_products:
            asin = str(p.get("asin", ""))
            if asin == "nan" or len(asin) > 10 or not asin or asin in self._index:
                continue
            options: dict[str, list[str]] = {}
            for opt_name, contents in (p.get("customization_options") or {}).items():
                if contents is None:
                    continue
                options[opt_name.lower()] = [
                    c["value"].strip().replace("/", " | ").lower() for c in contents if isinstance(c, dict)
                ]
            bullets = p.get("small_description")
            bullets = bullets if isinstance(bullets, list) else [bullets or ""]
            review_entry = all_reviews.get(asin, {})
            reviews = []
            for r in review_entry.get("reviews", []) or []:
                reviews.append(
                    {
                        "title": r.get("title", ""),
                        "score": r.get("score", r.get("stars", 0)),
                        "body": r.get("review", r.get("body", "")),
                    }
                )
            attr_entry = attributes.get(asin, {}) if isinstance(attributes, dict) else {}
            product = Product(
                asin=asin,
                title=p.get("name", "") or "",
                category=p.get("category", "") or "",
                query=(p.get("query", "") or "").lower().strip(),
                product_category=p.get("product_category", "") or "",
                description=p.get("full_description", "") or "",
                bullet_points=[str(b) for b in bullets],
                pricing=_parse_pricing(p.get("pricing")),
                options=options,
                attributes=list(attr_entry.get("attributes", ["DUMMY_ATTR"])),
                rating=str(review_entry.get("average_rating", "N.A.")),
                reviews=reviews,
            )
            self._index[asin] = len(self.products)
            self.products.append(product)
            pr = product.pricing
            self._prices.append(pr[0] if len(pr) == 1 else rng.uniform(pr[0], pr[1]))
            digest.update(asin.encode())
            if human is not None:
                if asin in human:
                    instructions.append((len(self.products) - 1, human[asin]))
            elif attr_entry.get("instruction"):
                instructions.append((len(self.products) - 1, attr_entry))
        self.goals: list[Goal] = self._build_goals(instructions, human is not None, rng)
        random.Random(GOAL_SHUFFLE_SEED).shuffle(self.goals)
        self._fingerprint = f"orig-{digest.hexdigest()[:12]}-n{len(self.products)}"

    def _build_goals(self, instructions: list[tuple[int, Any]], human: bool, rng: random.Random) -> list[Goal]:
        goals: list[Goal] = []
        for i, entry in instructions:
            product = self.products[i]
            if human:  # get_human_goals
                for ins in entry:
                    attrs = ins.get("instruction_attributes") or []
                    if not attrs:
                        continue
                    upper, price_text = price_cap(self._prices[i], rng)
                    goals.append(
                        Goal(
                            product.asin,
                            product.category,
                            product.query,
                            product.title,
                            product.product_category,
                            ins["instruction"].strip(".") + price_text,
                            list(attrs),
                            upper,
                            list(ins.get("instruction_options") or []),
                        )  # fmt: skip
                    )
            else:  # get_synthetic_goals: one goal per option combination
                attrs = entry.get("instruction_attributes") or []
                if not attrs:
                    continue
                upper, price_text = price_cap(self._prices[i], rng)
                names = sorted(product.options)
                for combo in itertools.product(*(product.options[n] for n in names)):
                    goal_options = dict(zip(names, combo, strict=True))
                    opt_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
                    opt_text = " with " + opt_text if opt_text else ""
                    goals.append(
                        Goal(product.asin, product.category, product.query, product.title, product.product_category,
                             f"{entry['instruction']}{opt_text}{price_text}", list(attrs), upper, goal_options)
                    )  # fmt: skip
        return goals

    def __len__(self) -> int:
        return len(self.products)

    def product(self, i: int) -> Product:
        return self.products[i]

    def index_of(self, asin: str) -> int | None:
        if not isinstance(asin, str):
            return None
        return self._index.get(asin.upper(), self._index.get(asin))

    def price(self, i: int) -> float:
        return self._prices[i]

    @property
    def n_goals(self) -> int:
        return len(self.goals)

    def goal(self, j: int) -> Goal:
        return self.goals[j]

    def fingerprint(self) -> str:
        return self._fingerprint
