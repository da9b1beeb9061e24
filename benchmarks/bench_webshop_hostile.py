"""Hostile-client load test of the bundled WebShop server, on 127.0.0.1 only, bounded in count and time.

    python benchmarks/bench_webshop_hostile.py                     # the server in this checkout
    python benchmarks/bench_webshop_hostile.py --root /path/to/other/checkout   # e.g. an older server, to compare

It starts ``webshop-server`` (1 worker, 1,000 generated products) as a subprocess, then:

1. **without attack**: ``--normal`` clients search (HTML results pages, keep-alive, ``--pause`` s between requests)
   for ``--window`` s; their request count, errors and p50 / p99 latency are recorded;
2. **during the attack**: the same clients, same window, while
   * ``--slow`` slow clients each send one byte of a request per second (a slow-loris: a client the server closes
     reconnects and starts again), and
   * ``--fuzzers`` threads send hostile requests, each on its own connection, drawn at random from the kinds in the
     table: deeply nested JSON (depth 100 to 20,000), declared bodies up to 100 MB, HTTP/0.9 and blank request
     lines, TLS ClientHellos, random bytes, fuzzed JSON bodies and fuzzed paths.

Every socket has a timeout: a request with neither an answer nor a close within ``--hang`` s counts as a hang. The
table gives, per kind, requests sent and responses by status class; "closed" is a close without any answer. It
exits 1 if any answer was a 5xx, anything hung, or a normal client saw an error during the attack.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"  # never anything else
WORDS = (
    "black",
    "running",
    "shoes",
    "men",
    "women",
    "size",
    "9",
    "leather",
    "wallet",
    "coffee",
    "table",
    "oak",
    "gluten",
    "free",
    "protein",
    "bar",
    "chocolate",
    "wireless",
    "headphones",
    "noise",
    "cancelling",
    "usb",
    "c",
    "cable",
    "pack",
    "of",
    "2",
    "face",
    "cream",
    "long",
    "lasting",
)


# ------------------------------------------------------------------------------------------------ the server
def start_server(root: Path, cache: str, extra: list[str]) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "webshop_server.cli", "--host", HOST, "--port", "0", "--num-products", "1000",
           "--cache-dir", cache, *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    line = proc.stdout.readline()
    m = re.search(r"127\.0\.0\.1:(\d+)/", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line!r}")
    return proc, int(m.group(1))


def supports(root: Path, flag: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "webshop_server.cli", "--help"], cwd=root, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(root)), timeout=60, check=False).stdout  # fmt: skip
    return flag in out


# ------------------------------------------------------------------------------------------------ normal clients
def normal_clients(port: int, n: int, window: float, pause: float, timeout: float, seed: int, out: mp.Queue) -> None:
    """``n`` threads searching for ``window`` s; puts (latencies in s, errors, error kinds) on ``out``."""
    lat: list[float] = []
    errors: Counter = Counter()
    lock = threading.Lock()
    stop = time.monotonic() + window

    def client(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        conn: http.client.HTTPConnection | None = None
        i = 0
        while time.monotonic() < stop:
            q = urllib.parse.quote_plus(" ".join(rng.sample(WORDS, 3)))
            path = f"/test_{k}/search?q={q}&page={1 + i % 3}"
            i += 1
            t0 = time.perf_counter()
            status, error = -1, ""
            for attempt in range(2):  # a keep-alive connection the server closed while idle is retried once
                reused = conn is not None
                if conn is None:
                    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
                try:
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                    if resp.getheader("Connection", "").lower() == "close":
                        conn.close()
                        conn = None
                    break
                except (OSError, http.client.HTTPException) as exc:
                    conn.close()
                    conn = None
                    error = type(exc).__name__
                    if not (reused and attempt == 0 and not isinstance(exc, TimeoutError)):
                        break
            took = time.perf_counter() - t0
            with lock:
                if status == 200:
                    lat.append(took)
                else:
                    errors[error or f"HTTP {status}"] += 1
            time.sleep(pause)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(window + timeout * 3)
    out.put((lat, sum(errors.values()), dict(errors)))


# ------------------------------------------------------------------------------------------------ hostile requests
def tls_hello(rng: random.Random) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    tls = ctx.wrap_bio(ssl.MemoryBIO(), out := ssl.MemoryBIO(), server_hostname=f"shop{rng.randrange(1000)}.test")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def _post(path: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body  # fmt: skip


def _json_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.4:
        return rng.choice([None, True, 0, -1, 1e308, "", "x" * rng.randrange(300), "\u2603", "/test_0", "click[buy now]",
                           "search[red shoes]", "text", "html", "\ud800", "\u0000"])  # fmt: skip
    if r < 0.7:
        return [_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["url", "action", "mode", "goal", "split", "index", "q", ""]): _json_value(rng, depth + 1)
            for _ in range(rng.randrange(5))}  # fmt: skip


def hostile(kind: str, rng: random.Random) -> tuple[bytes, bool, int]:
    """(payload, half-close after sending, bytes of a declared body not sent)."""
    if kind == "nested JSON":
        d = rng.randrange(100, 20_001)
        body = "[" * d + "]" * d if rng.random() < 0.5 else '{"url":' * d + "0" + "}" * d
        return _post(rng.choice(["/api/step", "/api/session", "/api/page"]), body.encode()), False, 0
    if kind == "huge body":
        declared = rng.randrange(100_000, 100_000_001)
        sent = min(declared, rng.randrange(0, 256 * 1024))
        head = (f"POST /api/step HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {declared}\r\n\r\n").encode()  # fmt: skip
        return head + b"{" * sent, False, declared - sent
    if kind == "HTTP/0.9 line":
        return rng.choice([b"GET /\r\n", b"GET /test_0\r\n", b"GET /api/catalog\r\n\r\n", b"POST /api/step\r\n",
                           b"GET /static/style.css\n"]), False, 0  # fmt: skip
    if kind == "blank line":
        return rng.choice([b"\r\n", b"\r\n\r\n", b"\n", b"\n\n\n"]), False, 0
    if kind == "TLS ClientHello":
        return tls_hello(rng), False, 0
    if kind == "random bytes":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))), True, 0
    if kind == "fuzzed JSON body":
        body = json.dumps(_json_value(rng)).encode()
        if rng.random() < 0.3:
            body = body[: rng.randrange(len(body) + 1)] + bytes(rng.randrange(256) for _ in range(rng.randrange(20)))
        return _post(rng.choice(["/api/step", "/api/session", "/api/page", "/test_0"]), body,
                     rng.choice(["application/json", "application/x-www-form-urlencoded", "text/plain"])), False, 0  # fmt: skip
    if kind == "fuzzed path":
        segs = ["test_0", "api", "item", "search", "static", "done", "B0ZZZZZZZZ", "%ff", "%zz", "..", "[", "health",
                "x" * rng.randrange(2000), "\u2603", "?q=", "&page=0", "o.color=red"]  # fmt: skip
        path = "/" + "/".join(urllib.parse.quote(rng.choice(segs), safe="%?&=[") for _ in range(rng.randrange(6)))
        method = rng.choice(["GET", "GET", "HEAD", "POST", "DELETE", "BREW"])
        return f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode(), False, 0
    raise ValueError(kind)


KINDS = ["nested JSON", "huge body", "HTTP/0.9 line", "blank line", "TLS ClientHello", "random bytes",
         "fuzzed JSON body", "fuzzed path"]  # fmt: skip


def exchange(port: int, payload: bytes, half_close: bool, hang: float) -> tuple[list[int], str]:
    """Send ``payload`` on a new connection; read until close or a complete answer. (statuses, how it ended)."""
    s = socket.create_connection((HOST, port), timeout=hang)
    deadline = time.monotonic() + hang
    data = b""
    end = "closed"
    try:
        try:
            s.sendall(payload)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed before taking it all: read the answer
        while True:
            if _complete(data):
                end = "answered"
                break
            left = deadline - time.monotonic()
            if left <= 0:
                end = "hang"
                break
            s.settimeout(left)
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                end = "hang"
                break
            except OSError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    codes = [int(c) for c in re.findall(rb"(?:^|\r\n)HTTP/1\.[01] (\d{3}) ", data) if not c.startswith(b"1")]
    return codes, end


def _complete(data: bytes) -> bool:
    """A final (non-1xx) response whose Content-Length body has arrived."""
    while data:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            return False
        head = data[:head_end]
        m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
        n = int(m.group(1)) if m else 0
        if re.match(rb"HTTP/1\.[01] 1\d\d ", head):
            data = data[head_end + 4 :]
            continue
        return len(data) >= head_end + 4 + n
    return False


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[str, Counter] = defaultdict(Counter)

    def add(self, kind: str, codes: list[int], end: str) -> None:
        with self.lock:
            row = self.rows[kind]
            row["sent"] += 1
            for c in codes:
                row[f"{c // 100}xx"] += 1
            if not codes:
                row["hang" if end == "hang" else "closed"] += 1
            elif end == "hang":
                row["hang"] += 1  # answered in part, then stuck


def fuzzer(port: int, seed: int, stop: float, limit: int, hang: float, tally: Tally) -> None:
    rng = random.Random(seed)
    for _ in range(limit):
        if time.monotonic() >= stop:
            return
        kind = rng.choice(KINDS)
        payload, half_close, _unsent = hostile(kind, rng)
        try:
            codes, end = exchange(port, payload, half_close, hang)
        except TimeoutError:  # not even accepted within the hang time
            codes, end = [], "hang"
        except OSError:
            codes, end = [], "refused"
        tally.add(kind, codes, end)


def slow_clients(port: int, n: int, stop: float, tally: Tally, ready: threading.Event) -> None:
    """``n`` connections each sending one byte a second of a request; a connection the server ends reconnects."""
    payload = b"GET /test_0/search?q=slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: " + b"d" * 4000
    socks: list[socket.socket | None] = [None] * n
    pos = [0] * n
    got: list[bytes] = [b""] * n
    row = tally.rows["slow client (1 B/s)"]

    def connect(i: int) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex((HOST, port))
        socks[i], pos[i], got[i] = s, 0, b""
        with tally.lock:
            row["sent"] += 1

    def ended(i: int) -> None:
        codes = [int(c) for c in re.findall(rb"HTTP/1\.[01] (\d{3}) ", got[i])]
        with tally.lock:
            for c in codes:
                row[f"{c // 100}xx"] += 1
            if not codes:
                row["closed"] += 1
        socks[i].close()
        socks[i] = None

    for i in range(n):
        connect(i)
    time.sleep(0.5)
    ready.set()
    tick = 0
    while time.monotonic() < stop:
        t_tick = time.monotonic()
        for i in range(n):  # one pass a second; each socket sends one byte per pass
            s = socks[i]
            try:
                chunk = s.recv(65536)
                if not chunk:
                    ended(i)
                    connect(i)
                    continue
                got[i] += chunk
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                ended(i)
                connect(i)
                continue
            try:
                pos[i] += s.send(payload[pos[i] : pos[i] + 1])
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                ended(i)
                connect(i)
        tick += 1
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t_tick)))
    for i in range(n):
        if socks[i] is not None:
            if got[i]:
                ended(i)
            else:
                with tally.lock:
                    row["open at end"] += 1
                socks[i].close()


# ------------------------------------------------------------------------------------------------ report
def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def measure_normal(port: int, args, seed: int) -> tuple[list[float], int, dict]:
    q: mp.Queue = mp.Queue()
    p = mp.Process(target=normal_clients, args=(port, args.normal, args.window, args.pause, args.hang, seed, q))
    p.start()
    try:
        return q.get(timeout=args.window + args.hang * 4 + 30)
    finally:
        p.join(10)
        if p.is_alive():
            p.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose webshop_server to start")
    ap.add_argument("--window", type=float, default=10.0, help="seconds the normal clients are measured, per phase")
    ap.add_argument("--normal", type=int, default=4, help="normal clients (threads, in their own process)")
    ap.add_argument("--pause", type=float, default=0.01, help="seconds between a normal client's requests")
    ap.add_argument("--slow", type=int, default=300, help="one-byte-a-second clients during the attack")
    ap.add_argument("--fuzzers", type=int, default=2, help="threads sending hostile requests during the attack")
    ap.add_argument("--fuzz-limit", type=int, default=20_000, help="at most this many hostile requests in all")
    ap.add_argument("--hang", type=float, default=5.0, help="seconds without an answer or a close that count as a hang")
    ap.add_argument("--max-connections", type=int, default=256,
                    help="the server's connection cap (the old server's fixed cap: 256); fewer than --slow exercises "
                         "shedding")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    extra = ["--max-connections", str(args.max_connections)] if supports(args.root, "--max-connections") else []
    with tempfile.TemporaryDirectory(prefix="ws-hostile-") as cache:
        proc, port = start_server(args.root, cache, extra)
        try:
            for _ in range(3):  # warm up: the search index and page templates
                measure = http.client.HTTPConnection(HOST, port, timeout=10)
                measure.request("GET", "/test_0/search?q=shoes")
                measure.getresponse().read()
                measure.close()
            calm = measure_normal(port, args, args.seed)

            tally = Tally()
            attack_len = args.window + 3.0
            stop = time.monotonic() + attack_len
            ready = threading.Event()
            threads = [threading.Thread(target=slow_clients, args=(port, args.slow, stop, tally, ready), daemon=True)]
            per = max(1, args.fuzz_limit // max(1, args.fuzzers))
            threads += [threading.Thread(target=fuzzer, args=(port, args.seed + 1 + k, stop, per, args.hang, tally),
                                         daemon=True) for k in range(args.fuzzers)]  # fmt: skip
            threads[0].start()
            ready.wait(30)
            for t in threads[1:]:
                t.start()
            time.sleep(1.0)  # the attack is under way before measuring
            attacked = measure_normal(port, args, args.seed)
            for t in threads:
                t.join(attack_len + args.hang * 2 + 10)
            alive = proc.poll() is None
            try:
                health = http.client.HTTPConnection(HOST, port, timeout=args.hang)
                health.request("GET", "/health")
                h = json.loads(health.getresponse().read())
                health.close()
            except (OSError, http.client.HTTPException, ValueError):
                h = {}
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    cols = ["sent", "2xx", "3xx", "4xx", "5xx", "closed", "hang"]
    print(f"\nWebShop hostile-client benchmark: server from "
          f"{'this checkout' if args.root.resolve() == ROOT else args.root} (1 worker, 1,000 products, "
          f"{' '.join(extra) or 'its built-in connection cap'}); attack {attack_len:.0f} s: {args.slow} slow clients "
          f"+ {args.fuzzers} fuzzing threads; hang = no answer and no close within {args.hang:g} s\n")  # fmt: skip
    print("| request kind | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    total: Counter = Counter()
    for kind in [*KINDS, "slow client (1 B/s)"]:
        row = tally.rows.get(kind, Counter())
        total.update({c: row[c] for c in cols})
        print(f"| {kind} | " + " | ".join(f"{row[c]:,}" for c in cols) + " |")
    print("| **total** | " + " | ".join(f"**{total[c]:,}**" for c in cols) + " |")
    slow = tally.rows.get("slow client (1 B/s)", Counter())
    print(f"\nslow clients: {slow['sent']:,} connections opened ({args.slow} at a time), {slow['4xx']:,} answered 4xx "
          f"(408), {slow['closed']:,} closed without an answer (shed or timed out before sending), "
          f"{slow['open at end']:,} still open at the end")  # fmt: skip
    if h.get("connections"):
        print(f"server counters after the attack: {json.dumps(h['connections'])}")
    print()
    print("| normal clients | requests OK | errors | req/s | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (lat, errs, kinds) in (("without attack", calm), ("during attack", attacked)):
        print(f"| {name} | {len(lat):,} | {errs:,}{' ' + json.dumps(kinds) if kinds else ''} | "
              f"{len(lat) / args.window:,.0f} | {_pct(lat, 50) * 1e3:.2f} | {_pct(lat, 99) * 1e3:.2f} | "
              f"{(max(lat) if lat else float('nan')) * 1e3:.2f} |")  # fmt: skip
    fivexx, hangs, errors = total["5xx"], total["hang"], attacked[1]
    ok = fivexx == 0 and hangs == 0 and errors == 0 and alive
    print(f"\n5xx: {fivexx} (must be 0) | hangs: {hangs} (must be 0) | normal-client errors during the attack: "
          f"{errors} (must be 0) | server alive: {alive} -> {'PASS' if ok else 'FAIL'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
