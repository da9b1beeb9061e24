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

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ragen_trainer.engines.base import SamplingParams, cut_at_stop
from ragen_trainer.engines.local_server import serve_missing, transformers_serve
from ragen_trainer.engines.openai import OpenAIEngine, OpenAIEngineError
from ragen_trainer.engines.vllm import VLLMEngine

STARTUP_TIMEOUT_S = 90.0  # measured ~5 s on 2 CPU cores; the bound only keeps a broken server from hanging the run
MESSAGES = [
    {"role": "system", "content": "You are playing a bandit game."},
    {"role": "user", "content": "Arms: Dragon, Phoenix. Choose one."},
]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """``transformers serve`` on a copy of the tiny model that samples (``do_sample``; the saved one is greedy, and a
    random model's greedy reply is one token repeated). Yields ``url`` (API root) and ``model`` (the name to send)."""
    reason = serve_missing()
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("served")
    folder = work / "tiny"
    shutil.copytree(tiny_model_dir, folder)
    config_path = folder / "generation_config.json"
    config = json.loads(config_path.read_text())
    config["do_sample"] = True
    config_path.write_text(json.dumps(config))
    with transformers_serve(work, folder, threads=1, startup_timeout=STARTUP_TIMEOUT_S) as server:
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
