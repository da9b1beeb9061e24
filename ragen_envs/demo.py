"""``ragen-demo`` (also ``python -m ragen_envs``): play every registered env with a scripted agent and show the episodes.

The agents see only what a model would see plus the env's structured state (``env.unwrapped.state_view()``), and
reply in the paper's format, with thinking written from that state (so the reasoning-grounding reward can check it):

* Bandit*: pulls the high-risk arm (the one whose expected payout is higher);
* FrozenLake: the move with the best chance to reach the goal in the moves left (dynamic programming over the
  slippery dynamics), one move a turn;
* Countdown: answers with :func:`ragen_envs.countdown.solve_countdown`;
* WebShop: searches for the instruction, opens the first result within budget, picks the options the instruction
  names when they are offered, and buys (a rule agent, like the original paper's rule baseline);
* Sokoban*: plays the solver's optimal plan (:func:`ragen_envs.sokoban.solver.solve_env`), as many moves a turn as
  the protocol allows;
* the text games (TicTacToe, ConnectFour, PrisonersDilemma, Negotiation): the game's strongest fixed opponent
  (:attr:`ragen_envs.games.GameEntry.strongest`) plays the agent's seat against the env's default opponent;
* anything else (new envs): random valid actions.

WebShop starts an embedded server (1,000 generated products) when its extra (``pip install ragen[webshop]``) is
installed, and is skipped otherwise or with ``--no-webshop``.

    ragen-demo                      # every env (the paper's and the games), 3 episodes each, the first one printed
    ragen-demo --env FrozenLake --episodes 20 --quiet
    ragen-demo --env TicTacToe
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ragen_envs.countdown import solve_countdown
from ragen_envs.driver import Episode, play_episodes, rollout_jobs
from ragen_envs.frozen_lake import best_action
from ragen_envs.games import GAMES, game_of
from ragen_envs.registration import ENV_IDS, GAME_IDS
from ragen_envs.sokoban.solver import solve_env

#: A scripted policy: the live episode (its env, latest info and protocol) and a generator -> the reply text.
Policy = Callable[[Episode, np.random.Generator], str]


def bandit_agent(episode: Episode, rng: np.random.Generator) -> str:
    view = episode.env.unwrapped.state_view()  # type: ignore[union-attr]
    high, low = view["high_risk_arm"], view["low_risk_arm"]
    return (
        f"<think>{high} is the risky arm and {low} is the safe one. The risky arm has the higher expected payout."
        f"</think><answer>{high}</answer>"
    )


def frozen_lake_agent(episode: Episode, rng: np.random.Generator) -> str:
    view = episode.env.unwrapped.state_view()  # type: ignore[union-attr]
    # One move a turn: the moves left are bounded by the action budget and by the turns left.
    turns_left = episode.protocol.max_turns - int(episode.info.get("turn", 0))
    steps_left = max(1, min(int(episode.info.get("actions_left", 1)), turns_left))
    move, chance = best_action(view, steps_left)
    (r, c), (gr, gc) = view["player"], view["goal"]
    think = (
        f"I am at ({r}, {c}) and the goal is at ({gr}, {gc}). The ice is slippery, so I plan one move at a time: "
        f"moving {move.lower()} gives the best chance ({chance:.0%}) to reach the goal in {steps_left} moves."
    )
    return f"<think>{think}</think><answer>{move}</answer>"


def countdown_agent(episode: Episode, rng: np.random.Generator) -> str:
    view = episode.env.unwrapped.state_view()  # type: ignore[union-attr]
    solution = solve_countdown(view["numbers"], view["target"]) or " + ".join(map(str, view["numbers"]))
    return f"<think>{solution} = {view['target']}</think><answer>{solution}</answer>"


def webshop_agent(episode: Episode, rng: np.random.Generator) -> str:
    view = episode.env.unwrapped.state_view()  # type: ignore[union-attr]
    instruction = view.get("instruction", "")
    clickables = view.get("clickables", [])
    if view.get("page") == "search":
        query = instruction.split(", and price")[0].removeprefix("i need a ").removeprefix("i want a ")
        return f"<think>Search for what the instruction asks.</think><answer>search[{query}]</answer>"
    if view.get("page") == "results":
        budget = view.get("budget") or float("inf")
        for product in view.get("products", []):
            price = product.get("price", "")
            first = price.replace("$", "").split(" to ")[0].split("-")[0].strip()
            within = not first.replace(".", "", 1).isdigit() or float(first) <= budget
            if within and product["asin"].lower() in clickables:
                return f"<think>{product['title'][:60]} is within budget.</think><answer>click[{product['asin'].lower()}]</answer>"
        return "<think>Nothing fits; take the first result.</think><answer>click[" + (
            [c for c in clickables if c not in ("back to search", "next >", "< prev")] or ["back to search"]
        )[0] + "]</answer>"
    wanted = [c for c in clickables if c not in ("buy now", "back to search", "< prev", "next >") and c in instruction]
    selected = view.get("selected") if isinstance(view.get("selected"), dict) else {}
    chosen = {str(v).lower() for v in selected.values()}
    # With one action left, buy now (as the reference's WebShop tips say): an unfinished episode buys nothing.
    last_action = int(episode.info.get("actions_left", 2)) <= 1
    for option in wanted:
        if last_action:
            break
        if option not in chosen and option not in ("description", "features", "reviews", "attributes"):
            return f"<think>The instruction asks for {option}.</think><answer>click[{option}]</answer>"
    target = "buy now" if "buy now" in clickables else (clickables or ["back to search"])[0]
    return f"<think>This matches; buy it.</think><answer>click[{target}]</answer>"


def sokoban_agent(episode: Episode, rng: np.random.Generator) -> str:
    plan = solve_env(episode.env)
    if plan is None or not plan.actions:  # deadlocked or already solved: nothing useful to do
        return random_agent(episode, rng)
    moves = plan.actions[: episode.protocol.actions_per_turn]
    sep = f" {episode.protocol.action_sep} "
    return (
        f"<think>The solver's plan needs {plan.moves} more moves ({plan.pushes} pushes).</think>"
        f"<answer>{sep.join(moves)}</answer>"
    )


def game_agent(episode: Episode, rng: np.random.Generator) -> str:
    """The game's strongest fixed opponent playing the agent's seat (one player per episode: some remember the game)."""
    base = episode.env.unwrapped  # type: ignore[union-attr]
    if "player" not in episode.memory:
        player = base.opponents[GAMES[game_of(episode.env_id) or ""].strongest]()
        player.reset(base.seat)
        episode.memory["player"] = player
    player = episode.memory["player"]
    move = player.act(base.state_view(), rng)
    return episode.protocol.format_reply([move], f"The {player.name} player's move: {move}.")


def random_agent(episode: Episode, rng: np.random.Generator) -> str:
    names = list(episode.env.unwrapped.action_names) or ["noop"]  # type: ignore[union-attr]
    k = episode.protocol.actions_per_turn
    moves = [names[int(i)] for i in rng.integers(len(names), size=int(rng.integers(1, k + 1)))]
    sep = f" {episode.protocol.action_sep} "
    return f"<think>I will explore with {len(moves)} random moves.</think><answer>{sep.join(moves)}</answer>"


class ScriptedAgent:
    """A :class:`Policy` as an agent of the episode driver; each episode draws from its own generator (its seed)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def reply_batch(self, episodes: list[Episode]) -> list[str]:
        replies = []
        for episode in episodes:
            rng = episode.memory.setdefault("rng", np.random.default_rng(episode.seed))
            replies.append(self.policy(episode, rng))
        return replies


def agent_for(env_id: str) -> tuple[str, Policy]:
    if "Bandit" in env_id:
        return "high-risk arm", bandit_agent
    if "FrozenLake" in env_id:
        return "planner", frozen_lake_agent
    if "Countdown" in env_id:
        return "solver", countdown_agent
    if "WebShop" in env_id:
        return "rule", webshop_agent
    if "Sokoban" in env_id:
        return "solver", sokoban_agent
    if game_of(env_id) is not None:
        return f"{GAMES[game_of(env_id) or ''].strongest} player", game_agent
    return "random", random_agent


def show_episode(episode: Episode) -> None:
    """Print one played episode: the prompts, the replies and what the env answered."""
    print(f"--- system prompt ---\n{episode.system_prompt}\n--- turn 1 prompt ---\n{episode.first_observation}")
    for k, turn in enumerate(episode.turns, 1):
        print(f"--- reply {k} ---\n{turn.reply}\n--- env (reward {turn.reward:g}, parts {turn.info['reward_parts']}) ---")
        print(turn.observation)


def offline_ids(include_webshop: bool) -> tuple[list[str], list[tuple[str, str]]]:
    ids, skipped = [], []
    for env_id, spec in {**ENV_IDS, **GAME_IDS}.items():
        module = spec.env_cls.partition(":")[0]
        if "WebShop" in env_id and not include_webshop:
            skipped.append((env_id, "--no-webshop given"))
        elif "WebShop" in env_id and importlib.util.find_spec("bm25s") is None:
            skipped.append((env_id, "the webshop extra is not installed: pip install 'ragen[webshop]'"))
        elif (
            importlib.util.find_spec(module.rpartition(".")[0] or module) is None
            or importlib.util.find_spec(module) is None
        ):
            skipped.append((env_id, f"module {module} is not installed"))
        else:
            ids.append(env_id)
    return ids, skipped


def print_table(rows: list[dict[str, Any]]) -> None:
    headers = ["env", "agent", "episodes", "success", "mean reward", "mean turns", "seconds"]
    cells = [
        [
            r["env"],
            r["agent"],
            str(r["episodes"]),
            f"{r['success']:.0%}",
            f"{r['reward']:.3f}",
            f"{r['turns']:.1f}",
            f"{r['seconds']:.2f}",
        ]
        for r in rows
    ]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
        print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
        print("  ".join("-" * w for w in widths))
        for c in cells:
            print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)))
        return
    table = Table(title="ragen-demo summary")
    for h in headers:
        table.add_column(h, justify="left" if h in ("env", "agent") else "right", no_wrap=True)
    for c in cells:
        table.add_row(*c)
    Console(width=max(120, Console().width)).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ragen-demo", description="Play every registered ragen env (the paper's and the text games) with a "
        "scripted agent."
    )
    parser.add_argument("--env", default="", help="only ids containing this text (case-insensitive)")
    parser.add_argument("--episodes", type=int, default=3, help="episodes per env (default 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode; episode k uses seed + k")
    parser.add_argument("--quiet", action="store_true", help="do not print the first episode of each env")
    parser.add_argument("--no-webshop", action="store_true", help="skip WebShop (it starts an embedded server)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"invalid argument --episodes={args.episodes}: expected an int >= 1")

    ids, skipped = offline_ids(not args.no_webshop)
    ids = [i for i in ids if args.env.lower() in i.lower()]
    skipped = [(i, why) for i, why in skipped if args.env.lower() in i.lower()]
    if not ids:
        print(f"no env matches --env {args.env!r}; ids: {', '.join([*ENV_IDS, *GAME_IDS])}", file=sys.stderr)
        return 2
    rows = []
    for n, env_id in enumerate(ids, 1):
        label, agent = agent_for(env_id)
        print(f"[{n}/{len(ids)}] {env_id}: {args.episodes} episode(s), {label} agent", flush=True)
        start = time.perf_counter()
        try:
            seeds = [args.seed + k for k in range(args.episodes)]
            episodes = play_episodes(env_id, rollout_jobs(seeds), ScriptedAgent(agent))
        except Exception as exc:  # one broken env (e.g. a server not running) must not stop the demo
            skipped.append((env_id, f"failed: {type(exc).__name__}: {exc}"))
            print(f"    skipped: {type(exc).__name__}: {exc}", flush=True)
            continue
        if not args.quiet:
            show_episode(episodes[0])
        rows.append(
            {
                "env": env_id,
                "agent": label,
                "episodes": len(episodes),
                "success": float(np.mean([e.success for e in episodes])),
                "reward": float(np.mean([e.reward for e in episodes])),
                "turns": float(np.mean([len(e.turns) for e in episodes])),
                "seconds": time.perf_counter() - start,
            }
        )
    print()
    print_table(rows)
    for env_id, why in skipped:
        print(f"skipped {env_id}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
