"""The HTTP server: HTML pages like the original's, a JSON API beside them, a health endpoint.

Why the standard library's ``ThreadingHTTPServer``: it adds no dependency (the bundled WebShop should install with
pip anywhere and start in a second), pages are small and rendered from strings, and the pre-fork design below gives
real parallelism. Flask + waitress would add two packages for routing we need five lines for; uvicorn would add an
event loop that the CPU-bound search and rendering do not benefit from.

Parallelism (``workers``): the listening socket is bound once, then ``workers`` processes are forked and each runs
its own threaded accept loop on that socket (the pre-fork model of gunicorn). Sessions are stateless (see
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
and unknown methods all get a 4xx with a message saying what was wrong and what is accepted.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qsl, quote

from webshop_server.render import OBSERVATION_MODES, render
from webshop_server.shop import PageState, Shop, ShopError, split_target

log = logging.getLogger("webshop_server")

MAX_BODY_BYTES = 64 * 1024
MAX_CONCURRENT_CONNECTIONS = 256
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
_STATIC = {"style.css": "text/css; charset=utf-8", "webshop.js": "text/javascript; charset=utf-8"}


def _static_bytes() -> dict[str, bytes]:
    # Next to this module first: importlib.resources.files() raises NotADirectoryError when the package is imported
    # as a namespace package (an editable install made before the package had its __init__.py).
    here = Path(__file__).resolve().parent / "static"
    if all((here / name).is_file() for name in _STATIC):
        return {name: (here / name).read_bytes() for name in _STATIC}
    root = resources.files("webshop_server") / "static"
    return {name: (root / name).read_bytes() for name in _STATIC}


class WebShopHTTPServer(ThreadingHTTPServer):
    """A threaded HTTP server with a bound on concurrent connections."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], shop: Shop, *, access_log: bool = False, workers: int = 1) -> None:
        self.shop = shop
        self.access_log = access_log
        self.workers = workers
        self.started = time.time()
        self.static = _static_bytes()
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_CONNECTIONS)
        super().__init__(address, WebShopHandler)

    def process_request(self, request, client_address):  # noqa: ANN001 - socketserver signature
        self._slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):  # noqa: ANN001
        log.debug("connection error from %s", client_address, exc_info=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class WebShopHandler(BaseHTTPRequestHandler):
    server: WebShopHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "WebShop/ragen"
    sys_version = ""
    timeout = 30  # per-connection socket timeout: a slow client cannot hold a thread forever

    # -------------------------------------------------------------- plumbing
    def setup(self) -> None:
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

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
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # we do not speak HTTP/0.9: always send a status line and headers
        body = f"{code} {message or HTTPStatus(code).phrase}\n".encode("utf-8", "replace")
        try:
            self._send(code, "text/plain; charset=utf-8", body)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.access_log:
            sys.stderr.write(f"{self.address_string()} - [{self.log_date_time_string()}] {format % args}\n")

    def _send(self, status: int, ctype: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("Referrer-Policy", "no-referrer")
        if self.close_connection:
            self.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        # Headers and body in one write: two small writes would meet Nagle + delayed ACK (40 ms per request).
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
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
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            raise ShopError(411, "chunked request bodies are not accepted; send Content-Length")
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        if not (raw.strip().isascii() and raw.strip().isdigit()):
            self.close_connection = True
            raise ShopError(400, f"invalid Content-Length {raw[:20]!r}")
        n = int(raw.strip()[:12])
        if n > MAX_BODY_BYTES:
            self.close_connection = True
            raise ShopError(413, f"request body of {n} bytes; at most {MAX_BODY_BYTES} are accepted")
        return self.rfile.read(n) if n else b""

    # -------------------------------------------------------------- methods
    def do_GET(self) -> None:
        self._dispatch(b"")

    def do_HEAD(self) -> None:
        self._dispatch(b"")

    def do_POST(self) -> None:
        try:
            body = self._read_body()
        except ShopError as err:
            self._error(err, api=self.path.startswith("/api/"))
            return
        self._dispatch(body)

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
            self._json(err.status, {"error": err.message, "status": err.status})
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
        try:
            data = json.loads(body.decode("utf-8"))
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
                             "catalog": shop.catalog.describe()})  # fmt: skip
            return
        if route.startswith("/static/"):
            name = route[len("/static/") :]
            if name not in self.server.static:
                raise ShopError(404, f"no static file {name[:40]!r}")
            self._send(200, _STATIC[name], self.server.static[name])
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
    from webshop_server.catalog import GeneratedCatalog, OriginalCatalog
    from webshop_server.search import SearchEngine

    if items_path:
        if not attrs_path:
            raise ValueError("invalid argument attrs_path=None: the original data needs items_ins_v2*.json too")
        catalog = OriginalCatalog(items_path, attrs_path, human_goals_path, reviews_path, num_products, seed)
    else:
        catalog = GeneratedCatalog(num_products, seed, goals_per_product)
    engine = SearchEngine.for_catalog(catalog, cache_dir=cache_dir, progress=progress)
    return Shop(catalog, engine, show_attrs=show_attrs)


def make_server(shop: Shop, host: str = "127.0.0.1", port: int = 3000, *, workers: int = 1,
                access_log: bool = False) -> WebShopHTTPServer:  # fmt: skip
    """Bind (not yet serve) the server. Port 0 picks a free port (``server.server_address``)."""
    return WebShopHTTPServer((host, port), shop, access_log=access_log, workers=workers)


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
