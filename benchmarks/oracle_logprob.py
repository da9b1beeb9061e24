"""The policy's log-probability of the oracle's first action: does training move the model toward the optimal move?

What is measured. For each model (a ragen checkpoint, any local Hugging Face folder, or ``smollm2`` for the bundled
SmolLM2-135M-Instruct) and each of ``--states`` initial states of ``--env`` (``gymnasium.make(env).reset(seed=s)`` for
``s = 0 .. N-1``, the initial-state distribution training samples from), at the FIRST turn only:

1. The prompt token ids exactly as a training rollout builds them (:class:`ragen_trainer.rollout.TokenAgent`, the
   same ids as ``benchmarks/bench_engines.py``'s ``first_turn_prompts``): the env's system prompt and first
   observation through the chat template with the generation prompt (:class:`ragen_trainer.rollout.ChatTokens`),
   then the protocol's generation prefix (``ProtocolSettings.generation_prefix``: ``<think>`` with thinking on,
   ``<answer>`` with it off), tokenised on its own. The model continues from there.
2. For every legal action ``a`` of the env (FrozenLake ``Left, Down, Right, Up``; Sokoban ``Up, Down, Left, Right``),
   the reply the protocol expects for that single action, ``TurnProtocol.format_reply([a], think)`` (what
   ``evaluation.agents.format_reply`` writes), minus the generation prefix that already ends the prompt: with thinking
   on and the default empty think, the continuation is ``"</think><answer>Left</answer>"``. It parses
   (:func:`ragen_envs.parsing.parse_reply`, once the prefix is put back) to exactly ``[a]``. The continuation is
   tokenised on its own (as the model writes it after the prefix) and scored by teacher forcing: ``log p(reply_a)`` is
   the sum of the per-token log-softmax values of its tokens, one forward pass (the prompt is encoded once per state
   and its KV cache shared by the actions' continuations, right-padded in a batch). Generation stops at the
   protocol's stop string ``</answer>``, so nothing after it is scored.
   ``--think`` chooses the thinking text placed before the answer: ``empty`` (default), ``oracle`` (the oracle's
   own think line, which names the state but not the move), ``state`` (the state in words,
   :func:`ragen_trainer.evaluation.agents.state_thought`: what the ``mixed-state`` warm-up's teacher writes, so the
   preference measured is the move given true facts about the board), or any literal text. It is the same for every action, so
   it only sets the context of the answer; the shares below compare the answers under that context.
3. The oracle (:data:`ragen_trainer.evaluation.agents.ORACLES`, what :class:`OracleAgent` plays) and the set of
   optimal first actions: FrozenLake, finite-horizon value iteration over the slippery dynamics with the episode's
   action budget (``q = P[s] @ V[budget - 1]``; every action within 1e-9 of the best is optimal; the oracle takes the
   first of them); Sokoban, the move-optimal solver (an action is optimal when it moves the player and the position it
   leads to is solved in one move fewer). The oracle's pick is always in the set; ties are common on FrozenLake.

Reported per model (means over the states; a uniform policy for reference):

* ``logp_oracle``: ``log p`` of the oracle's reply, the best of the optimal actions' replies where there are several
  (the absolute number also prices the format and the think text; compare it between checkpoints, not between envs);
* ``share_optimal``: the normalised preference for an optimal action, ``sum_{a optimal} p_a / sum_{a legal} p_a`` over
  the legal actions' replies (a softmax over their log-probs). Uniform: ``|optimal| / |legal|`` (``1/4`` when one
  action is optimal): the policy is indifferent there; ``1`` means it always prefers an optimal move;
* ``top1_optimal``: the fraction of states whose most probable reply is an optimal action (uniform: the same
  ``|optimal| / |legal|``, a random tie-break);
* ``share_oracle_pick``: the share of the one action the oracle plays (uniform ``1/|legal|``);
* ``share_optimal_first``: ``share_optimal`` scored only up to the action's name (``...<answer>Left``): the
  preference for the *first* action named, whatever follows it (a model that writes ``Left || Down`` still counts);
* ``format_mass``: the mean total probability ``sum_a p_a`` of the legal single-action replies (how much of the
  policy's mass goes to well-formed one-action answers under this context; tiny with the empty think, which models
  rarely write);
* ``most preferred`` (table) / ``preferred_counts`` (JSON): which action has the highest ``log p`` in how many states.
  One action preferred in every state whatever the board says is a state-blind policy: its ``share_optimal`` stays
  near the uniform baseline even while it grows more confident (``max_share`` rises).

Tokens. The continuation is tokenised on its own, as the model samples it after the prefix. The trainer's default
``reply_tokens="cleaned"`` trains the tokenisation of the whole cleaned reply, prefix included; the two agree except
where the prefix merges with the continuation's first characters (with the empty think, ``"<think></think>"``
tokenises as ``< think ></ think`` for byte-level BPE tokenisers such as SmolLM2's). ``joint_tokenization`` in the
JSON counts the states where they agree for every action (all of them with a think text that starts with a letter).

Why: RL on FrozenLake should raise the policy's probability of good moves. The success rate of sampled episodes mixes
that with the format, the slips of the ice and luck; ``share_optimal`` isolates the policy's preference for the
optimal first move on the same states and the same prompt ids that training uses. A share that rises over
checkpoints (above the uniform baseline and above the starting model) is the policy learning the task; a flat share
at the baseline means training has not changed which move the model prefers (whatever happened to the format).

Run (one thread, deterministic: no sampling, float32 on the CPU)::

    OMP_NUM_THREADS=1 python benchmarks/oracle_logprob.py smollm2 runs/multiturn/frozenlake/seed0/checkpoint-10 \\
        --labels base step10 --states 64 --json oracle.json --md oracle.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym
import numpy as np

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.driver import Episode, EpisodeJob, _start_episode  # the driver's own first turn
from ragen_envs.frozen_lake import ACTIONS, reach_values, transition_model
from ragen_envs.parsing import parse_reply
from ragen_envs.protocol import TurnProtocol, find_protocol
from ragen_envs.sokoban.solver import move, solve
from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf.transformers_api import cache_keyword
from ragen_trainer.evaluation.agents import ORACLES, format_reply, state_thought
from ragen_trainer.evaluation.metrics import env_family
from ragen_trainer.models import is_default_model, load_model_and_tokenizer
from ragen_trainer.rollout import ChatTokens
from ragen_trainer.safe_yaml import load_yaml

DEFAULT_ENV = "ragen/FrozenLake-v0"
SUPPORTED_FAMILIES = ("FrozenLake", "Sokoban")
#: Two action values closer than this are a tie (FrozenLake's q values are probabilities).
TIE_TOLERANCE = 1e-9


# ------------------------------------------------------------------------------------------------ the first turn
def first_turn_context(env: gym.Env, env_id: str, seed: int) -> Episode:
    """The :class:`~ragen_trainer.evaluation.agents.TurnContext` (a driver :class:`Episode`) of ``env``'s first turn
    after ``reset(seed=seed)``, built as ``ragen_envs.driver`` starts an episode (system + first user message)."""
    return _start_episode(env_id, env_id, EpisodeJob(group_id=seed, seed=seed), env, on_error="raise")


def frozen_lake_optimal(ctx: Episode) -> tuple[list[str], list[float]]:
    """The optimal first actions of a FrozenLake turn and every action's value: the oracle's value iteration
    (``_oracle_frozen_lake``: the belief is the player's cell at a turn's first action, so ``q = P[s] @ V[budget-1]``)."""

    view = ctx.env.unwrapped.state_view()
    P, is_goal, terminal = transition_model(view)
    budget = int(ctx.info.get("actions_left", ctx.protocol.max_actions_per_episode))
    values = reach_values(P, is_goal, terminal, budget)
    s = view["player"][0] * view["size"][1] + view["player"][1]
    q = P[s] @ values[budget - 1]
    best = float(q.max())
    return [ACTIONS[a] for a in range(len(ACTIONS)) if q[a] >= best - TIE_TOLERANCE], [float(v) for v in q]


def sokoban_optimal(ctx: Episode) -> tuple[list[str], list[float]]:
    """The move-optimal first actions of a Sokoban position, and each action's moves-to-go after it (``inf``: it
    does not move the player or leads to an unsolvable position). ``[]`` when the solver finds no solution."""

    base = ctx.env.unwrapped
    level = base.snapshot()
    start = solve(level.fixed, level.boxes, level.player)
    if start is None:
        return [], [math.inf] * len(base.action_names)
    togo = []
    for action in base.action_names:
        boxes, player = move(np.asarray(level.fixed), level.boxes, level.player, action)
        if player == tuple(level.player):
            togo.append(math.inf)
            continue
        after = solve(level.fixed, boxes, player)
        togo.append(1.0 + after.moves if after is not None else math.inf)
    return [a for a, t in zip(base.action_names, togo) if t == start.moves], togo


OPTIMAL = {"FrozenLake": frozen_lake_optimal, "Sokoban": sokoban_optimal}


@dataclass
class StateCase:
    """One initial state's first turn: the prompt ids and, per legal action, the scored continuation."""

    seed: int
    prompt_ids: list[int]
    actions: list[str]
    replies: dict[str, str]
    """action -> the whole reply (generation prefix included) that parses to exactly ``[action]``."""
    continuations: dict[str, list[int]]
    """action -> token ids of the reply after the generation prefix (what is scored)."""
    first_action_tokens: dict[str, int | None]
    """action -> how many of its continuation ids end at the action's name (``None``: no token boundary there)."""
    oracle_action: str
    optimal: list[str]
    action_values: list[float]
    joint_tokenization: bool
    """Whether ``encode(prefix + continuation) == encode(prefix) + encode(continuation)`` for every action (the
    trainer's ``reply_tokens="cleaned"`` trains the joint tokenisation)."""
    observation: str = ""
    think: str = ""
    notes: list[str] = field(default_factory=list)


def think_text(mode: str, oracle_think: str, ctx: Any = None) -> str:
    if mode == "empty":
        return ""
    if mode == "oracle":
        return oracle_think
    if mode == "state":
        return state_thought(ctx)
    return mode


def build_cases(tokenizer: Any, env_id: str, states: int, think: str = "empty",
                env_kwargs: dict[str, Any] | None = None) -> tuple[list[StateCase], dict]:  # fmt: skip
    """The first turn of ``env_id`` (made with ``env_kwargs``) after ``reset(seed=s)`` for ``s`` in
    ``0 .. states-1``; also the env's settings."""

    family = env_family(env_id)
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(f"--env {env_id}: supported env families are {SUPPORTED_FAMILIES}")
    chat = ChatTokens(tokenizer)
    env = gym.make(env_id, **(env_kwargs or {}))
    try:
        protocol: TurnProtocol = find_protocol(env)
        settings = protocol.settings
        prefix = settings.generation_prefix
        prefix_ids = chat.encode(prefix) if prefix else []
        names = [str(a) for a in env.unwrapped.action_names]
        close = "</answer>"
        cases = []
        for seed in range(states):
            ctx = first_turn_context(env, env_id, seed)
            prompt = chat.prompt_ids(ctx.messages) + prefix_ids
            oracle_think, oracle_actions = ORACLES[family](ctx)
            oracle_reply = format_reply(ctx, oracle_think, oracle_actions)
            parsed = parse_reply(oracle_reply, enable_think=settings.enable_think, separator=settings.action_sep)
            if not parsed.format_ok:
                raise RuntimeError(f"{env_id} seed {seed}: the oracle's reply does not parse: {oracle_reply!r}")
            oracle_action = parsed.actions[0]
            optimal, values = OPTIMAL[family](ctx)
            notes = []
            if not optimal:
                optimal = [oracle_action]
                notes.append("no solution found: the oracle's pick stands for the optimal set")
            if oracle_action not in optimal:
                raise RuntimeError(f"{env_id} seed {seed}: the oracle plays {oracle_action}, not in {optimal}")
            text = think_text(think, oracle_think, ctx)
            replies, continuations, first, joint = {}, {}, {}, True
            for action in names:
                reply = format_reply(ctx, text, [action])
                check = parse_reply(reply, enable_think=settings.enable_think, separator=settings.action_sep)
                if not (check.format_ok and check.actions == [action]):
                    raise RuntimeError(f"{env_id}: the reply {reply!r} does not parse to [{action!r}]")
                if not reply.startswith(prefix):
                    raise RuntimeError(f"{env_id}: the reply {reply!r} does not start with the prefix {prefix!r}")
                if not reply.endswith(action + close):
                    raise RuntimeError(f"{env_id}: the reply {reply!r} does not end with {action + close!r}")
                continuation = reply[len(prefix) :]
                ids = chat.encode(continuation)
                head = chat.encode(continuation[: len(continuation) - len(close)])
                replies[action] = reply
                continuations[action] = ids
                first[action] = len(head) if ids[: len(head)] == head and 0 < len(head) < len(ids) else None
                joint = joint and chat.encode(reply) == prefix_ids + ids
            cases.append(StateCase(seed=seed, prompt_ids=prompt, actions=names, replies=replies,
                                   continuations=continuations, first_action_tokens=first,
                                   oracle_action=oracle_action, optimal=optimal, action_values=values,
                                   joint_tokenization=joint, observation=str(ctx.messages[-1]["content"]),
                                   think=text, notes=notes))  # fmt: skip
        env_settings = {"env": env_id, "family": family, "generation_prefix": prefix, "actions": names,
                        "protocol": settings.to_dict()}  # fmt: skip
    finally:
        env.close()
    return cases, env_settings


# ------------------------------------------------------------------------------------------------ scoring
def sequence_logprobs_full(model: Any, prompt_ids: list[int], continuation: list[int]) -> list[float]:
    """Per-token ``log p`` of ``continuation`` after ``prompt_ids``: one plain forward pass over the whole sequence
    (no cache, no batch), the reference the batched scorer is checked against."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor([prompt_ids + continuation], dtype=torch.long, device=model.device)
        logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        n = len(prompt_ids)
        return [float(logp[n - 1 + j, tok]) for j, tok in enumerate(continuation)]


def _groups(cases: list[StateCase], batch_states: int) -> list[list[int]]:
    """Case indices in batches of at most ``batch_states`` whose prompts have the same length (no prompt padding)."""
    by_length: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        by_length.setdefault(len(case.prompt_ids), []).append(i)
    out = []
    for length in sorted(by_length):
        idx = by_length[length]
        out.extend(idx[k : k + batch_states] for k in range(0, len(idx), batch_states))
    return out


def score_cases(model: Any, cases: list[StateCase], *, batch_states: int = 8, progress: Any = None
                ) -> list[dict[str, list[float]]]:  # fmt: skip
    """Per case, per action: the per-token ``log p`` of the action's continuation under ``model``.

    One batch = up to ``batch_states`` states with equal-length prompts: the prompts in one forward pass
    (``use_cache``), the cache repeated for each state's actions, then every (state, action) continuation in one
    right-padded forward pass (padding sits after the real tokens, so causal attention keeps it out of them).
    """
    import torch


    model.eval()
    keyword = cache_keyword(model)  # `cache` in recent transformers, `past_key_values` before
    out: list[dict[str, list[float]]] = [{} for _ in cases]
    device = model.device
    with torch.inference_mode():
        for group in _groups(cases, batch_states):
            actions = cases[group[0]].actions  # every state of an env has the same legal actions
            prompts = torch.tensor([cases[i].prompt_ids for i in group], dtype=torch.long, device=device)
            first = model(input_ids=prompts, use_cache=True)
            last = torch.log_softmax(first.logits[:, -1].float(), dim=-1)  # (B, V): the first continuation token
            cache = first.cache if "cache" in first else first.past_key_values
            cache.batch_repeat_interleave(len(actions))
            rows = [cases[i].continuations[a] for i in group for a in actions]
            width = max(len(r) for r in rows)
            pad = 0
            ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
            logits = model(input_ids=ids, **{keyword: cache}, use_cache=True).logits.float()  # (B*A, W, V)
            if width > 1:
                nxt = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]  # (B*A, W-1)
            for k, i in enumerate(group):
                for j, a in enumerate(actions):
                    r = k * len(actions) + j
                    n = len(rows[r])
                    values = [float(last[k, rows[r][0]])]
                    if n > 1:
                        values += [float(v) for v in nxt[r, : n - 1]]
                    out[i][a] = values
            if progress is not None:
                progress.update(len(group))
    return out


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def state_metrics(case: StateCase, token_logps: dict[str, list[float]]) -> dict[str, Any]:
    """One state's numbers (see the module docstring)."""
    actions = case.actions
    logp = [sum(token_logps[a]) for a in actions]
    share = _softmax(logp)
    optimal = [actions.index(a) for a in case.optimal]
    best = max(range(len(actions)), key=lambda i: logp[i])
    row: dict[str, Any] = {
        "seed": case.seed,
        "optimal": case.optimal,
        "oracle_action": case.oracle_action,
        "action_values": case.action_values,
        "logp": dict(zip(actions, logp)),
        "share": dict(zip(actions, share)),
        "logp_oracle": max(logp[i] for i in optimal),
        "share_optimal": sum(share[i] for i in optimal),
        "share_oracle_pick": share[actions.index(case.oracle_action)],
        "top1_optimal": float(best in optimal),
        "preferred": actions[best],
        "uniform_share": len(optimal) / len(actions),
        "format_mass": sum(math.exp(v) for v in logp),
        "max_share": max(share),
    }
    if all(case.first_action_tokens[a] is not None for a in actions):
        first = [sum(token_logps[a][: case.first_action_tokens[a]]) for a in actions]
        first_share = _softmax(first)
        row["logp_first"] = dict(zip(actions, first))
        row["share_optimal_first"] = sum(first_share[i] for i in optimal)
    else:
        row["share_optimal_first"] = None
    return row


SUMMARY_KEYS = ("logp_oracle", "share_optimal", "share_oracle_pick", "top1_optimal", "share_optimal_first",
                "format_mass", "max_share", "uniform_share")  # fmt: skip


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"states": len(rows)}
    for key in SUMMARY_KEYS:
        values = [r[key] for r in rows if r.get(key) is not None]
        if not values:
            out[key] = None
            continue
        mean = float(np.mean(values))
        out[key] = mean
        out[key + "_sem"] = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else None
    out["uniform_pick_share"] = 1.0 / len(rows[0]["share"]) if rows else None
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["preferred"]] = counts.get(r["preferred"], 0) + 1
    out["preferred_counts"] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    return out


# ------------------------------------------------------------------------------------------------ models
def model_source(name: str | None) -> str | None:
    """``None`` (the bundled model) for ``smollm2`` and the other bundled-model aliases."""

    return None if name is None or is_default_model(name) else name


def own_thinking(model: Any, tokenizer: Any, env_id: str, cases: list[StateCase], max_new_tokens: int,
                 env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """What the model writes itself on each state's first turn (greedy, up to ``max_new_tokens``, stopped at
    ``</answer>``): whether the reply parses, what its thinking claims about the board (the env's own
    ``check_reasoning``: supported / contradicted claims), and whether its first action is optimal. A warm-up meant to
    name the state before the move (``--think state``'s teacher) should write true claims and then the right moves.
    """
    engine = HFEngine(model, tokenizer, batch_size=len(cases) or 1)
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens, stop=("</answer>",))
    results = engine.generate([c.prompt_ids for c in cases], params)
    env = gym.make(env_id, **(env_kwargs or {}))
    try:
        protocol = find_protocol(env)
        settings = protocol.settings
        rows = []
        for case, result in zip(cases, results):
            ctx = first_turn_context(env, env_id, case.seed)
            view = env.unwrapped.state_view()
            reply = settings.generation_prefix + result.text
            parsed = parse_reply(reply, enable_think=settings.enable_think, separator=settings.action_sep)
            claims = env.unwrapped.check_reasoning(parsed.think, view, parsed.actions) if parsed.format_ok else None
            rows.append({"seed": case.seed, "reply": reply, "format_ok": parsed.format_ok,
                         "supported": claims["supported"] if claims else 0,
                         "contradicted": claims["contradicted"] if claims else 0,
                         "truth": state_thought(ctx),
                         "first_optimal": bool(parsed.actions) and parsed.actions[0] in case.optimal})  # fmt: skip
    finally:
        env.close()
    n = max(len(rows), 1)
    return {
        "states": len(rows),
        "format_ok": sum(r["format_ok"] for r in rows) / n,
        "supported_per_state": sum(r["supported"] for r in rows) / n,
        "contradicted_per_state": sum(r["contradicted"] for r in rows) / n,
        "all_claims_true": sum(r["supported"] > 0 and r["contradicted"] == 0 for r in rows) / n,
        "first_action_optimal": sum(r["first_optimal"] for r in rows) / n,
        "uniform_first_action_optimal": sum(len(c.optimal) / len(c.actions) for c in cases) / max(len(cases), 1),
        "rows": rows,
    }


def evaluate_model(model: Any, tokenizer: Any, env_id: str, states: int, *, think: str = "empty",
                   batch_states: int = 8, progress: Any = None, own_tokens: int = 0,
                   env_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every state's numbers and their summary for one loaded model (``own_tokens`` > 0: also :func:`own_thinking`)."""
    cases, env_settings = build_cases(tokenizer, env_id, states, think, env_kwargs)
    scores = score_cases(model, cases, batch_states=batch_states, progress=progress)
    rows = [state_metrics(c, s) for c, s in zip(cases, scores)]
    return {
        "own_thinking": own_thinking(model, tokenizer, env_id, cases, own_tokens, env_kwargs) if own_tokens > 0 else None,
        "summary": summarize(rows),
        "states": rows,
        "env": env_settings,
        "distinct_states": len({c.observation for c in cases}),
        "joint_tokenization": sum(c.joint_tokenization for c in cases),
        "prompt_tokens": [len(c.prompt_ids) for c in cases],
        "continuation_text": {
            a: cases[0].replies[a][len(env_settings["generation_prefix"]) :] for a in cases[0].actions
        }
        if cases
        else {},
    }


def _fmt(value: float | None, digits: int = 3, sem: float | None = None, *, exp: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}e}" if exp else f"{value:.{digits}f}"
    return text + (f" ± {sem:.{digits}f}" if sem is not None else "")


TABLE_HEADER = ("model", "states", "log p(oracle reply)", "share(optimal)", "top-1 optimal", "share(oracle pick)",
                "share(optimal), first action", "format mass", "most preferred")  # fmt: skip


def _mode(summary: dict[str, Any]) -> str:
    """The action most often preferred (highest log p) and in how many states, e.g. ``Up 8/8``."""
    counts = summary.get("preferred_counts") or {}
    if not counts:
        return "-"
    action, n = next(iter(counts.items()))
    return f"{action} {n}/{summary['states']}"


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for entry in result["models"]:
        s = entry["summary"]
        rows.append([entry["label"], str(s["states"]), _fmt(s["logp_oracle"], 2, s.get("logp_oracle_sem")),
                     _fmt(s["share_optimal"], 3, s.get("share_optimal_sem")), _fmt(s["top1_optimal"], 3),
                     _fmt(s["share_oracle_pick"], 3), _fmt(s["share_optimal_first"], 3),
                     _fmt(s["format_mass"], 1, exp=True), _mode(s)])  # fmt: skip
    if result["models"]:
        s = result["models"][0]["summary"]
        rows.append(["uniform policy", str(s["states"]), "-", _fmt(s["uniform_share"], 3), _fmt(s["uniform_share"], 3),
                     _fmt(s["uniform_pick_share"], 3), _fmt(s["uniform_share"], 3), "-", "-"])  # fmt: skip
    return rows


def format_text(result: dict[str, Any]) -> str:
    rows = [list(TABLE_HEADER), *table_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        f"# Oracle first-action preference: {s['env']}",
        "",
        (
            f"{s['states']} initial states (seeds 0-{s['states'] - 1}), first turn; think: `{s['think']}`; "
            f"{result['date']}. Scored continuation per action, e.g. `{s.get('example_continuation', '')}`; "
            "± is one standard error over the states."
        ),
        "",
        "| " + " | ".join(TABLE_HEADER) + " |",
        "|" + "|".join("---" for _ in TABLE_HEADER) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(result)]
    own = [(m["label"], m["own_thinking"]) for m in result["models"] if m.get("own_thinking")]
    if own:
        lines += ["", ("What each model writes itself (greedy first reply; claims checked by the env's "
                       "`check_reasoning`):"), "",
                  ("| model | states | format ok | supported claims / state | contradicted / state | "
                   "all claims true | first action optimal (uniform) |"), "|---|---|---|---|---|---|---|"]
        lines += [f"| {label} | {o['states']} | {o['format_ok']:.3f} | {o['supported_per_state']:.2f} | "
                  f"{o['contradicted_per_state']:.2f} | {o['all_claims_true']:.3f} | "
                  f"{o['first_action_optimal']:.3f} ({o['uniform_first_action_optimal']:.3f}) |" for label, o in own]
    lines += ["", "Models:", ""]
    lines += [f"- {m['label']}: `{m['model']}`" for m in result["models"]]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "models",
        nargs="*",
        default=["smollm2"],
        help="model folders (ragen checkpoints, HF folders) or 'smollm2' for the bundled model (default)",
    )
    p.add_argument("--labels", nargs="+", default=None, help="one label per model (default: the folder names)")
    p.add_argument("--env", default=DEFAULT_ENV, help=f"env id (FrozenLake or Sokoban family; default {DEFAULT_ENV})")
    p.add_argument("--env-kwargs", default="{}",
                   help="env keyword arguments as YAML, as the warm-up's (e.g. '{cell_separator: \" \"}')")
    p.add_argument("--states", type=int, default=64, help="initial states: seeds 0 .. N-1 (default 64)")
    p.add_argument(
        "--think", default="empty",
        help="think text before the answer: 'empty' (default), 'oracle', 'state' (the state in words, what the "
             "mixed-state warm-up's teacher writes), or literal text"
    )
    p.add_argument("--batch-states", type=int, default=8, help="states per forward pass (default 8)")
    p.add_argument("--own-thinking", type=int, default=0, metavar="TOKENS",
                   help="also generate each model's own greedy first reply (up to TOKENS new tokens) and check its "
                        "thinking's claims and first action (default 0: off)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", default=None, help="write the full result (per-state numbers included) here")
    p.add_argument("--md", default=None, help="write the table as Markdown here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", action="store_true",
                   help="do nothing when --json already exists (a pipeline stage that has run)")
    return p


def default_label(name: str) -> str:
    if model_source(name) is None:
        return "smollm2"
    path = Path(name)
    return f"{path.parent.name}/{path.name}" if path.name.startswith("checkpoint") else path.name


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.resume and not args.json:
        build_parser().error("--resume needs --json")
    if args.resume and Path(args.json).is_file():
        print(f"{args.json} exists: the check has run", file=sys.stderr)
        return 0
    models = list(args.models) or ["smollm2"]
    if args.labels is not None and len(args.labels) != len(models):
        build_parser().error(f"--labels: {len(args.labels)} labels for {len(models)} models")
    if args.states < 1:
        build_parser().error("--states must be >= 1")
    try:
        env_kwargs = load_yaml(args.env_kwargs, "--env-kwargs")
        if not isinstance(env_kwargs, dict):
            raise TypeError(f"expected a mapping such as '{{size: 4}}', got {type(env_kwargs).__name__}")
        gym.make(args.env, **env_kwargs).close()
    except (ValueError, TypeError) as error:
        build_parser().error(f"--env-kwargs {args.env_kwargs!r}: {error}")
    import torch
    from tqdm import tqdm


    torch.set_num_threads(max(1, args.threads))
    labels = args.labels or [default_label(m) for m in models]
    settings = {"env": args.env, "env_kwargs": env_kwargs, "states": args.states, "think": args.think, "own_thinking": args.own_thinking,
                "batch_states": args.batch_states,
                "threads": args.threads, "dtype": "float32", "device": "cpu"}  # fmt: skip
    result: dict[str, Any] = {
        "settings": settings,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "models": [],
    }
    t_start = time.perf_counter()
    for label, name in zip(labels, models):
        t0 = time.perf_counter()
        model, tokenizer = load_model_and_tokenizer(model_source(name), dtype="float32", device="cpu")
        model.eval()
        with tqdm(total=args.states, desc=label, file=sys.stderr, disable=args.no_progress) as bar:
            entry = evaluate_model(model, tokenizer, args.env, args.states, think=args.think,
                                   batch_states=args.batch_states, progress=bar,
                                   own_tokens=args.own_thinking, env_kwargs=env_kwargs)  # fmt: skip
        entry = {"label": label, "model": name, "seconds": round(time.perf_counter() - t0, 2), **entry}
        result["models"].append(entry)
        result["settings"].setdefault("example_continuation", next(iter(entry["continuation_text"].values()), ""))
        s = entry["summary"]
        print(f"{label}: share(optimal) {s['share_optimal']:.3f} (uniform {s['uniform_share']:.3f}), "
              f"top-1 {s['top1_optimal']:.3f}, log p(oracle) {s['logp_oracle']:.2f}  "
              f"[{entry['seconds']:.0f} s]", file=sys.stderr, flush=True)  # fmt: skip
        if entry["own_thinking"]:
            o = entry["own_thinking"]
            print(f"{label}, own greedy replies: format ok {o['format_ok']:.3f}, claims true in "
                  f"{o['all_claims_true']:.3f} of states ({o['contradicted_per_state']:.2f} contradicted / state), "
                  f"first action optimal {o['first_action_optimal']:.3f} (uniform "
                  f"{o['uniform_first_action_optimal']:.3f})", file=sys.stderr, flush=True)  # fmt: skip
        del model
    result["seconds"] = round(time.perf_counter() - t_start, 2)
    text = format_text(result)
    result["table"] = text
    print(f"\nOracle first-action preference, {args.env}, {args.states} states (think: {args.think!r}):\n")
    print(text, flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(format_markdown(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
