"""The hot paths of a training step as pytest-benchmark tests, each timed next to a reference computation of the same
work in the same run, so that their *ratio* -- not a wall-clock time, which depends on the machine and its load --
can be held against a baseline saved in the repository (``benchmarks/baselines/hot_paths.json``).

How a ratio is measured so that another job on the machine cannot move it by 20 % (:func:`run_paired`):

* **long timed units** -- each path's call is repeated until one timed unit lasts about :data:`UNIT_S` (the counts
  are set once, after a warm-up call), so a time slice lost to another process is a small part of a unit; the env
  path, for one, times thousands of turns a unit, not the 200 (about 6 ms) it once did;
* **paired rounds** -- every round times both paths back to back, the reference first and then ragen's path, and the
  round's ratio is ragen's time per call over the reference's. Always in that order: alternating it made the ratios
  of ``update`` bimodal (the padded reference runs 7 % slower right after ragen's path than after itself, as each
  leaves the allocator and the caches to the other), and a median of two modes jumps between them;
* **the median** of many rounds' ratios is the group's ratio: a few rounds hit by a burst of load move a median
  not at all, where they moved a fastest-round ratio (fastest ragen round over fastest reference round, the old
  statistic) by up to 50 %;
* **CPU time** (``time.process_time``; ``scripts/check_hot_paths.sh`` runs torch on one thread, as the baselines
  were measured) is what is timed, not the wall clock: the time this process spends waiting for a core while
  another job holds it is not work of either path, and on a 2-core machine shared with two training processes it was
  most of the noise. The wall times are kept in the report too.

    python -m pytest benchmarks/test_hot_paths.py --benchmark-only --benchmark-json=hot.json   # all of them
    python -m pytest benchmarks/test_hot_paths.py --benchmark-only -m quick --benchmark-json=hot.json  # CI's
    python benchmarks/compare_hot_paths.py hot.json          # fails on a ratio > 1.2 x its baseline
    python benchmarks/compare_hot_paths.py hot.json --update # writes the baselines (after a deliberate change)

``RAGEN_HOT_PATH_SLOWDOWN=0.3`` makes every ragen path do 30 % more work (a busy loop after each call, as long as
that call's own CPU time times 0.3): how ``tests/benchmarks/test_hot_path_check.py`` shows that the check catches a
real slowdown.

Each benchmark (its group) times a ``ragen`` path against a ``reference`` path on the same inputs:

* ``update`` -- one training micro-batch, forward and backward of the StarPO loss through ragen's packed rows (each
  group's prompt once, no padding) vs the same loss through an ordinary padded forward (what a trainer without
  packing computes);
* ``scoring`` -- the no-grad log-prob pass, packed vs padded;
* ``decode`` -- a batch of replies through ragen's ``HFEngine`` (KV cache, continuous batching) vs ``model.generate``;
* ``env`` -- protocol turns (a model reply parsed, acted, the next prompt written) vs the raw env's steps.

All four are ``quick`` (a small random Llama; about 1.5 minutes in all on a 2-core machine), the ones CI runs. One on
the bundled SmolLM2 would be marked ``slow`` and run by the first command only. pytest-benchmark's own table shows
the time of a whole round (both paths); the ratios are in each benchmark's ``extra_info`` and printed by
``compare_hot_paths.py``.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pytest_benchmark")

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_trainer.config import load_config
from ragen_trainer.critic import PolicyWithCritic, attach_critic
from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf_generate import left_pad
from ragen_trainer.packing import pack, use_packed_attention
from ragen_trainer.rollout import collect_rollouts
from ragen_trainer.update import action_mask, token_logprobs
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer, padded_batch

#: Rounds per group (each times both paths once); the group's ratio is the median of the rounds' ratios.
ROUNDS = 21
#: About how long one timed unit of a path lasts (seconds of CPU time): its call repeated that long. A unit of ~6 ms
#: (the env path's 200 turns) could lose half of itself to one time slice of another job; a quarter second loses a
#: few per cent at most.
UNIT_S = 0.25
#: The decode group's rounds: each of its calls already lasts about a second (both paths generate 16 replies).
DECODE_ROUNDS = 11
#: The environment variable that adds work to every ragen path (a fraction of its own time; see the module docstring).
SLOWDOWN_ENV = "RAGEN_HOT_PATH_SLOWDOWN"
#: The clock of the timed units: this process's CPU time (see the module docstring). ``perf_counter`` is kept as well.
clock = time.process_time


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _model(tokenizer, hidden=256, layers=4, critic=None):
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer, hidden_size=hidden, num_layers=layers)
    if critic:
        attach_critic(model, critic)
    use_packed_attention(model)
    return model


@pytest.fixture(scope="module")
def bandit_batch(tokenizer):
    """8 Bandit rollouts of one initial state (one group: the prompt shared by all) from the random model."""
    model = _model(tokenizer)
    # the replies-only mask: the hot paths are timed on the model's own tokens
    cfg = load_config("starpo-s").replace(env_id="ragen/Bandit-v0", enable_think=False, loss_mask="replies")
    engine = HFEngine(model, tokenizer, batch_size=16)
    batch = collect_rollouts(engine, tokenizer, "ragen/Bandit-v0", [0], 8, settings=cfg.rollout_settings(),
                             env_kwargs=cfg.env_make_kwargs(),
                             sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=0))
    trajs = batch.trajectories
    return trajs, action_mask(trajs, max(len(t.input_ids) for t in trajs) - 1)


def _padded_logprobs(model, ids, attn, mask):
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) * mask


def slowdown_fraction() -> float:
    """The extra work asked of every ragen path by ``RAGEN_HOT_PATH_SLOWDOWN`` (0: none)."""
    text = os.environ.get(SLOWDOWN_ENV, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        pytest.fail(f"{SLOWDOWN_ENV}={text!r}: expected a number >= 0 (0.3 gives every ragen path 30 % more work)",
                    pytrace=False)
    return value


def with_slowdown(path: Callable[[], object], fraction: float) -> Callable[[], object]:
    """``path`` followed, on every call, by a busy loop of ``fraction`` times that call's CPU time: ``fraction`` more
    work, which a machine's load slows as it slows the path itself (``path`` unchanged when ``fraction`` is 0)."""
    if not fraction:
        return path

    def slowed() -> None:
        t0 = clock()
        path()
        end = clock() + fraction * (clock() - t0)
        while clock() < end:
            pass

    return slowed


def calls_per_unit(path: Callable[[], object]) -> int:
    """How many calls of ``path`` make a timed unit of about :data:`UNIT_S` (after one warm-up call: the first call's
    allocations and caches stay out of every unit)."""
    path()
    t0 = clock()
    path()
    return max(1, round(UNIT_S / max(clock() - t0, 1e-6)))


def run_paired(benchmark, ragen: Callable[[], object], reference: Callable[[], object], rounds: int = ROUNDS) -> None:
    """Time ``ragen`` and ``reference`` in ``rounds`` paired rounds (see the module docstring) through ``benchmark``
    (which times each whole round). ``benchmark.extra_info`` gets per round each path's CPU time per call
    (``ragen_s``, ``reference_s``) and their ratio (``ratios``), the group's ``ratio`` (their median), the calls per
    unit (``calls``), the wall-clock times per call (``ragen_wall_s``, ``reference_wall_s``) and the ``slowdown``."""
    fraction = slowdown_fraction()
    paths = {"ragen": with_slowdown(ragen, fraction), "reference": reference}
    calls = {name: calls_per_unit(path) for name, path in paths.items()}
    cpu: dict[str, list[float]] = {name: [] for name in paths}
    wall: dict[str, list[float]] = {name: [] for name in paths}

    def unit(name: str) -> None:
        path, n = paths[name], calls[name]
        w0, c0 = time.perf_counter(), clock()
        for _ in range(n):
            path()
        cpu[name].append((clock() - c0) / n)
        wall[name].append((time.perf_counter() - w0) / n)

    def paired_round() -> None:
        unit("reference")
        unit("ragen")

    benchmark.pedantic(paired_round, rounds=rounds, iterations=1, warmup_rounds=0)
    ratios = [r / f for r, f in zip(cpu["ragen"], cpu["reference"])]
    benchmark.extra_info.update({
        "clock": "process_time", "calls": calls, "slowdown": fraction,
        "ragen_s": cpu["ragen"], "reference_s": cpu["reference"], "ratios": ratios,
        "ratio": statistics.median(ratios),
        "ragen_wall_s": wall["ragen"], "reference_wall_s": wall["reference"],
    })


@pytest.mark.quick
@pytest.mark.benchmark(group="update")
def test_update_micro_batch(benchmark, tokenizer, bandit_batch):
    trajs, mask = bandit_batch
    model = _model(tokenizer)
    policy = PolicyWithCritic(model)
    packed = pack(trajs, mask)
    ids, attn = padded_batch(trajs)

    def backward(logp):
        (-(logp * mask).sum() / mask.sum()).backward()

    def ragen():
        model.zero_grad(set_to_none=True)
        backward(token_logprobs(policy, packed, mask, temperature=1.0, entropy=True, values=False)[0])

    def reference():
        model.zero_grad(set_to_none=True)
        backward(_padded_logprobs(model, ids, attn, mask))

    run_paired(benchmark, ragen, reference)


@pytest.mark.quick
@pytest.mark.benchmark(group="scoring")
def test_scoring_pass(benchmark, tokenizer, bandit_batch):
    trajs, mask = bandit_batch
    model = _model(tokenizer).eval()
    policy = PolicyWithCritic(model)
    packed = pack(trajs, mask)
    ids, attn = padded_batch(trajs)

    @torch.no_grad()
    def ragen():
        token_logprobs(policy, packed, mask, temperature=1.0, entropy=False, values=False)

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
    ids, attn = left_pad(prompts, tokenizer.pad_token_id)

    @torch.no_grad()
    def ragen():
        engine.generate(prompts, params)

    @torch.no_grad()
    def reference():
        model.generate(input_ids=ids, attention_mask=attn, do_sample=True, max_new_tokens=32,
                       pad_token_id=tokenizer.pad_token_id)

    run_paired(benchmark, ragen, reference, rounds=DECODE_ROUNDS)


@pytest.mark.quick
@pytest.mark.benchmark(group="env")
def test_env_turns(benchmark):
    """FrozenLake turns, 200 a call (a unit repeats the call ~40 times): through the turn protocol (a reply parsed,
    the next prompt written) vs raw steps."""
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
