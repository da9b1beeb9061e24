"""Fixtures for the WebShop tests: one small generated shop and one server in a thread, shared by the session."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest

from webshop_server.app import build_shop, start_in_thread

N_PRODUCTS = 300


@pytest.fixture(scope="session")
def ws_cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("webshop-cache"))


@pytest.fixture(scope="session")
def shop(ws_cache_dir):
    return build_shop(num_products=N_PRODUCTS, seed=0, cache_dir=ws_cache_dir)


@pytest.fixture(scope="session")
def server(shop):
    srv, thread = start_in_thread(shop)
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=5)


class Client:
    """A tiny keep-alive HTTP client for tests."""

    def __init__(self, server) -> None:
        host, port = server.server_address[:2]
        self.conn = http.client.HTTPConnection(host, port, timeout=10)

    def request(self, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None):
        if isinstance(body, str):
            body = body.encode()
        try:
            self.conn.request(method, path, body=body, headers=headers or {})
            resp = self.conn.getresponse()
            data = resp.read()
        except (http.client.HTTPException, OSError):
            self.conn.close()
            self.conn.request(method, path, body=body, headers=headers or {})
            resp = self.conn.getresponse()
            data = resp.read()
        if resp.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return resp.status, data

    def get(self, path: str):
        return self.request("GET", path)

    def api(self, path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, data = self.request("POST", path, json.dumps(payload), {"Content-Type": "application/json"})
        return status, json.loads(data)

    def step(self, url: str, action: str, mode: str = "text") -> dict[str, Any]:
        status, data = self.api("/api/step", {"url": url, "action": action, "mode": mode})
        assert status == 200, data
        return data

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def client(server):
    c = Client(server)
    yield c
    c.close()


def solve(client: Client, shop, session: str, goal_index: int, *, options: bool = True) -> dict[str, Any]:
    """Play the goal's product through the JSON API: search its title, open it, pick its options, buy."""
    goal = shop.catalog.goal(goal_index)
    page = client.step(f"/{session}", f"search[{goal.name}]")["page"]
    assert goal.asin.lower() in page["clickables"], "the goal product's own title must find it on page 1"
    page = client.step(page["url"], f"click[{goal.asin.lower()}]")["page"]
    assert page["page"] == "item" and page["asin"] == goal.asin
    if options:
        for value in goal.goal_options.values():
            page = client.step(page["url"], f"click[{value}]")["page"]
    return client.step(page["url"], "click[buy now]")
