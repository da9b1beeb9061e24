"""The OpenAI protocol against a real OpenAI-compatible server on CPU: ``transformers serve`` serving the tiny test
model from a folder, started as a subprocess on 127.0.0.1 (a free port), once for this module (~5 s to start).

What this server can check, and what it cannot (transformers 5.x):

* ``/v1/chat/completions`` takes ``stop`` (as ``generate``'s ``stop_strings``: it stops there and *keeps* the string,
  with the rest of the token that completed it) and ``seed`` (a global torch seed, so requests go one at a time), so
  :class:`~ragen_trainer.engines.openai.OpenAIEngine`'s stop-string handling runs end to end. It refuses fields that
  are not in OpenAI's schema (``top_k``: HTTP 422) and ignores ``logprobs``.
* ``/v1/completions`` takes text prompts only (a token-id prompt: HTTP 400), returns neither token ids nor log-probs,
  and refuses vLLM's extra fields (HTTP 422). So ``VLLMEngine(mode="openai")``, which needs all of that, is only
  checked here for refusing such a server with a clear message; its exchange with ``vllm serve`` is checked against a
  stand-in with vLLM's response shapes (``test_engines_stop.py``), and needs a GPU to run against vLLM itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ragen_trainer.engines.base import SamplingParams, cut_at_stop
from ragen_trainer.engines.openai import OpenAIEngine, OpenAIEngineError
from ragen_trainer.engines.vllm import VLLMEngine

STARTUP_TIMEOUT_S = 90.0  # measured ~5 s on 2 CPU cores; the bound only keeps a broken server from hanging the run
MESSAGES = [
    {"role": "system", "content": "You are playing a bandit game."},
    {"role": "user", "content": "Arms: Dragon, Phoenix. Choose one."},
]


def _serve_missing() -> str | None:
    """Why ``transformers serve`` cannot run here, or ``None``."""
    from transformers.utils.import_utils import is_serve_available

    if int(transformers.__version__.split(".")[0]) < 5:
        return f"transformers {transformers.__version__} is older than the 5.x `transformers serve` this test drives"
    if not is_serve_available():
        return "`transformers serve` needs fastapi, uvicorn and openai: pip install -e '.[dev]'"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


@contextlib.contextmanager
def transformers_serve(work: Path, folder: Path | None = None) -> Iterator[SimpleNamespace]:
    """``transformers serve`` on 127.0.0.1 (a free port), run in ``work`` and logging to ``work/serve.log``, until the
    block ends. ``folder``: the model it serves; ``None``: each request loads the model (folder) it names. Yields
    ``url`` (API root) and ``log``."""
    port = _free_port()
    log_path = work / "serve.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",  # a local folder: nothing to download, no update check
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", *([str(folder)] if folder else [])]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--log-level", "warning"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=work, env=env)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode} while starting:\n{_log_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve not up after {STARTUP_TIMEOUT_S:.0f} s:\n{_log_tail(log_path)}")
            time.sleep(0.2)
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/v1", log=log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """``transformers serve`` on a copy of the tiny model that samples (``do_sample``; the saved one is greedy, and a
    random model's greedy reply is one token repeated). Yields ``url`` (API root) and ``model`` (the name to send)."""
    reason = _serve_missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("served")
    folder = work / "tiny"
    shutil.copytree(tiny_model_dir, folder)
    config_path = folder / "generation_config.json"
    config = json.loads(config_path.read_text())
    config["do_sample"] = True
    config_path.write_text(json.dumps(config))
    with transformers_serve(work, folder) as server:
        yield SimpleNamespace(url=server.url, model=str(folder), log=server.log)


def _reply(engine: OpenAIEngine, params: SamplingParams) -> tuple[Any, int]:
    """One reply, and how many tokens the server says it generated for it."""
    before = engine.usage["completion_tokens"]
    [result] = engine.generate_chat([MESSAGES], params)
    return result, engine.usage["completion_tokens"] - before


def _stop_string_in(text: str) -> str | None:
    """Two ASCII letters that first occur in the first half of ``text`` (not at its start): a stop string the reply
    reaches well before its end."""
    match = re.search(r"[A-Za-z]{2}", text[1:])
    if match is None:
        return None
    stop = match.group(0)
    return stop if text.find(stop) > 0 and text.find(stop) + len(stop) <= len(text) // 2 else None


def test_openai_engine_stop_strings_against_transformers_serve(served):
    # One request at a time: the server seeds torch globally per request. It keeps stop strings in the text, so a bare
    # "stop" is the model's own end (restore_stop=False).
    engine = OpenAIEngine(served.model, served.url, concurrency=1, timeout=60, max_retries=0, restore_stop=False)
    for seed in range(20):  # a seed whose free reply has a usable stop string early on
        free, free_tokens = _reply(engine, SamplingParams(max_new_tokens=24, seed=seed))
        stop = _stop_string_in(free.text)
        if stop is not None:
            break
    else:
        pytest.fail(f"no seed in 0..19 gave a reply with two ASCII letters in its first half; last: {free.text!r}")
    again, _ = _reply(engine, SamplingParams(max_new_tokens=24, seed=seed))
    assert again.text == free.text  # seeded sampling is reproducible: the stopped reply is the free one, cut

    stopped, stopped_tokens = _reply(engine, SamplingParams(max_new_tokens=24, seed=seed, stop=(stop,)))
    assert stopped.text == cut_at_stop(free.text, (stop,))[0] and stopped.text.endswith(stop)
    assert stopped.finish_reason == "stop"
    assert stopped_tokens < free_tokens, "the server did not stop at the stop string (it was only cut here)"

    # A stop string that never comes: the reply is the free one, untouched, and ends as it did.
    untouched, _ = _reply(engine, SamplingParams(max_new_tokens=24, seed=seed, stop=("</answer>",)))
    assert untouched.text == free.text and untouched.finish_reason == free.finish_reason


def test_vllm_openai_mode_is_refused_by_a_server_without_token_prompts(served, tiny_tokenizer):
    engine = VLLMEngine(
        served.model, tiny_tokenizer, mode="openai", base_url=served.url, max_retries=0, timeout=60, concurrency=1
    )
    with pytest.raises(OpenAIEngineError, match=r"(?s)HTTP 4\d\d.*only vLLM's OpenAI server \(vllm serve\)"):
        engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, stop=("</answer>",)))
