"""The hot paths of a training step as pytest-benchmark tests, each timed next to a reference computation of the same
work in the same run, so that their *ratio* -- not a wall-clock time, which depends on the machine and its load --
can be held against a baseline saved in the repository (``benchmarks/baselines/hot_paths.json``).

The two paths take turns: every round runs the reference once (in the round's ``setup``, timed here and kept in the
benchmark's ``extra_info["reference_s"]``) and then ragen's path (timed by pytest-benchmark), so both see the same
load from other jobs; each path's fastest round counts. Timed one path after the other, as separate benchmarks, the
ratios moved by 50 % from run to run on a shared 2-core machine.

    python -m pytest benchmarks/test_hot_paths.py --benchmark-only --benchmark-json=hot.json   # all of them
    python -m pytest benchmarks/test_hot_paths.py --benchmark-only -m quick --benchmark-json=hot.json  # CI's
    python benchmarks/compare_hot_paths.py hot.json          # fails on a ratio > 1.2 x its baseline
    python benchmarks/compare_hot_paths.py hot.json --update # writes the baselines (after a deliberate change)

Each benchmark (its group) times a ``ragen`` path against a ``reference`` path on the same inputs:

* ``update`` -- one training micro-batch, forward and backward of the StarPO loss through ragen's packed rows (each
  group's prompt once, no padding) vs the same loss through an ordinary padded forward (what a trainer without
  packing computes);
* ``scoring`` -- the no-grad log-prob pass, packed vs padded;
* ``decode`` -- a batch of replies through ragen's ``HFEngine`` (KV cache, continuous batching) vs ``model.generate``;
* ``env`` -- protocol turns (a model reply parsed, acted, the next prompt written) vs the raw env's steps.

All four are ``quick`` (a small random Llama, seconds a round; about a minute in all), the ones CI runs. One on the
bundled SmolLM2 would be marked ``slow`` and run by the first command only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pytest_benchmark")

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_trainer.config import load_config
from ragen_trainer.critic import attach_critic, install_policy_forward
from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.packing import pack, use_packed_attention
from ragen_trainer.rollout import collect_rollouts
from ragen_trainer.update import action_mask, token_logprobs
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer, padded_batch

#: Timed rounds per path; each path's fastest counts. On a machine shared with other jobs a round can run 1.5-2x
#: slower than the quietest one, so enough rounds for one of them to be quiet (5 were not: ratios moved 50 % run to run).
ROUNDS = 15


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _model(tokenizer, hidden=256, layers=4, critic=None):
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=layers)
    if critic:
        attach_critic(model, critic)
    install_policy_forward(model)
    use_packed_attention(model)
    return model


@pytest.fixture(scope="module")
def bandit_batch(tokenizer):
    """8 Bandit rollouts of one initial state (one group: the prompt shared by all) from the random model."""
    model = _model(tokenizer)
    env_kwargs = load_config("starpo-s").replace(env_id="ragen/Bandit-v0", enable_think=False).env_make_kwargs()
    engine = HFEngine(model, tokenizer, batch_size=16)
    batch = collect_rollouts(engine, tokenizer, "ragen/Bandit-v0", [0], 8, env_kwargs=env_kwargs,
                             sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=0))
    trajs = batch.trajectories
    return trajs, action_mask(trajs, max(len(t.input_ids) for t in trajs) - 1)


def _padded_logprobs(model, ids, attn, mask):
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) * mask


def run_paired(benchmark, ragen: Callable[[], object], reference: Callable[[], object], rounds: int = ROUNDS) -> None:
    """Time ``ragen`` with ``benchmark`` and ``reference`` just before it in every round (see the module docstring);
    the reference's times (its warm-up round left out) go to ``benchmark.extra_info["reference_s"]``."""
    times: list[float] = []

    def run_reference() -> None:
        t0 = time.perf_counter()
        reference()
        times.append(time.perf_counter() - t0)

    benchmark.pedantic(ragen, setup=run_reference, rounds=rounds, iterations=1, warmup_rounds=1)
    benchmark.extra_info["reference_s"] = times[1:]


@pytest.mark.quick
@pytest.mark.benchmark(group="update")
def test_update_micro_batch(benchmark, tokenizer, bandit_batch):
    trajs, mask = bandit_batch
    model = _model(tokenizer)
    packed = pack(trajs, mask)
    ids, attn = padded_batch(trajs)

    def backward(logp):
        (-(logp * mask).sum() / mask.sum()).backward()

    def ragen():
        model.zero_grad(set_to_none=True)
        backward(token_logprobs(model, packed, mask, temperature=1.0, entropy=True, values=False)[0])

    def reference():
        model.zero_grad(set_to_none=True)
        backward(_padded_logprobs(model, ids, attn, mask))

    run_paired(benchmark, ragen, reference)


@pytest.mark.quick
@pytest.mark.benchmark(group="scoring")
def test_scoring_pass(benchmark, tokenizer, bandit_batch):
    trajs, mask = bandit_batch
    model = _model(tokenizer).eval()
    packed = pack(trajs, mask)
    ids, attn = padded_batch(trajs)

    @torch.no_grad()
    def ragen():
        token_logprobs(model, packed, mask, temperature=1.0, entropy=False, values=False)

    @torch.no_grad()
    def reference():
        _padded_logprobs(model, ids, attn, mask)

    run_paired(benchmark, ragen, reference)


@pytest.mark.quick
@pytest.mark.benchmark(group="decode")
def test_decode_replies(benchmark, tokenizer):
    """16 replies of up to 32 new tokens to 8 FrozenLake first prompts (2 per prompt)."""
    model = _model(tokenizer).eval()
    prompts = []
    for seed in range(8):
        env = gym.make("ragen/FrozenLake-v0", enable_think=False)
        prompt, info = env.reset(seed=seed)
        messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts += [list(tokenizer(text, add_special_tokens=False)["input_ids"])] * 2
    params = SamplingParams(temperature=1.0, max_new_tokens=32, seed=0)
    engine = HFEngine(model, tokenizer, batch_size=16)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as generate wants
        ids[i, width - len(p):] = torch.tensor(p)
        attn[i, width - len(p):] = 1

    @torch.no_grad()
    def ragen():
        engine.generate(prompts, params)

    @torch.no_grad()
    def reference():
        model.generate(input_ids=ids, attention_mask=attn, do_sample=True, max_new_tokens=32,
                       pad_token_id=tokenizer.pad_token_id)

    run_paired(benchmark, ragen, reference, rounds=ROUNDS // 3)


@pytest.mark.quick
@pytest.mark.benchmark(group="env")
def test_env_turns(benchmark):
    """200 FrozenLake turns: through the turn protocol (a reply parsed, the next prompt written) vs raw steps."""
    env = gym.make("ragen/FrozenLake-v0")

    # the protocol's step takes a whole reply; the unwrapped env's takes one action string (benchmarks/bench_envs.py)
    def turns(step, action):
        env.reset(seed=0)
        for _ in range(200):
            _, _, terminated, truncated, _ = step(action)
            if terminated or truncated:
                env.reset(seed=0)

    run_paired(benchmark, lambda: turns(env.step, "<think>down is safe</think><answer>Down</answer>"),
               lambda: turns(env.unwrapped.step, "Down"))
