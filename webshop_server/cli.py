"""``webshop-server``: start the bundled WebShop.

    webshop-server                                  # 1,000 generated products on http://127.0.0.1:3000
    webshop-server --num-products 100000 --workers 2
    webshop-server --items-path data/items_shuffle_1000.json --attrs-path data/items_ins_v2_1000.json \\
                   --human-goals-path data/items_human_ins.json   # the original benchmark's data
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from webshop_server.app import build_shop, make_server, serve
from webshop_server.serving import Limits


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="webshop-server",
        description="Serve the bundled WebShop (HTML pages, JSON API under /api, /health).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind; keep 127.0.0.1 unless you mean to expose it")
    p.add_argument("--port", type=int, default=3000, help="port to bind (0: a free port)")
    p.add_argument("--workers", type=int, default=1, help="worker processes sharing the socket (POSIX)")
    p.add_argument("--num-products", type=int, default=1000, help="generated catalog size (or cap on original data)")
    p.add_argument("--seed", type=int, default=0, help="catalog seed")
    p.add_argument("--goals-per-product", type=int, default=2, help="goals made from each generated product")
    p.add_argument("--items-path", help="original items_shuffle*.json (use the original data instead of generating)")
    p.add_argument("--attrs-path", help="original items_ins_v2*.json")
    p.add_argument("--human-goals-path", help="original items_human_ins.json (human goals; else synthetic goals)")
    p.add_argument("--reviews-path", help="original reviews.json (optional)")
    p.add_argument("--show-attrs", action="store_true", help="show the Attributes tab on item pages")
    p.add_argument("--cache-dir", help="where the search index is cached (default: ragen's cache dir)")
    p.add_argument("--access-log", action="store_true", help="log every request to stderr")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        help="seconds for a whole request (head and body) to arrive; slower clients get 408",
    )
    p.add_argument("--keepalive-timeout", type=float, default=30.0, help="seconds an idle keep-alive connection stays")
    p.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="open connections per worker; past it the slowest connection is closed for a new one",
    )
    p.add_argument("--threads", type=int, default=8, help="request-handler threads per worker")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not 0 <= args.port <= 65535:
        print(f"error: invalid --port {args.port}: expected 0..65535", file=sys.stderr)
        return 2
    if not 1 <= args.workers <= 256:
        print(f"error: invalid --workers {args.workers}: expected 1..256", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {args.host}: the shop is reachable from other machines", file=sys.stderr)

    try:
        limits = Limits(request_timeout=args.request_timeout, keepalive_timeout=args.keepalive_timeout,
                        max_connections=args.max_connections, handler_threads=args.threads)  # fmt: skip
    except (TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    progress_cb, finish = _progress()
    try:
        shop = build_shop(
            num_products=args.num_products, seed=args.seed, goals_per_product=args.goals_per_product,
            items_path=args.items_path, attrs_path=args.attrs_path, human_goals_path=args.human_goals_path,
            reviews_path=args.reviews_path, show_attrs=args.show_attrs, cache_dir=args.cache_dir,
            progress=progress_cb,
        )  # fmt: skip
    except ValueError as exc:
        finish()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finish()
    try:
        server = make_server(shop, args.host, args.port, workers=args.workers, access_log=args.access_log,
                             limits=limits)  # fmt: skip
    except OSError as exc:
        print(f"error: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    info = shop.catalog.describe()
    print(
        f"WebShop ready in {time.perf_counter() - t0:.2f}s: {info['products']:,} products, {info['goals']:,} goals "
        f"(test {info['splits']['test']}, eval {info['splits']['eval']}, train {info['splits']['train']}) "
        f"at {server.url}/ with {args.workers} worker(s). Ctrl-C stops.",
        flush=True,
    )
    serve(server, args.workers)
    print("WebShop stopped.", flush=True)
    return 0


def _progress():
    """A rich progress bar for the one-time index build (silent when the index is cached)."""
    state: dict = {}

    def update(done: int, total: int) -> None:
        if "bar" not in state:
            try:
                from rich.console import Console
                from rich.progress import Progress

                state["bar"] = Progress(console=Console(stderr=True), transient=False)  # stdout: the ready line
                state["bar"].start()
                state["task"] = state["bar"].add_task("building the search index (once)", total=total)
            except ImportError:  # rich is optional: plain lines
                state["bar"] = None
        if state["bar"] is not None:
            state["bar"].update(state["task"], completed=done)
        else:
            print(f"indexing {done}/{total}", file=sys.stderr)

    def finish() -> None:
        if state.get("bar") is not None:
            state["bar"].stop()

    return update, finish


if __name__ == "__main__":
    sys.exit(main())
