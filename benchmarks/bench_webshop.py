"""Benchmark the bundled WebShop server: start-up, search latency, full-page throughput, memory.

    python benchmarks/bench_webshop.py                       # 1,000 and 100,000 products
    python benchmarks/bench_webshop.py --sizes 1000 --requests 2000

For each catalog size it starts ``webshop-server`` as a subprocess (as a user would) with a fresh cache directory
and measures:

* start-up: seconds from launch until ``/health`` answers, cold (generates the catalog and builds the index) and
  cached (the index is memory-mapped from the cache);
* search latency p50 / p99: the engine alone (in this process, on the cached index) and end to end (an HTTP
  results page for a query never asked before, so the server's result cache does not help);
* full-page requests per second on loopback: a bounded load generator (``--clients`` keep-alive connections in
  ``--procs`` processes, ``--requests`` pages in total: search, results, item and sub-pages, HTML) against 1 and
  ``--workers`` server workers;
* memory: RSS of the server (all worker processes summed) after the load.

Targets (issue 4): start-up < 5 s and search p50 < 5 ms at 1,000 products; search p50 < 30 ms and RSS < 1 GB at
100,000 products.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from webshop_server.catalog import GeneratedCatalog
from webshop_server.search import SearchEngine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _start(n: int, cache: str, workers: int) -> tuple[subprocess.Popen, int, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "webshop_server.cli", "--port", "0", "--num-products", str(n), "--workers",
         str(workers), "--cache-dir", cache],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    line = proc.stdout.readline()
    m = re.search(r"127\.0\.0\.1:(\d+)/", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    port = int(m.group(1))
    while True:  # ready = /health answers
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                c.close()
                break
        except OSError:
            time.sleep(0.01)
    return proc, port, time.perf_counter() - t0


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _rss_mb(pid: int) -> float:
    """Memory of the server: RSS of one process; with worker processes, the sum of their PSS (shared pages such as
    the memory-mapped index counted once, not once per worker)."""
    import psutil

    p = psutil.Process(pid)
    kids = p.children(recursive=True)
    if not kids:
        return p.memory_info().rss / 2**20
    total = 0
    for x in [p, *kids]:
        try:
            total += x.memory_full_info().pss
        except (AttributeError, psutil.AccessDenied):
            total += x.memory_info().rss
    return total / 2**20


def _pages(n: int, count: int) -> list[str]:
    """A mix of full HTML pages a shopper visits: search, results (pages 1-2), item, sub-pages."""
    cat = GeneratedCatalog(n)
    urls = []
    for j in range(count):
        goal = cat.goal(j % cat.n_goals)
        sid = f"train_{j % 100}"
        q = urllib.parse.quote_plus(goal.query + " " + goal.attributes[0])
        kind = j % 5
        if kind == 0:
            urls.append(f"/{sid}")
        elif kind in (1, 2):
            urls.append(f"/{sid}/search?q={q}&page={1 + (j % 2)}")
        elif kind == 3:
            urls.append(f"/{sid}/item/{goal.asin}?q={q}&page=1")
        else:
            urls.append(f"/{sid}/item/{goal.asin}/features?q={q}&page=1")
    return urls


def _load_worker(port: int, urls: list[str], clients: int, out: mp.Queue) -> None:
    import threading

    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    chunks = [urls[i::clients] for i in range(clients)]

    def run(chunk: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        for u in chunk:
            t = time.perf_counter()
            conn.request("GET", u)
            r = conn.getresponse()
            r.read()
            mine.append(time.perf_counter() - t)
            if r.status != 200:
                with lock:
                    errors[0] += 1
        conn.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put((lat, errors[0]))


def _throughput(port: int, urls: list[str], procs: int, clients: int) -> tuple[float, int]:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    parts = [urls[i::procs] for i in range(procs)]
    workers = [ctx.Process(target=_load_worker, args=(port, part, clients, q)) for part in parts]
    # warm up the connection path once so process start-up is not counted
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    results = [q.get() for _ in workers]
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - t0
    n = sum(len(r[0]) for r in results)
    return n / elapsed, sum(r[1] for r in results)


def _search_latency_http(port: int, n: int, count: int) -> list[float]:
    cat = GeneratedCatalog(n)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    lat = []
    for j in range(count):
        q = urllib.parse.quote_plus(cat.goal(j).instruction_text + f" {j}")  # never asked before
        t = time.perf_counter()
        conn.request("GET", f"/api/train_0/search?q={q}")
        r = conn.getresponse()
        r.read()
        lat.append(time.perf_counter() - t)
        assert r.status == 200
    conn.close()
    return lat


def _search_latency_engine(n: int, cache: str, count: int) -> list[float]:
    cat = GeneratedCatalog(n)
    eng = SearchEngine.for_catalog(cat, cache_dir=cache)
    queries = [cat.goal(j).instruction_text for j in range(count)]
    lat = []
    for q in queries:
        t = time.perf_counter()
        eng.search(q)
        lat.append(time.perf_counter() - t)
    return lat


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--requests", type=int, default=4000, help="pages requested per throughput run")
    ap.add_argument("--procs", type=int, default=1, help="load-generator processes")
    ap.add_argument("--clients", type=int, default=8, help="keep-alive connections per load-generator process")
    ap.add_argument("--workers", type=int, default=2, help="server workers for the second throughput run")
    ap.add_argument("--searches", type=int, default=500, help="queries for the latency percentiles")
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    rows = []
    for n in args.sizes:
        with tempfile.TemporaryDirectory(prefix="ws-bench-") as cache:
            console.log(f"[bold]{n:,} products[/]: cold start (generate + index) ...")
            proc, port, cold = _start(n, cache, 1)
            _stop(proc)
            console.log(f"cold start {cold:.2f}s; cached start ...")
            proc, port, warm = _start(n, cache, 1)
            try:
                console.log("search latency (engine, then HTTP) ...")
                eng = _search_latency_engine(n, cache, args.searches)
                http_lat = _search_latency_http(port, n, args.searches)
                console.log(f"throughput, 1 worker, {args.requests} pages ...")
                urls = _pages(n, args.requests)
                rps1, err1 = _throughput(port, urls, args.procs, args.clients)
                rss1 = _rss_mb(proc.pid)
            finally:
                _stop(proc)
            console.log(f"throughput, {args.workers} workers ...")
            proc, port, _ = _start(n, cache, args.workers)
            try:
                rpsw, errw = _throughput(port, urls, args.procs, args.clients)
                rssw = _rss_mb(proc.pid)
            finally:
                _stop(proc)
        rows.append({
            "products": n, "cold_start_s": cold, "start_s": warm,
            "engine_p50_ms": statistics.median(eng) * 1e3, "engine_p99_ms": _pct(eng, 99) * 1e3,
            "http_p50_ms": statistics.median(http_lat) * 1e3, "http_p99_ms": _pct(http_lat, 99) * 1e3,
            "rps_1": rps1, "rps_w": rpsw, "errors": err1 + errw, "rss_1_mb": rss1, "rss_w_mb": rssw,
        })  # fmt: skip

    table = Table(title=f"bundled WebShop on {os.cpu_count()} CPU cores (load: {args.procs} procs x {args.clients} "
                  f"connections, {args.requests} HTML pages)")  # fmt: skip
    cols = ["products", "start-up cold / cached (s)", "search p50 / p99 engine (ms)", "search p50 / p99 HTTP (ms)",
            "pages/s 1 worker", f"pages/s {args.workers} workers", "RSS 1 worker (MB)",
            f"PSS {args.workers} workers (MB)", "non-200"]  # fmt: skip
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(
            f"{r['products']:,}", f"{r['cold_start_s']:.2f} / {r['start_s']:.2f}",
            f"{r['engine_p50_ms']:.2f} / {r['engine_p99_ms']:.2f}", f"{r['http_p50_ms']:.2f} / {r['http_p99_ms']:.2f}",
            f"{r['rps_1']:.0f}", f"{r['rps_w']:.0f}", f"{r['rss_1_mb']:.0f}", f"{r['rss_w_mb']:.0f}", str(r["errors"]),
        )  # fmt: skip
    console.print(table)
    checks = []
    for r in rows:
        if r["products"] <= 1000:
            checks += [
                ("start-up < 5 s", r["start_s"] < 5 and r["cold_start_s"] < 5),
                ("search p50 < 5 ms", r["http_p50_ms"] < 5),
            ]
        if r["products"] >= 100_000:
            checks += [("search p50 < 30 ms", r["http_p50_ms"] < 30), ("RSS < 1 GB", r["rss_1_mb"] < 1024)]
    for name, ok in checks:
        console.print(f"{'[green]PASS' if ok else '[red]FAIL'}[/] {name}")
    print(json.dumps(rows))
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
