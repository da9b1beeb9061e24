"""The HTTP server: HTML pages like the original's, a JSON API beside them, a health endpoint.

Standard library only: it adds no dependency (the bundled WebShop should install with pip anywhere and start in a
second), pages are small and rendered from strings, and the pre-fork design below gives real parallelism. Requests
are parsed by ``http.server.BaseHTTPRequestHandler``; connections are handled by :mod:`webshop_server.serving`, a
selector loop that reads whole requests before a handler thread sees them, with limits on size, JSON depth and
time, so slow or hostile clients cannot hold threads or starve others (see that module for why and how). Flask +
waitress would add two packages for routing we need five lines for.

Parallelism (``workers``): the listening socket is bound once, then ``workers`` processes are forked and each runs
its own selector loop (and handler threads) on that socket (the pre-fork model of gunicorn). Sessions are stateless (see
:mod:`webshop_server.shop`), so any process can answer any request and no sticky routing or shared store is
needed; the catalog and the memory-mapped search index are shared copy-on-write.

Routes (GET, and POST with a form or JSON body):

=====================================  ==========================================================================
``/``                                  redirect to a new session with a random train goal
``/<session>``                         search page (``?search_query=`` as in the original also searches)
``/<session>/search?q=&page=``         results, 10 per page out of the top 50
``/<session>/item/<asin>?q=&page=&o.<name>=<value>``  item page; ``/description|features|reviews|attributes``
``/<session>/done/<asin>?o.<name>=``   purchase: the reward and its parts
``/api/<any page above>``              the page as JSON (its model)
``/api/session``                       new session id: ``split`` and ``index``, or ``goal`` (JSON or query)
``/api/page?url=&mode=``               a page as JSON with its observation (``text``, ``text_rich``, ``html``)
``/api/step``  (POST JSON)             ``{"url", "action", "mode"}``: apply ``search[...]``/``click[...]``
``/api/catalog``, ``/health``          catalog summary; liveness
=====================================  ==========================================================================

Bad input never gets a 5xx: malformed URLs, unknown sessions / products / options, huge or odd queries, bad bodies
and unknown methods all get a 4xx with a message saying what was wrong and what is accepted; too large or too deep
input, too slow clients and non-HTTP bytes get a 4xx whose JSON body names the limit (``{"error", "status",
"limit"}``). Static files carry an ETag and Last-Modified and are revalidated (304).
"""

from __future__ import annotations

import dataclasses
import email.parser
import hashlib
import io
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from email.utils import formatdate, parsedate_to_datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from itertools import accumulate
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

from webshop_server.catalog import GeneratedCatalog, OriginalCatalog
from webshop_server.render import OBSERVATION_MODES, render
from webshop_server.search import SearchEngine
from webshop_server.serving import Limits, SelectorHTTPServer, run_handler
from webshop_server.shop import PageState, Shop, ShopError, split_target

log = logging.getLogger("webshop_server")

DEFAULT_LIMITS = Limits()
MAX_BODY_BYTES = DEFAULT_LIMITS.max_body_bytes
MAX_JSON_DEPTH = DEFAULT_LIMITS.max_json_depth
MAX_CONCURRENT_CONNECTIONS = DEFAULT_LIMITS.max_connections
STATIC_CACHE_CONTROL = "no-cache"  # browsers may keep the files but revalidate each use (a 304 when unchanged)
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
_STATIC = {"style.css": "text/css; charset=utf-8", "webshop.js": "text/javascript; charset=utf-8"}


def _static_bytes() -> dict[str, bytes]:
    return {name: data for name, (data, _mtime) in _static_files().items()}


def _static_files() -> dict[str, tuple[bytes, float | None]]:
    """Each static file's bytes and modification time (None when it cannot be known)."""
    # Next to this module first: importlib.resources.files() raises NotADirectoryError when the package is imported
    # as a namespace package (an editable install made before the package had its __init__.py).
    here = Path(__file__).resolve().parent / "static"
    if all((here / name).is_file() for name in _STATIC):
        return {name: ((here / name).read_bytes(), (here / name).stat().st_mtime) for name in _STATIC}
    root = resources.files("webshop_server") / "static"
    return {name: ((root / name).read_bytes(), None) for name in _STATIC}


class StaticFile:
    """A static file with its validators: a strong ETag (hash of the bytes) and Last-Modified."""

    __slots__ = ("ctype", "data", "etag", "last_modified", "mtime")

    def __init__(self, data: bytes, ctype: str, mtime: float) -> None:
        self.data, self.ctype = data, ctype
        self.etag = '"' + hashlib.sha256(data).hexdigest()[:20] + '"'
        self.mtime = int(mtime)
        self.last_modified = formatdate(self.mtime, usegmt=True)

    def not_modified(self, if_none_match: str | None, if_modified_since: str | None) -> bool:
        """RFC 9110 13.1: If-None-Match (weak comparison) decides when present, else If-Modified-Since."""
        if if_none_match is not None:
            tags = [t.strip() for t in if_none_match.split(",")]
            return "*" in tags or any(t.removeprefix("W/") == self.etag for t in tags)
        if if_modified_since:
            try:
                since = parsedate_to_datetime(if_modified_since)
            except (TypeError, ValueError, IndexError, OverflowError):
                return False
            if since is None or since.tzinfo is None:
                return False
            return self.mtime <= since.timestamp()
        return False


class LimitError(ShopError):
    """A request over one of the server's limits; the JSON error body names it (``"limit": {name: value}``)."""

    def __init__(self, status: int, message: str, limit: dict[str, Any]) -> None:
        super().__init__(status, message)
        self.limit = limit


class WebShopHTTPServer(SelectorHTTPServer):
    """The shop's HTTP server: :class:`~webshop_server.serving.SelectorHTTPServer` running :class:`WebShopHandler`."""

    server_version = "WebShop/ragen"

    def __init__(self, address: tuple[str, int], shop: Shop, *, access_log: bool = False, workers: int = 1,
                 limits: Limits | None = None) -> None:  # fmt: skip
        self.shop = shop
        self.access_log = access_log
        self.workers = workers
        self.started = time.time()
        self.static = _static_bytes()
        self.static_files = {name: StaticFile(data, _STATIC[name], mtime if mtime is not None else self.started)
                             for name, (data, mtime) in _static_files().items()}  # fmt: skip
        super().__init__(address, limits)

    def handle_request_bytes(self, data: bytes, client_address: Any, force_close: bool) -> tuple[bytes, bool]:
        return run_handler(WebShopHandler, self, data, client_address, force_close)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def _header_lines(rfile: Any) -> list[bytes]:
    """The header lines of a request held in memory, up to the empty line that ends them (not included)."""
    lines = []
    while len(lines) <= 10_000:  # the connection layer allows far fewer; a guard for direct use
        line = rfile.readline(65537)
        if line in (b"", b"\r\n", b"\n"):
            break
        lines.append(line)
    return lines


class WebShopHandler(BaseHTTPRequestHandler):
    """Answers one complete request held in memory (``rfile``/``wfile`` are buffers; see ``serving.run_handler``)."""

    server: WebShopHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "WebShop/ragen"
    sys_version = ""
    force_close = False  # set per request: the body's length was unknown, so the connection must close after it

    # -------------------------------------------------------------- plumbing
    def parse_request(self) -> bool:
        if not self.raw_requestline.strip():
            self.command, self.requestline, self.request_version = None, "", "HTTP/1.0"
            self.send_error(400, "blank request line: expected 'METHOD /path HTTP/1.1'")
            return False
        # The headers are parsed here: http.client's parser refuses a request's 100th header (it counts the empty
        # line that ends them against its limit of 100), while the connection layer has already enforced
        # Limits.max_headers (100, as documented). The stdlib parses the request line before an empty header block.
        head = _header_lines(self.rfile)
        self.rfile = io.BytesIO(b"\r\n" + self.rfile.read())
        if not super().parse_request():
            return False
        self.headers = email.parser.Parser(_class=self.MessageClass).parsestr(b"".join(head).decode("iso-8859-1"))
        connection = self.headers.get("Connection", "").lower()  # what the stdlib decides from the headers
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive" and self.protocol_version >= "HTTP/1.1":
            self.close_connection = False
        if self.request_version == "HTTP/0.9":
            self.send_error(400, "HTTP/0.9 requests are not supported: send 'GET /path HTTP/1.1'")
            return False
        if self.force_close:
            self.close_connection = True
        return True

    def handle_expect_100(self) -> bool:
        return True  # the connection layer has already sent "100 Continue" when the body was still to come

    def __getattr__(self, name: str) -> Any:
        # http.server answers 501 to methods without a do_X; any method we do not serve is a client error (405).
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        self.close_connection = True
        self._send(
            405,
            "text/plain; charset=utf-8",
            b"method not allowed: use GET, HEAD or POST\n",
            {"Allow": "GET, HEAD, POST"},
        )

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Errors the stdlib raises while parsing a request (bad request line, HTTP/2.0, ...) are the client's.
        if code >= 500:
            code, message = 400, f"bad request ({message or 'unsupported request'})"
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") in ("HTTP/0.9", ""):
            self.request_version = "HTTP/1.0"  # we do not speak HTTP/0.9: always send a status line and headers
        payload: dict[str, Any] = {"error": message or HTTPStatus(code).phrase, "status": code}
        if code == 431:
            payload["limit"] = {"max_headers": self.server.limits.max_headers,
                                "max_head_bytes": self.server.limits.max_head_bytes}
        elif code == 414:
            payload["limit"] = {"max_line_bytes": self.server.limits.max_line_bytes}
        self._send(code, "application/json; charset=utf-8", json.dumps(payload).encode("utf-8"))

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.access_log:
            sys.stderr.write(f"{self.address_string()} - [{self.log_date_time_string()}] {format % args}\n")

    def _send(self, status: int, ctype: str, body: bytes, headers: dict[str, str] | None = None,
              cache_control: str = "no-store") -> None:  # fmt: skip
        self.send_response(status)
        if status == 304:  # no body, no representation headers (RFC 9110 15.4.5)
            body = b""
        else:
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache_control)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("Referrer-Policy", "no-referrer")
        if self.close_connection:
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        # Headers and body in one write: two small writes would meet Nagle + delayed ACK (40 ms per request).
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD" and body:
            self._headers_buffer.append(body)
        self.flush_headers()

    def _json(self, status: int, payload: Any) -> None:
        try:
            body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate echoed from a JSON body: send it \u-escaped (still valid JSON)
            body = json.dumps(payload).encode("ascii")
        self._send(status, "application/json; charset=utf-8", body)

    def _html(self, status: int, text: str) -> None:
        self._send(status, "text/html; charset=utf-8", text.encode("utf-8", "replace"))

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            raise ShopError(411, "chunked (Transfer-Encoding) request bodies are not accepted; send Content-Length")
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return b""
        raw = values[0]
        if len({v.strip() for v in values}) > 1:
            self.close_connection = True
            raise ShopError(400, "conflicting Content-Length headers")
        if not (raw.strip().isascii() and raw.strip().isdigit() and len(raw.strip()) <= 15):
            self.close_connection = True
            raise ShopError(400, f"invalid Content-Length {raw[:20]!r}")
        n = int(raw.strip())
        limit = self.server.limits.max_body_bytes
        if n > limit:
            self.close_connection = True
            raise LimitError(413, f"request body of {n} bytes; at most {limit} are accepted", {"max_body_bytes": limit})
        body = self.rfile.read(n) if n else b""
        if len(body) != n:  # cannot happen behind the connection layer, which reads whole bodies
            self.close_connection = True
            raise ShopError(400, f"request body shorter than its Content-Length ({len(body)} of {n} bytes)")
        return body

    # -------------------------------------------------------------- methods
    def do_GET(self) -> None:
        self._with_body(ignore=True)

    def do_HEAD(self) -> None:
        self._with_body(ignore=True)

    def do_POST(self) -> None:
        self._with_body(ignore=False)

    def _with_body(self, ignore: bool) -> None:
        try:
            body = self._read_body()  # a GET's body is read (so it is not taken for the next request) and ignored
        except ShopError as err:
            path = self.path if isinstance(self.path, str) else "/"
            self._error(err, api=path.startswith("/api/") or path == "/api")
            return
        self._dispatch(b"" if ignore else body)

    def _dispatch(self, body: bytes) -> None:
        path = self.path if isinstance(self.path, str) else "/"
        api = path.startswith("/api/") or path == "/api"
        try:
            self._route(path, body)
        except ShopError as err:
            self._error(err, api)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:  # a bug, not bad input: log it, answer 500, keep serving
            log.exception("internal error on %s %s", self.command, path[:200])
            self.close_connection = True
            try:
                self._send(500, "text/plain; charset=utf-8", b"internal server error\n")
            except OSError:
                pass

    def _error(self, err: ShopError, api: bool) -> None:
        if api:
            payload: dict[str, Any] = {"error": err.message, "status": err.status}
            if isinstance(err, LimitError):
                payload["limit"] = err.limit
            self._json(err.status, payload)
        else:
            from html import escape

            page = (
                '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>WebShop error</title>'
                '<link rel="stylesheet" href="/static/style.css"></head><body><div class="container">'
                f'<h1>{err.status} {escape(HTTPStatus(err.status).phrase)}</h1><p id="error">{escape(err.message)}</p>'
                '<p><a href="/">Start a new session</a></p></div></body></html>'
            )
            self._html(err.status, page)

    # -------------------------------------------------------------- routes
    def _form(self, body: bytes) -> dict[str, str]:
        if not body:
            return {}
        ctype = (self.headers.get("Content-Type") or "").lower()
        if "application/x-www-form-urlencoded" not in ctype:
            return {}
        try:
            return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=64))
        except ValueError:
            raise ShopError(400, "too many form fields (at most 64)") from None

    def _json_body(self, body: bytes) -> dict[str, Any]:
        if not body:
            return {}
        depth = self.server.limits.max_json_depth
        too_deep = LimitError(400, f"the JSON body is nested deeper than {depth} levels of arrays and objects",
                              {"max_json_depth": depth})  # fmt: skip
        if json_depth_exceeds(body, depth):
            raise too_deep
        try:
            data = json.loads(body.decode("utf-8"))
        except RecursionError:  # not reached after the depth check; kept so that no nesting can give a 500
            raise too_deep from None
        except (UnicodeDecodeError, ValueError):
            raise ShopError(400, "the body must be a JSON object (UTF-8)") from None
        if not isinstance(data, dict):
            raise ShopError(400, f"the body must be a JSON object, got {type(data).__name__}")
        return data

    def _route(self, path: str, body: bytes) -> None:
        shop = self.server.shop
        if len(path) > 8192:
            raise ShopError(414, "URL longer than 8192 characters")
        route, query = split_target(path)
        if route == "/":
            sid = shop.new_session("train")
            self._send(302, "text/plain; charset=utf-8", b"", {"Location": "/" + quote(sid, safe="")})
            return
        if route == "/health":
            self._json(200, {"status": "ok", "pid": os.getpid(), "workers": self.server.workers,
                             "uptime_s": round(time.time() - self.server.started, 3),
                             "catalog": shop.catalog.describe(), "connections": self.server.stats()})  # fmt: skip
            return
        if route.startswith("/static/"):
            name = route[len("/static/") :]
            static = self.server.static_files.get(name)
            if static is None:
                raise ShopError(404, f"no static file {name[:40]!r}")
            validators = {"ETag": static.etag, "Last-Modified": static.last_modified}
            unchanged = static.not_modified(self.headers.get("If-None-Match"), self.headers.get("If-Modified-Since"))
            self._send(304 if unchanged else 200, static.ctype, static.data, validators, STATIC_CACHE_CONTROL)
            return
        if route in ("/favicon.ico", "/robots.txt"):
            self._send(404, "text/plain; charset=utf-8", b"not found\n")
            return
        if route == "/api" or route.startswith("/api/"):
            self._api(route[4:] or "/", query, body)
            return
        state = shop.parse_url(path, self._form(body))
        self._html(200, render(shop.page(state), "html"))

    def _params(self, query: str, body: bytes) -> dict[str, Any]:
        try:
            params: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True, max_num_fields=64))
        except ValueError:
            raise ShopError(400, "too many query parameters (at most 64)") from None
        ctype = (self.headers.get("Content-Type") or "").lower()
        if body and "json" in ctype:
            params.update(self._json_body(body))
        elif body:
            params.update(self._form(body))
        return params

    def _api(self, route: str, query: str, body: bytes) -> None:
        shop = self.server.shop
        if route == "/catalog":
            self._json(200, shop.catalog.describe())
            return
        if route == "/session":
            p = self._params(query, body)
            goal, index = _opt_int(p.get("goal"), "goal"), _opt_int(p.get("index"), "index")
            split = p.get("split")
            if split is not None and not isinstance(split, str):
                raise ShopError(400, "split must be 'test', 'eval' or 'train'")
            sid = shop.new_session(split, index, goal)
            self._json(200, {"session": sid, "url": "/" + quote(sid, safe=""), "goal_index": shop.goal_index(sid),
                             "instruction": shop.goal(sid).instruction_text})  # fmt: skip
            return
        if route == "/page":
            p = self._params(query, body)
            state = shop.parse_url(_str_param(p, "url"))
            self._json(200, _page_payload(shop, state, _mode(p)))
            return
        if route == "/step":
            if self.command != "POST":
                raise ShopError(405, 'use POST /api/step with a JSON body {"url", "action", "mode"}')
            p = self._params(query, body)
            state = shop.parse_url(_str_param(p, "url"))
            action = _str_param(p, "action")
            mode = _mode(p)
            new_state, reason = shop.step(state, action)
            payload = _page_payload(shop, new_state, mode)
            self._json(200, {"valid": reason is None, "reason": reason, "done": new_state.kind == "done",
                             "reward": payload.get("reward", 0.0) if reason is None else 0.0, "page": payload})  # fmt: skip
            return
        # /api/<session>/...: the page model as JSON
        state = shop.parse_url(route + (f"?{query}" if query else ""), self._form(body))
        self._json(200, shop.page(state))


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKET_DELTA = [0] * 256
for _c in b"[{":
    _BRACKET_DELTA[_c] = 1
for _c in b"]}":
    _BRACKET_DELTA[_c] = -1
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """Whether a JSON text nests arrays / objects deeper than ``limit`` (brackets inside strings do not count).

    Checked before ``json.loads``, whose C scanner recurses once per level and raises RecursionError near 1,000
    levels (a 500 before this check). Linear time; the scan runs in C (regex, translate, accumulate).
    """
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    return any(d > limit for d in accumulate(map(_BRACKET_DELTA.__getitem__, brackets)))


def _opt_int(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ShopError(400, f"{name} must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 12:
        return int(value.strip())
    raise ShopError(400, f"{name}={str(value)[:30]!r} must be a non-negative integer")


def _str_param(p: dict[str, Any], name: str) -> str:
    value = p.get(name)
    if not isinstance(value, str) or not value:
        raise ShopError(400, f"missing or non-string {name!r}")
    return value


def _mode(p: dict[str, Any]) -> str:
    mode = p.get("mode", "text")
    if mode not in OBSERVATION_MODES:
        raise ShopError(400, f"invalid mode={str(mode)[:30]!r}: expected one of {list(OBSERVATION_MODES)}")
    return mode


def _page_payload(shop: Shop, state: PageState, mode: str) -> dict[str, Any]:
    model = shop.page(state)
    model["observation"] = render(model, mode)
    model["available_actions"] = {"has_search_bar": model["has_search_bar"], "clickables": model["clickables"]}
    return model


# ================================================================================================= building & serving
def build_shop(
    num_products: int = 1000,
    seed: int = 0,
    *,
    goals_per_product: int = 2,
    items_path: str | None = None,
    attrs_path: str | None = None,
    human_goals_path: str | None = None,
    reviews_path: str | None = None,
    show_attrs: bool = False,
    cache_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Shop:
    """The catalog (generated, or the original's files when ``items_path`` is given), its index, and the shop."""
    if items_path:
        if not attrs_path:
            raise ValueError("invalid argument attrs_path=None: the original data needs items_ins_v2*.json too")
        catalog = OriginalCatalog(items_path, attrs_path, human_goals_path, reviews_path, num_products, seed)
    else:
        catalog = GeneratedCatalog(num_products, seed, goals_per_product)
    engine = SearchEngine.for_catalog(catalog, cache_dir=cache_dir, progress=progress)
    return Shop(catalog, engine, show_attrs=show_attrs)


def make_server(shop: Shop, host: str = "127.0.0.1", port: int = 3000, *, workers: int = 1, access_log: bool = False,
                limits: Limits | None = None, **limit_overrides: Any) -> WebShopHTTPServer:  # fmt: skip
    """Bind (not yet serve) the server. Port 0 picks a free port (``server.server_address``).

    ``limits`` (a :class:`~webshop_server.serving.Limits`) or keyword overrides of its fields (``request_timeout=2``,
    ``max_connections=64``, ...) bound what one client may cost; the defaults suit a shop on 127.0.0.1.
    """
    unknown = set(limit_overrides) - set(Limits.__dataclass_fields__)
    if unknown:
        known = sorted(Limits.__dataclass_fields__)
        raise TypeError(f"make_server() got unknown limits {sorted(unknown)}; known: {known}")
    if limit_overrides:
        limits = dataclasses.replace(limits or Limits(), **limit_overrides)
    return WebShopHTTPServer((host, port), shop, access_log=access_log, workers=workers, limits=limits)


def start_in_thread(shop: Shop, host: str = "127.0.0.1", port: int = 0) -> tuple[WebShopHTTPServer, threading.Thread]:
    """Serve in a daemon thread of this process (tests, the embedded server of the env). Stop with ``server.shutdown()``
    then ``server.server_close()``."""
    server = make_server(shop, host, port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
                              name="webshop-server")  # fmt: skip
    thread.start()
    return server, thread


def serve(server: WebShopHTTPServer, workers: int = 1) -> None:
    """Serve until SIGINT / SIGTERM, in ``workers`` forked processes sharing the bound socket (POSIX)."""
    if workers <= 1 or not hasattr(os, "fork"):
        if workers > 1:
            log.warning("--workers needs fork (POSIX); serving with one process")
        signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            server.serve_forever(poll_interval=0.5)
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return
    server.socket.setblocking(False)  # idle workers must not block in accept() while another took the connection
    children: list[int] = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # worker
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent coordinates shutdown
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                server.serve_forever(poll_interval=0.5)
            finally:
                os._exit(0)
        children.append(pid)

    stopping = False

    def _stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            try:
                os.kill(child, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    alive = set(children)
    while alive:
        try:
            pid, _status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        alive.discard(pid)
        if not stopping:  # a worker died unexpectedly: stop the others too, do not limp on
            log.error("worker %d exited; stopping the server", pid)
            _stop()
    server.server_close()


def _raise_interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
