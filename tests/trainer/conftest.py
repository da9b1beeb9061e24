"""Fixtures for trainer tests: a tiny random causal LM with a real (byte-level BPE, ChatML) tokenizer, built in code.

Nothing is downloaded and nothing is read from the bundled SmolLM2 (that is the slow tests' job): the tokenizer is
trained in a few milliseconds on the env texts, so it tokenises prompts into realistic multi-token pieces, and its
chat template is ChatML (the template of SmolLM2 and Qwen). The model is a 2-layer Llama with hidden size 32.

Fixtures:
    tiny_tokenizer   session-scoped tokenizer (``<|im_end|>`` is eos and end of turn, ``<|endoftext|>`` is pad)
    tiny_model       a fresh random model (function-scoped: tests may train it)
    tiny_model_dir   a folder holding a saved tiny model + tokenizer (``from_pretrained`` loads it)
    scripted_engine  factory: ``scripted_engine(tokenizer, ["<answer>Dragon</answer>", ...])`` -> an engine that
                     replies with the given texts in turn (tokenised, ending with ``<|im_end|>``)

The builders (:func:`build_tiny_tokenizer`, :func:`build_tiny_model`) and :func:`latest_rollout` (the rollout
settings of the tests that play episodes) are importable:
``from tests.trainer.conftest import build_tiny_model``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ragen_trainer.config import load_config
from ragen_trainer.settings import RolloutSettings
from ragen_trainer.update import pad_rows  # noqa: E402  (after the skips: it needs torch)

# Tiny models run fastest on one thread: their matmuls are too small to split, and with two threads on a busy
# 2-core CI machine every op waits for a core (measured: a 32-wide linear layer 25x slower).
torch.set_num_threads(1)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    (
        "You're a helpful assistant. You are playing a bandit game. Goal: maximize your total reward by choosing "
        "which arm to pull. Game rules: There are 2 arms, named Phoenix and Dragon. Each arm has its own reward "
        "distribution, related to its name. Analyze the symbolic meaning of each arm's name."
    ),
    (
        "Turn 1:\nState:\nArms: Dragon, Phoenix. Choose one.\nYou have 1 actions left. Always output: "
        "<think>...</think><answer>...</answer> with no extra text. Strictly follow this format. "
        "Max response length: 400 words (tokens)."
    ),
    "<think>The dragon is risky but pays more on average.</think><answer>Dragon</answer>",
    "<think>I will go left then down.</think><answer>Left || Down || Right || Up</answer>",
    "Reward:\n0.1\nThe episode has ended.\nState:\n_ _ P O\n_ O _ G\nYou are on a frozen lake. Reach the goal.",
    "system user assistant the a an of to is in it you your reward state action turn think answer",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] , . : ; ! ? ' \" # _ | < > @ √ X O P G S W C B A",
]


def build_tiny_tokenizer(vocab_size: int = 400) -> Any:
    """A byte-level BPE tokenizer trained in code, with ChatML special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_model(tokenizer: Any, *, seed: int = 0, hidden_size: int = 32, num_layers: int = 2) -> Any:
    """A random 2-layer Llama sized for ``tokenizer`` (float32, CPU, train mode)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.train()
    return model


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture
def tiny_model(tiny_tokenizer: Any) -> Any:
    return build_tiny_model(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A folder with a saved tiny model and tokenizer (its own tokenizer instance: tests can't change the shared
    one)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def latest_rollout(**changes: Any) -> RolloutSettings:
    """The rollout settings most rollout tests were written with, ``changes`` (config fields) applied: StarPO-S as the
    later reference trains it (only the replies trained, cleaned replies, 3600 tokens of context, a group's env
    randomness shared), made by the config as a run makes them."""
    return load_config("starpo-s").replace(reference="latest", **changes).rollout_settings()


def padded_batch(trajs: Any) -> tuple[Any, Any]:
    """``input_ids`` and ``attention_mask`` (``[B, W]`` long) of trajectories padded on the right: the ordinary padded
    batch that packing is checked and timed against."""
    width = max(len(t.input_ids) for t in trajs)
    ids = pad_rows([t.input_ids for t in trajs], width, 0, torch.long)
    attn = pad_rows([[1] * len(t.input_ids) for t in trajs], width, 0, torch.long)
    return ids, attn


class ScriptedEngine:
    """A token engine that replies with fixed texts: reply ``i`` of a ``generate`` call is ``script(call, i)``.

    ``replies`` is a list of texts used in turn for every episode (turn k of each live episode gets
    ``replies[min(k, len-1)]``, k counted as the scripted replies already in the prompt) or a callable
    ``(prompt_text, call_index, row) -> text``. The reply is tokenised and
    ends with ``<|im_end|>`` (finish_reason "stop"), like a model that emits its end-of-turn token.
    """

    supports_token_ids = True
    name = "scripted"

    def __init__(self, tokenizer: Any, replies: Sequence[str] | Callable[[str, int, int], str]) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.calls = 0
        self.prompts: list[list[list[int]]] = []

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        from ragen_trainer.engines.base import GenerationResult

        self.prompts.append([list(p) for p in prompts])
        out = []
        for row, prompt in enumerate(prompts):
            if callable(self.replies):
                text = self.replies(self.tokenizer.decode(prompt), self.calls, row)
            else:
                # The turn = how many scripted replies the conversation already holds (works with any template).
                seen = self.tokenizer.decode(prompt)
                turn = sum(seen.count(reply) for reply in set(self.replies))
                text = self.replies[min(turn, len(self.replies) - 1)]
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
            ids = ids[: params.max_new_tokens]
            finish = "stop" if ids and ids[-1] == self.tokenizer.eos_token_id else "length"
            out.append(
                GenerationResult(
                    token_ids=ids,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    logprobs=[-1.0] * len(ids),
                    finish_reason=finish,
                )
            )
        self.calls += 1
        return out

    def generate_chat(self, messages_batch: list[list[dict[str, str]]], params: Any) -> list[Any]:
        raise NotImplementedError

    def update_weights(self, model: Any) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def scripted_engine() -> Callable[..., ScriptedEngine]:
    return ScriptedEngine


class JSONServer:
    """A local HTTP server on 127.0.0.1 (random port) that records POSTed JSON bodies and answers with
    ``respond(path, body) -> (status, payload)`` (``body`` is ``None`` for a GET). ``root``: its address; ``url``: its
    ``/v1`` API root."""

    def __init__(self, respond: Callable[[str, dict], tuple[int, dict]]) -> None:
        self.requests: list[dict] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer(*respond(self.path, None))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.requests.append({"path": self.path, "body": body})
                self._answer(*respond(self.path, body))

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.url = self.root + "/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> JSONServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
