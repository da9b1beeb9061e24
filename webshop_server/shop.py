"""The shop's pages and flow, independent of any web framework: sessions, URLs, page models, the
``search[...]`` / ``click[...]`` action semantics of the original text env, and the reward on purchase.

Sessions are *stateless*: a session id names its goal (``fixed_<j>`` is goal ``j`` of the shuffled goal list as in
the original; ``test_<k>`` / ``eval_<k>`` / ``train_<k>`` is goal ``k`` of that split; an optional ``-<tag>`` suffix
makes ids unique per client) and every page's URL carries the rest (query, results page, product, chosen options).
Any worker process can therefore answer any request, two sessions can never see each other's state, and the server
keeps no per-session memory at all (bounded by construction). The only cache is a bounded LRU of search results.

A page is a plain dict (its *model*); :mod:`webshop_server.render` turns it into HTML, ``text`` or ``text_rich``.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from webshop_server.catalog import Catalog, Goal
from webshop_server.reward import get_reward
from webshop_server.search import SEARCH_RETURN_N, SearchEngine

PRODUCT_WINDOW = 10
END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")
MAX_QUERY_CHARS = 500
MAX_PAGE = SEARCH_RETURN_N // PRODUCT_WINDOW
SEARCH_CACHE_SIZE = 4096

# \Z, not $: "$" also matches before a final newline, which would accept "train_0\n" as a session id
_SESSION_RE = re.compile(r"^(fixed|test|eval|train)_([0-9]{1,9})(?:-([A-Za-z0-9]{1,32}))?\Z")
_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
OPTION_PREFIX = "o."


class ShopError(Exception):
    """A client error: ``status`` (4xx) and a message saying what was wrong and what is accepted."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class PageState:
    """Where a session is: everything a page needs besides the session's goal."""

    session: str
    kind: str = "search"  # search | results | item | sub | done
    query: str = ""
    page: int = 1
    asin: str = ""
    sub: str = ""
    options: dict[str, str] = field(default_factory=dict)

    def url(self) -> str:
        sid = quote(self.session, safe="")
        if self.kind == "search":
            return f"/{sid}"
        if self.kind == "results":
            return f"/{sid}/search?" + urlencode({"q": self.query, "page": self.page})
        params = {"q": self.query, "page": self.page} if self.kind in ("item", "sub") else {}
        params.update({OPTION_PREFIX + k: v for k, v in self.options.items()})
        qs = ("?" + urlencode(params)) if params else ""
        asin = quote(self.asin, safe="")
        if self.kind == "item":
            return f"/{sid}/item/{asin}{qs}"
        if self.kind == "sub":
            return f"/{sid}/item/{asin}/{self.sub.lower()}{qs}"
        return f"/{sid}/done/{asin}{qs}"


def split_target(target: str) -> tuple[str, str]:
    """(path, query) of a request target. Not urlsplit: it reads "//host" as a network location and raises on
    "//[x" (an invalid IPv6 literal), and a request path is never a full URL here."""
    path, _, rest = target.partition("?")
    path = path.partition("#")[0]
    return path, rest.partition("#")[0]


def _clean_query(raw: str) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in raw).strip().lower()
    return " ".join(text.split())


class Shop:
    """The shop over a catalog and its search engine. Thread-safe; holds no per-session state."""

    def __init__(self, catalog: Catalog, engine: SearchEngine, *, show_attrs: bool = False) -> None:
        self.catalog = catalog
        self.engine = engine
        self.show_attrs = show_attrs
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ sessions
    def goal_index(self, session: str) -> int:
        """The global goal index a session id names, or a 404 ShopError."""
        m = _SESSION_RE.match(session) if isinstance(session, str) else None
        if m is None:
            raise ShopError(
                404,
                f"unknown session {session[:60]!r}: session ids look like 'fixed_<goal>', 'test_<k>', 'eval_<k>' or "
                "'train_<k>', optionally followed by '-<tag>' (letters and digits); create one with POST /api/session",
            )
        kind, num = m.group(1), int(m.group(2))
        if kind == "fixed":
            if num >= self.catalog.n_goals:
                raise ShopError(
                    404, f"unknown session {session!r}: goal {num} out of range 0..{self.catalog.n_goals - 1}"
                )
            return num
        split = self.catalog.splits[kind]
        if num >= len(split):
            raise ShopError(404, f"unknown session {session!r}: the {kind} split has goals 0..{len(split) - 1}")
        return split[num]

    def goal(self, session: str) -> Goal:
        return self.catalog.goal(self.goal_index(session))

    def new_session(self, split: str | None = None, index: int | None = None, goal: int | None = None) -> str:
        """A fresh session id (random tag) for goal ``goal``, or goal ``index`` of ``split`` (random when None)."""
        tag = secrets.token_hex(6)
        if goal is not None:
            if not isinstance(goal, int) or isinstance(goal, bool) or not 0 <= goal < self.catalog.n_goals:
                raise ShopError(400, f"invalid goal={goal!r}: expected an int in 0..{self.catalog.n_goals - 1}")
            return f"fixed_{goal}-{tag}"
        split = split or "train"
        if split not in self.catalog.splits:
            raise ShopError(400, f"invalid split={split!r}: expected one of {list(self.catalog.splits)}")
        n = len(self.catalog.splits[split])
        if n == 0:
            raise ShopError(400, f"the {split} split is empty for this catalog")
        if index is None:
            index = secrets.randbelow(n)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
            raise ShopError(400, f"invalid index={index!r}: expected an int in 0..{n - 1} for split {split!r}")
        return f"{split}_{index}-{tag}"

    # ------------------------------------------------------------------ search
    def search(self, query: str) -> list[int]:
        """Top-50 catalog indices for ``query`` (cached, bounded LRU)."""
        with self._lock:
            hit = self._cache.get(query)
            if hit is not None:
                self._cache.move_to_end(query)
                return hit
        result = self.engine.search(query)
        with self._lock:
            self._cache[query] = result
            if len(self._cache) > SEARCH_CACHE_SIZE:
                self._cache.popitem(last=False)
        return result

    # ------------------------------------------------------------------ URLs -> states
    def parse_url(self, url: str, extra_params: dict[str, str] | None = None) -> PageState:
        """The page state of a shop URL (path and query string), validated; ShopError (4xx) when malformed."""
        if not isinstance(url, str) or len(url) > 8192:
            raise ShopError(414 if isinstance(url, str) else 400, "the URL is missing or longer than 8192 characters")
        path, query = split_target(url)
        segments = [unquote(s, errors="replace") for s in path.split("/") if s]
        try:
            params = dict(parse_qsl(query, keep_blank_values=True, max_num_fields=64))
        except ValueError:
            raise ShopError(400, "too many query parameters (at most 64)") from None
        if extra_params:
            params.update(extra_params)
        if not segments:
            raise ShopError(404, "no session in the URL: pages live under /<session>/...")
        session = segments[0]
        self.goal_index(session)  # validates
        rest = segments[1:]
        if not rest:
            if "search_query" in params:  # the original's search form field
                return self._results_state(session, params.get("search_query", ""), "1")
            return PageState(session)
        head = rest[0]
        if head == "search" and len(rest) == 1:
            return self._results_state(
                session, params.get("q", params.get("search_query", "")), params.get("page", "1")
            )
        if head in ("item", "done") and len(rest) in (2, 3):
            asin = rest[1]
            i = self.catalog.index_of(asin)
            if i is None:
                raise ShopError(404, f"unknown product {asin[:40]!r}: use an ASIN from the search results")
            product = self.catalog.product(i)
            options = {}
            for key, value in params.items():
                if not key.startswith(OPTION_PREFIX):
                    continue
                name = key[len(OPTION_PREFIX) :]
                if name not in product.options:
                    raise ShopError(
                        400,
                        f"option {name[:40]!r} does not exist for {product.asin}; options: {sorted(product.options)}",
                    )
                if value not in product.options[name]:
                    raise ShopError(
                        400,
                        f"value {value[:40]!r} is not an option of {name!r} for {product.asin}; "
                        f"values: {product.options[name]}",
                    )
                options[name] = value
            query = _clean_query(params.get("q", ""))[:MAX_QUERY_CHARS]
            page = self._page_number(params.get("page", "1"))
            if head == "done":
                if len(rest) != 2:
                    raise ShopError(404, f"no such page: {path[:80]!r}")
                return PageState(session, "done", query, page, product.asin, "", options)
            if len(rest) == 2:
                return PageState(session, "item", query, page, product.asin, "", options)
            sub = rest[2].capitalize()
            if sub not in SUB_PAGES or (sub == "Attributes" and not self.show_attrs):
                allowed = [s.lower() for s in SUB_PAGES if s != "Attributes" or self.show_attrs]
                raise ShopError(404, f"no sub-page {rest[2][:40]!r}; sub-pages: {allowed}")
            return PageState(session, "sub", query, page, product.asin, sub, options)
        raise ShopError(
            404,
            f"no such page: {path[:80]!r}; pages are /<session>, /<session>/search?q=...&page=N, "
            "/<session>/item/<asin>[/description|features|reviews|attributes], /<session>/done/<asin>",
        )

    @staticmethod
    def _page_number(raw: str) -> int:
        # isascii: str.isdigit() also accepts "²" and other digits int() rejects
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 4 or not 1 <= int(raw) <= MAX_PAGE:
            raise ShopError(400, f"invalid page={raw[:20]!r}: expected an int in 1..{MAX_PAGE}")
        return int(raw)

    def _results_state(self, session: str, raw_query: str, raw_page: str) -> PageState:
        if len(raw_query) > MAX_QUERY_CHARS:
            raise ShopError(
                400, f"the search query is {len(raw_query)} characters; at most {MAX_QUERY_CHARS} are accepted"
            )
        query = _clean_query(raw_query)
        if not query:
            raise ShopError(400, "empty search query: type some keywords, e.g. 'red running shoes'")
        return PageState(session, "results", query, self._page_number(raw_page))

    # ------------------------------------------------------------------ states -> page models
    def page(self, state: PageState) -> dict[str, Any]:
        """The page model of ``state`` (a JSON-serialisable dict), with its clickables."""
        goal = self.goal(state.session)
        model: dict[str, Any] = {
            "page": state.kind,
            "url": state.url(),
            "session": state.session,
            "instruction": goal.instruction_text,
        }
        if state.kind == "search":
            model.update(has_search_bar=True, clickables=[])
            return model
        if state.kind == "results":
            hits = self.search(state.query)
            start = (state.page - 1) * PRODUCT_WINDOW
            products = []
            for i in hits[start : start + PRODUCT_WINDOW]:
                p = self.catalog.product(i)
                item = PageState(state.session, "item", state.query, state.page, p.asin)
                products.append({"asin": p.asin, "title": p.title, "price": p.price_tag, "url": item.url()})
            has_prev = state.page > 1
            has_next = state.page * PRODUCT_WINDOW < len(hits)
            clickables = [BACK_TO_SEARCH.lower()]
            if has_prev:
                clickables.append(PREV_PAGE.lower())
            if has_next:
                clickables.append(NEXT_PAGE.lower())
            clickables += [p["asin"].lower() for p in products]
            model.update(
                query=state.query, page_num=state.page, total=len(hits), products=products, has_prev=has_prev,
                has_next=has_next, has_search_bar=False, clickables=clickables,
            )  # fmt: skip
            return model
        product = self.catalog.product_by_asin(state.asin)
        assert product is not None  # validated by parse_url
        if state.kind in ("item", "sub"):
            model.update(query=state.query, page_num=state.page, asin=product.asin, selected=dict(state.options))
        if state.kind == "item":
            tabs = [s for s in SUB_PAGES if s != "Attributes" or self.show_attrs]
            clickables = [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()] + [t.lower() for t in tabs] + [END_BUTTON.lower()]
            for values in product.options.values():
                clickables += [v for v in values if v not in clickables]
            model.update(
                title=product.title, price=product.price_tag, rating=product.rating, options=product.options,
                tabs=tabs, has_search_bar=False, clickables=clickables,
            )  # fmt: skip
            return model
        if state.kind == "sub":
            if state.sub == "Description":
                content: Any = product.description
            elif state.sub == "Features":
                content = list(product.bullet_points)
            elif state.sub == "Reviews":
                content = list(product.reviews)
            else:
                content = list(product.attributes)
            model.update(
                sub=state.sub, content=content, has_search_bar=False,
                clickables=[BACK_TO_SEARCH.lower(), PREV_PAGE.lower()],
            )  # fmt: skip
            return model
        # done: the reward
        i = self.catalog.index_of(product.asin)
        price = self.catalog.price(i)
        reward, info = get_reward(product.reward_view(), goal.as_dict(), price, state.options)
        model.update(
            asin=product.asin, title=product.title, options=dict(state.options), price=round(price, 2),
            reward=reward, reward_info=info, goal=goal.as_dict(), has_search_bar=False, clickables=[],
            purchased={"query": product.query, "category": product.category,
                       "product_category": product.product_category, "attributes": product.attributes},
        )  # fmt: skip
        return model

    # ------------------------------------------------------------------ actions
    def step(self, state: PageState, action: str) -> tuple[PageState, str | None]:
        """Apply one text action (``search[...]`` / ``click[...]``) to ``state``.

        Returns the next state and ``None``, or the unchanged state and the reason the action is not available here
        (the original's no-op for invalid actions).
        """
        if not isinstance(action, str):
            return state, "the action must be a string"
        m = _ACTION_RE.match(action)
        if m is None:
            return state, f"unrecognised action {action[:60]!r}: use search[keywords] or click[label]"
        verb, arg = m.group(1).lower(), m.group(2).strip().lower()
        if state.kind == "done":
            return state, "the purchase is done; the episode has ended"
        if verb == "search":
            if state.kind != "search":
                return state, "search[...] is only available on the search page; click[back to search] first"
            if len(arg) > MAX_QUERY_CHARS:
                return state, f"the search query is {len(arg)} characters; at most {MAX_QUERY_CHARS} are accepted"
            query = _clean_query(arg)
            if not query:
                return state, "empty search query: write search[keywords]"
            return PageState(state.session, "results", query, 1), None
        clickables = self.page(state)["clickables"]
        if arg not in clickables:
            return state, f"click[{arg[:60]}] is not available on this page; clickables: {clickables[:30]}"
        if arg == BACK_TO_SEARCH.lower():
            return PageState(state.session), None
        if state.kind == "results":
            if arg == NEXT_PAGE.lower():
                return PageState(state.session, "results", state.query, state.page + 1), None
            if arg == PREV_PAGE.lower():
                return PageState(state.session, "results", state.query, state.page - 1), None
            return PageState(state.session, "item", state.query, state.page, arg.upper()), None
        if state.kind == "sub":  # < prev
            return PageState(state.session, "item", state.query, state.page, state.asin, "", dict(state.options)), None
        # item page
        if arg == PREV_PAGE.lower():
            return PageState(state.session, "results", state.query, state.page), None
        if arg == END_BUTTON.lower():
            return PageState(state.session, "done", state.query, state.page, state.asin, "", dict(state.options)), None
        for tab in SUB_PAGES:
            if arg == tab.lower():
                return PageState(
                    state.session, "sub", state.query, state.page, state.asin, tab, dict(state.options)
                ), None
        product = self.catalog.product_by_asin(state.asin)
        assert product is not None
        for name, values in product.options.items():
            if arg in values:
                options = dict(state.options)
                options[name] = arg
                return PageState(state.session, "item", state.query, state.page, state.asin, "", options), None
        return state, f"click[{arg[:60]}] is not available on this page"  # unreachable: clickables cover all cases
