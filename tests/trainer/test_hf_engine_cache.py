"""HFEngine, ragen's decoding loop: the same trajectories as ``model.generate`` (GenerateEngine), with the KV cache
kept across turns, shared group prompts, stop strings and continuous batching."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ragen_envs.driver import AgentReply, rollout_jobs
from ragen_trainer.engines.base import GenerationRequest, SamplingParams, stop_string_end
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf.cache import common_prefix
from ragen_trainer.engines.hf.scheduler import MIN_SHARED_PREFIX
from ragen_trainer.engines.hf_generate import GenerateEngine
from ragen_trainer.rollout import collect_rollouts
from tests.trainer.conftest import latest_rollout

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
#: The rollout settings of these engine comparisons (only the replies trained, cleaned replies).
LATEST = latest_rollout()


def _prompt(tokenizer, text):
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(chat, add_special_tokens=False)["input_ids"])


def _teacher_forced(model, ids):
    """Log-prob of every token of ``ids`` given the ones before it, from one full forward pass (no cache)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return [0.0] + torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1).tolist()


def _signature(batch):
    return [(t.input_ids, t.loss_mask, t.replies, t.turn_rewards, t.finish_reasons) for t in batch.trajectories]


# ------------------------------------------------------------------------------------------------ parity
@pytest.mark.parametrize(
    ("env_id", "env_kwargs"),
    [
        ("ragen/FrozenLake-v0", {}),
        ("ragen/Bandit-v0", {}),
        ("ragen/Sokoban-v0", {"protocol": {"stop_after_answer": False}}),
    ],
)
def test_greedy_rollouts_are_token_identical_to_model_generate(tiny_model, tiny_tokenizer, env_id, env_kwargs):
    seeds, group = [0, 1], 3
    old = collect_rollouts(GenerateEngine(tiny_model, tiny_tokenizer), tiny_tokenizer, env_id, seeds, group,
                           settings=LATEST, sampling=GREEDY, env_kwargs=env_kwargs)  # fmt: skip
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=4)  # fewer rows than episodes: continuous batching
    new = collect_rollouts(engine, tiny_tokenizer, env_id, seeds, group, settings=LATEST, sampling=GREEDY,
                           env_kwargs=env_kwargs)  # fmt: skip
    assert _signature(new) == _signature(old)
    for a, b in zip(old.trajectories, new.trajectories):
        assert b.old_logprobs == pytest.approx(a.old_logprobs, abs=1e-4)
    assert engine.stats["reused_tokens"] > 0  # the group's shared prompt at least


def multi_turn_episodes(model, tokenizer) -> tuple[HFEngine, list]:
    """Four-turn FrozenLake episodes sampled by ``HFEngine`` on ``model``: the engine and the episodes of more than
    one turn (each reusing its parked cache). The sampled ids are kept (the default re-tokenises cleaned replies: no
    sampling log-probs, and a reply whose re-tokenisation differs from the sample cannot reuse the parked cache)."""
    engine = HFEngine(model, tokenizer, batch_size=8)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    batch = collect_rollouts(engine, tokenizer, "ragen/FrozenLake-v0", [0, 1], 2, sampling=sampling,
                             env_kwargs={"protocol": {"stop_after_answer": False, "max_turns": 4}},
                             settings=latest_rollout(reply_tokens="sampled"))  # fmt: skip
    multi_turn = [t for t in batch.trajectories if len(t.turn_spans) > 1]
    assert multi_turn, "the tiny model's replies should not end every episode in one turn"
    return engine, multi_turn


def test_cache_reuse_across_turns_gives_the_log_probs_of_a_full_re_encode(tiny_model, tiny_tokenizer):
    engine, multi_turn = multi_turn_episodes(tiny_model, tiny_tokenizer)
    # Turns after the first re-encoded only the env's delta: most of every later prompt came from the parked cache.
    later_prompt_tokens = sum(t.turn_spans[k][0] for t in multi_turn for k in range(1, len(t.turn_spans)))
    assert engine.stats["reused_tokens"] >= later_prompt_tokens * 0.5
    for traj in multi_turn:
        full = _teacher_forced(tiny_model, traj.input_ids)
        for pos, trained in enumerate(traj.loss_mask):
            if trained:
                assert traj.old_logprobs[pos] == pytest.approx(full[pos], abs=1e-4)


def test_parked_cache_budget_and_eviction_do_not_change_results(tiny_model, tiny_tokenizer):
    kwargs = {"env_kwargs": {"protocol": {"stop_after_answer": False}}, "sampling": GREEDY, "settings": LATEST}
    cached = collect_rollouts(HFEngine(tiny_model, tiny_tokenizer), tiny_tokenizer, "ragen/FrozenLake-v0", [4], 3,
                              **kwargs)  # fmt: skip
    uncached = HFEngine(tiny_model, tiny_tokenizer, max_parked_tokens=0)
    plain = collect_rollouts(uncached, tiny_tokenizer, "ragen/FrozenLake-v0", [4], 3, **kwargs)
    assert _signature(plain) == _signature(cached)


def test_a_prompt_that_departs_from_the_parked_cache_reuses_the_common_prefix(tiny_model, tiny_tokenizer):
    # A cleaned, re-tokenised reply (reply_tokens="cleaned") makes the next prompt differ from the parked cache
    # inside the last reply: the keys before the first differing token are still right and are reused.
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=4)
    prompt = _prompt(tiny_tokenizer, "Arms: Dragon, Phoenix. Choose one.")
    with engine.session(GREEDY) as session:
        session.submit(GenerationRequest(key="ep", prompt=prompt))
        first = []
        while session.busy:
            first += session.step()
        ((_, reply),) = first
        rewritten = prompt + [
            t for t in tiny_tokenizer("<answer>Dragon</answer>", add_special_tokens=False)["input_ids"]
        ]
        rewritten += _prompt(tiny_tokenizer, "Reward: 1")[1:]
        before = dict(engine.stats)
        session.submit(GenerationRequest(key="ep", prompt=rewritten))
        second = []
        while session.busy:
            second += session.step()
    common = next(i for i, (a, b) in enumerate(zip(rewritten, prompt + reply.token_ids)) if a != b)
    assert engine.stats["reused_tokens"] - before["reused_tokens"] == common >= len(prompt)
    assert engine.stats["prefill_tokens"] - before["prefill_tokens"] == len(rewritten) - common
    fresh = HFEngine(tiny_model, tiny_tokenizer).generate([rewritten], GREEDY)[0]
    ((_, again),) = second
    assert again.token_ids == fresh.token_ids
    assert again.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)


# ------------------------------------------------------------------------------------------------ sharing, batching
def test_identical_prompts_are_encoded_once(tiny_model, tiny_tokenizer):
    prompt = _prompt(tiny_tokenizer, "Arms: Dragon, Phoenix. Choose one.")
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=8)
    replies = engine.generate([prompt] * 4, SamplingParams(max_new_tokens=6, seed=1))
    assert engine.stats["prefill_tokens"] == len(prompt)
    assert engine.stats["reused_tokens"] == 3 * len(prompt)
    assert len({tuple(r.token_ids) for r in replies}) > 1  # each row samples its own reply


def test_seeded_replies_do_not_depend_on_the_batch(tiny_model, tiny_tokenizer):
    prompts = [_prompt(tiny_tokenizer, text) for text in ("Turn 1:\nState:\n_ _ P O", "reward", "think answer")]
    params = SamplingParams(max_new_tokens=10, seed=11)
    together = HFEngine(tiny_model, tiny_tokenizer, batch_size=8).generate(prompts, params)
    one_row = HFEngine(tiny_model, tiny_tokenizer, batch_size=1).generate(prompts, params)
    assert [r.token_ids for r in together] == [r.token_ids for r in one_row]
    assert [r.token_ids for r in together] == [
        r.token_ids for r in HFEngine(tiny_model, tiny_tokenizer, batch_size=2).generate(prompts, params)
    ]


def test_continuous_batching_refills_rows_as_replies_end(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=2)
    prompts = [_prompt(tiny_tokenizer, f"turn {i} reward") for i in range(5)]
    limits = [1, 8, 2, 8, 3]
    finished_at: dict[int, int] = {}
    with engine.session(SamplingParams(temperature=0, max_new_tokens=8)) as session:
        for key, (prompt, limit) in enumerate(zip(prompts, limits)):
            session.submit(GenerationRequest(key, prompt=prompt, max_new_tokens=limit))
        step = 0
        while session.busy:
            step += 1
            for key, result in session.step():
                finished_at[key] = step
                assert len(result.token_ids) <= limits[key]
    assert set(finished_at) == set(range(5))
    # With 2 rows, 22 tokens at most one per row and step: a refilled batch needs no more than ~11 steps, a batch
    # that waits for its slowest row (1+8, then 2+8, then 3) would need 8 + 8 + 3.
    assert step <= 13


# ------------------------------------------------------------------------------------------------ stop strings
@pytest.mark.parametrize("engine_cls", [HFEngine, GenerateEngine])
def test_stop_strings_end_replies_and_stay_in_the_text(tiny_model, tiny_tokenizer, engine_cls):
    prompts = [_prompt(tiny_tokenizer, text) for text in ("Arms: Dragon, Phoenix.", "State: _ _ P O", "reward")]
    free = engine_cls(tiny_model, tiny_tokenizer).generate(prompts, SamplingParams(max_new_tokens=30, seed=2))
    # A stop string the free replies contain: the text of two tokens in the middle of the first reply.
    first = free[0].token_ids
    assert len(first) >= 6
    stop = tiny_tokenizer.decode(first[3:5], skip_special_tokens=True)
    assert stop.strip()
    params = SamplingParams(max_new_tokens=30, seed=2, stop=(stop,))
    cut = engine_cls(tiny_model, tiny_tokenizer).generate(prompts, params)
    for before, after in zip(free, cut):
        end = stop_string_end(tiny_tokenizer, before.token_ids, (stop,))
        if end is None:
            assert after.token_ids == before.token_ids
            continue
        assert after.token_ids == before.token_ids[:end]
        assert after.finish_reason == "stop" and after.text.endswith(stop) and after.text.count(stop) == 1
        assert len(after.logprobs) == len(after.token_ids)
    assert len(cut[0].token_ids) <= 5


def test_rollouts_stop_at_answer_by_default(tiny_model, tiny_tokenizer):
    """The protocol's ``stop_after_answer`` (default on) reaches the engine: no reply runs past ``</answer>``."""

    ids = tiny_tokenizer("Left</answer> and then some more text", add_special_tokens=False)["input_ids"]
    bias = torch.zeros(len(tiny_tokenizer))

    def forced(module, args, kwargs, output):  # the model writes "Left</answer> and then some more text"
        position = kwargs["position_ids"][:, -1:]  # the last input's position tells how many tokens are written
        logits = output.logits.clone()
        for row in range(logits.shape[0]):
            written = int(position[row, 0]) - forced.last_prompt_position
            token = ids[min(written, len(ids) - 1)]
            logits[row, -1] = bias.clone()
            logits[row, -1, token] = 100.0
        output.logits = logits
        return output

    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=4)
    prompt = _prompt(tiny_tokenizer, "State: _ _ P O")
    forced.last_prompt_position = len(prompt) - 1
    handle = tiny_model.register_forward_hook(forced, with_kwargs=True)
    try:
        stopped = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=20, stop=("</answer>",)))[0]
    finally:
        handle.remove()
    assert stopped.text == "Left</answer>" and stopped.finish_reason == "stop"
    assert tiny_tokenizer.decode(stopped.token_ids) == "Left</answer>"


def test_protocol_stop_strings_reach_the_engine(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, ["<think>go</think><answer>Left</answer>"])
    seen = []
    original = engine.generate

    def recording(prompts, params):
        seen.append(params.stop)
        return original(prompts, params)

    engine.generate = recording
    collect_rollouts(engine, tiny_tokenizer, "ragen/FrozenLake-v0", [0], 1, settings=LATEST, sampling=GREEDY)
    collect_rollouts(engine, tiny_tokenizer, "ragen/FrozenLake-v0", [0], 1, settings=LATEST, sampling=GREEDY,
                     env_kwargs={"protocol": {"stop_after_answer": False}})  # fmt: skip
    assert seen[0] == ("</answer>",) and seen[-1] == ()


# ------------------------------------------------------------------------------------------------ the driver
class _SlowEnvAgent:
    """A streaming agent answering every turn with a fixed reply after ``delay`` polls (a stand-in for a model)."""

    def __init__(self, delay: int) -> None:
        self.delay, self.waiting, self.released = delay, {}, []

    def submit(self, episode):
        self.waiting[id(episode)] = [episode, self.delay]

    def poll(self):
        ready = []
        for key, item in list(self.waiting.items()):
            item[1] -= 1
            if item[1] <= 0:
                ready.append((item[0], AgentReply("<think>x</think><answer>Up</answer>")))
                del self.waiting[key]
        return ready

    def pending(self):
        return bool(self.waiting)

    def release(self, episode):
        self.released.append(episode.seed)

    def finish_stream(self):
        self.waiting.clear()


@pytest.mark.parametrize("env_workers", [0, 3])
def test_streaming_driver_plays_every_job_in_order(env_workers):
    from ragen_envs.driver import play_episodes

    agent = _SlowEnvAgent(delay=2)
    jobs = rollout_jobs([0, 1, 2], 2)
    episodes = play_episodes("ragen/FrozenLake-v0", jobs, agent, batch_size=4, env_workers=env_workers)
    assert [(e.seed, e.rollout) for e in episodes] == [(j.seed, j.rollout) for j in jobs]
    assert all(e.done and e.env is None and e.turns for e in episodes)
    assert sorted(agent.released) == sorted(j.seed for j in jobs)
    inline = play_episodes("ragen/FrozenLake-v0", jobs, _SlowEnvAgent(delay=1), batch_size=2)
    assert [[t.observation for t in e.turns] for e in inline] == [[t.observation for t in e.turns] for e in episodes]


def test_streaming_driver_records_agent_errors():
    from ragen_envs.driver import play_episodes

    class Broken(_SlowEnvAgent):
        def poll(self):
            raise RuntimeError("engine fell over")

    episodes = play_episodes("ragen/Bandit-v0", rollout_jobs([0, 1], 1), Broken(1), on_error="record")
    assert all(e.error and "engine fell over" in e.error for e in episodes)
    with pytest.raises(RuntimeError, match="engine fell over"):
        play_episodes("ragen/Bandit-v0", rollout_jobs([0], 1), Broken(1))


def test_io_bound_envs_step_in_threads_while_the_model_generates(tiny_model, tiny_tokenizer, monkeypatch):
    """WebShop declares ``io_bound``: its HTTP steps run in the driver's env threads, with the real engine, and the
    episodes are those of inline stepping."""
    import threading

    from ragen_envs import driver

    threads: set[str] = set()
    original = driver._step

    def recording_step(episode, reply):
        threads.add(threading.current_thread().name)
        return original(episode, reply)

    monkeypatch.setattr(driver, "_step", recording_step)
    kwargs = {"env_kwargs": {"num_products": 64, "protocol": {"max_turns": 2}}, "sampling": GREEDY, "settings": LATEST}
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=2)
    threaded = collect_rollouts(engine, tiny_tokenizer, "ragen/WebShop-v0", [0, 1], 2, **kwargs)
    assert threads and all(name.startswith("ragen-env") for name in threads)
    assert all(len(t.turn_spans) >= 1 for t in threaded.trajectories)
    inline = collect_rollouts(GenerateEngine(tiny_model, tiny_tokenizer), tiny_tokenizer, "ragen/WebShop-v0", [0, 1], 2,
                              **kwargs)  # fmt: skip
    assert _signature(inline) == _signature(threaded)


def test_models_with_sliding_window_layers_are_refused_with_the_engine_to_use(tiny_tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=16,
                         layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    with pytest.raises(ValueError, match="sliding_attention.*hf-generate"):
        HFEngine(Qwen2ForCausalLM(config), tiny_tokenizer)


def test_models_that_do_not_call_the_attention_interface_are_refused(tiny_model, tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(type(tiny_model), "_supports_attention_backend", False)
    with pytest.raises(ValueError, match="attention interface.*hf-generate"):
        HFEngine(tiny_model, tiny_tokenizer)


# ------------------------------------------------------------------------------------------------ packed prefill
def test_distinct_prompts_share_the_encoding_of_their_common_head(tiny_model, tiny_tokenizer):
    # Distinct states of one env: the chat template's system head and the rules are the same, the board differs.
    rules = "You are on a frozen lake. Reach the goal G without falling into a hole O. Answer Left, Right, Up, Down."
    boards = ["_ _ P O", "P _ _ O", "_ O P _", "O _ _ P"]
    prompts = [_prompt(tiny_tokenizer, f"{rules}\nState:\n{board}") for board in boards]
    head = min(common_prefix(prompts[0], p) for p in prompts[1:])
    assert head >= MIN_SHARED_PREFIX
    params = SamplingParams(temperature=0, max_new_tokens=1)
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=2)  # two rows: the last two are admitted later
    with engine.session(params) as session:
        for key, prompt in enumerate(prompts):
            session.submit(GenerationRequest(key=key, prompt=prompt))
        results = {}
        while session.busy:
            results.update(session.step())
    # The head is encoded once (by the first admission) and reused by all four prompts, the later two included.
    assert engine.stats["prefill_tokens"] == head + sum(len(p) - head for p in prompts)
    assert engine.stats["reused_tokens"] == 4 * head
    for key, prompt in enumerate(prompts):
        with torch.no_grad():
            logits = tiny_model(torch.tensor([prompt])).logits[0, -1].float()
        expected = torch.log_softmax(logits, -1)
        assert results[key].token_ids == [int(expected.argmax())]
        assert results[key].logprobs[0] == pytest.approx(float(expected.max()), abs=1e-4)


def test_shared_prefixes_change_no_reply_of_a_multi_turn_rollout(tiny_model, tiny_tokenizer):
    kwargs = {"sampling": SamplingParams(temperature=0, max_new_tokens=12), "progress": False, "settings": LATEST}
    runs = [collect_rollouts(HFEngine(tiny_model, tiny_tokenizer, batch_size=4, share_prefixes=share), tiny_tokenizer,
                             "ragen/FrozenLake-v0", [0, 1, 2], 2, **kwargs) for share in (False, True)]  # fmt: skip
    assert _signature(runs[0]) == _signature(runs[1])


def test_shared_prefixes_are_a_checked_option(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="share_prefixes"):
        HFEngine(tiny_model, tiny_tokenizer, share_prefixes="yes")


def test_packed_prefill_gives_each_prompt_the_logits_of_its_own_forward_pass(tiny_model, tiny_tokenizer):
    # Prompts of different lengths, one with a parked prefix: encoded together, each must see only its own tokens.
    prompts = [_prompt(tiny_tokenizer, text) for text in ("a", "Turn 1:\nState:\n_ _ P O\nGo left or right?", "ok")]
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=8, share_prefixes=False)  # shared heads: the next test
    params = SamplingParams(temperature=0, max_new_tokens=1)
    with engine.session(params) as session:
        session.submit(GenerationRequest(key="parked", prompt=prompts[0]))
        while session.busy:
            session.step()
        follow_up = prompts[0] + _prompt(tiny_tokenizer, "Reward: 0")[1:]
        for key, prompt in [("parked", follow_up), (1, prompts[1]), (2, prompts[2])]:
            session.submit(GenerationRequest(key=key, prompt=prompt))
        before = dict(engine.stats)
        results = dict(session.step())
    assert engine.stats["reused_tokens"] - before["reused_tokens"] == len(prompts[0])  # one pass, one reused prefix
    for key, prompt in [("parked", follow_up), (1, prompts[1]), (2, prompts[2])]:
        with torch.no_grad():
            logits = tiny_model(torch.tensor([prompt])).logits[0, -1].float()
        expected = torch.log_softmax(logits, -1)
        assert results[key].token_ids == [int(expected.argmax())]
        assert results[key].logprobs[0] == pytest.approx(float(expected.max()), abs=1e-4)


def test_prefill_in_small_passes_gives_the_same_rollouts(tiny_model, tiny_tokenizer):
    kwargs = {"sampling": SamplingParams(temperature=1.0, max_new_tokens=8, seed=5), "settings": LATEST}
    one_pass = collect_rollouts(HFEngine(tiny_model, tiny_tokenizer), tiny_tokenizer, "ragen/FrozenLake-v0", [0, 1], 2,
                                **kwargs)  # fmt: skip
    small = HFEngine(tiny_model, tiny_tokenizer, prefill_tokens=1)  # every prompt in a pass of its own
    many_passes = collect_rollouts(small, tiny_tokenizer, "ragen/FrozenLake-v0", [0, 1], 2, **kwargs)
    assert _signature(many_passes) == _signature(one_pass)
    for a, b in zip(one_pass.trajectories, many_passes.trajectories):
        assert b.old_logprobs == pytest.approx(a.old_logprobs, abs=1e-4)


def test_the_models_attention_implementation_is_restored_after_a_prefill(tiny_model, tiny_tokenizer, monkeypatch):
    before = tiny_model.config._attn_implementation
    prompt = _prompt(tiny_tokenizer, "Arms: Dragon, Phoenix. Choose one.")
    HFEngine(tiny_model, tiny_tokenizer).generate([prompt], GREEDY)
    assert tiny_model.config._attn_implementation == before

    def broken(*args, **kwargs):
        assert tiny_model.config._attn_implementation != before  # the packed attention is on during the pass
        raise RuntimeError("out of memory")

    monkeypatch.setattr(tiny_model, "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        HFEngine(tiny_model, tiny_tokenizer).generate([prompt], GREEDY)
    assert tiny_model.config._attn_implementation == before


# ------------------------------------------------------------------------------------------------ decode segments
def _segments_cost(segments, cost):
    return sum((stop - start) * (window - first) + cost for start, stop, first, window in segments)


@pytest.mark.parametrize("seed", range(20))
def test_row_segments_are_the_cheapest_cover_of_the_rows(seed):
    import itertools
    import random

    from ragen_trainer.engines.hf.runner import row_segments as _row_segments

    rng = random.Random(seed)
    rows = rng.randint(1, 7)
    columns = [rng.choice([rng.randint(1, 40), rng.randint(200, 900)]) for _ in range(rows)]
    segments = _row_segments(columns, cost=100)
    # Consecutive, covering every row once, each window the widest row's columns (no row reads less than it holds).
    assert [s[0] for s in segments] == [0] + [s[1] for s in segments[:-1]] and segments[-1][1] == rows
    assert all(first == 0 and window == max(columns[start:stop]) for start, stop, first, window in segments)
    # Optimal: no way of cutting the rows costs less (brute force over every set of cut points).
    cheapest = min(
        _segments_cost([(a, b, 0, max(columns[a:b])) for a, b in zip((0, *cuts), (*cuts, rows))], 100)
        for k in range(rows) for cuts in itertools.combinations(range(1, rows), k)
    )  # fmt: skip
    assert _segments_cost(segments, 100) == cheapest


def test_rows_of_close_lengths_attend_in_one_segment_and_far_ones_apart():
    from ragen_trainer.engines.hf.runner import row_segments as _row_segments

    assert _row_segments([500, 510, 505, 498], cost=160) == [(0, 4, 0, 510)]
    assert _row_segments([900, 40, 41, 905], cost=160) == [(0, 1, 0, 900), (1, 3, 0, 41), (3, 4, 0, 905)]
    # Rows that read their first columns elsewhere (shared with a group) read only the rest on their own.
    assert _row_segments([500, 510, 40, 41], cost=160, starts=[300, 300, 0, 0]) == [(0, 2, 300, 510), (2, 4, 0, 41)]


def test_segmented_decode_attention_gives_the_replies_of_one_window(tiny_model, tiny_tokenizer, monkeypatch):
    from ragen_trainer.engines.hf import runner

    # Rows of very different lengths decoded together: a long multi-turn context beside short first turns.
    long_prompt = _prompt(tiny_tokenizer, "Turn 1:\nState:\n_ _ P O\n" * 30 + "Go left or right?")
    prompts = [long_prompt, _prompt(tiny_tokenizer, "reward"), _prompt(tiny_tokenizer, "think, then answer")]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=4)
    real = runner.row_segments
    monkeypatch.setattr(runner, "row_segments", lambda columns, starts: [(0, len(columns), 0, max(columns))])
    one_window = HFEngine(tiny_model, tiny_tokenizer, batch_size=4, share_attention=False)
    expected = one_window.generate(prompts, params)
    monkeypatch.setattr(runner, "row_segments", lambda columns, starts: real(columns, cost=0))  # a window per row
    segmented = HFEngine(tiny_model, tiny_tokenizer, batch_size=4, share_attention=False)
    replies = segmented.generate(prompts, params)
    assert [r.token_ids for r in replies] == [r.token_ids for r in expected]
    for a, b in zip(expected, replies):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert segmented.stats["attended_columns"] == segmented.stats["cached_columns"]  # no padding read
    assert one_window.stats["attended_columns"] > one_window.stats["cached_columns"]


# ------------------------------------------------------------------------------------------------ sampling
@pytest.mark.parametrize("vocab", [5, 256, 1000, 49152])
def test_blocked_inverse_cdf_sampling_draws_the_token_of_a_full_cumsum(vocab):
    from ragen_trainer.engines.hf.sampler import inverse_cdf_sample as _inverse_cdf_sample

    rows = 64
    source = torch.Generator().manual_seed(vocab)
    logits = torch.randn(rows, vocab, generator=source) * 4
    logits[::3, torch.randperm(vocab, generator=source)[: vocab // 2]] = float("-inf")  # filtered out: probability 0
    probs = torch.softmax(logits, -1)
    chosen = _inverse_cdf_sample(probs, [torch.Generator().manual_seed(i) for i in range(rows)])
    # The reference: the first token whose float64 cumulative probability exceeds u times the total.
    uniforms = [float(torch.rand((), generator=torch.Generator().manual_seed(i))) for i in range(rows)]
    cdf = probs.double().cumsum(-1)
    expected = [int(torch.searchsorted(cdf[r], uniforms[r] * cdf[r, -1], right=True).clamp(max=vocab - 1))
                for r in range(rows)]  # fmt: skip
    assert chosen.tolist() == expected
    assert bool((probs.gather(-1, chosen[:, None]) > 0).all())


def test_sampling_never_draws_a_zero_probability_token_at_the_edges():
    from ragen_trainer.engines.hf.sampler import inverse_cdf_sample as _inverse_cdf_sample

    probs = torch.zeros(4, 600)
    probs[0, 0] = 1.0  # only the first token
    probs[1, 599] = 1.0  # only the last token (in the padded last block)
    probs[2, 255] = probs[2, 256] = 0.5  # across a block boundary
    probs[3, 300:310] = 0.1
    for seed in range(50):
        chosen = _inverse_cdf_sample(probs, [torch.Generator().manual_seed(seed + r) for r in range(4)])
        assert bool((probs.gather(-1, chosen[:, None]) > 0).all()), chosen.tolist()


def _one_reply(session, prompt):
    session.submit(GenerationRequest(key=0, prompt=prompt, seed=7))
    replies = []
    while session.busy:
        replies += session.step()
    return replies[0][1]


def test_sessions_sharing_a_model_give_it_back_when_the_last_one_closes(tiny_model, tiny_tokenizer):
    """Two engines on one model (the two seats of a self-play game): each session samples as if alone, and the model
    gets its train mode and attention implementation back only when both are closed."""
    before = tiny_model.config._attn_implementation
    prompt = _prompt(tiny_tokenizer, "Arms: Dragon, Phoenix. Choose one.")
    params = SamplingParams(max_new_tokens=6)
    with HFEngine(tiny_model, tiny_tokenizer).session(params) as session:
        alone = _one_reply(session, prompt)
    outer = HFEngine(tiny_model, tiny_tokenizer).session(params)
    inner = HFEngine(tiny_model, tiny_tokenizer).session(params)
    outer.close()
    assert not tiny_model.training and tiny_model.config._attn_implementation != before  # the inner one still uses it
    assert _one_reply(inner, prompt).token_ids == alone.token_ids
    inner.close()
    inner.close()  # closing twice gives nothing back twice
    assert tiny_model.training and tiny_model.config._attn_implementation == before


def test_running_the_model_while_a_session_is_open_fails_with_what_to_do(tiny_model, tiny_tokenizer):
    with HFEngine(tiny_model, tiny_tokenizer).session(GREEDY), pytest.raises(RuntimeError, match="close it"):
        tiny_model(torch.tensor([[1, 2, 3]]))
    assert tiny_model(torch.tensor([[1, 2, 3]])).logits.shape[1] == 3  # closed: the model's own attention again


# ------------------------------------------------------------------------------------------------ shared attention
def test_rows_holding_copies_of_one_computation_are_grouped_by_their_deepest_shared_pass():
    import torch

    from ragen_trainer.engines.hf.cache import MIN_SHARED_COLUMNS, BatchCache

    cache = BatchCache((1, 4, 1), 6, dtype=torch.float32, device="cpu")
    cache.reserve(200)
    head = cache.open_row(50)  # a shared head, encoded once
    head_lineage = cache.lineage[head]
    cache.close_last_row()
    layers = [(torch.zeros(1, 1, 50, 4), torch.zeros(1, 1, 50, 4))]
    first = cache.open_row(120, layers, 50, head_lineage)  # a group's first prompt on the head ...
    second = cache.open_row(120)
    cache.fill_row(second, first)  # ... and its copy (two requests, one prefill job)
    other = cache.open_row(110, layers, 50, head_lineage)  # another state's prompt on the same head
    lone = cache.open_row(90)  # nothing in common
    groups = {tuple(g.rows): g.columns for g in cache.shared_groups()}
    # The group's rows share their whole first prompt; the other state's row shares only the head, with nobody
    # else left to read it (the group reads its deeper pass), so it reads its own; the lone row shares nothing.
    assert groups == {(first, second): 120}
    parked = cache.lineage[first]
    parked_layers = [(torch.zeros(1, 1, 140, 4), torch.zeros(1, 1, 140, 4))]
    later = cache.open_row(150, parked_layers, 100, parked)  # the group's next turn: 100 columns of its parked cache
    groups = {tuple(g.rows): g.columns for g in cache.shared_groups()}
    assert groups == {(first, second, later): 100}
    cache.move_row(len(cache.lengths) - 1, first)  # the first row finishes: the last takes its place
    assert {tuple(g.rows): g.columns for g in cache.shared_groups()} == {(first, second): 100}
    assert other != lone
    small = BatchCache((1, 4, 1), 2, dtype=torch.float32, device="cpu")
    small.open_row(MIN_SHARED_COLUMNS - 1)
    small.open_row(MIN_SHARED_COLUMNS - 1)
    small.fill_row(1, 0)
    assert small.shared_groups() == []  # too few shared columns to be worth a pass of their own


def test_attention_merged_from_two_parts_by_log_sum_exp_is_one_softmax():
    import torch

    from ragen_trainer.engines.hf.runner import attention_with_lse, attention_with_lse_math

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 4, 8, generator=gen), torch.randn(3, 2, 40, 8, generator=gen),
               torch.randn(3, 2, 40, 8, generator=gen))  # fmt: skip
    mask = torch.zeros(3, 1, 1, 40)
    mask[1, ..., 30:] = torch.finfo(torch.float32).min
    whole, whole_lse = attention_with_lse(q, k, v, mask, 0.3)
    assert torch.allclose(whole, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3),
                          atol=1e-6)  # fmt: skip
    math_out, math_lse = attention_with_lse_math(q, k, v, mask, 0.3)  # the path off the CPU
    assert torch.allclose(math_out, whole, atol=1e-5) and torch.allclose(math_lse, whole_lse, atol=1e-5)
    a, a_lse = attention_with_lse(q, k[:, :, :25], v[:, :, :25], None, 0.3)
    b, b_lse = attention_with_lse(q, k[:, :, 25:], v[:, :, 25:], mask[..., 25:], 0.3)
    total = torch.logaddexp(a_lse, b_lse)
    merged = a * torch.exp(a_lse - total)[..., None] + b * torch.exp(b_lse - total)[..., None]
    assert torch.allclose(merged, whole, atol=1e-6) and torch.allclose(total, whole_lse, atol=1e-5)


def test_shared_attention_reads_a_groups_columns_once_and_changes_no_reply(tiny_model, tiny_tokenizer):
    # GRPO-like rollouts: two states, four episodes each (a group's rows share their first prompt, the states the
    # env's head), four turns reusing parked caches; sampled, so every row's tokens depend on its log-probs.
    def rollouts(share):
        engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=8, share_attention=share)
        batch = collect_rollouts(engine, tiny_tokenizer, "ragen/FrozenLake-v0", [0, 1], 4,
                                 sampling=SamplingParams(temperature=1.0, max_new_tokens=10, seed=3),
                                 env_kwargs={"protocol": {"stop_after_answer": False, "max_turns": 4}},
                                 settings=latest_rollout(reply_tokens="sampled"))  # fmt: skip
        return engine, batch

    plain_engine, plain = rollouts(False)
    shared_engine, shared = rollouts(True)
    assert _signature(shared) == _signature(plain)
    for a, b in zip(plain.trajectories, shared.trajectories):
        assert b.old_logprobs == pytest.approx(a.old_logprobs, abs=1e-4)
    # Without sharing every row reads every column it holds; with it, a group's shared columns are read once.
    assert plain_engine.stats["attended_columns"] == plain_engine.stats["cached_columns"]
    assert shared_engine.stats["attended_columns"] < 0.6 * shared_engine.stats["cached_columns"]
    with pytest.raises(ValueError, match="share_attention"):
        HFEngine(tiny_model, tiny_tokenizer, share_attention="yes")


def test_only_groups_that_save_more_than_they_cost_are_read_apart():
    from ragen_trainer.engines.hf.cache import SharedColumns
    from ragen_trainer.engines.hf.runner import GROUP_COST, SHARED_COST, worth_sharing

    group_of_8 = SharedColumns(0, 240, list(range(8)))  # a GRPO group's first prompt: saves 7 x 240 pairs
    pair = SharedColumns(8, 240, [8, 9])  # two rows: saves 240, less than a group costs
    assert 240 <= GROUP_COST < 7 * 240 and 7 * 240 > SHARED_COST
    assert worth_sharing([group_of_8, pair]) == [group_of_8]
    assert worth_sharing([pair]) == []
    small = SharedColumns(0, 100, list(range(8)))  # worth a group (700 pairs) but not the step's fixed cost
    assert 7 * 100 > GROUP_COST and worth_sharing([small]) == []
