"""The HTTP server: the full flow and its reward, pages, session isolation, bad input, fuzzing, --workers."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse

import pytest

from tests.webshop.conftest import Client, solve


def test_health_and_catalog(client):
    status, body = client.get("/health")
    data = json.loads(body)
    assert status == 200 and data["status"] == "ok" and data["catalog"]["products"] == 300


def test_full_flow_gives_reward_one_for_the_goal(client, shop):
    split = shop.catalog.splits["test"]
    for k in range(5):
        done = solve(client, shop, f"test_{k}", split[k])
        assert done["valid"] and done["done"] and done["reward"] == 1.0, done["page"]["reward_info"]
        assert done["page"]["page"] == "done" and done["page"]["goal"]["asin"] == shop.catalog.goal(split[k]).asin


def test_wrong_choices_give_less(client, shop):
    split = shop.catalog.splits["test"]
    k = next(k for k in range(len(split)) if shop.catalog.goal(split[k]).goal_options)
    goal = shop.catalog.goal(split[k])
    no_options = solve(client, shop, f"test_{k}", split[k], options=False)
    assert no_options["done"] and no_options["reward"] < 1.0
    assert no_options["page"]["reward_info"]["n_option_matches"] == 0
    # a product of another type: the type factor and the attributes drop
    other = next(
        shop.catalog.product(i) for i in range(len(shop.catalog)) if shop.catalog.product(i).query != goal.query
    )
    page = client.step(f"/test_{k}", f"search[{other.title}]")["page"]
    page = client.step(page["url"], f"click[{other.asin.lower()}]")["page"]
    wrong = client.step(page["url"], "click[buy now]")
    assert wrong["done"] and wrong["reward"] < no_options["reward"] <= 1.0


def test_pagination_and_navigation(client, shop):
    page = client.step("/train_0", "search[black]")["page"]
    assert page["page"] == "results" and page["page_num"] == 1 and len(page["products"]) <= 10
    assert page["total"] <= 50
    if page["has_next"]:
        nxt = client.step(page["url"], "click[next >]")["page"]
        assert nxt["page_num"] == 2 and "< prev" in nxt["clickables"]
        assert {p["asin"] for p in nxt["products"]}.isdisjoint({p["asin"] for p in page["products"]})
        back = client.step(nxt["url"], "click[< prev]")["page"]
        assert back["products"] == page["products"]
    item = client.step(page["url"], f"click[{page['products'][0]['asin'].lower()}]")["page"]
    for tab in ("description", "features", "reviews"):
        sub = client.step(item["url"], f"click[{tab}]")["page"]
        assert sub["page"] == "sub" and sub["sub"].lower() == tab
        assert client.step(sub["url"], "click[< prev]")["page"]["url"] == item["url"]
    assert client.step(item["url"], "click[< prev]")["page"]["url"] == page["url"]
    assert client.step(item["url"], "click[back to search]")["page"]["page"] == "search"
    # actions that are not on the page are no-ops with a reason
    bad = client.step(item["url"], "search[shoes]")
    assert not bad["valid"] and "search page" in bad["reason"] and bad["page"]["url"] == item["url"]
    bad = client.step(item["url"], "click[no such button]")
    assert not bad["valid"] and "not available" in bad["reason"]
    bad = client.step(item["url"], "jump[now]")
    assert not bad["valid"] and "search[keywords] or click[label]" in bad["reason"]


def test_observation_modes(client, shop):
    status, data = client.api("/api/page", {"url": "/test_0/search?q=coffee+table", "mode": "text_rich"})
    assert status == 200 and "[button] Back to Search [button_]" in data["observation"]
    asin = data["products"][0]["asin"]
    item_url = data["products"][0]["url"]
    product = shop.catalog.product_by_asin(asin)
    if product.options:
        name, values = next(iter(product.options.items()))
        step = client.step(item_url, f"click[{values[0]}]", mode="text_rich")
        assert f"[clicked button] {values[0]} [clicked button_]" in step["page"]["observation"]
        assert step["page"]["observation"].startswith(f"You have clicked {values[0]}.")
    html = client.step(item_url, "click[description]", mode="html")["page"]["observation"]
    assert html.startswith("<!DOCTYPE html>") and "Back to Search" in html
    text = client.step("/test_0", "search[coffee table]")["page"]["observation"]
    assert text.startswith("Instruction: [SEP] ") and "[SEP] Back to Search [SEP] Page 1 (Total results:" in text


def test_html_pages_and_escaping(client, shop):
    status, body = client.get("/test_0")
    html = body.decode()
    assert status == 200 and 'id="search_input"' in html and shop.goal("test_0").instruction_text in html
    q = urllib.parse.quote("<script>alert('x')</script> \"onmouseover=")
    status, body = client.get(f"/test_0/search?q={q}")
    html = body.decode()
    assert status == 200 and "<script>alert" not in html and "&lt;script&gt;alert(&#x27;x&#x27;)" in html
    status, body = client.request("POST", "/test_0", "search_query=coffee+table",
                                  {"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert status == 200 and "Results" in body.decode()  # the original's search form field
    status, _ = client.request("GET", "/")
    assert status == 302
    status, body = client.get("/static/webshop.js")
    assert status == 200 and b"data-url" in body or b"dataset.url" in body


def test_done_page_shows_reward_parts(client, shop):
    goal = shop.goal("test_1")
    opts = "&".join(f"o.{urllib.parse.quote(k)}={urllib.parse.quote(v)}" for k, v in goal.goal_options.items())
    status, body = client.get(f"/test_1/done/{goal.asin}?{opts}")
    html = body.decode()
    assert status == 200 and 'id="reward">1.0<' in html
    for part in ("r_type", "r_att", "r_price", "title_score"):
        assert f'id="part-{part}"' in html


def test_sessions_are_isolated_under_concurrency(server, shop):
    split = shop.catalog.splits["train"]
    results: dict[int, tuple[float, str]] = {}
    errors: list[BaseException] = []

    def play(k: int) -> None:
        c = Client(server)
        try:
            for _ in range(3):
                done = solve(c, shop, f"train_{k}-t{k}", split[k])
                results[k] = (done["reward"], done["page"]["goal"]["asin"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=play, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert len(results) == 16
    for k, (reward, asin) in results.items():
        assert reward == 1.0 and asin == shop.catalog.goal(split[k]).asin


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("/nosuchsession", 404, "unknown session"),
        ("/test_99999", 404, "test split has goals"),
        ("/fixed_999999", 404, "out of range"),
        ("/test_0/item/B0ZZZZZZZZ", 404, "unknown product"),
        ("/test_0/item/%ff%fe", 404, "unknown product"),
        ("/test_0/search?q=", 400, "empty search query"),
        ("/test_0/search?q=a&page=0", 400, "invalid page"),
        ("/test_0/search?q=a&page=abc", 400, "invalid page"),
        ("/test_0/search?q=" + "x" * 600, 400, "at most 500"),
        ("/test_0/nothing/here", 404, "no such page"),
        ("/static/../../etc/passwd", 404, "no static file"),
        ("/api/test_0/search", 400, "empty search query"),
    ],
)
def test_bad_input_gets_a_clear_4xx(client, path, status, needle):
    got, body = client.get(path)
    assert got == status and needle in body.decode()


def test_bad_options_and_api_bodies(client, shop):
    asin = shop.catalog.product(0).asin
    p = shop.catalog.product(0)
    got, body = client.get(f"/test_0/item/{asin}?o.nosuchoption=x")
    assert got == 400 and "does not exist" in body.decode()
    if p.options:
        name = next(iter(p.options))
        got, body = client.get(f"/test_0/item/{asin}?o.{urllib.parse.quote(name)}=nosuchvalue")
        assert got == 400 and "is not an option" in body.decode()
    hdr = {"Content-Type": "application/json"}
    assert client.request("POST", "/api/step", "{not json", hdr)[0] == 400
    assert client.request("POST", "/api/step", "[1, 2]", hdr)[0] == 400
    assert client.request("POST", "/api/step", json.dumps({"url": 5, "action": "x"}), hdr)[0] == 400
    assert (
        client.request("POST", "/api/step", json.dumps({"url": "/test_0", "action": "x", "mode": "pdf"}), hdr)[0] == 400
    )
    assert client.request("GET", "/api/step")[0] == 405
    assert client.request("POST", "/api/session", json.dumps({"split": "nope"}), hdr)[0] == 400
    assert client.request("POST", "/api/session", json.dumps({"goal": -1}), hdr)[0] == 400
    status, body = client.request("POST", "/api/session", json.dumps({"split": "eval", "index": 2}), hdr)
    data = json.loads(body)
    assert (
        status == 200 and data["session"].startswith("eval_2-") and data["goal_index"] == shop.catalog.splits["eval"][2]
    )
    assert client.request("BREW", "/")[0] == 405
    assert client.request("POST", "/test_0", b"x" * (70 * 1024), {"Content-Type": "text/plain"})[0] == 413


def _raw(server, payload: bytes) -> bytes:
    with socket.create_connection(server.server_address[:2], timeout=5) as s:
        s.sendall(payload)
        chunks = []
        while True:
            try:
                data = s.recv(65536)
            except socket.timeout:
                break
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def _status(response: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", response)
    return int(m.group(1)) if m else -1


def test_malformed_requests_on_the_wire(server):
    for payload in [
        b"GET / HTTP/2.0\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        b"POST /api/step HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /api/step HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"GET /test_0 HTTP/1.1\r\n" + b"X: y\r\n" * 200 + b"\r\n",
        b"GET /test_0/search?q=\xff\xfe\xc0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "POST /test_0 HTTP/1.1\r\nContent-Length: \u00b2\r\nConnection: close\r\n\r\n".encode("latin-1"),
        b"GET //[::1/x HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET //[x?q=1 HTTP/1.1\r\nConnection: close\r\n\r\n",
    ]:
        status = _status(_raw(server, payload))
        assert 200 <= status < 500, (payload[:60], status)


def test_fuzz_http_surface_has_no_5xx(server, shop):
    rng = random.Random(1234)
    asin = shop.catalog.product(5).asin
    segs = ["[", "[::1", "test_0", "train_3-abc", "fixed_7", "eval_1", "bogus", "api", "item", "done", "search", asin,
            asin.lower(), "description", "reviews", "attributes", "%00", "%ff", "%zz", "..", "\u00e9\u2603",
            "x" * 300, "B0" + "Z" * 8, "static", "health", "page", "step", "session", "catalog", ""]  # fmt: skip
    keys = ["q", "page", "o.color", "o.size", "o.", "url", "action", "mode", "goal", "split", "index",
            "search_query", "\u2603", "o.\u00e9"]  # fmt: skip
    vals = ["", "1", "0", "-1", "6", "99999999999999999999", "black", "small", "search[x]", "click[buy now]",
            "/test_0", "text", "html", "<script>", "\u0000", "\ud7ff\U0001f600", "%", "x" * 2000, "[]", "{}", "\u00b2", "\u0663", " 1"]  # fmt: skip
    methods = ["GET", "GET", "GET", "POST", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"]
    c = Client(server)
    counts: dict[int, int] = {}
    try:
        for _ in range(3000):
            # percent-encode non-ASCII (http.client sends ASCII only) but keep the deliberate bad escapes like %zz
            path = "/" + "/".join(urllib.parse.quote(rng.choice(segs), safe="%.") for _ in range(rng.randint(0, 5)))
            if rng.random() < 0.3:
                path = "/api" + path
            params = [(rng.choice(keys), rng.choice(vals)) for _ in range(rng.randint(0, 4))]
            if params:
                path += "?" + urllib.parse.urlencode(params)
            method = rng.choice(methods)
            body = None
            headers = {}
            if method == "POST":
                kind = rng.randrange(4)
                if kind == 0:
                    body = json.dumps({k: v for k, v in params} | {"url": rng.choice(vals), "action": rng.choice(vals)})
                    headers["Content-Type"] = "application/json"
                elif kind == 1:
                    body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
                    headers["Content-Type"] = rng.choice(["application/json", "application/x-www-form-urlencoded"])
                elif kind == 2:
                    body = urllib.parse.urlencode(params)
                    headers["Content-Type"] = "application/x-www-form-urlencoded"
            status, _ = c.request(method, path, body, headers)
            counts[status] = counts.get(status, 0) + 1
            assert status < 500, (method, path, body)
    finally:
        c.close()
    assert any(s == 200 for s in counts) and any(400 <= s < 500 for s in counts)
    ok = Client(server)
    assert ok.get("/health")[0] == 200  # still serving
    ok.close()


def _start_cli(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "webshop_server.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    line = proc.stdout.readline()
    m = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
    assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, m.group(1)


def test_cli_workers_serve_consistently(ws_cache_dir, shop):
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc, url = _start_cli(["--port", "0", "--workers", "2", "--num-products", "300", "--cache-dir", ws_cache_dir], env)
    try:
        host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port

        class _Srv:
            server_address = (host, port)

        split = shop.catalog.splits["test"]
        pids: set[int] = set()
        rewards: list[float] = []
        lock = threading.Lock()

        def play(k: int) -> None:
            for _ in range(4):
                c = Client(_Srv)  # a new connection each time: the kernel spreads them over the workers
                with lock:
                    pids.add(json.loads(c.get("/health")[1])["pid"])
                r = solve(c, shop, f"test_{k}", split[k])["reward"]
                with lock:
                    rewards.append(r)
                c.close()

        threads = [threading.Thread(target=play, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert rewards == [1.0] * 32
        assert len(pids) == 2, pids  # both worker processes answered
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "WebShop stopped." in out


def test_cli_rejects_bad_arguments():
    for args in (["--port", "70000"], ["--workers", "0"], ["--items-path", "/nonexistent.json"]):
        res = subprocess.run([sys.executable, "-m", "webshop_server.cli", *args], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert res.returncode == 2 and "error:" in res.stderr, (args, res.stderr)
