"""HFEngine gives exactly the replies it gave before its split into a package (scheduler, cache, runner, sampler).

``data/hf_engine_reference.json`` holds what the engine returned (token ids, log-probabilities, finish reasons, texts
and its work counters) on the tiny model of ``conftest.py``, recorded with the single-module engine
(``ragen_trainer/engines/hf.py`` at commit 32cb5ee) before the split. The scenarios drive everything the engine does:
multi-turn sessions whose next prompt extends the parked cache (and one that departs from it inside the last reply),
shared group prompts, continuous batching with fewer rows than requests, per-request token limits, a released
episode, an evicting parked-cache budget, stop strings and stop tokens, packed prefill cut into several passes, decode
segments of rows of very different lengths, top-k / top-p / temperature sampling and greedy decoding.

To re-record (only for a change that is *meant* to change the engine's replies)::

    python3 -m tests.trainer.test_hf_engine_reference --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines.base import GenerationRequest, SamplingParams
from ragen_trainer.engines.hf import HFEngine
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

REFERENCE = Path(__file__).parent / "data" / "hf_engine_reference.json"


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prompt(tokenizer: Any, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return _ids(tokenizer, chat)


def _result(result: Any) -> dict[str, Any]:
    return {"tokens": result.token_ids, "logprobs": result.logprobs, "finish": result.finish_reason,
            "text": result.text}  # fmt: skip


def _multi_turn(model: Any, tokenizer: Any, *, batch_size: int, max_parked_tokens: int,
                **engine_options: Any) -> dict[str, Any]:  # fmt: skip
    """Six episodes of three turns in one session, each next turn submitted as soon as its reply is back (the
    streaming driver's pattern): prompt + reply + the env's delta, except episode 2, whose reply is rewritten (its
    last two tokens replaced) so its next prompt departs from the parked cache; episode 5 is released after turn 1."""
    long = _prompt(tokenizer, "Turn 1:\nState:\n_ _ P O\n_ O _ G\n" * 12 + "Go left or right?")
    short = _prompt(tokenizer, "reward")
    medium = _prompt(tokenizer, "Arms: Dragon, Phoenix. Choose one.")
    first = {0: long, 1: short, 2: medium, 3: short, 4: short, 5: medium}  # 1, 3, 4 share their first prompt
    delta = _prompt(tokenizer, "Reward: 0\nState:\n_ P _ O")[1:]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, stop=("a",))
    engine = HFEngine(model, tokenizer, batch_size=batch_size, max_parked_tokens=max_parked_tokens, **engine_options)
    replies: dict[str, list[dict[str, Any]]] = {str(key): [] for key in first}
    prompts = dict(first)
    with engine.session(params) as session:
        for key, prompt in first.items():
            session.submit(GenerationRequest(key=key, prompt=prompt, seed=100 + key,
                                             max_new_tokens=4 if key == 4 else None))  # fmt: skip
        while session.busy:
            for key, result in session.step():
                turns = replies[str(key)]
                turns.append(_result(result))
                if key == 5:
                    session.release(key)
                    continue
                if len(turns) == 3:
                    continue
                reply = list(result.token_ids)
                if key == 2:
                    reply = reply[:-2] + _ids(tokenizer, "<answer>Up</answer>")
                prompts[key] = prompts[key] + reply + delta
                session.submit(GenerationRequest(key=key, prompt=prompts[key], seed=200 + 10 * key + len(turns)))
    return {"replies": replies, "stats": dict(engine.stats)}


def _one_shot(model: Any, tokenizer: Any, params: SamplingParams, **engine_kwargs: Any) -> dict[str, Any]:
    prompts = [
        _prompt(tokenizer, "Turn 1:\nState:\n_ _ P O\n" * 20 + "Go left or right?"),
        _prompt(tokenizer, "reward"),
        _prompt(tokenizer, "think, then answer"),
        _prompt(tokenizer, "reward"),
        _prompt(tokenizer, "You are on a frozen lake. Reach the goal."),
    ]
    engine = HFEngine(model, tokenizer, **engine_kwargs)
    return {"replies": [_result(r) for r in engine.generate(prompts, params)], "stats": dict(engine.stats)}


#: The engine as it was when the reference was recorded: every distinct prompt encoded in full (shared prefixes came
#: later and change the work counters by design; their outputs are compared with these below).
RECORDED = {"share_prefixes": False, "share_attention": False}  # the engine as it was recorded


def run_scenarios(model: Any, tokenizer: Any, **engine_options: Any) -> dict[str, Any]:
    """What the engine returns on every scenario, as JSON-able data."""
    o = engine_options
    return {
        "multi_turn": _multi_turn(model, tokenizer, batch_size=3, max_parked_tokens=65_536, **o),
        "multi_turn_small_budget": _multi_turn(model, tokenizer, batch_size=4, max_parked_tokens=120, **o),
        "filtered_sampling": _one_shot(
            model, tokenizer, SamplingParams(temperature=0.7, top_k=20, top_p=0.8, max_new_tokens=14, seed=5),
            batch_size=2, prefill_tokens=16, **o,
        ),
        "top_p_only": _one_shot(model, tokenizer, SamplingParams(temperature=1.3, top_p=0.5, max_new_tokens=9, seed=9),
                                **o),  # fmt: skip
        "greedy": _one_shot(model, tokenizer, SamplingParams(temperature=0, max_new_tokens=12), batch_size=4, **o),
    }


def fingerprint(model: Any, tokenizer: Any) -> dict[str, str]:
    """Hashes of the tiny model's weights and the tiny tokenizer's vocabulary: the reference holds only for them."""
    weights = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        weights.update(name.encode())
        weights.update(tensor.detach().float().contiguous().numpy().tobytes())
    vocab = hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    return {"weights": weights.hexdigest(), "vocab": vocab.hexdigest()}


def _replies(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    replies = scenario["replies"]
    return [r for turns in replies.values() for r in turns] if isinstance(replies, dict) else list(replies)


def _without_logprobs(scenario: dict[str, Any]) -> dict[str, Any]:
    return {**scenario, "replies": [{k: v for k, v in r.items() if k != "logprobs"} for r in _replies(scenario)]}


def _logprobs(scenario: dict[str, Any]) -> list[float]:
    return [p for r in _replies(scenario) for p in r["logprobs"]]


def test_the_engine_gives_the_recorded_tokens_and_log_probs():
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    reference = json.loads(REFERENCE.read_text())
    assert fingerprint(model, tokenizer) == reference["fingerprint"], (
        "the tiny model or tokenizer is not the one the reference was recorded with (torch, transformers or tokenizers "
        "changed how they are built): re-record the reference with code known to be right (see the module docstring)"
    )
    got = run_scenarios(model, tokenizer, **RECORDED)
    assert got.keys() == reference["scenarios"].keys()
    for name, expected in reference["scenarios"].items():
        assert _without_logprobs(got[name]) == _without_logprobs(expected), name
        # Recorded and replayed on one machine they are equal to the bit; another CPU's float32 kernels may round
        # the last bit differently.
        assert _logprobs(got[name]) == pytest.approx(_logprobs(expected), rel=0, abs=1e-6), name
    assert model.training  # the engine puts the live model back in training mode


@pytest.mark.parametrize("share_attention", [False, True])
def test_shared_prefixes_give_the_recorded_replies_with_less_prefill(share_attention):
    # Every scenario's prompts share the chat template's system head: encoded once, the replies are the recorded ones
    # (the keys of a prefix encoded on its own equal those of the full prompt up to float rounding). With shared
    # attention (the default) rows holding copies of one encoding may read them once: never more read, the same
    # replies (these short prompts share too few columns to be worth it; test_hf_engine_cache's rollouts share most).
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    reference = json.loads(REFERENCE.read_text())
    got = run_scenarios(model, tokenizer, share_prefixes=True, share_attention=share_attention)
    for name, expected in reference["scenarios"].items():
        assert [r["tokens"] for r in _replies(got[name])] == [r["tokens"] for r in _replies(expected)], name
        assert [r["text"] for r in _replies(got[name])] == [r["text"] for r in _replies(expected)], name
        assert _logprobs(got[name]) == pytest.approx(_logprobs(expected), rel=0, abs=1e-4), name
        stats, recorded = got[name]["stats"], expected["stats"]
        assert stats["prefill_tokens"] < recorded["prefill_tokens"], name
        # Every prompt token is either encoded or reused: the two together are the same work as before.
        assert stats["prefill_tokens"] + stats["reused_tokens"] >= recorded["prefill_tokens"] + recorded["reused_tokens"]
        assert stats["decode_steps"] == recorded["decode_steps"], name
        assert stats["attended_columns"] <= recorded["attended_columns"], name


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python3 -m {__spec__.name if __spec__ else 'tests.trainer.test_hf_engine_reference'} --write")
    torch.set_num_threads(1)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    data = {"fingerprint": fingerprint(model, tokenizer), "scenarios": run_scenarios(model, tokenizer, **RECORDED)}
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {REFERENCE}: {', '.join(data['scenarios'])}")
