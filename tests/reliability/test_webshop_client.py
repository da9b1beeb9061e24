"""``ragen/WebShop-v0`` pointed at a server that is not a WebShop server, or at one behind a path prefix, and the
bundled server's header limit as the docs state it.

A web page, bytes that are not UTF-8, JSON that is not an object, or a catalog without the split's goal count is a
:class:`~ragen_envs.webshop.NotWebShopError` (a ``ConnectionError``) naming the URL and what came back, never a raw
``JSONDecodeError``. ``server_url="http://host:port/shop"`` sends every request under ``/shop``. The server accepts
exactly 100 request headers (docs/webshop.md) and answers 431 to 101.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from ragen_envs.webshop import NotWebShopError, WebShopEnv
from tests.reliability.hostile_http import RawServer, answer

pytest.importorskip("bm25s")


def _base(server: RawServer) -> str:
    return server.url.removesuffix("/v1")


NOT_WEBSHOP = {
    "html-page": (answer(200, b"<!DOCTYPE html><html><body>It works!</body></html>", {"Content-Type": "text/html"}),
                  "that is not JSON"),
    "not-utf8": (answer(200, b"\xff\xfe\x00garbage"), "that is not JSON"),
    "json-list": (answer(200, [1, 2]), "JSON that is not an object"),
    "json-without-splits": (answer(200, {"status": "ok"}), "has no goal count for the 'test' split"),
    "not-found": (answer(404, {"detail": "Not Found"}), "answered 404"),
}


@pytest.mark.parametrize("name", list(NOT_WEBSHOP))
def test_a_server_that_is_not_webshop_is_a_clear_error(name):
    behaviour, words = NOT_WEBSHOP[name]
    with RawServer(behaviour) as server, pytest.raises(NotWebShopError) as err:
        WebShopEnv(server_url=_base(server), split="test", timeout=5)
    message = str(err.value)
    assert "is not a WebShop server" in message and words in message and _base(server) in message
    assert isinstance(err.value, ConnectionError) and not isinstance(err.value.__cause__, json.JSONDecodeError)


def test_a_path_prefix_in_server_url_is_kept():
    page = {"page": "search", "observation": "WebShop [SEP] Instruction: [SEP] i need a lamp [SEP] Search",
            "available_actions": {"has_search_bar": True, "clickables": []}, "instruction": "i need a lamp"}  # fmt: skip

    def shop(conn, request):
        if request.path == "/shop/api/catalog":
            answer(200, {"splits": {"train": 3, "eval": 1, "test": 1}, "products": 1})(conn, request)
        elif request.path.startswith("/shop/api/"):
            answer(200, page)(conn, request)
        else:
            answer(404, {"error": f"no route {request.path}"})(conn, request)

    with RawServer(shop) as server:
        env = WebShopEnv(server_url=_base(server) + "/shop/", split="test", timeout=5)
        try:
            observation, _ = env.reset(seed=0)
        finally:
            env.close()
    assert "i need a lamp" in observation
    assert [r.path for r in server.requests] == ["/shop/api/catalog", "/shop/api/page"]


def _get_with_headers(url: str, count: int) -> bytes:
    """A GET with exactly ``count`` header lines (Host and Connection among them); the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    headers = [f"Host: {host}", "Connection: close"] + [f"X-Test-{k}: {k}" for k in range(count - 2)]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(("GET /health HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_the_server_accepts_exactly_100_headers_as_documented():
    from webshop_server.app import build_shop, start_in_thread
    from webshop_server.serving import Limits

    docs = (Path(__file__).resolve().parents[2] / "docs" / "webshop.md").read_text(encoding="utf-8")
    assert Limits().max_headers == 100 and "(and 100 headers" in docs
    server, _thread = start_in_thread(build_shop(num_products=20, seed=0), port=0)
    try:
        assert _get_with_headers(server.url, 100).startswith(b"HTTP/1.1 200")
        refused = _get_with_headers(server.url, 101)
        assert refused.startswith(b"HTTP/1.1 431") and b'"max_headers": 100' in refused
        assert b"101 request headers" in refused
    finally:
        server.shutdown()
        server.server_close()
