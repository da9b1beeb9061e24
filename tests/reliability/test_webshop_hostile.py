"""The WebShop server under hostile clients: it answers everyone, fast, with a 4xx, and never a 5xx or a hang.

Every test here is bounded: sockets have timeouts, load loops have a fixed count and a deadline, and all traffic
goes to servers on 127.0.0.1 started by the fixtures below.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webshop_server.app import build_shop, make_server

N_PRODUCTS = 300
HANG = 5.0  # a socket read that waits this long counts as a hang


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    return build_shop(num_products=N_PRODUCTS, seed=0, cache_dir=str(tmp_path_factory.mktemp("ws-hostile-cache")))


def _serve(shop, **kwargs):
    srv = make_server(shop, "127.0.0.1", 0, **kwargs)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    return srv, thread


def _stop(srv, thread) -> None:
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


@pytest.fixture(scope="module")
def server(shop):
    """The server with its default limits."""
    srv, thread = _serve(shop)
    yield srv
    _stop(srv, thread)


@pytest.fixture(scope="module")
def tight(shop):
    """Short timeouts and a small connection cap, to see them act within a test's time."""
    srv, thread = _serve(shop, request_timeout=1.0, keepalive_timeout=1.0, max_connections=40)
    yield srv
    _stop(srv, thread)


# ------------------------------------------------------------------------------------------------ helpers
def _addr(srv) -> tuple[str, int]:
    return srv.server_address[:2]


def _post_step(srv, body: str) -> tuple[int, dict]:
    """POST ``body`` to /api/step; the status and the JSON answer."""
    conn = http.client.HTTPConnection(*_addr(srv), timeout=HANG)
    try:
        conn.request("POST", "/api/step", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def exchange(srv, payload: bytes, *, half_close: bool = False, timeout: float = HANG) -> tuple[bytes, str, float]:
    """Send raw bytes; read until the server closes. Returns (bytes read, how it ended, seconds).

    How it ended: "closed" (the server closed the connection), "reset", or "hang" (nothing more for ``timeout`` s).
    """
    t0 = time.monotonic()
    chunks: list[bytes] = []
    with socket.create_connection(_addr(srv), timeout=timeout) as s:
        try:
            s.sendall(payload)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        end = "closed"
        while True:
            try:
                data = s.recv(65536)
            except TimeoutError:
                end = "hang"
                break
            except ConnectionResetError:
                end = "reset"
                break
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks), end, time.monotonic() - t0


def status_of(response: bytes) -> int:
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", response)
    return int(m.group(1)) if m else -1


def json_body(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def tls_client_hello() -> bytes:
    """The bytes a TLS client sends first (a real ClientHello, made by the ssl module in memory)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello = outgoing.read()
    assert hello[:1] == b"\x16"  # a TLS handshake record
    return hello


def timed_get(srv, path: str, conn: http.client.HTTPConnection | None = None, timeout: float = 3.0):
    """GET ``path`` (on ``conn`` if given, else a new connection). Returns (status, seconds, conn or None)."""
    t0 = time.monotonic()
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(*_addr(srv), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        status = resp.status
    except (OSError, http.client.HTTPException):
        conn.close()
        return -1, time.monotonic() - t0, None
    if own:
        conn.close()
        conn = None
    return status, time.monotonic() - t0, conn


class SlowClients:
    """``n`` sockets that each send one byte of a request per ``interval`` s, for ``duration`` s, then close.

    One thread drives them all with non-blocking sockets, so the driver itself never blocks (a server that stops
    accepting cannot stall it) and it stops by itself after ``duration``.
    """

    PAYLOAD = b"GET /test_0/search?q=slow+client HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: " + b"x" * 200

    def __init__(self, addr, n: int, duration: float, interval: float = 1.0) -> None:
        self.addr, self.n, self.duration, self.interval = addr, n, duration, interval
        self.connected = self.bytes_sent = self.closed_by_server = 0
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="slow-clients")

    def __enter__(self) -> SlowClients:  # noqa: PYI034
        self.thread.start()
        assert self.ready.wait(20), "could not open the slow sockets"
        return self

    def __exit__(self, *exc) -> None:
        self.thread.join(self.duration + 10)

    def _run(self) -> None:
        socks = []
        try:
            for _ in range(self.n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex(self.addr)
                socks.append(s)
            time.sleep(0.3)  # let the connections complete
            self.ready.set()
            pos = [0] * self.n
            dead = [False] * self.n
            stop = time.monotonic() + self.duration
            while time.monotonic() < stop:
                for i, s in enumerate(socks):
                    if dead[i]:
                        continue
                    try:
                        if s.recv(4096, socket.MSG_PEEK) == b"":
                            dead[i] = True
                            self.closed_by_server += 1
                            continue
                    except BlockingIOError:
                        pass
                    except OSError:
                        dead[i] = True
                        self.closed_by_server += 1
                        continue
                    try:
                        self.bytes_sent += s.send(self.PAYLOAD[pos[i] % len(self.PAYLOAD) :][:1])
                        pos[i] += 1
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:
                        dead[i] = True
                        self.closed_by_server += 1
                time.sleep(self.interval)
        finally:
            self.connected = sum(1 for s in socks if s.fileno() >= 0)
            self.ready.set()
            for s in socks:
                s.close()


# ------------------------------------------------------------------------------------------------ JSON depth
DEEP = 10_000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/step", "[" * DEEP + "]" * DEEP),
        ("/api/step", '{"url": "/test_0", "action": ' + "[" * DEEP + "]" * DEEP + "}"),
        ("/api/session", '{"a":' * DEEP + "1" + "}" * DEEP),
        ("/api/page", '{"url": "/test_0", "x": ' + '[{"y":' * (DEEP // 2) + "0" + "}]" * (DEEP // 2) + "}"),
    ],
)
def test_deeply_nested_json_is_a_400_naming_the_limit(server, path, body):
    conn = http.client.HTTPConnection(*_addr(server), timeout=HANG)
    try:
        conn.request("POST", path, body=body.encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 400, (resp.status, data)
    assert "nested" in data["error"] and data["limit"] == {"max_json_depth": server.limits.max_json_depth}


def test_json_nesting_within_the_limit_is_parsed(server):
    depth = server.limits.max_json_depth - 2
    body = json.dumps({"url": "/test_0", "action": "search[shoes]", "x": json.loads("[" * depth + "]" * depth)})
    status, data = _post_step(server, body)
    assert status == 200 and data["valid"], data
    # brackets inside strings are text, not nesting
    body = json.dumps({"url": "/test_0", "action": "search[" + "[" * 5000 + "]"})
    status, data = _post_step(server, body)
    assert status != 500 and "nested" not in data.get("error", ""), data


# ------------------------------------------------------------------------------------------------ sizes
def test_huge_body_is_a_413_naming_the_limit(server):
    declared = 50_000_000
    head = (f"POST /api/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared}\r\n\r\n").encode()  # fmt: skip
    response, end, took = exchange(server, head + b"[" * 1_000_000)
    assert status_of(response) == 413, (response[:200], end)
    assert json_body(response)["limit"] == {"max_body_bytes": server.limits.max_body_bytes}
    assert end == "closed" and took < 3.0


def test_huge_body_through_http_client_is_a_413(server):
    conn = http.client.HTTPConnection(*_addr(server), timeout=HANG)
    try:
        conn.request("POST", "/api/step", body=b"{" * 2_000_000, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 413 and "65536" in data["error"], data


def test_huge_head_and_request_line_are_4xx(server):
    response, _, _ = exchange(server, b"GET /test_0 HTTP/1.1\r\n" + b"X-Pad: " + b"p" * 100_000 + b"\r\n\r\n")
    assert status_of(response) == 431 and "max_head_bytes" in json_body(response)["limit"], response[:200]
    response, _, _ = exchange(server, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n")
    assert status_of(response) == 414, response[:200]


# ------------------------------------------------------------------------------------------------ request lines
MALFORMED = {
    "http09": b"GET /\r\n",
    "http09-session": b"GET /test_0\r\n\r\n",
    "blank-line": b"\r\n",
    "blank-lines": b"\r\n\r\n",
    "tls-client-hello": tls_client_hello(),
    "sslv2-hello": b"\x80\x2e\x01\x00\x02\x00\x15\x00\x00\x00\x10" + b"\x00" * 40,
    "nul-bytes": b"\x00" * 64,
    "binary-garbage": bytes(range(256)),
    "http2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "one-word": b"GARBAGE\r\n\r\n",
    "bad-version": b"GET / HTTP/1.1.1\r\n\r\n",
    "four-words": b"GET / HTTP/1.1 extra\r\n\r\n",
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_request_line_gets_a_400_at_once(server, name):
    response, end, took = exchange(server, MALFORMED[name])
    assert end != "hang", f"{name}: no answer within {HANG}s"
    assert status_of(response) == 400, (name, response[:120], end)
    assert end == "closed" and took < 2.0, (name, end, took)


def test_half_closed_partial_request_is_answered(server):
    response, end, took = exchange(server, b"GET /test_0 HTT", half_close=True)
    assert end == "closed" and took < 2.0 and status_of(response) in (-1, 400), (response[:120], end, took)


def test_the_server_keeps_serving_after_the_hostile_lines(server):
    for payload in MALFORMED.values():
        exchange(server, payload)
    status, took, _ = timed_get(server, "/health")
    assert status == 200 and took < 2.0


# ------------------------------------------------------------------------------------------------ timeouts
def test_a_byte_trickle_gets_408_at_the_request_timeout(tight):
    t0 = time.monotonic()
    with socket.create_connection(_addr(tight), timeout=HANG) as s:
        s.sendall(b"GET /test_0 HTTP/1.1\r\n")
        answered = b""
        for ch in b"X-Slow: " + b"s" * 100:  # one byte every 0.1 s: every read makes progress, the request never ends
            try:
                s.sendall(bytes([ch]))
            except OSError:
                break
            s.settimeout(0.1)
            try:
                answered = s.recv(65536)
                break
            except TimeoutError:
                continue
            finally:
                s.settimeout(HANG)
        took = time.monotonic() - t0
    assert status_of(answered) == 408 and json_body(answered)["limit"] == {"request_timeout_s": 1.0}, answered
    assert 0.9 <= took < 2.5, took


def test_a_stalled_body_gets_408(tight):
    response, end, took = exchange(tight, b'POST /api/step HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"url"')
    assert status_of(response) == 408 and end == "closed" and took < 2.5, (response[:120], end, took)


def test_a_silent_connection_is_closed(tight):
    response, end, took = exchange(tight, b"")
    assert response == b"" and end == "closed" and took < 2.5, (end, took)


def test_an_idle_keepalive_connection_is_closed(tight):
    conn = http.client.HTTPConnection(*_addr(tight), timeout=HANG)
    status, _, conn = timed_get(tight, "/health", conn)
    assert status == 200 and conn is not None
    time.sleep(1.6)
    assert conn.sock.recv(1) == b""  # the server closed it
    conn.close()


# ------------------------------------------------------------------------------------------------ slow clients
def test_300_slow_clients_do_not_starve_a_normal_client(server):
    latencies = []
    with SlowClients(_addr(server), 300, duration=5.0) as slow:
        conn = None
        stop = time.monotonic() + 5.0
        i = 0
        while time.monotonic() < stop and len(latencies) < 200:
            # alternate new and keep-alive connections; every request must be answered, quickly
            status, took, conn = timed_get(server, f"/api/test_0/search?q=shoes+{i % 7}", conn if i % 2 else None)
            assert status == 200, f"request {i} while 300 slow clients are open: status {status} after {took:.2f}s"
            latencies.append(took)
            i += 1
            time.sleep(0.02)
        if conn is not None:
            conn.close()
    assert len(latencies) >= 20 and max(latencies) < 1.5, (len(latencies), max(latencies))
    assert slow.bytes_sent >= 300 * 3


def test_slow_clients_over_the_cap_are_shed_not_queued(tight):
    cap = tight.limits.max_connections
    latencies = []
    with SlowClients(_addr(tight), 3 * cap, duration=3.0, interval=0.5) as slow:
        for i in range(20):
            status, took, _ = timed_get(tight, f"/api/test_0/search?q=table+{i}")
            assert status == 200, f"request {i} with {3 * cap} slow clients and a cap of {cap}: {status}"
            latencies.append(took)
            time.sleep(0.05)
        health = json.loads(_get_body(tight, "/health"))
    assert max(latencies) < 1.5, latencies
    assert health["connections"]["open"] <= cap and health["connections"]["shed"] >= 2 * cap - 20, health
    assert slow.closed_by_server >= 2 * cap - 20


def _get_body(srv, path: str) -> bytes:
    conn = http.client.HTTPConnection(*_addr(srv), timeout=HANG)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def test_at_the_cap_with_every_handler_busy_new_clients_wait_not_fail():
    from webshop_server.serving import Limits, SelectorHTTPServer

    class Sleepy(SelectorHTTPServer):
        def handle_request_bytes(self, data, client_address, force_close):
            time.sleep(0.3)
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", True

    srv = Sleepy(("127.0.0.1", 0), Limits(max_connections=2, handler_threads=2))
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    try:
        results: list[tuple[int, str]] = []
        lock = threading.Lock()

        def one() -> None:
            response, end, _ = exchange(srv, b"GET / HTTP/1.1\r\n\r\n")
            with lock:
                results.append((status_of(response), end))

        clients = [threading.Thread(target=one) for _ in range(6)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(HANG * 2)
        assert results == [(200, "closed")] * 6, results  # 6 clients, a cap of 2: all served, in turn
        assert srv.stats()["open"] <= 3
    finally:
        _stop(srv, thread)


# ------------------------------------------------------------------------------------------------ protocol kept
def test_pipelined_requests_and_expect_continue(server):
    two = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /api/catalog HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    response, end, _ = exchange(server, two)
    assert response.count(b"HTTP/1.1 200 OK") == 2 and end == "closed", response[:300]
    with socket.create_connection(_addr(server), timeout=HANG) as s:
        body = json.dumps({"url": "/test_0", "action": "search[red shoes]"}).encode()
        s.sendall(b"POST /api/step HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")  # fmt: skip
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert status_of(data) == 200 and json_body(data)["valid"] is True


def test_get_with_a_body_does_not_desync_keepalive(server):
    response, _, _ = exchange(server, b"GET /health HTTP/1.1\r\nContent-Length: 24\r\n\r\nGET /nothing HTTP/1.1\r\n\r\n"
                                      b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")  # fmt: skip
    assert response.count(b"HTTP/1.1 200 OK") == 2 and b" 404 " not in response, response[:300]


@pytest.mark.parametrize("eol", [b"\r\n", b"\n"])
def test_a_request_sent_byte_by_byte_is_served(server, eol):
    body = json.dumps({"url": "/test_0", "action": "search[coffee table]"}).encode()
    request = eol.join([b"POST /api/step HTTP/1.1", b"Host: x", b"Content-Type: application/json",
                        b"Content-Length: " + str(len(body)).encode(), b"Connection: close", b"", b""]) + body  # fmt: skip
    with socket.create_connection(_addr(server), timeout=HANG) as s:
        for i in range(len(request)):
            s.sendall(request[i : i + 1])
            if i % 16 == 0:
                time.sleep(0.001)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert status_of(data) == 200 and json_body(data)["page"]["page"] == "results", data[:200]


# ------------------------------------------------------------------------------------------------ fuzzing
FUZZ = settings(max_examples=250, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=30,
)
step_like = st.fixed_dictionaries(
    {"url": st.sampled_from(["/test_0", "/test_0/search?q=shoes", "/nosuch", "", "/test_0/item/%ff"]) | st.text(),
     "action": st.sampled_from(["search[red shoes]", "click[buy now]", "click[< prev]", "jump"]) | st.text()},
    optional={"mode": st.sampled_from(["text", "html", "text_rich", "pdf"]) | json_values,
              "goal": json_values, "split": json_values, "index": json_values},
)  # fmt: skip
nested = st.tuples(st.integers(1, 20_000), st.booleans()).map(
    lambda t: "[" * t[0] + "]" * t[0] if t[1] else '{"k":' * t[0] + "0" + "}" * t[0]
)
bodies = (
    step_like.map(lambda d: json.dumps(d).encode())
    | json_values.map(lambda v: json.dumps(v).encode())
    | nested.map(str.encode)
    | st.binary(max_size=3000)
    | st.text(max_size=500).map(lambda t: t.encode("utf-8", "surrogatepass"))
)


@FUZZ
@given(
    path=st.sampled_from(["/api/step", "/api/session", "/api/page", "/test_0", "/api/test_0/search", "/api/catalog"]),
    method=st.sampled_from(["POST", "POST", "PUT", "GET"]),
    ctype=st.sampled_from(["application/json", "application/x-www-form-urlencoded", "text/plain", ""]),
    body=bodies,
)
def test_fuzzed_bodies_never_get_a_5xx(server, path, method, ctype, body):
    conn = http.client.HTTPConnection(*_addr(server), timeout=HANG)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": ctype} if ctype else {})
        resp = conn.getresponse()
        resp.read()
    finally:
        conn.close()
    assert resp.status < 500, (method, path, body[:100], resp.status)


@FUZZ
@given(
    method=st.sampled_from([b"GET", b"POST", b"HEAD", b"GET", b"BREW", b"get"]),
    target=st.binary(max_size=300)
    | st.text(max_size=100).map(lambda t: b"/" + urllib.parse.quote(t, safe="/?=&%[]").encode())
    | st.lists(st.sampled_from(["test_0", "api", "item", "search", "static", "done", "%ff", "..", "[", "?q=", "&"]),
               max_size=6).map(lambda p: ("/" + "/".join(p)).encode()),
    version=st.sampled_from([b" HTTP/1.1", b" HTTP/1.0", b"", b" HTTP/2.0", b" HTTP/1.1 x", b" http/1.1"]),
    headers=st.binary(max_size=200) | st.just(b"Host: x\r\n"),
    tail=st.binary(max_size=100),
)  # fmt: skip
def test_fuzzed_raw_requests_never_get_a_5xx_or_hang(server, method, target, version, headers, tail):
    payload = method + b" " + target + version + b"\r\n" + headers + b"\r\n" + tail
    response, end, took = exchange(server, payload, half_close=True)
    assert end == "closed" and took < 2.0, (payload[:200], end, took)
    codes = [int(c) for c in re.findall(rb"HTTP/1\.[01] (\d{3}) ", response)]
    assert codes, f"no answer to {payload[:200]!r}"  # every request gets a status line, not a silent close
    assert all(c < 500 for c in codes), (payload[:200], response[:200])


@FUZZ
@given(data=st.binary(min_size=1, max_size=2000))
def test_fuzzed_bytes_never_get_a_5xx_or_hang(server, data):
    response, end, took = exchange(server, data, half_close=True)
    assert end == "closed" and took < 2.0, (data[:100], end, took)
    assert 200 <= status_of(response) < 500, (data[:100], response[:200])
