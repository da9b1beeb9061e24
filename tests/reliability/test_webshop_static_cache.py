"""Static files are cacheable with validators: ETag and Last-Modified, revalidated (304), while pages stay no-store."""

from __future__ import annotations

import http.client
import threading

import pytest

from webshop_server.app import build_shop, make_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    shop = build_shop(num_products=100, seed=0, cache_dir=str(tmp_path_factory.mktemp("ws-static-cache")))
    srv = make_server(shop, "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


def _get(srv, path: str, headers: dict[str, str] | None = None, method: str = "GET"):
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("name", ["style.css", "webshop.js"])
def test_static_files_carry_validators_and_allow_revalidation(server, name):
    status, headers, body = _get(server, f"/static/{name}")
    assert status == 200 and body
    etag, last_modified = headers["etag"], headers["last-modified"]
    assert etag.startswith('"') and etag.endswith('"') and last_modified.endswith(" GMT")
    cache = headers["cache-control"]
    assert "no-store" not in cache and "no-cache" in cache  # stored, revalidated before each use

    for validator in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        status, headers304, body = _get(server, f"/static/{name}", {"If-None-Match": validator})
        assert status == 304 and body == b"", validator
        assert headers304["etag"] == etag and headers304["cache-control"] == cache
        assert "content-length" not in headers304 and "content-type" not in headers304
    status, _, body = _get(server, f"/static/{name}", {"If-None-Match": '"stale"'})
    assert status == 200 and body

    status, _, body = _get(server, f"/static/{name}", {"If-Modified-Since": last_modified})
    assert status == 304 and body == b""
    status, _, body = _get(server, f"/static/{name}", {"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"})
    assert status == 200 and body
    status, _, body = _get(server, f"/static/{name}", {"If-Modified-Since": "not a date"})
    assert status == 200 and body
    # If-None-Match decides when both are sent (RFC 9110 13.2.2)
    status, _, _ = _get(server, f"/static/{name}", {"If-None-Match": '"stale"', "If-Modified-Since": last_modified})
    assert status == 200
    status, headers, body = _get(server, f"/static/{name}", {"If-None-Match": etag}, method="HEAD")
    assert status == 304 and body == b""


def test_a_304_keeps_the_connection_usable(server):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    try:
        conn.request("GET", "/static/style.css")
        first = conn.getresponse()
        etag = first.getheader("ETag")
        first.read()
        for _ in range(3):
            conn.request("GET", "/static/style.css", headers={"If-None-Match": etag})
            again = conn.getresponse()
            assert again.status == 304 and again.read() == b""
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_pages_and_api_stay_no_store(server):
    for path in ("/test_0", "/api/catalog", "/health", "/nosuchsession"):
        _, headers, _ = _get(server, path)
        assert headers["cache-control"] == "no-store", path
        assert "etag" not in headers
