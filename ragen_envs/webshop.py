"""WebShop (Yao et al., 2022): buy the product an instruction describes, by searching and clicking in a web shop.

The env is an HTTP client of the bundled shop (``webshop-server``, package ``webshop_server``): give ``server_url``
of a running server, or leave it ``None`` and the env starts an embedded server on 127.0.0.1 with a free port in a
background thread (shared by every env of this process with the same catalog settings, stopped when the last one
closes). Only the standard library is used to talk to it, and nothing of the server is imported until needed.

Action space: ``UnicodeText``; one action per step, ``search[keywords]`` (only on the search page) or
``click[label]`` where ``label`` is one of the page's clickables (lower-case: ``back to search``, ``next >``,
``< prev``, a product's ASIN, an option value, ``description``, ``features``, ``reviews``, ``buy now``). Case and
surrounding whitespace are ignored. An action that is not available on the current page is a no-op with
``action_is_valid = False`` and a ``reason``.

Observation: the page as the original's ``text`` (texts joined by `` [SEP] ``), ``text_rich`` (buttons marked) or
``html``, followed by ``Available actions: [...]`` (``info["available_actions"]`` carries the same list).

Rewards: 0 until ``click[buy now]``, then the original's reward
``R = r_type * (attributes + options + price matched) / (goal attributes + goal options + 1)`` in [0, 1];
``info["reward_info"]`` has its parts. Success = ``R == 1``.

Episode end: terminated on purchase; with the protocol, truncated after ``max_turns`` (9) turns / 9 actions
(the reference RAGEN config: 9 turns, 1 action per turn).

Arguments:
    server_url: ``http://host:port`` of a running ``webshop-server`` (a path after it, ``http://host/shop`` behind a
        reverse proxy, is kept); ``None`` starts an embedded one. A server that answers something else is a
        :class:`NotWebShopError` (a ``ConnectionError``) saying what it answered.
    split: goals to draw from on ``reset(seed)``: ``"train"``, ``"eval"`` or ``"test"`` (the original's split).
    observation_mode: ``"text"``, ``"text_rich"`` or ``"html"``.
    show_available_actions: append the list of available actions to each observation.
    num_products, catalog_seed, goals_per_product, items_path, attrs_path, human_goals_path, show_attrs: the
        embedded server's catalog (ignored with ``server_url``); see ``webshop-server --help``.
    timeout: seconds to wait for the server per request.

``reset(options={"goal_index": k})`` picks goal ``k`` of the split instead of a random one.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import re
import sys
import threading
from typing import Any, SupportsFloat
from urllib.parse import urlsplit

import numpy as np

from ragen_envs.cache import cache_dir
from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg, default_info

_ACTION_RE = re.compile(r"^(search|click)\s*\[(.*)\]$", re.IGNORECASE | re.DOTALL)
_PRICE_RE = re.compile(r"\$\s?(\d{1,6}(?:\.\d{1,2})?)|(\d{1,6}(?:\.\d{1,2})?)\s?(?:dollars|usd)\b", re.IGNORECASE)
_ASIN_RE = re.compile(r"\b(B[0-9A-Z]{9})\b", re.IGNORECASE)
_BUDGET_RE = re.compile(r"price lower than (\d+(?:\.\d+)?) dollars")
SPLITS = ("train", "eval", "test")
MODES = ("text", "text_rich", "html")

#: The reference's shopping tips after each page (RAGEN ``ragen/env/webshop/env.py`` ``RENDER_INSTRUCTIONS`` joined by
#: newlines; a missing comma there fuses its 6th and 7th tips, kept as is).
REFERENCE_TIPS = "\n".join(
    (
        "We must buy a product within 10 actions. It doesn't have to match perfectly with description.",
        "Search term should not include details like size, color.",
        "Never search for more than 2 times.",
        "Do not be too strict about the description, it's more important to buy one that is close enough within "
        "action limit.",
        "Prioritize click a product in the current page over going to next page.",
        "Almost never click[next >] for more than 2 times.Almost never click[< prev] unless you are sure the product "
        "is on one of the previous pages.",
        "If you have less than 3 actions left, just buy the first product you see in the current page.",
        "If an matching option exists, make sure to click[size] then click[color], one at a time, before "
        "click[buy now], but don't have to if only 1 action left, in that case you just click[buy now]. Never click "
        "description.",
    )
)

INSTRUCTIONS = (
    "You are browsing an online shop. Based on the instruction, buy a product that matches the description. "
    "You need to search, read the search results, pick a product, choose its options (such as size and color) "
    "and buy it. Available actions depend on the page: on the search page, search[keywords]; on the results "
    "page, click[<asin>] to open a product or click[next >] / click[< prev] to change page; on a product page, "
    "click[<option value>] to choose an option, click[description] / click[features] / click[reviews] to read "
    "more, click[buy now] to buy, click[< prev] to go back; click[back to search] everywhere. Only use an action "
    "from the available actions list shown with each page. Example: I need a gingko light and 20x20 pillow cover "
    "that is hand painted. First search[gingko light 20x20 pillow cover hand painted], answer format: "
    "<answer>search[blanket with fleece throw]</answer>. Valid answers are search[<keywords>] or click[<clickable>]."
)


# ------------------------------------------------------------------------------------------- embedded server
class _Embedded:
    """One in-process server per catalog configuration, shared by every env that asks for it (ref-counted).

    A process must be able to end without ``env.close()``: the server thread is a daemon (it does not keep the
    interpreter alive) and :meth:`stop_all` (an ``atexit`` hook) stops every server while that thread still runs.
    Without it, an env collected during interpreter shutdown would call ``server.shutdown()``, which waits for the
    (by then frozen) daemon thread forever. Servers belong to the process that started them: a forked child forgets
    its parent's (their threads do not exist in it) and starts its own when an env asks.
    """

    # Re-entrant: WebShopEnv.__del__ releases, and a garbage collection may run it in a thread that holds the lock.
    _lock = threading.RLock()
    _servers: dict[tuple, list[Any]] = {}  # key -> [server, thread, refcount]

    @classmethod
    def acquire(cls, key: tuple, build_kwargs: dict[str, Any]) -> str:
        with cls._lock:
            entry = cls._servers.get(key)
            if entry is None:
                from webshop_server.app import build_shop, start_in_thread  # lazily: the server's deps

                # ragen's cache folder: the search index is built once per catalog for every env and process.
                shop = build_shop(**build_kwargs, cache_dir=str(cache_dir("webshop")))
                server, thread = start_in_thread(shop, "127.0.0.1", 0)  # a daemon thread
                entry = cls._servers[key] = [server, thread, 0]
            entry[2] += 1
            return entry[0].url

    @classmethod
    def release(cls, key: tuple) -> None:
        with cls._lock:
            entry = cls._servers.get(key)
            if entry is None:
                return
            entry[2] -= 1
            if entry[2] <= 0:
                del cls._servers[key]
                cls._stop(entry[0], entry[1])

    @staticmethod
    def _stop(server: Any, thread: threading.Thread) -> None:
        # shutdown() blocks until serve_forever returns: only ask a serving thread that can still answer (not one of
        # another process, not one frozen by interpreter shutdown).
        if thread.is_alive() and not sys.is_finalizing():
            server.shutdown()
            thread.join(timeout=5)
        server.server_close()

    @classmethod
    def stop_all(cls) -> None:
        """Stop every embedded server of this process (at exit; envs still open then get connection errors)."""
        with cls._lock:
            entries, cls._servers = list(cls._servers.values()), {}
        for server, thread, _ in entries:
            cls._stop(server, thread)

    @classmethod
    def _forget_after_fork(cls) -> None:
        cls._lock = threading.RLock()
        cls._servers = {}


atexit.register(_Embedded.stop_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_Embedded._forget_after_fork)


#: Largest answer read from a WebShop server (a results page is some KB).
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class NotWebShopError(ConnectionError):
    """The server at ``server_url`` answered something a WebShop server does not (the message says what)."""


class _Client:
    """A keep-alive JSON client for one server, standard library only. A path in the URL
    (``http://host/shop``, a server behind a reverse proxy) is kept in front of every request's path."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.timeout = parts.hostname or "127.0.0.1", parts.port or 80, timeout
        self.prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """``(status, the JSON object answered)``; ``ConnectionError`` when the server does not answer,
        :class:`NotWebShopError` when it answers something that is not a JSON object."""
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in range(2):  # one reconnect: the server may have closed an idle keep-alive connection
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request(method, self.prefix + path, body=body, headers=headers)
                resp = self._conn.getresponse()
                data = resp.read(MAX_ANSWER_BYTES + 1)
                if resp.getheader("Connection", "").lower() == "close" or len(data) > MAX_ANSWER_BYTES:
                    self.close()
                return resp.status, self._parse(method, path, resp, data)
            except (http.client.HTTPException, ConnectionError, OSError) as exc:
                self.close()
                if isinstance(exc, NotWebShopError):
                    raise
                if attempt == 1:
                    raise ConnectionError(
                        f"WebShop server at {self.url} did not answer {method} {path}: {exc}. "
                        "Start it with `webshop-server` or pass server_url=None for an embedded one."
                    ) from exc
        raise AssertionError("unreachable")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self.prefix}"

    def _parse(self, method: str, path: str, resp: http.client.HTTPResponse, data: bytes) -> dict[str, Any]:
        if not data:
            return {}
        what = f"{self.url} is not a WebShop server: {method} {path} answered {resp.status}"
        kind = resp.getheader("Content-Type") or "no Content-Type"
        if len(data) > MAX_ANSWER_BYTES:
            raise NotWebShopError(f"{what} with more than {MAX_ANSWER_BYTES:,} bytes ({kind})")
        try:
            parsed = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            start = data[:80].decode("utf-8", errors="replace")
            raise NotWebShopError(f"{what} with {kind} that is not JSON (it starts {start!r}); server_url must "
                                  "name a running webshop-server, e.g. http://127.0.0.1:3000") from None  # fmt: skip
        if not isinstance(parsed, dict):
            raise NotWebShopError(f"{what} with JSON that is not an object ({type(parsed).__name__})")
        return parsed

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_conn": None}  # a socket cannot be pickled; the copy connects on first request


# ------------------------------------------------------------------------------------------------- the env
class WebShopEnv(BaseTextEnv):
    """Shop for the product an instruction describes. See the module docstring."""

    # RAGEN config/envs.yaml WebShop env_instruction, verbatim.
    reference_instruction = (
        "You are browsing an online shop. Based on the instruction, buy a product that close to the production "
        "description. You need to search, read the search results, pick a product, choose the size and color and "
        "buy. You should only choose action from the available actions list provided later.  Example process: I need "
        "a gingko light and 20x20 pillow cover that is hand painted. First search[gingko light 20x20 pillow cover "
        "hand painted], answer format: <answer>search[blanket with fleece throw]</answer>. Valid answer is "
        "search[<keywords>] or click[<clickable>]."
    )
    max_action_chars = 1024
    #: Each step is an HTTP round trip: the episode driver steps it in a thread while the model generates.
    io_bound = True

    def __init__(
        self,
        server_url: str | None = None,
        *,
        split: str = "train",
        observation_mode: str = "text",
        show_available_actions: bool = True,
        num_products: int = 1000,
        catalog_seed: int = 0,
        goals_per_product: int = 2,
        items_path: str | None = None,
        attrs_path: str | None = None,
        human_goals_path: str | None = None,
        show_attrs: bool = False,
        timeout: float = 30.0,
        render_mode: str | None = None,
    ) -> None:
        check_arg(split in SPLITS, "split", split, f"one of {SPLITS}")
        check_arg(observation_mode in MODES, "observation_mode", observation_mode, f"one of {MODES}")
        check_arg(isinstance(show_available_actions, bool), "show_available_actions", show_available_actions, "a bool")
        check_arg(
            isinstance(num_products, int) and not isinstance(num_products, bool) and num_products >= 1,
            "num_products", num_products, "an int >= 1",
        )  # fmt: skip
        check_arg(isinstance(catalog_seed, int) and catalog_seed >= 0, "catalog_seed", catalog_seed, "an int >= 0")
        check_arg(
            isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < 1e9,
            "timeout", timeout, "a finite number of seconds > 0",
        )  # fmt: skip
        if server_url is not None:
            parts = urlsplit(server_url) if isinstance(server_url, str) else None
            check_arg(
                parts is not None and parts.scheme == "http" and bool(parts.hostname),
                "server_url", server_url, "None or 'http://host:port' of a running webshop-server",
            )  # fmt: skip
        super().__init__(render_mode=render_mode)
        self.split = split
        self.observation_mode = observation_mode
        self.show_available_actions = show_available_actions
        self._embedded_key: tuple | None = None
        self._embedded_pid = 0  # the process whose embedded server this env holds a reference to
        if server_url is None:
            build = dict(
                num_products=num_products, seed=catalog_seed, goals_per_product=goals_per_product,
                items_path=items_path, attrs_path=attrs_path, human_goals_path=human_goals_path, show_attrs=show_attrs,
            )  # fmt: skip
            self._embedded_key = tuple(sorted(build.items()))
            server_url = _Embedded.acquire(self._embedded_key, build)
            self._embedded_pid = os.getpid()
        self.server_url = server_url.rstrip("/")
        self._client = _Client(self.server_url, float(timeout))
        try:
            status, catalog = self._client.request("GET", "/api/catalog")
        except ConnectionError:
            self.close()
            raise
        splits = catalog.get("splits") if status == 200 else None
        if not (isinstance(splits, dict) and isinstance(splits.get(split), int) and not isinstance(splits[split], bool)):
            self.close()
            said = f"answered {status}" if status != 200 else f"has no goal count for the {split!r} split"
            raise NotWebShopError(f"{self.server_url} is not a WebShop server (/api/catalog {said}); server_url must "
                                  "name a running webshop-server, e.g. http://127.0.0.1:3000")  # fmt: skip
        self.catalog_info = catalog
        self.n_goals = int(splits[split])
        if self.n_goals == 0:
            self.close()
            raise ValueError(f"invalid argument split={split!r}: the server's {split} split has no goals")
        self._page: dict[str, Any] = {}
        self._reward = 0.0
        self._closed = False
        self._reference_at_start = True  # the reference shows the goal instruction, not the page, before any action

    # ------------------------------------------------------------------ text
    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    def available_actions(self) -> list[str]:
        """The actions valid on the current page, as ``search[...]`` / ``click[...]`` strings."""
        avail = self._page.get("available_actions", {})
        out = ["search[<content>]"] if avail.get("has_search_bar") else []
        return out + [f"click[{c}]" for c in avail.get("clickables", [])]

    def describe_actions(self) -> str:
        return ", ".join(self.available_actions()) or "none (the episode has ended)"

    def state_text(self) -> str:
        obs = self._page.get("observation", "")
        if self.show_available_actions:
            obs += f"\nAvailable actions: {self.available_actions()}"
        return obs

    def reference_state_text(self) -> str:
        """The reference's rendering (``prepare_render_cache``): the goal instruction at reset, then the page; its
        shopping tips; the available actions (``click[next >]`` dropped on a last results page, as it does)."""
        text = self._page.get("instruction", "") if self._reference_at_start else self._page.get("observation", "")
        actions = self.available_actions()
        if tuple(actions) == ("click[back to search]", "click[< prev]", "click[next >]"):
            actions = actions[:2]
        return text + "." + REFERENCE_TIPS + "\n You must choose from these actions:" + ", ".join(actions) + "."

    def state_view(self) -> dict[str, Any]:
        view = {k: v for k, v in self._page.items() if k not in ("observation", "goal")}
        budget = _BUDGET_RE.search(self._page.get("instruction", ""))
        view["budget"] = float(budget.group(1)) if budget else None
        return view

    # ------------------------------------------------------------------ actions
    def parse_action(self, text: str) -> str | None:
        """``search[...]`` / ``click[...]`` (any case, extra whitespace) if available on this page, else None."""
        m = _ACTION_RE.match(text.strip().strip("`\"'").strip())
        if m is None:
            return None
        verb, arg = m.group(1).lower(), " ".join(m.group(2).split())
        avail = self._page.get("available_actions", {})
        if verb == "search":
            return f"search[{arg}]" if avail.get("has_search_bar") and arg and len(arg) <= 500 else None
        arg = arg.lower()
        return f"click[{arg}]" if arg in avail.get("clickables", []) else None

    def _why_invalid(self, action: Any) -> str:
        if not isinstance(action, str):
            return f"the action must be text, got {type(action).__name__}"
        m = _ACTION_RE.match(action.strip().strip("`\"'").strip())
        if m is None:
            return f"unrecognised action {action[:60]!r}: use search[keywords] or click[label]"
        verb, arg = m.group(1).lower(), " ".join(m.group(2).split())
        if self._page.get("page") == "done":
            return "the purchase is done; the episode has ended"
        if verb == "search":
            if not self._page.get("available_actions", {}).get("has_search_bar"):
                return "search[...] is only available on the search page; click[back to search] first"
            return "search[...] needs 1 to 500 characters of keywords"
        return f"click[{arg[:60]}] is not available on this page; available actions: {self.describe_actions()}"

    def _call(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        status, data = self._client.request("POST", path, payload)
        if status != 200:
            raise ConnectionError(f"WebShop server answered {status} to {path}: {data.get('error', data)}")
        return data

    def _reset_state(self, options: dict[str, Any] | None) -> None:
        index = (options or {}).get("goal_index")
        if index is None:
            index = int(self.np_random.integers(self.n_goals))
        check_arg(
            isinstance(index, (int, np.integer)) and not isinstance(index, bool) and 0 <= index < self.n_goals,
            "goal_index",
            index,
            f"an int in 0..{self.n_goals - 1}",
        )
        # A deterministic session id: the server is stateless, so envs sharing a goal cannot interfere.
        self._page = self._call("/api/page", {"url": f"/{self.split}_{int(index)}", "mode": self.observation_mode})
        self._reward = 0.0
        self._reference_at_start = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        info.update(self._extra())
        return obs, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        if isinstance(action, str) and self.parse_action(action) is not None:
            observation, reward, terminated, truncated, info = super().step(action)
            if "server_reason" in info:  # the server refused it (e.g. a query with nothing printable): a no-op
                self.num_env_steps -= 1
                info["action_is_valid"] = False
                info["actions"] = []
                info["reason"] = info["server_reason"]
            return observation, reward, terminated, truncated, info
        info = default_info(
            action_is_valid=False,
            success=self.is_success(),
            reward_parts={"env": 0.0},
            reason=self._why_invalid(action),
        )
        info.update(self._extra())
        return self._observation(self.state_text()), 0.0, False, False, info

    def _apply_action(self, action: str) -> StepOutcome:
        before = self._page.get("url")
        data = self._call("/api/step", {"url": before, "action": action, "mode": self.observation_mode})
        self._page = data["page"]
        self._reference_at_start = False
        done = bool(data["done"]) and data["valid"]
        reward = float(data["reward"]) if done else 0.0
        self._reward = reward
        extra = self._extra()
        if not data["valid"]:
            extra["server_reason"] = data["reason"]
        if done:
            extra["reward_info"] = self._page.get("reward_info", {})
        return StepOutcome(
            reward=reward, terminated=done, effective=self._page.get("url") != before, success=self.is_success(),
            extra=extra,
        )  # fmt: skip

    def current_goal(self) -> Any:
        """The goal of the current episode (product, attributes, options, price cap): the answer key oracles use.

        Only an env running the embedded server (no ``server_url``) can read it; a remote server keeps goals private.
        """
        entry = _Embedded._servers.get(self._embedded_key) if self._embedded_key is not None else None
        if entry is None:
            raise ValueError(
                "current_goal() needs the env's embedded server: make the env without server_url "
                "(a remote webshop-server does not reveal goals)"
            )
        return entry[0].shop.goal(self.state_view()["session"])

    def state_info(self) -> dict[str, Any]:
        return self._extra()

    def _extra(self) -> dict[str, Any]:
        return {
            "available_actions": self.available_actions(),
            "page": self._page.get("page"),
            "url": self._page.get("url"),
        }

    def is_success(self) -> bool:
        return self._page.get("page") == "done" and self._reward == 1.0

    # ------------------------------------------------------------------ reasoning check
    def check_reasoning(self, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        """Check price claims: a dollar amount in a sentence that names a product on the page (its ASIN), or any
        amount on a product page, must be that product's price (or within its price range). The goal's budget is
        not a claim about a product and is skipped; amounts on pages without products are not checkable."""
        prices: dict[str, tuple[float, float]] = {}
        for p in view_before.get("products", []) or []:
            prices[p["asin"].upper()] = _price_bounds(p["price"])
        current = None
        if view_before.get("page") == "item":
            current = _price_bounds(view_before.get("price", ""))
            prices[str(view_before.get("asin", "")).upper()] = current
        budget = view_before.get("budget")
        supported = contradicted = 0
        for sentence in re.split(r"(?<=[.!?;\n])\s+", think):
            amounts = [float(a or b) for a, b in _PRICE_RE.findall(sentence)]
            amounts = [a for a in amounts if budget is None or abs(a - budget) > 0.005]
            if not amounts:
                continue
            named = [a.upper() for a in _ASIN_RE.findall(sentence) if a.upper() in prices]
            bounds = prices[named[0]] if len(named) == 1 else (current if not named else None)
            if bounds is None or bounds[0] < 0:
                continue
            for amount in amounts:
                if bounds[0] - 0.005 <= amount <= bounds[1] + 0.005:
                    supported += 1
                else:
                    contradicted += 1
        return {"supported": supported, "contradicted": contradicted}

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        client = getattr(self, "_client", None)
        if client is not None:
            client.close()
        if getattr(self, "_embedded_key", None) is not None:
            if self._embedded_pid == os.getpid():  # a forked copy of an env holds no reference in its process
                _Embedded.release(self._embedded_key)
            self._embedded_key = None
        super().close()

    # ------------------------------------------------------------------ pickling (the client drops its socket)
    def __setstate__(self, state: dict[str, Any]) -> None:
        """An env with an embedded server gets one in the unpickling process (the same catalog, so the same goals
        and pages: sessions live in page URLs, an episode goes on where it was); one with ``server_url``
        reconnects to that URL on its first request."""
        self.__dict__.update(state)
        if self._embedded_key is not None and not self._closed:
            self.server_url = _Embedded.acquire(self._embedded_key, dict(self._embedded_key)).rstrip("/")
            self._embedded_pid = os.getpid()
            self._client = _Client(self.server_url, self._client.timeout)

    def __del__(self) -> None:  # an env dropped without close() must not keep the embedded server alive forever
        try:
            self.close()
        except Exception:
            pass


def _price_bounds(tag: str) -> tuple[float, float]:
    """``"$12.5"`` -> (12.5, 12.5); ``"$10 to $20"`` -> (10, 20); unparseable -> (-1, -1)."""
    values = [float(v) for v in re.findall(r"\$(\d+(?:\.\d+)?)", str(tag))]
    if not values:
        return (-1.0, -1.0)
    return (min(values), max(values))
