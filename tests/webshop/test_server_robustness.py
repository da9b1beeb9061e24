"""The WebShop server on odd input and odd installs: a lone surrogate in an action, a session id with a trailing
newline, the static files when the package is imported from outside the repo."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from webshop_server.shop import ShopError


def test_api_step_with_a_lone_surrogate_is_not_a_500(client):
    # The reason of an invalid action echoes the action; a lone surrogate (valid JSON "\\ud800") made the UTF-8
    # encoding of the JSON answer raise, and the server answered 500.
    body = b'{"url": "/train_0", "action": "click[\\ud800]"}'
    status, data = client.request("POST", "/api/step", body, {"Content-Type": "application/json"})
    assert status == 200
    payload = json.loads(data)
    assert payload["valid"] is False and "not available" in payload["reason"]
    status, data = client.request(
        "POST",
        "/api/step",
        b'{"url": "/train_0", "action": "search[\\udfff shoes]"}',
        {"Content-Type": "application/json"},
    )
    assert status == 200 and json.loads(data)["valid"] is True


@pytest.mark.parametrize("session", ["train_0\n", "test_1-abc\n"])
def test_session_id_with_a_trailing_newline_is_unknown(shop, session):
    # `$` in the session pattern also matched before a final "\n", so "/train_0%0A" was served as a session whose
    # id then appeared, newline included, in every URL of its pages.
    with pytest.raises(ShopError) as err:
        shop.goal_index(session)
    assert err.value.status == 404


def test_static_files_load_when_the_package_is_imported_from_outside_the_repo(tmp_path):
    # With an editable install made before webshop_server/ had its __init__.py (as on this machine), the package
    # imports as a namespace package outside the repo root, and importlib.resources.files() then raised
    # NotADirectoryError: every server start (and the WebShop env, and the demo) failed when run from elsewhere.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import importlib.util; print(importlib.util.find_spec('webshop_server') is not None)"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    if found.stdout.strip() != "True":
        pytest.skip("the ragen distribution is not installed: webshop_server cannot be imported outside the repo")
    code = "from webshop_server.app import _static_bytes; print(sorted(_static_bytes()))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "style.css" in out.stdout and "webshop.js" in out.stdout
