"""Agents the leaderboard evaluates: a model, and reference agents that bound every score from below and above.

Every agent plays through the *same* LLM-facing env (``gymnasium.make("ragen/...")``, i.e. the turn protocol) as a
model does, and writes its replies in the protocol's format ``<think>...</think><answer>a1 || a2</answer>``; so a
reference score is measured exactly like a model's, format penalties and action budgets included.

* :class:`RandomAgent` -- the floor: uniformly random valid actions (as many per turn as the protocol allows).
* :class:`MixedAgent` -- the oracle at a share of the turns, random at the others: a teacher for warm-ups.
* :class:`OracleAgent` -- the ceiling: reads the true state (``env.unwrapped.state_view()``) and acts with the env's own
  solver: the Bandit's high-risk arm, value iteration for FrozenLake on the known map, the Sokoban solver's plan, the
  Countdown solver, and for WebShop a search for the goal product followed by buying it with the goal's options.
* :class:`ModelAgent` -- a causal LM (Hugging Face id, local path, or a ``ragen-trainer train`` checkpoint folder)
  generating with one of the trainer's engines (HF, vLLM, an OpenAI-compatible endpoint), a batch of episodes at once.

Interface: an agent gets one :class:`TurnContext` per live episode and returns one :class:`AgentReply` each from
:meth:`Agent.reply_batch` (default: :meth:`Agent.reply` per context). ``identity()`` is written into the result file.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ragen_envs.core import check_arg
from ragen_envs.countdown import solve_countdown
from ragen_envs.driver import AgentReply, Episode
from ragen_envs.frozen_lake import ACTIONS as FL_ACTIONS
from ragen_envs.frozen_lake import reach_values as frozen_lake_values
from ragen_envs.frozen_lake import transition_model as frozen_lake_model
from ragen_envs.games import GAMES
from ragen_envs.games.negotiation import OPPONENTS
from ragen_envs.protocol import find_protocol  # noqa: F401  (re-exported for agents' authors)
from ragen_envs.sokoban.solver import solve_level
from ragen_trainer import (
    engines,  # its engines load on first use (torch, vllm, http): see engines/__init__
    models,
)
from ragen_trainer.checkpoints.layout import is_ragen_checkpoint, read_checkpoint_info
from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.base import BatchSession
from ragen_trainer.engines.choice import AUTO, choose_engine
from ragen_trainer.evaluation.metrics import env_family
from ragen_trainer.evaluation.suites import DEFAULT_DECODING
from ragen_trainer.rollout import TokenAgent, check_prefix_supported
from ragen_trainer.settings import DEFAULT_MAX_CONTEXT_TOKENS, RolloutSettings

#: What an agent sees at one turn of one episode: the driver's live :class:`~ragen_envs.driver.Episode` (its
#: ``messages``, latest ``info``, ``env``, ``memory``, ``env_name``, ``seed``, ``rollout`` and ``protocol``).
TurnContext = Episode


class Agent:
    """Base class: override :meth:`reply` (one episode at a time) or :meth:`reply_batch` (all live episodes)."""

    name: str = "agent"
    kind: str = "reference"

    def identity(self) -> dict[str, Any]:
        """What identifies this agent in a result file (name, kind, and settings that change its behaviour)."""
        return {"name": self.name, "kind": self.kind}

    def reply(self, ctx: TurnContext) -> AgentReply | str:
        raise NotImplementedError

    def reply_batch(self, contexts: list[TurnContext]) -> list[AgentReply]:
        out = []
        for ctx in contexts:
            reply = self.reply(ctx)
            out.append(reply if isinstance(reply, AgentReply) else AgentReply(str(reply)))
        return out

    def close(self) -> None:
        """Release resources (engines, servers)."""


# ------------------------------------------------------------------------------------------------------ helpers
def format_reply(ctx: TurnContext, think: str, actions: list[str]) -> str:
    """A reply in the protocol's format: ``<think>..</think><answer>a1 || a2</answer>`` (no think when it is off)."""
    return ctx.protocol.format_reply(actions, think)


def actions_this_turn(ctx: TurnContext) -> int:
    """How many actions the protocol will still execute this turn (per-turn cap and episode budget)."""
    protocol = ctx.protocol
    left = ctx.info.get("actions_left", protocol.max_actions_per_episode)
    return max(1, min(protocol.actions_per_turn, int(left)))


def turns_left(ctx: TurnContext) -> int:
    return max(1, ctx.protocol.max_turns - int(ctx.info.get("turn", 0)))


def episode_rng(*keys: Any) -> np.random.Generator:
    """A generator seeded from ``keys`` only (never from call order), so batching does not change the draws."""
    return np.random.default_rng([zlib.crc32(str(k).encode()) for k in keys])


# ------------------------------------------------------------------------------------------------------ random
def _random_countdown(view: dict[str, Any], rng: np.random.Generator) -> str:
    numbers = [int(n) for n in view["numbers"]]
    rng.shuffle(numbers)
    text = str(numbers[0])
    for n in numbers[1:]:
        text = f"({text} {'+-*/'[int(rng.integers(4))]} {n})"
    return text[1:-1] if text.startswith("(") else text


def _random_webshop(view: dict[str, Any], rng: np.random.Generator) -> str:
    clickables = [str(c) for c in view.get("clickables") or view.get("available_actions", {}).get("clickables") or []]
    has_search = bool(view.get("has_search_bar") or view.get("available_actions", {}).get("has_search_bar"))
    if has_search and (not clickables or rng.random() < 0.5):
        words = str(view.get("instruction") or view.get("goal_instruction") or "item").split()
        picked = [words[int(i)] for i in rng.choice(len(words), size=min(3, len(words)), replace=False)]
        return f"search[{' '.join(picked)}]"
    if clickables:
        return f"click[{clickables[int(rng.integers(len(clickables)))]}]"
    return "search[item]"


def _random_negotiation(view: dict[str, Any], rng: np.random.Generator) -> str:
    return OPPONENTS["random"]().act(view, rng)


#: Env family -> random free-form action (envs without a fixed list of action names).
RANDOM_ACTIONS: dict[str, Callable[[dict[str, Any], np.random.Generator], str]] = {
    "Countdown": _random_countdown,
    "WebShop": _random_webshop,
    "Negotiation": _random_negotiation,
}


class RandomAgent(Agent):
    """Uniformly random valid actions, as many as the protocol executes this turn: the floor of every env.

    Draws come from a generator seeded by ``(seed, env name, env seed, rollout, turn)``, so a run is reproducible
    and independent of batching.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "seed": self.seed}

    def reply(self, ctx: TurnContext) -> AgentReply:
        rng = episode_rng(self.seed, ctx.env_name, ctx.seed, ctx.rollout, ctx.info.get("turn", 0))
        return AgentReply(format_reply(ctx, "I pick random actions.", random_actions(ctx, rng)))


def random_actions(ctx: TurnContext, rng: np.random.Generator) -> list[str]:
    """Uniformly random valid actions, as many as the protocol executes this turn (one free-form action where the
    env lists no action names)."""
    base = ctx.env.unwrapped
    names = list(getattr(base, "action_names", ()) or ())
    if names:
        return [names[int(i)] for i in rng.integers(len(names), size=actions_this_turn(ctx))]
    make = RANDOM_ACTIONS.get(env_family(ctx.env_id))
    if make is None:
        raise ValueError(f"no random action for env {ctx.env_id} (it lists no action names)")
    return [make(base.state_view(), rng)]


# ------------------------------------------------------------------------------------------------------ oracles
def _oracle_bandit(ctx: TurnContext) -> tuple[str, list[str]]:
    view = ctx.env.unwrapped.state_view()
    arm = view["high_risk_arm"]
    return f"{arm} is the high-risk arm; its expected payout is the higher one.", [arm]


def _oracle_countdown(ctx: TurnContext) -> tuple[str, list[str]]:
    base = ctx.env.unwrapped
    view = base.state_view()
    expression = solve_countdown(view["numbers"], view["target"], use_all=getattr(base, "use_all_numbers", True))
    if expression is None:  # unsolvable puzzle: answer something well-formed
        return "No expression reaches the target.", [" + ".join(str(n) for n in view["numbers"])]
    return f"{expression} = {view['target']}", [expression]


# FrozenLake: finite-horizon value iteration on the known map (the env's own planner) ------------------------------


def _oracle_frozen_lake(ctx: TurnContext) -> tuple[str, list[str]]:
    """Plan this turn's actions by value iteration, open-loop within the turn.

    The protocol runs a turn's actions without showing the state in between, so the plan is greedy over the belief
    (the distribution of where the slips may have taken the player), with the per-action values of the remaining
    budget. Turns are used evenly: ``ceil(actions left / turns left)`` actions per turn, one when every action can
    have its own turn (then the policy is the exact closed-loop optimum).
    """
    view = ctx.env.unwrapped.state_view()
    if "model" not in ctx.memory:
        ctx.memory["model"] = frozen_lake_model(view)
    P, is_goal, terminal = ctx.memory["model"]
    budget = int(ctx.info.get("actions_left", ctx.protocol.max_actions_per_episode))
    values = frozen_lake_values(P, is_goal, terminal, budget)
    n = min(actions_this_turn(ctx), math.ceil(budget / turns_left(ctx)))
    ncol = view["size"][1]
    belief = np.zeros(P.shape[0])
    belief[view["player"][0] * ncol + view["player"][1]] = 1.0
    actions = []
    for i in range(n):
        q = belief @ (P @ values[budget - i - 1])  # expected value of each action under the belief
        a = int(np.argmax(q))
        actions.append(FL_ACTIONS[a])
        belief = belief @ P[:, a, :]
    think = (
        f"I am at {tuple(view['player'])}, the goal at {tuple(view['goal'])}. Value iteration gives success "
        f"probability {values[budget][view['player'][0] * ncol + view['player'][1]]:.2f} with {budget} actions left."
    )
    return think, actions


def _oracle_sokoban(ctx: TurnContext) -> tuple[str, list[str]]:
    """Follow the optimal (fewest-moves) plan of the env's own solver, replanned from the current position."""
    base = ctx.env.unwrapped
    position = base.snapshot()
    key = (position.player, position.boxes)
    plan = ctx.memory.get("plans", {}).get(key)
    if plan is None:
        solution = solve_level(position)
        plan = list(solution.actions) if solution is not None else []
        ctx.memory.setdefault("plans", {})[key] = plan
    if not plan:
        return "The solver finds no solution from here.", [base.action_names[0]]
    n = actions_this_turn(ctx)
    return f"The solver's optimal plan has {len(plan)} moves; I follow it.", plan[:n]


def webshop_goal(base: Any) -> Any:
    """The goal of the WebShop env's current session (an oracle knows the goal); see ``WebShopEnv.current_goal``."""
    return base.current_goal()


def _oracle_webshop(ctx: TurnContext) -> tuple[str, list[str]]:
    """Search for the goal product by its name, open it, choose the goal's options, buy it."""
    base = ctx.env.unwrapped
    goal = webshop_goal(base)
    view = base.state_view()
    clickables = [str(c) for c in (view.get("available_actions") or {}).get("clickables", [])]
    has_search = bool((view.get("available_actions") or {}).get("has_search_bar"))
    asin = goal.asin.lower()
    wanted = list(goal.goal_options.values()) if isinstance(goal.goal_options, dict) else list(goal.goal_options)
    wanted = [str(v).lower() for v in wanted]
    page = view.get("page")
    tried = ctx.memory.setdefault("queries", 0)
    if has_search:
        queries = [goal.name, goal.query, goal.instruction_text]
        ctx.memory["queries"] = tried + 1
        return f"I search for the goal product {goal.asin}.", [f"search[{queries[min(tried, 2)]}]"]
    if page == "results":
        if asin in clickables:
            return f"{goal.asin} is in the results; I open it.", [f"click[{asin}]"]
        if "next >" in clickables and ctx.memory.get("pages", 0) < 2:
            ctx.memory["pages"] = ctx.memory.get("pages", 0) + 1
            return "The goal product is not on this page.", ["click[next >]"]
        ctx.memory["pages"] = 0
        return "The goal product is not in these results; I search again.", ["click[back to search]"]
    if page in ("item", "sub"):
        if view.get("asin", "").lower() != asin:
            return "This is not the goal product.", ["click[back to search]" if "back to search" in clickables
                                                     else "click[< prev]"]  # fmt: skip
        selected = {str(v).lower() for v in (view.get("selected") or {}).values()}
        for value in wanted:
            if value not in selected and value in clickables:
                return f"I choose the option {value}.", [f"click[{value}]"]
        if "buy now" in clickables:
            return "Every goal option is chosen; I buy it.", ["click[buy now]"]
        return "I go back to the product page.", ["click[< prev]"]
    return "I start over.", ["click[back to search]"]


#: Env family -> oracle policy ``ctx -> (think, actions)``.
#: Game env family -> the fixed opponent the oracle plays the agent's seat with: the strongest the game has
#: (:attr:`ragen_envs.games.GameEntry.strongest`).
GAME_ORACLE_OPPONENTS: dict[str, str] = {env_family(entry.env_id): entry.strongest for entry in GAMES.values()}


def _oracle_game(ctx: TurnContext) -> tuple[str, list[str]]:
    """A game's strongest fixed opponent (:data:`GAME_ORACLE_OPPONENTS`) playing the agent's seat; one opponent per
    episode (some remember the game), drawing from a generator seeded by the episode."""
    base = ctx.env.unwrapped
    if "oracle" not in ctx.memory:
        opponent = base.opponents[GAME_ORACLE_OPPONENTS[env_family(ctx.env_id)]]()
        opponent.reset(base.seat)
        ctx.memory["oracle"] = (opponent, episode_rng("oracle", ctx.env_name, ctx.seed, ctx.rollout))
    opponent, rng = ctx.memory["oracle"]
    return f"{opponent.name or type(opponent).__name__} play.", [opponent.act(base.state_view(), rng)]


ORACLES: dict[str, Callable[[TurnContext], tuple[str, list[str]]]] = {
    "Bandit": _oracle_bandit,
    "Countdown": _oracle_countdown,
    "FrozenLake": _oracle_frozen_lake,
    "Sokoban": _oracle_sokoban,
    "WebShop": _oracle_webshop,
    **dict.fromkeys(GAME_ORACLE_OPPONENTS, _oracle_game),
}


class OracleAgent(Agent):
    """Reads the true state and acts with the env's own solver: the ceiling of every env (see the module docstring)."""

    name = "oracle"

    def reply(self, ctx: TurnContext) -> AgentReply:
        policy = ORACLES.get(env_family(ctx.env_id))
        if policy is None:
            raise ValueError(f"OracleAgent has no oracle for env {ctx.env_id}; it knows {sorted(ORACLES)}")
        think, actions = policy(ctx)
        return AgentReply(format_reply(ctx, think, actions))


# State thoughts: true facts about the state a turn sees, for a teacher's thinking ----------------------------------


def _cells(cells: Any) -> str:
    return ", ".join(f"({r}, {c})" for r, c in cells)


def _relative(entity: str, player: Any, cell: Any) -> list[str]:
    """Sentences saying where ``cell`` lies from ``player`` (``"The goal is below me."``), rows first."""
    (r0, c0), (r, c) = player, cell
    out = [f"The {entity} is below me." if r > r0 else f"The {entity} is above me."] if r != r0 else []
    if c != c0:
        out.append(f"The {entity} is to the right." if c > c0 else f"The {entity} is to the left.")
    return out


def _state_thought_frozen_lake(base: Any) -> str:
    view = base.state_view()
    player, goal = view["player"], view["goal"]
    sentences = [f"I am at ({player[0]}, {player[1]}), the goal at ({goal[0]}, {goal[1]})."]
    sentences += _relative("goal", player, goal)
    sentences += [f"Moving {d.lower()} leads to a hole." for d in FL_ACTIONS if "hole" in base.outcomes_of(d, view)]
    return " ".join(sentences)


def _state_thought_sokoban(base: Any) -> str:
    view = base.state_view()
    player = view["player"]
    return (f"I am at ({player[0]}, {player[1]}). Boxes at {_cells(view['boxes'])}. "
            f"Targets at {_cells(view['targets'])}.")


#: Env family -> the state thought ``unwrapped env -> text``: where the player, the goal or the boxes are, and (FrozenLake) where
#: the goal lies and which moves lead into a hole. Every sentence is a claim the env's ``check_reasoning`` recognises
#: and supports; none names the move to make.
STATE_THOUGHTS: dict[str, Callable[[Any], str]] = {
    "FrozenLake": _state_thought_frozen_lake,
    "Sokoban": _state_thought_sokoban,
}


def state_thought(ctx: TurnContext) -> str:
    """What a turn's state is, in words (:data:`STATE_THOUGHTS`); a ``ValueError`` naming the envs it knows."""
    make = STATE_THOUGHTS.get(env_family(ctx.env_id))
    if make is None:
        raise ValueError(f"no state thought for env {ctx.env_id}; known env families: {sorted(STATE_THOUGHTS)}")
    return make(ctx.env.unwrapped)



class MixedAgent(Agent):
    """The oracle's actions at a share of the turns, uniformly random valid ones at the others, under one thinking
    sentence for both (or, with ``think="state"``, the turn's state in words: :func:`state_thought`): a teacher whose
    action depends on the state, but only partly.

    Each turn is the oracle's with probability ``oracle_share`` (drawn from a generator seeded by ``(seed, env name,
    env seed, rollout, turn)``, so a run is reproducible and independent of batching). The thinking text does not
    depend on which kind of turn it is, so a model imitating this agent cannot tell the two kinds apart by its own
    thinking: what it learns is an action distribution that leans toward the oracle's action in each state
    (``oracle_share`` of the mass plus the uniform rest), if it can read the board at all. The ``mixed`` warm-up
    (:mod:`ragen_trainer.warmup`) uses it for that; with the fixed sentence SmolLM2-135M did not learn the state
    dependence from 64 episodes (docs/learning.md). The state thought writes the board's facts out first, so that the
    move can be read off text the model wrote itself (its coordinates, where the goal lies, which moves fall in).
    """

    name = "mixed"
    THINK = "I choose my next actions."
    #: ``think`` values: ``fixed`` (:attr:`THINK` on every turn) or ``state`` (:func:`state_thought`: the turn's state
    #: in words, the same for the oracle's turns and the random ones).
    THINKS: tuple[str, ...] = ("fixed", "state")

    def __init__(self, oracle_share: float = 0.5, seed: int = 0, think: str = "fixed") -> None:
        share_ok = isinstance(oracle_share, (int, float)) and not isinstance(oracle_share, bool)
        check_arg(share_ok and 0.0 <= oracle_share <= 1.0, "oracle_share", oracle_share, "a number in [0, 1]")
        check_arg(think in self.THINKS, "think", think, f"one of {list(self.THINKS)}")
        self.oracle_share = float(oracle_share)
        self.seed = int(seed)
        self.think = think

    def identity(self) -> dict[str, Any]:
        out = {"name": self.name, "kind": self.kind, "seed": self.seed, "oracle_share": self.oracle_share}
        return out if self.think == "fixed" else {**out, "think": self.think}

    def reply(self, ctx: TurnContext) -> AgentReply:
        rng = episode_rng("mixed", self.seed, ctx.env_name, ctx.seed, ctx.rollout, ctx.info.get("turn", 0))
        if rng.random() < self.oracle_share:
            policy = ORACLES.get(env_family(ctx.env_id))
            if policy is None:
                raise ValueError(f"MixedAgent has no oracle for env {ctx.env_id}; it knows {sorted(ORACLES)}")
            actions = policy(ctx)[1]
        else:
            actions = random_actions(ctx, rng)
        think = self.THINK if self.think == "fixed" else state_thought(ctx)
        return AgentReply(format_reply(ctx, think, actions))


#: Names accepted by ``ragen-trainer eval --agent``.
REFERENCE_AGENTS: dict[str, Callable[..., Agent]] = {"random": RandomAgent, "oracle": OracleAgent}


# ------------------------------------------------------------------------------------------------------ model
ENGINES: tuple[str, ...] = ("auto", "hf", "hf-generate", "vllm", "openai")


def hash_model_files(source: str | None) -> str | None:
    """sha256 (first 16 hex digits) over a local model folder's weights, config and tokenizer files; ``None`` when
    ``source`` is not a local folder (a hub id or an endpoint: its name is the identity then)."""
    import hashlib
    from pathlib import Path

    if not source or not Path(source).is_dir():
        return None
    folder = Path(source)
    patterns = ("*.safetensors", "*.bin", "*.gguf", "*.pt", "config.json", "tokenizer.json", "tokenizer_config.json",
                "adapter_config.json", "chat_template.jinja")  # fmt: skip
    files = sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


class _PrependingEngine:
    """A chat engine whose replies get ``text`` put before them: the generation prefix that a served ragen
    checkpoint's chat template wrote into the prompt and that a server (vLLM) leaves out of the reply it returns."""

    supports_token_ids = False
    tokenizer = None

    def __init__(self, engine: Any, text: str) -> None:
        if getattr(engine, "supports_token_ids", True):
            raise ValueError(f"invalid argument prepend={text!r}: only for a chat engine (openai), not "
                             f"{type(engine).__name__}")
        self.inner = engine
        self.text = text
        self.name = getattr(engine, "name", type(engine).__name__)

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        return self.inner.generate(prompts, params)  # raises: a chat engine takes messages

    def generate_chat(self, messages_batch: list[list[dict[str, str]]], params: Any) -> list[Any]:
        from dataclasses import replace

        return [replace(r, text=self.text + r.text) for r in self.inner.generate_chat(messages_batch, params)]

    def session(self, params: Any) -> Any:
        return BatchSession(self, params)  # type: ignore[arg-type]  (a duck-typed engine: generate_chat is enough)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # usage counters, base_url, ...
        return getattr(self.inner, name)


class ModelAgent(Agent):
    """A causal LM replying through one of the trainer's engines; all live episodes of a batch in one call.

    It generates exactly as training rollouts do (:class:`ragen_trainer.rollout.TokenAgent`): the chat template's
    prompt, the env protocol's generation prefix (``<think>`` / ``<answer>``, the suite's ``reply_prefix`` setting),
    then each later turn only the template's delta; earlier replies stay in the conversation cleaned and
    re-tokenised (``reply_tokens="cleaned"``, the reference's, as training and its validation keep them), so a
    trained model is evaluated the way it was trained. Chat engines (``openai``) cannot continue a partial reply: they get the messages
    and no prefix from ragen (a suite that sets an explicit non-empty ``reply_prefix`` is refused with them); a served
    ragen checkpoint's own chat template pre-writes its prefix (:mod:`ragen_trainer.model_card`), and ``transformers
    serve`` returns it in the reply, while vLLM needs ``prepend`` (the text put before every reply). When the served
    model is named by its local folder, the prefix its template pre-writes must be the suite's (else ``ValueError``
    naming both). What each env was effectively played with (generation prefix, stop strings, thinking, decoding) is
    :meth:`generation_settings`, which the runner records with its hash. Decoding is the
    suite's (temperature, top_p, max_new_tokens); the sampling seed of each call is derived from the suite's seed, the
    env and the batch's first seed and turn, so the same suite, model and batch size give the same replies.

    Build it with :meth:`load` (a model id / path / checkpoint folder, or an endpoint for ``engine="openai"``) or
    around an existing engine (``ModelAgent(engine, name=...)``, as the tests do with a tiny model).
    """

    kind = "model"

    def __init__(
        self,
        engine: Any,
        *,
        name: str,
        model: str | None = None,
        model_hash: str | None = None,
        engine_name: str | None = None,
        extra_identity: dict[str, Any] | None = None,
        max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS,
        prepend: str | None = None,
        template_prefix: str | None = None,
    ) -> None:
        if not hasattr(engine, "generate_chat"):
            raise ValueError(f"invalid argument engine={engine!r}: expected a ragen_trainer.engines GenerationEngine")
        self._token_prompts = bool(getattr(engine, "supports_token_ids", False)) and (
            getattr(engine, "tokenizer", None) is not None
        )
        if prepend is not None and not (isinstance(prepend, str) and prepend):
            raise ValueError(f"invalid argument prepend={prepend!r}: expected a non-empty str (or None)")
        if prepend is not None and self._token_prompts:
            raise ValueError(f"invalid argument prepend={prepend!r}: only for a chat engine (openai); a token engine "
                             "continues after the protocol's generation prefix itself")
        #: The generation prefix the served model's chat template pre-writes (a ragen checkpoint), when known.
        self.template_prefix = template_prefix
        #: Text put before every reply of a chat engine (the prefix a server's template wrote and left out).
        self.prepend = prepend
        if prepend is not None:
            engine = _PrependingEngine(engine, prepend)
        self.engine = engine
        self.name = name
        self.model = model
        self.model_hash = model_hash
        self.engine_name = engine_name or getattr(engine, "name", type(engine).__name__)
        self.extra_identity = dict(extra_identity or {})
        self.max_context_tokens = int(max_context_tokens)
        self.decoding: dict[str, Any] = {}
        self._env_name = ""
        self._agent: Any = None

    # -------------------------------------------------------------------------------------------- construction
    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        engine: str = AUTO,
        name: str | None = None,
        batch_size: int = 16,
        device: str = "auto",
        dtype: str = "auto",
        base_url: str | None = None,
        api_key: str | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        prepend: str | None = None,
    ) -> ModelAgent:
        """Load ``model`` (HF id, local folder, ``ragen-trainer train`` checkpoint; ``None``: the bundled SmolLM2)
        and wrap it in ``engine`` (``"auto"``: :func:`~ragen_trainer.engines.choice.choose_engine` for ``device``,
        printed; ``"hf"``, ``"hf-generate"``, ``"vllm"``, or ``"openai"`` for an OpenAI-compatible ``base_url``).

        With ``"openai"``, ``model`` is the served model's name; when that is a local folder (``transformers serve``
        and ``vllm serve`` name a model by the path they load) the prefix its chat template pre-writes is read from it
        and checked against each env of the suite. ``prepend``: text put before every reply (for a server that
        renders such a template but returns only the model's continuation, e.g. vLLM; not ``transformers serve``,
        which returns the prefix itself)."""
        from pathlib import Path

        if engine not in ENGINES:
            raise ValueError(f"invalid argument engine={engine!r}: expected one of {ENGINES}")
        if engine == AUTO:
            import torch  # lazily, as below: the reference agents need no torch

            where = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
            engine, why = choose_engine(AUTO, str(where).split(":")[0])
            print(f"generation engine: {engine} ({why})", file=sys.stderr, flush=True)
        if prepend is not None and engine != "openai":
            raise ValueError(f"invalid argument prepend={prepend!r}: only with engine='openai' (the {engine} engine "
                             "adds the protocol's generation prefix itself)")
        kwargs = dict(engine_kwargs or {})
        extra: dict[str, Any] = {}
        if engine == "openai":
            if not base_url:
                raise ValueError("invalid argument base_url=None: the openai engine needs the endpoint's base URL")
            if not model:
                raise ValueError("invalid argument model=None: the openai engine needs the served model's name")
            built = engines.OpenAIEngine(base_url=base_url, model=model, api_key=api_key, **kwargs)
            served = Path(model).expanduser()
            template_prefix = models.saved_template_prefix(served) if served.is_dir() else None
            return cls(built, name=name or model, model=model, engine_name="openai",
                       model_hash=hash_model_files(str(served)) if served.is_dir() else None,
                       extra_identity={"base_url": base_url}, prepend=prepend,
                       template_prefix=template_prefix)  # fmt: skip

        source = models.resolve_model_source(model)  # the local folder it loads from (the converted default too)
        if Path(source).is_dir() and is_ragen_checkpoint(source):
            extra["checkpoint"] = read_checkpoint_info(source)
        if engine == "vllm":
            import torch

            if torch.cuda.is_available():  # on a CPU vLLM reads it as a share of the RAM: its own default stays
                kwargs.setdefault("gpu_memory_utilization", 0.85)  # evaluation only: no trainer shares the GPU
            built = engines.VLLMEngine(source, **kwargs)
        else:
            net, tokenizer = models.load_model_and_tokenizer(model, device=device, dtype=dtype)
            net.eval()
            engine_cls = engines.GenerateEngine if engine == "hf-generate" else engines.HFEngine
            built = engine_cls(net, tokenizer, batch_size=batch_size, **kwargs)
            extra["dtype"] = str(next(net.parameters()).dtype).replace("torch.", "")
        label = models.DEFAULT_MODEL if models.is_default_model(model) else str(model)
        return cls(
            built,
            name=name or Path(label.rstrip("/")).name,
            model=label,
            model_hash=hash_model_files(source),
            engine_name=engine,
            extra_identity=extra,
        )

    def identity(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "model": self.model,
            "model_hash": self.model_hash,
            "engine": self.engine_name,
            # Token engines continue after each env's generation prefix (the suite's protocol); chat engines cannot.
            "generation_prefix": self._token_prompts,
            "max_context_tokens": self.max_context_tokens,
            **({"template_prefix": self.template_prefix} if self.template_prefix is not None else {}),
            **({"prepend": self.prepend} if self.prepend is not None else {}),
            **self.extra_identity,
        }

    def generation_settings(self, entries: Any) -> dict[str, Any]:
        """What each env of the suite is effectively generated with, by env name: the generation prefix the model
        continues after (a token engine: the env protocol's, added by ragen; a chat engine: the one the served ragen
        checkpoint's chat template pre-writes, known from its folder or from ``prepend``, else ``None``: no prefix
        known), the stop strings, thinking on/off and the pinned decoding; for envs of several turns also how earlier
        replies come back into the prompt (token engines: cleaned and re-tokenised; chat engines: as the server
        returned them, rendered by its template) and the context limit, which only then can matter.

        The runner records this, and its hash, in the result; the leaderboard ranks models together only when their
        suite hashes *and* these hashes agree. Who wrote the prefix is not part of it (the identity's
        ``generation_prefix`` / ``template_prefix`` / ``prepend`` say that): a served checkpoint whose template wrote
        ``<answer>`` generates exactly like ragen's engine that appended it, and ranks with it."""
        out: dict[str, Any] = {}
        for entry in entries:
            protocol = entry.protocol
            if self._token_prompts:
                prefix = protocol.generation_prefix
            else:
                prefix = self.template_prefix if self.template_prefix is not None else self.prepend
            settings: dict[str, Any] = {
                "generation_prefix": prefix,
                "stop_strings": list(protocol.stop_strings),
                "enable_think": protocol.enable_think,
                "decoding": {k: entry.decoding.get(k) for k in ("temperature", "top_p", "max_new_tokens", "seed")},
            }
            if protocol.max_turns > 1:
                settings["history"] = "cleaned token ids" if self._token_prompts else "replies as returned"
                settings["max_context_tokens"] = self.max_context_tokens if self._token_prompts else None
            out[entry.name] = settings
        return out

    # -------------------------------------------------------------------------------------------- acting
    def begin_env(self, entry: Any) -> None:
        """Called by the runner before each env of the suite: take that env's pinned decoding and protocol."""
        check_prefix_supported(self.engine, entry.protocol, f"the suite's env {entry.name!r}")
        if not self._token_prompts:
            wanted = entry.protocol.generation_prefix
            for what, prefix in (("the served model's chat template pre-writes", self.template_prefix),
                                 ("prepend is", self.prepend)):  # fmt: skip
                if prefix is not None and prefix != wanted:
                    raise ValueError(
                        f"{what} {prefix!r}, but the suite's env {entry.name!r} plays with the generation prefix "
                        f"{wanted!r} (enable_think={entry.protocol.enable_think}, reply_prefix="
                        f"{entry.protocol.reply_prefix!r}): its replies would not parse; evaluate with a protocol "
                        f"whose prefix is {prefix!r} (e.g. --protocol enable_think="
                        f"{'false' if prefix == '<answer>' else 'true'}) or --envs of such a suite"
                    )
        self._start(entry.name, entry.decoding)

    def _start(self, env_name: str, decoding: dict[str, Any]) -> None:
        """Generate from now on with ``decoding`` (the suite's keys), sampling seeds derived from ``env_name``."""
        self.decoding = dict(decoding)
        self._env_name = env_name
        params = SamplingParams(temperature=float(decoding["temperature"]), top_p=float(decoding["top_p"]),
                                max_new_tokens=int(decoding["max_new_tokens"]))  # fmt: skip
        tokenizer = getattr(self.engine, "tokenizer", None)
        # Evaluation trains nothing: no trajectory is made, so the loss mask is unused (and the group randomness is the
        # runner's jobs'); replies continue from their cleaned ids, as training keeps them (see the class docstring).
        settings = RolloutSettings(loss_mask="replies", reply_tokens="cleaned",
                                   max_context_tokens=self.max_context_tokens, group_randomness="shared")
        self._agent = TokenAgent(self.engine, tokenizer, params, settings=settings, seed_for=self._seed_for)

    def _seed_for(self, episodes: list[Episode], turn: int) -> int | None:
        seed = self.decoding.get("seed")
        if seed is None:
            return None
        first = episodes[0]
        return zlib.crc32(f"{seed}|{self._env_name}|{first.seed}|{first.rollout}|{turn}".encode())

    def _token_agent(self, context: TurnContext) -> Any:
        if self._agent is None:  # used outside the runner: the suites' default decoding
            self._start(context.env_name, DEFAULT_DECODING)
        return self._agent

    def reply_batch(self, contexts: list[TurnContext]) -> list[AgentReply]:
        if not contexts:
            return []
        return self._token_agent(contexts[0]).reply_batch(contexts)

    # The streaming form (ragen_envs.driver.StreamingAgent): episodes advance independently, so a continuous-batching
    # engine keeps its batch full; each episode's sampling seed depends on the episode only, not on the batch.
    def submit(self, context: TurnContext) -> AgentReply | None:
        return self._token_agent(context).submit(context)

    def poll(self) -> list[tuple[TurnContext, AgentReply]]:
        return self._agent.poll() if self._agent is not None else []

    def pending(self) -> bool:
        return self._agent is not None and self._agent.pending()

    def release(self, context: TurnContext) -> None:
        if self._agent is not None:
            self._agent.release(context)

    def finish_stream(self) -> None:
        if self._agent is not None:
            self._agent.finish_stream()

    def close(self) -> None:
        self.engine.close()
