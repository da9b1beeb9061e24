"""Multi-turn rollouts: the loss mask covers exactly the model's tokens, groups share initial states, turn limits,
context limits, reward placement, chat-template variants, and chat (HTTP) engines."""

from __future__ import annotations

import copy
from dataclasses import fields

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.rollout import ChatTokens, after_system_mask, collect_rollouts, placed_rewards
from ragen_trainer.settings import RolloutSettings
from tests.trainer.conftest import latest_rollout

WIN = "<think>The dragon is risky but pays more on average.</think><answer>Dragon</answer>"
BAD = "<think>hmm</think><answer>Unicorn</answer>"


class RecordingEngine:
    """Wraps an engine and keeps every result it returned, to compare with the trajectories."""

    supports_token_ids = True

    def __init__(self, inner):
        self.inner, self.results, self.prompts = inner, [], []

    def generate(self, prompts, params):
        out = self.inner.generate(prompts, params)
        self.prompts.append([list(p) for p in prompts])
        self.results.append(out)
        return out


def collect(*args, max_turns=None, reply_prefix=None, env_kwargs=None, **kwargs):
    """``collect_rollouts`` with protocol settings (turn cap, generation prefix) given as the env's kwargs, and
    rollout settings (``loss_mask``, ``reply_tokens``, ...) as keywords over :func:`latest_rollout`'s."""
    env_kwargs = dict(env_kwargs or {})
    if max_turns is not None:
        env_kwargs["max_turns"] = max_turns
    if reply_prefix is not None:
        env_kwargs["reply_prefix"] = reply_prefix
    settings = latest_rollout(**{f.name: kwargs.pop(f.name) for f in fields(RolloutSettings) if f.name in kwargs})
    return collect_rollouts(*args, settings=settings, env_kwargs=env_kwargs, **kwargs)


def rollouts_no_prefix(*args, **kwargs):
    """``collect`` with the reply prefix off (the scripted replies below are whole replies, tags included) and 5 turns
    (the reference's Bandit has one; the scripted BAD-then-WIN episodes test multi-turn bookkeeping on it)."""
    kwargs.setdefault("reply_prefix", "")
    kwargs.setdefault("max_turns", 5)
    return collect(*args, **kwargs)


def _spans_mask(traj):
    mask = [0] * len(traj.input_ids)
    for start, end in traj.turn_spans:
        for i in range(start, end):
            mask[i] = 1
    return mask


def test_rollout_masks_exactly_the_model_tokens(tiny_model, tiny_tokenizer):
    engine = RecordingEngine(HFEngine(tiny_model, tiny_tokenizer, batch_size=8))
    batch = collect(
        engine,
        tiny_tokenizer,
        "ragen/FrozenLake-v0",
        [0, 1],
        2,
        max_turns=3,
        sampling=SamplingParams(max_new_tokens=16, seed=0),
        reply_tokens="sampled",  # the sampled ids verbatim (the default re-tokenises the cleaned reply)
    )
    assert len(batch) == 4
    assert set(batch.timings) >= {"generation", "environment", "tokenization", "total"}
    # Reconstruct what the engine returned, per episode and turn (live episodes are generated in batch order).
    replies = {i: [] for i in range(4)}
    for turn_results in engine.results:
        live = [i for i in range(4) if len(replies[i]) < batch.trajectories[i].num_turns]
        for i, res in zip(live, turn_results):
            replies[i].append(res)
    for i, traj in enumerate(batch.trajectories):
        assert len(traj.input_ids) == len(traj.loss_mask) == len(traj.old_logprobs)
        assert traj.loss_mask == _spans_mask(traj)
        assert traj.num_turns == len(traj.turn_spans) == len(traj.replies) == len(traj.infos) >= 1
        for (start, end), res in zip(traj.turn_spans, replies[i]):
            assert traj.input_ids[start:end] == res.token_ids  # verbatim, never re-tokenised
            assert traj.old_logprobs[start:end] == res.logprobs
        assert all(lp == 0.0 for lp, m in zip(traj.old_logprobs, traj.loss_mask) if m == 0)
        env_text = tiny_tokenizer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m == 0])
        assert traj.messages[0]["content"] in env_text  # system prompt: env text, masked
        assert "Turn 1:" in env_text and "FrozenLake" in env_text
        # Each turn's prompt is exactly the trajectory's prefix up to that reply.
        for (start, _), prompt in zip(traj.turn_spans, [p for p in _prompts_of(engine, i, batch)]):
            assert traj.input_ids[:start] == prompt
        assert traj.num_turns <= 3


def _prompts_of(engine, index, batch):
    counts = [0] * len(batch)
    out = []
    for prompts in engine.prompts:
        live = [i for i in range(len(batch)) if counts[i] < batch.trajectories[i].num_turns]
        for i, prompt in zip(live, prompts):
            counts[i] += 1
            if i == index:
                out.append(prompt)
    return out


def test_group_rollouts_share_the_initial_state_and_seeded_runs_repeat(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    params = SamplingParams(max_new_tokens=8, seed=3)
    seeds = [0, 3, 5]  # Bandit arm orders: seed 0 Phoenix first, seeds 3 and 5 Dragon first
    batch = collect(engine, tiny_tokenizer, "ragen/Bandit-v0", seeds, 2, sampling=params, max_turns=2)
    groups = batch.groups()
    assert sorted(groups) == list(range(3))
    first_prompt = {}
    for gid, members in groups.items():
        assert [t.seed for t in members] == [seeds[gid]] * 2
        a, b = (t.input_ids[: t.turn_spans[0][0]] for t in members)
        assert a == b  # same initial state, same prompt tokens
        first_prompt[gid] = a
    assert len({tuple(p) for p in first_prompt.values()}) == 2  # Bandit: two arm orders across seeds
    again = collect(engine, tiny_tokenizer, "ragen/Bandit-v0", seeds, 2, sampling=params, max_turns=2)
    assert [t.input_ids for t in again.trajectories] == [t.input_ids for t in batch.trajectories]


def test_scripted_multi_turn_rewards_success_and_reward_placement(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, [BAD, WIN])
    batch = rollouts_no_prefix(  # Bandit is one turn in the reference; two turns here to test multi-turn bookkeeping
        engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 3, sampling=SamplingParams(max_new_tokens=64), max_turns=5
    )
    for traj in batch.trajectories:
        assert traj.num_turns == 2 and traj.success and not traj.truncated
        assert traj.turn_rewards[0] == pytest.approx(-0.1)  # format penalty for the invalid arm
        assert traj.infos[0]["invalid_actions"] == ["Unicorn"] and traj.infos[1]["actions"] == ["Dragon"]
        assert traj.replies == [BAD, WIN]
        assert traj.finish_reasons == ["stop", "stop"]
        # The template renders the same text as the incremental token building (ChatML, replies with <|im_end|>).
        rendered = tiny_tokenizer.apply_chat_template(traj.messages[:-1], tokenize=False)
        assert tiny_tokenizer.decode(traj.input_ids) + "\n" == rendered
        assert "The episode has ended" in traj.messages[-1]["content"]  # final observation kept in messages
        # The model's own <|im_end|> is trained (mask 1), and not written twice.
        end = traj.turn_spans[0][1]
        assert traj.input_ids[end - 1] == tiny_tokenizer.eos_token_id and traj.loss_mask[end - 1] == 1
        assert traj.input_ids[end] != tiny_tokenizer.eos_token_id and traj.loss_mask[end] == 0

        by_traj = placed_rewards(traj, "trajectory")
        by_turn = placed_rewards(traj, "turn")
        assert len(by_traj) == len(by_turn) == len(traj.input_ids)
        last = traj.turn_spans[-1][1] - 1
        assert by_traj[last] == pytest.approx(traj.reward) and sum(by_traj) == pytest.approx(traj.reward)
        assert by_turn[traj.turn_spans[0][1] - 1] == pytest.approx(-0.1)
        assert by_turn[last] == pytest.approx(traj.turn_rewards[1])
        assert sum(1 for r in by_turn if r != 0) <= 2
    with pytest.raises(ValueError, match="placement"):
        placed_rewards(batch.trajectories[0], "token")


def _reference_masks_and_score_position(input_ids, tokenizer):
    """RAGEN 3059df8 ``get_masks_and_scores`` on one unpadded row (``ctx_manager.py`` lines 28-48): the loss mask
    (``turn_indicators > 1``: after the system turn), the response mask (assistant turns) and the score's position, all
    over targets ``input_ids[1:]`` (index ``j`` here is target ``j + 1``)."""
    ids = torch.tensor([input_ids])
    turn_starts = (ids == tokenizer.convert_tokens_to_ids("<|im_start|>")).long()
    indicators = torch.cumsum(turn_starts, dim=-1)
    response = ((indicators % 2 == 1) & (indicators > 1))[0, :-1].long().tolist()
    after_system = (indicators > 1)[0, :-1].long().tolist()
    return after_system, response, len(input_ids) - 2  # score_tensor[:, -1], then [:, 1:]


@pytest.mark.parametrize("prefix", ["", "auto"])
def test_after_system_mask_is_the_paper_runs_mask(tiny_tokenizer, scripted_engine, prefix):
    engine = scripted_engine(tiny_tokenizer, [BAD, WIN])
    kwargs = dict(sampling=SamplingParams(max_new_tokens=64), max_turns=5, reply_prefix=prefix)
    after = collect(engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 2, loss_mask="after_system", **kwargs)
    engine = scripted_engine(tiny_tokenizer, [BAD, WIN])
    replies = collect(engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 2, loss_mask="replies", **kwargs)
    for traj, plain in zip(after.trajectories, replies.trajectories):
        # The conversation the reference trains on: the chat re-rendered without the final state, ending with the
        # template's closing text after the last reply (ChatML "<|im_end|>\n"), tokenised whole.
        rendered = tiny_tokenizer.apply_chat_template(traj.messages[:-1], tokenize=False)
        assert tiny_tokenizer.decode(traj.input_ids) == rendered
        assert traj.input_ids[: len(plain.input_ids)] == plain.input_ids  # only the closing "\n" is added
        assert traj.turn_spans == plain.turn_spans and traj.num_model_tokens == plain.num_model_tokens
        ref_mask, ref_response, score_at = _reference_masks_and_score_position(traj.input_ids, tiny_tokenizer)
        assert traj.loss_mask[1:] == ref_mask
        # env text, role headers and the closing newline are trained; the system turn is not
        system_len = len(ChatTokens(tiny_tokenizer).system_turn_ids(traj.messages[0]["content"]))
        assert traj.loss_mask[: system_len + 1] == [0] * (system_len + 1) and all(traj.loss_mask[system_len + 1 :])
        # the reference's response mask (enable_response_mask) covers ragen's replies and more (headers, newlines)
        assert all(ref_response[j - 1] for j, m in enumerate(plain.loss_mask) if m)
        # the episode's reward sits on the last token, as the reference's score
        rewards = placed_rewards(traj, "trajectory")
        assert rewards[score_at + 1] == pytest.approx(traj.reward) and sum(rewards) == pytest.approx(traj.reward)


def test_after_system_mask_without_a_system_turn():
    assert after_system_mask([5, 6, 7, 8], [5, 6]) == [0, 0, 0, 1]
    assert after_system_mask([5, 6, 7, 8], [9, 9]) == [0, 1, 1, 1]  # no system turn: all but the first token
    assert after_system_mask([5, 6, 7], []) == [0, 1, 1]


def test_max_turns_and_env_turn_limit_truncate(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, [BAD])
    capped = rollouts_no_prefix(
        engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 2, max_turns=2, sampling=SamplingParams(max_new_tokens=64)
    )
    assert all(t.num_turns == 2 and t.truncated and not t.success for t in capped.trajectories)
    # Without max_turns the id's reference limit (Bandit: one turn) ends the episode, also truncated.
    env_limit = rollouts_no_prefix(
        engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 1, sampling=SamplingParams(max_new_tokens=64), max_turns=None
    )
    assert env_limit.trajectories[0].num_turns == 1 and env_limit.trajectories[0].truncated


def test_context_limit_cuts_the_reply_and_truncates(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, [BAD])
    probe = rollouts_no_prefix(
        engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 1, max_turns=1, sampling=SamplingParams(max_new_tokens=64)
    )
    prompt_len = probe.trajectories[0].turn_spans[0][0]
    reply_len = probe.trajectories[0].num_model_tokens
    # Room for half a reply: the reply is cut, and the episode ends truncated at the context limit.
    limit = prompt_len + reply_len // 2
    batch = rollouts_no_prefix(
        engine,
        tiny_tokenizer,
        "ragen/Bandit-v0",
        [0],
        1,
        max_context_tokens=limit,
        sampling=SamplingParams(max_new_tokens=64),
    )
    traj = batch.trajectories[0]
    assert len(traj.input_ids) == limit and traj.truncated and traj.num_turns == 1
    assert traj.finish_reasons == ["length"] and traj.num_model_tokens == reply_len // 2
    # Room for one full reply but not the next prompt: one turn, truncated, nothing appended past the limit.
    limit = prompt_len + reply_len + 5
    traj = rollouts_no_prefix(
        engine,
        tiny_tokenizer,
        "ragen/Bandit-v0",
        [0],
        1,
        max_context_tokens=limit,
        sampling=SamplingParams(max_new_tokens=64),
    ).trajectories[0]
    assert traj.num_turns == 1 and traj.truncated and len(traj.input_ids) <= limit
    with pytest.raises(ValueError, match="max_context_tokens"):
        rollouts_no_prefix(
            engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 1, max_context_tokens=prompt_len, sampling=SamplingParams()
        )


def test_reply_cut_by_max_new_tokens_gets_the_end_marker_as_env_text(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, [BAD])
    traj = rollouts_no_prefix(  # "sampled": the default trains the template's end-of-turn token after every reply
        engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 1, max_turns=2, sampling=SamplingParams(max_new_tokens=4),
        reply_tokens="sampled",
    ).trajectories[0]  # fmt: skip
    assert traj.finish_reasons == ["length", "length"]
    end = traj.turn_spans[0][1]
    assert tiny_tokenizer.eos_token_id not in traj.input_ids[traj.turn_spans[0][0] : end]
    assert traj.input_ids[end] == tiny_tokenizer.eos_token_id and traj.loss_mask[end] == 0  # template's marker


LLAMA3_LIKE = (
    "{{ '<|begin_of_text|>' }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
NO_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize("template", [LLAMA3_LIKE, NO_SYSTEM], ids=["llama3-like", "no-system-role"])
def test_other_chat_templates(tiny_tokenizer, scripted_engine, template):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = template
    chat = ChatTokens(tokenizer)
    assert chat.fold_system == (template is NO_SYSTEM)
    engine = scripted_engine(tokenizer, [BAD, WIN])
    traj = rollouts_no_prefix(  # the model's own stop token kept: the sampled ids (the default cleans them)
        engine, tokenizer, "ragen/Bandit-v0", [0], 1, sampling=SamplingParams(max_new_tokens=64), reply_tokens="sampled"
    ).trajectories[0]
    assert traj.success and traj.num_turns == 2
    assert traj.loss_mask == _spans_mask(traj)
    text = tokenizer.decode(traj.input_ids)
    system = traj.messages[0]["content"]
    assert system.strip() in text and text.count("Turn 1:") == 1 and text.count("Turn 2:") == 1
    if template is NO_SYSTEM:
        assert text.startswith("<start_of_turn>user\n" + system)  # folded into the first user turn
        assert text.count("<start_of_turn>assistant\n") == 2
    else:
        assert text.startswith("<|begin_of_text|>") and text.count("<|begin_of_text|>") == 1
        # The model stopped with <|im_end|>, which this template does not write: its own marker follows as env text.
        # system, user 1, after reply 1, user 2 (the final reply ends with the model's own token).
        assert text.count("<|eot_id|>") == 4 and text.count("<|im_end|><|eot_id|>") == 1


def test_chat_engine_rollout_is_eval_only():
    from ragen_trainer.engines.openai import OpenAIEngine
    from tests.trainer.test_engines import _FakeChatServer

    with _FakeChatServer(reply=WIN) as server:
        engine = OpenAIEngine("fake", server.url, backoff=0.0)
        batch = rollouts_no_prefix(
            engine, None, "ragen/Bandit-v0", [0, 1], 2, sampling=SamplingParams(max_new_tokens=64, seed=0)
        )
    assert len(server.requests) == 4
    first = server.requests[0]["body"]["messages"]
    assert first[0]["role"] == "system" and first[1]["role"] == "user" and "Turn 1:" in first[1]["content"]
    for traj in batch.trajectories:
        assert traj.eval_only and traj.old_logprobs is None and traj.success
        assert traj.input_ids == [] and traj.replies[0].startswith(WIN)


def test_chat_engine_rollout_with_tokenizer_retokenises(tiny_tokenizer):
    from ragen_trainer.engines.openai import OpenAIEngine
    from tests.trainer.test_engines import _FakeChatServer

    with _FakeChatServer(reply=WIN) as server:
        batch = rollouts_no_prefix(
            OpenAIEngine("fake", server.url),
            tiny_tokenizer,
            "ragen/Bandit-v0",
            [0],
            1,
            sampling=SamplingParams(max_new_tokens=64),
        )
    traj = batch.trajectories[0]
    assert traj.eval_only and traj.old_logprobs is None
    start, end = traj.turn_spans[0]
    assert tiny_tokenizer.decode(traj.input_ids[start:end]) == traj.replies[0]
    assert traj.loss_mask == _spans_mask(traj)


def test_bad_arguments(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, [WIN])
    params = SamplingParams()
    with pytest.raises(ValueError, match="env_id.*ragen/Bandit-v0"):
        rollouts_no_prefix(engine, tiny_tokenizer, "ragen/NoSuchEnv-v0", [0], 1, sampling=params)
    with pytest.raises(ValueError, match="group_size"):
        rollouts_no_prefix(engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 0, sampling=params)
    with pytest.raises(ValueError, match="seeds"):
        rollouts_no_prefix(engine, tiny_tokenizer, "ragen/Bandit-v0", [], 1, sampling=params)
    with pytest.raises(ValueError, match="sampling"):
        rollouts_no_prefix(engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 1, sampling={"temperature": 1.0})
    no_template = copy.deepcopy(tiny_tokenizer)
    no_template.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        rollouts_no_prefix(engine, no_template, "ragen/Bandit-v0", [0], 1, sampling=params)
    with pytest.raises(ValueError, match="tokenizer"):
        rollouts_no_prefix(engine, None, "ragen/Bandit-v0", [0], 1, sampling=params)


def test_env_kwargs_reach_the_env(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, ["<think>x</think><answer>Trader</answer>"])
    batch = rollouts_no_prefix(
        engine,
        tiny_tokenizer,
        "ragen/Bandit-v0",
        [0],
        1,
        sampling=SamplingParams(),
        env_kwargs={"low_risk_name": "Trader", "high_risk_name": "Librarian"},
    )
    traj = batch.trajectories[0]
    assert "Librarian" in traj.messages[1]["content"] and traj.infos[0]["actions"] == ["Trader"]
    assert not traj.success


@pytest.mark.slow
def test_smollm2_short_rollout_on_bandit():
    """The bundled SmolLM2-135M-Instruct plays one short Bandit episode end to end (conversion cached once)."""
    from ragen_trainer.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(None, device="cpu")
    engine = HFEngine(model, tokenizer)
    batch = collect(
        engine,
        tokenizer,
        "ragen/Bandit-v0",
        [0],
        2,
        max_turns=2,
        sampling=SamplingParams(max_new_tokens=48, seed=0, temperature=0.7),
    )
    for traj in batch.trajectories:
        assert traj.loss_mask == _spans_mask(traj) and traj.num_turns >= 1
        assert len(traj.old_logprobs) == len(traj.input_ids)
        assert all(r.strip() for r in traj.replies)


def test_rollouts_of_a_group_share_the_initial_state_and_by_default_the_payouts(tiny_tokenizer, scripted_engine):
    # Bandit pays the high-risk arm 1.0 with probability 0.25. The reference resets the N rollouts of a group with
    # one seed, so they share the env's random stream: the same arm pays the same (group_randomness="shared").
    # With "independent" each rollout draws its own payout.
    engine = scripted_engine(tiny_tokenizer, [WIN])
    sampling = SamplingParams(max_new_tokens=64)
    shared = rollouts_no_prefix(engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1, 2, 3], 16, sampling=sampling)
    for trajectories in shared.groups().values():
        assert len({t.messages[1]["content"] for t in trajectories}) == 1  # one initial state per group
        assert len({t.reward for t in trajectories}) == 1  # one payout per group
    independent = rollouts_no_prefix(engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1, 2, 3], 16, sampling=sampling,
                                     group_randomness="independent")  # fmt: skip
    for trajectories in independent.groups().values():
        assert len({t.messages[1]["content"] for t in trajectories}) == 1
        payouts = [t.reward for t in trajectories]
        assert 0 < sum(p == 1.0 for p in payouts) < len(payouts)
    again = rollouts_no_prefix(engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1, 2, 3], 16, sampling=sampling,
                               group_randomness="independent")  # fmt: skip
    assert [t.reward for t in again.trajectories] == [t.reward for t in independent.trajectories]  # reproducible


# ---------------------------------------------------------------------------------------------- reply prefix
THINK_CONT = ["hmm</think><answer>Unicorn</answer>", WIN[len("<think>") :]]  # the model continues after "<think>"
ANSWER_CONT = ["Unicorn</answer>", "Dragon</answer>"]  # ... after "<answer>" (thinking off)


def _by_turn(replies):
    """A script giving ``replies[k]`` at generate call k (every episode here lives the same turns)."""
    return lambda prompt, call, row: replies[min(call, len(replies) - 1)]


def _check_prefixed_rollout(tokenizer, engine, batch, prefix, expected_replies):
    prefix_ids = list(tokenizer(prefix, add_special_tokens=False)["input_ids"])
    for traj in batch.trajectories:
        assert traj.num_turns == 2 and traj.success
        # The env and the chat got prefix + the model's text (a valid reply: Unicorn is invalid, Dragon wins).
        assert traj.replies == expected_replies
        assert traj.infos[0]["invalid_actions"] == ["Unicorn"] and traj.infos[1]["actions"] == ["Dragon"]
        assert [m["content"] for m in traj.messages if m["role"] == "assistant"] == expected_replies
        # Exact template alignment over several turns: the rendered assistant messages contain the prefix.
        rendered = tokenizer.apply_chat_template(traj.messages[:-1], tokenize=False)
        assert tokenizer.decode(traj.input_ids) + "\n" == rendered
        # The loss mask covers only the model's sample; the prefix tokens sit just before each reply, mask 0.
        assert traj.loss_mask == _spans_mask(traj)
        for start, _ in traj.turn_spans:
            assert traj.input_ids[start - len(prefix_ids) : start] == prefix_ids
            assert traj.loss_mask[start - len(prefix_ids) : start] == [0] * len(prefix_ids)
            before = tokenizer.decode(traj.input_ids[: start - len(prefix_ids)])
            assert before.endswith("<|im_start|>assistant\n")  # right after the generation prompt
    # Every prompt the engine saw ends with the prefix: the model continues inside the tag.
    assert all(p[-len(prefix_ids) :] == prefix_ids for call in engine.prompts for p in call)


def test_reply_prefix_auto_with_thinking_continues_inside_think(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_turn(THINK_CONT))
    batch = collect(  # "sampled": prefix masked (the default trains it: tests/trainer/test_reply_tokens.py)
        engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 2, sampling=SamplingParams(max_new_tokens=64), max_turns=5,
        reply_tokens="sampled",
    )  # fmt: skip
    _check_prefixed_rollout(tiny_tokenizer, engine, batch, "<think>", [BAD, WIN])


def test_reply_prefix_auto_without_thinking_continues_inside_answer(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_turn(ANSWER_CONT))
    batch = collect(
        engine,
        tiny_tokenizer,
        "ragen/Bandit-v0",
        [0, 1],
        2,
        env_kwargs={"enable_think": False},
        sampling=SamplingParams(max_new_tokens=64),
        max_turns=5,
        reply_tokens="sampled",
    )
    _check_prefixed_rollout(
        tiny_tokenizer, engine, batch, "<answer>", ["<answer>Unicorn</answer>", "<answer>Dragon</answer>"]
    )


def test_reply_prefix_custom_text_and_empty_disables(tiny_tokenizer, scripted_engine):
    engine = scripted_engine(tiny_tokenizer, _by_turn(ANSWER_CONT))
    batch = collect(
        engine,
        tiny_tokenizer,
        "ragen/Bandit-v0",
        [0],
        1,
        reply_prefix="<think>ok</think><answer>",
        sampling=SamplingParams(max_new_tokens=64),
        max_turns=5,
        reply_tokens="sampled",
    )
    full = ["<think>ok</think><answer>Unicorn</answer>", "<think>ok</think><answer>Dragon</answer>"]
    _check_prefixed_rollout(tiny_tokenizer, engine, batch, "<think>ok</think><answer>", full)

    # "" turns the prefix off: the prompt ends at the generation prompt and the env gets the bare reply.
    engine = scripted_engine(tiny_tokenizer, _by_turn(ANSWER_CONT))
    traj = collect(
        engine,
        tiny_tokenizer,
        "ragen/Bandit-v0",
        [0],
        1,
        reply_prefix="",
        env_kwargs={"enable_think": False},
        max_turns=1,
        sampling=SamplingParams(max_new_tokens=64),
    ).trajectories[0]
    assert traj.replies == ["Unicorn</answer>"]  # the bare reply, no tag added
    assert tiny_tokenizer.decode(engine.prompts[0][0]).endswith("<|im_start|>assistant\n")
    assert tiny_tokenizer.decode(traj.input_ids[: traj.turn_spans[0][0]]) == tiny_tokenizer.apply_chat_template(
        traj.messages[:2], tokenize=False, add_generation_prompt=True
    )


def test_reply_prefix_resolution_and_bad_values(tiny_tokenizer, scripted_engine):
    from ragen_envs.settings import ProtocolSettings

    assert ProtocolSettings().generation_prefix == "<think>"
    assert ProtocolSettings(enable_think=False).generation_prefix == "<answer>"
    assert ProtocolSettings(reply_prefix="").generation_prefix == ""
    assert ProtocolSettings(reply_prefix="Go: ").generation_prefix == "Go: "
    engine = scripted_engine(tiny_tokenizer, [WIN])
    for bad in (None, 3, "a\x00b"):
        with pytest.raises(ValueError, match="reply_prefix"):
            collect_rollouts(engine, tiny_tokenizer, "ragen/Bandit-v0", [0], 1, settings=latest_rollout(),
                             sampling=SamplingParams(), env_kwargs={"reply_prefix": bad})


def test_chat_engine_refuses_an_explicit_reply_prefix():
    from ragen_trainer.engines.openai import OpenAIEngine

    engine = OpenAIEngine("fake", "http://127.0.0.1:9", backoff=0.0)
    with pytest.raises(ValueError, match="reply_prefix.*cannot continue"):
        collect(engine, None, "ragen/Bandit-v0", [0], 1, sampling=SamplingParams(), reply_prefix="<answer>")
