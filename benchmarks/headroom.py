"""How much a policy can score on a FrozenLake or Sokoban run's validation states, computed exactly: what a policy
that does not read the board can gain at all, against one that does.

Why. Every multi-turn run of ``benchmarks/learn_multiturn.py`` starts from a warm-up whose first move is the same in
every state (``benchmarks/oracle_logprob.py``: FrozenLake's Up, Left or Down in 55-64 of 64 states, Sokoban's Left in
64 of 64), and no run's validation rose beyond its interval (docs/learning.md). This script says how far success can
move for a policy that plays the same moves whatever the board, and how far for one that reads it, on exactly the
states a run validates on.

What is computed. For each of ``--states`` validation states (the trainer's: ``reset(seed=VAL_SEED_BASE + i)``) the
env's own rules give, with no sampling, the probability of solving it within the episode's ``--moves`` moves:
FrozenLake's slip model (:func:`ragen_envs.frozen_lake.transition_model`: ``P[s, a, s']``, holes and goal absorbing),
Sokoban's deterministic moves (:func:`ragen_envs.sokoban.solver.move` over every position reachable in ``--moves``
moves, a solved position absorbing). The policies:

* **uniform random moves** (the ``random`` agent the warm-up imitates: the board is never read);
* **one move repeated** (each of the four): what a warm-up that prefers one move in every state plays;
* **the best open-loop sequence**: the one sequence of ``--moves`` moves, the same for every state, with the highest
  mean success over the states, found by exhaustive search over all ``4 ** moves`` sequences (the ceiling of any
  policy that ignores the board: mixing sequences cannot beat the best one);
* **the protocol's oracle**: the best policy that reads the board at the start of each of the ``--turns`` turns and
  plays up to ``--per-turn`` moves a turn without seeing the result (the text protocol's): on FrozenLake by dynamic
  programming over (turn, moves left, cell) and every move sequence of a turn; on Sokoban, where nothing slips, whether
  the level can be solved within ``--moves`` moves at all;
* **the closed-loop oracle** (FrozenLake): the best policy that sees the board after every move (``reach_values``).

Each row also gives the 95 % range a single validation of ``--states`` states would measure around that probability
(binomial), and the last lines the half-width of a gain's 95 % interval for one run and for three seeds pooled: a
policy that does not read the board can only show a gain larger than that if its best sequence is that far above
where it starts.

Run (numpy only, one core, a minute or two an env)::

    python benchmarks/headroom.py --md docs/learning/frozenlake-headroom.md
    python benchmarks/headroom.py --env ragen/Sokoban-v0 --md docs/learning/sokoban-headroom.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym
import numpy as np
from tqdm import tqdm

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.frozen_lake import ACTIONS as FROZEN_LAKE_ACTIONS
from ragen_envs.frozen_lake import FrozenLakeEnv, reach_values, transition_model
from ragen_envs.sokoban.env import SokobanEnv
from ragen_envs.sokoban.solver import ACTIONS as SOKOBAN_ACTIONS
from ragen_envs.sokoban.solver import move, solved
from ragen_trainer.safe_yaml import load_yaml
from ragen_trainer.trainer import VAL_SEED_BASE

#: Moves expanded breadth-first below each enumerated prefix in the exhaustive search (4**7 distributions a block).
BLOCK_DEPTH = 7


def frozen_lake_states(env_id: str, states: int, env_kwargs: dict[str, Any], first_seed: int = VAL_SEED_BASE
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The validation states' dynamics, stacked: ``P[n, s, a, s']``, goal indicators ``goal[n, s]``, terminal cells
    ``terminal[n, s]`` (holes and goal) and start distributions ``start[n, s]`` (one-hot), from
    ``gymnasium.make(env_id).reset(seed=first_seed + n)``."""
    env = gym.make(env_id, **env_kwargs)
    Ps, goals, terminals, starts = [], [], [], []
    for i in range(states):
        env.reset(seed=first_seed + i)
        if not isinstance(env.unwrapped, FrozenLakeEnv):
            raise TypeError(f"{env_id} is not a FrozenLake env")
        view = env.unwrapped.state_view()
        P, is_goal, terminal = transition_model(view)
        start = np.zeros(P.shape[0])
        start[view["player"][0] * view["size"][1] + view["player"][1]] = 1.0
        Ps.append(P)
        goals.append(is_goal)
        terminals.append(terminal)
        starts.append(start)
    env.close()
    sizes = {P.shape[0] for P in Ps}
    if len(sizes) != 1:
        raise ValueError(f"{env_id}: validation maps of different sizes {sorted(sizes)}")
    return np.stack(Ps), np.stack(goals), np.stack(terminals), np.stack(starts)


def sequence_success(P: np.ndarray, goal: np.ndarray, start: np.ndarray, moves: list[int]) -> np.ndarray:
    """Each state's probability of having reached the goal after playing ``moves`` blind (holes and goal absorb)."""
    dist = start
    for a in moves:
        dist = np.einsum("ns,nst->nt", dist, P[:, :, a, :])
    return (dist * goal).sum(axis=1)


def random_success(P: np.ndarray, goal: np.ndarray, start: np.ndarray, moves: int) -> np.ndarray:
    """Each state's probability of reaching the goal with ``moves`` uniformly random moves."""
    mean_move = P.mean(axis=2)
    dist = start
    for _ in range(moves):
        dist = np.einsum("ns,nst->nt", dist, mean_move)
    return (dist * goal).sum(axis=1)


def exhaustive_best_sequence(start: Any, play: Callable[[Any, int], Any], last_scores: Callable[[Any], np.ndarray],
                             moves: int, progress: bool = False) -> tuple[list[int], float]:
    """The sequence of ``moves`` moves (actions ``0..3``) with the highest mean success over the states, by
    exhaustive search over all ``4 ** moves``.

    ``start``: every state's start, ``[n, 1, ...]`` (one partial sequence); ``play(states, a)``: the states after move
    ``a``, same shape; ``last_scores(states)``: ``[m, 4]``, the mean success over the states of each of the ``m``
    partial sequences followed by each last move. The sequences are enumerated as a prefix (``moves - 1 -
    BLOCK_DEPTH`` moves, one at a time) and a block below it expanded breadth-first along axis 1 (the new move the
    slowest index), the last move scored without expanding."""
    prefix_len = max(0, moves - 1 - BLOCK_DEPTH)
    block = moves - 1 - prefix_len
    best_score, best_seq = -1.0, []
    prefixes = list(itertools.product(range(4), repeat=prefix_len))
    for prefix in tqdm(prefixes, desc="open-loop sequences", unit="block", disable=not progress, file=sys.stderr):
        states = start
        for a in prefix:
            states = play(states, a)
        for _ in range(block):
            states = np.concatenate([play(states, a) for a in range(4)], axis=1)
        scores = last_scores(states)
        m, a = np.unravel_index(int(np.argmax(scores)), scores.shape)
        if scores[m, a] > best_score:
            best_score = float(scores[m, a])
            inner = []
            for _ in range(block):  # decode m: the block's first move is its least significant base-4 digit
                inner.append(int(m % 4))
                m //= 4
            best_seq = [*prefix, *inner, int(a)]
    return [int(x) for x in best_seq], best_score


def best_open_loop(P: np.ndarray, goal: np.ndarray, start: np.ndarray, moves: int, progress: bool = False
                   ) -> tuple[list[int], float]:
    """FrozenLake's best sequence for all states (:func:`exhaustive_best_sequence` over the belief ``dist[n, m, s]``;
    after the last move ``a`` the success is ``dist @ (P[:, a] @ goal)``)."""
    last = np.einsum("nsat,nt->nas", P, goal)  # [n, a, s]: the goal's mass after each last move
    moves_ab = P.transpose(0, 2, 1, 3)  # [n, a, s, s']
    return exhaustive_best_sequence(
        start[:, None, :], lambda dist, a: dist @ moves_ab[:, a],
        lambda dist: np.einsum("nms,nas->ma", dist, last) / P.shape[0], moves, progress)


def protocol_oracle(P: np.ndarray, goal: np.ndarray, start: np.ndarray, turns: int, per_turn: int, moves: int
                    ) -> np.ndarray:
    """Each state's highest probability of reaching the goal under the text protocol: the board is read at the start of
    each of ``turns`` turns, then up to ``per_turn`` moves are played blind, ``moves`` in the whole episode.

    ``V[t][k][s]``: the best success from cell ``s`` at turn ``t`` with ``k`` moves left; a turn plays a sequence of
    ``1..min(per_turn, k)`` moves (``M_seq[s, s']`` the product of its moves' matrices), ``V[turns][k] = V[t][0] =
    goal``."""
    out = np.zeros(P.shape[0])
    for n in range(P.shape[0]):
        mats = [P[n, :, a, :] for a in range(4)]
        by_length = {1: np.stack(mats)}
        for length in range(2, per_turn + 1):
            by_length[length] = np.einsum("mst,atu->masu", by_length[length - 1], np.stack(mats)).reshape(
                -1, P.shape[1], P.shape[1])
        values = {k: goal[n] for k in range(moves + 1)}  # after the last turn
        for _ in range(turns):
            new = {0: goal[n]}
            for k in range(1, moves + 1):
                best = goal[n]
                for length in range(1, min(per_turn, k) + 1):
                    best = np.maximum(best, (by_length[length] @ values[k - length]).max(axis=0))
                new[k] = best
            values = new
        out[n] = values[moves] @ start[n]
    return out


def closed_loop_oracle(P: np.ndarray, goal: np.ndarray, terminal: np.ndarray, start: np.ndarray, moves: int
                       ) -> np.ndarray:
    """Each state's highest probability of reaching the goal within ``moves`` moves, seeing the board after each."""
    return np.array([reach_values(P[n], goal[n], terminal[n], moves)[-1] @ start[n] for n in range(P.shape[0])])


# Sokoban: deterministic moves over the positions reachable within the episode's moves -------------------------------


def sokoban_tables(env_id: str, states: int, env_kwargs: dict[str, Any], moves: int, first_seed: int = VAL_SEED_BASE
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The validation levels' moves (``reset(seed=first_seed + n)``) as tables: ``T[n, p, a]`` the position after action ``a`` (``SOKOBAN_ACTIONS``'
    order) from position ``p`` of level ``n``, over every position reachable within ``moves`` moves (breadth-first,
    :func:`ragen_envs.sokoban.solver.move`; position 0 the start, a solved position absorbing, unused rows of the
    padding pointing at themselves), and ``win[n, p]``, whether ``p`` is solved."""
    env = gym.make(env_id, **env_kwargs)
    tables, wins = [], []
    for i in range(states):
        env.reset(seed=first_seed + i)
        if not isinstance(env.unwrapped, SokobanEnv):
            raise TypeError(f"{env_id} is not a Sokoban env")
        level = env.unwrapped.snapshot()
        fixed = np.asarray(level.fixed)
        start = (tuple(map(tuple, level.boxes)), tuple(level.player))
        index = {start: 0}
        frontier, rows = [start], []
        for _ in range(moves + 1):  # the positions after `moves` moves get rows too (pointing onward or at themselves)
            nxt = []
            for position in frontier:
                row = []
                for action in SOKOBAN_ACTIONS:
                    after = position if solved(fixed, position[0]) else move(fixed, *position, action)
                    if after not in index:
                        index[after] = len(index)
                        nxt.append(after)
                    row.append(index[after])
                rows.append((index[position], row))
            frontier = nxt
        table = np.arange(len(index))[:, None].repeat(4, axis=1)
        for p, row in rows:
            table[p] = row
        tables.append(table)
        wins.append(np.array([solved(fixed, position[0]) for position in index]))
    env.close()
    size = max(len(t) for t in tables)
    T = np.zeros((states, size, 4), dtype=np.int64)
    win = np.zeros((states, size), dtype=bool)
    for n, (table, w) in enumerate(zip(tables, wins)):
        T[n] = np.arange(size)[:, None]
        T[n, : len(table)] = table
        win[n, : len(w)] = w
    return T, win


def sokoban_sequence_success(T: np.ndarray, win: np.ndarray, moves: list[int]) -> np.ndarray:
    """Whether each level is solved after playing ``moves`` (0 / 1)."""
    rows = np.arange(T.shape[0])
    position = np.zeros(T.shape[0], dtype=np.int64)
    for a in moves:
        position = T[rows, position, a]
    return win[rows, position].astype(float)


def sokoban_random_success(T: np.ndarray, win: np.ndarray, moves: int) -> np.ndarray:
    """Each level's probability of being solved by ``moves`` uniformly random moves."""
    n, size, _ = T.shape
    dist = np.zeros((n, size))
    dist[:, 0] = 1.0
    rows = np.repeat(np.arange(n), size)
    for _ in range(moves):
        new = np.zeros_like(dist)
        for a in range(4):
            np.add.at(new, (rows, T[:, :, a].ravel()), dist.ravel() / 4)
        dist = new
    return (dist * win).sum(axis=1)


def sokoban_best_open_loop(T: np.ndarray, win: np.ndarray, moves: int, progress: bool = False
                           ) -> tuple[list[int], float]:
    """Sokoban's best sequence for all levels (:func:`exhaustive_best_sequence` over the positions ``[n, m]``)."""
    rows = np.arange(T.shape[0])[:, None]
    return exhaustive_best_sequence(
        np.zeros((T.shape[0], 1), dtype=np.int64), lambda position, a: T[rows, position, a],
        lambda position: np.stack([win[rows, T[rows, position, a]].mean(axis=0) for a in range(4)], axis=1),
        moves, progress)


def sokoban_solvable(T: np.ndarray, win: np.ndarray, moves: int) -> np.ndarray:
    """Whether each level can be solved within ``moves`` moves (the tables hold every position reachable in them)."""
    n, size, _ = T.shape
    reach = np.zeros((n, size), dtype=bool)
    reach[:, 0] = True
    rows = np.repeat(np.arange(n), size)
    for _ in range(moves):
        new = reach.copy()
        for a in range(4):
            new[rows[reach.ravel()], T[:, :, a].ravel()[reach.ravel()]] = True
        reach = new
    return (reach & win).any(axis=1).astype(float)


def binomial_range(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The central 95 % range of a success rate measured on ``n`` states whose true mean is ``p`` (normal)."""
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n)
    return max(0.0, p - half), min(1.0, p + half)


def headroom(env_id: str, states: int, moves: int, turns: int, per_turn: int, env_kwargs: dict[str, Any],
             progress: bool = False) -> dict[str, Any]:
    """Every policy's mean success over the states (see the module's docstring), and the gains' interval widths."""
    rows: list[dict[str, Any]] = []

    def add(policy: str, reads_board: str, per_state: np.ndarray, **extra: Any) -> None:
        mean = float(per_state.mean())
        rows.append({"policy": policy, "reads_board": reads_board, "success": mean,
                     "validation_range": binomial_range(mean, states), **extra})

    probe = gym.make(env_id, **env_kwargs)
    family = type(probe.unwrapped)
    probe.close()
    if issubclass(family, SokobanEnv):
        T, win = sokoban_tables(env_id, states, env_kwargs, moves)
        names = SOKOBAN_ACTIONS
        add("uniform random moves", "never", sokoban_random_success(T, win, moves))
        for a, name in enumerate(names):
            add(f"{name} repeated", "never", sokoban_sequence_success(T, win, [a] * moves))
        seq, _ = sokoban_best_open_loop(T, win, moves, progress=progress)
        add("best open-loop sequence", "never", sokoban_sequence_success(T, win, seq),
            sequence=" ".join(names[a] for a in seq))
        held_T, held_win = sokoban_tables(env_id, states, env_kwargs, moves, first_seed=VAL_SEED_BASE + states)
        add("the same sequence on other states", "never", sokoban_sequence_success(held_T, held_win, seq))
        add("protocol's oracle (solvable within the moves)", f"at each of {turns} turns",
            sokoban_solvable(T, win, moves))
    elif issubclass(family, FrozenLakeEnv):
        P, goal, terminal, start = frozen_lake_states(env_id, states, env_kwargs)
        names = FROZEN_LAKE_ACTIONS
        add("uniform random moves", "never", random_success(P, goal, start, moves))
        for a, name in enumerate(names):
            add(f"{name} repeated", "never", sequence_success(P, goal, start, [a] * moves))
        seq, _ = best_open_loop(P, goal, start, moves, progress=progress)
        add("best open-loop sequence", "never", sequence_success(P, goal, start, seq),
            sequence=" ".join(names[a] for a in seq))
        held_P, held_goal, _, held_start = frozen_lake_states(env_id, states, env_kwargs, VAL_SEED_BASE + states)
        add("the same sequence on other states", "never", sequence_success(held_P, held_goal, held_start, seq))
        add("protocol's oracle", f"at each of {turns} turns", protocol_oracle(P, goal, start, turns, per_turn, moves))
        add("closed-loop oracle", "after every move", closed_loop_oracle(P, goal, terminal, start, moves))
    else:
        raise TypeError(f"{env_id} is neither a FrozenLake nor a Sokoban env")
    p0 = rows[0]["success"]
    one_run = 1.96 * math.sqrt(2 * p0 * (1 - p0) / states)
    pooled = 1.96 * math.sqrt(2 * p0 * (1 - p0) / (3 * states))
    return {"env": env_id, "env_kwargs": env_kwargs, "states": states, "moves": moves, "turns": turns,
            "per_turn": per_turn, "rows": rows, "gain_half_width_one_run": one_run,
            "gain_half_width_three_seeds": pooled}


def format_markdown(result: dict[str, Any]) -> str:
    lines = [(f"Exact success probabilities on {result['env']}'s {result['states']} validation states "
              f"(seeds {VAL_SEED_BASE}..{VAL_SEED_BASE + result['states'] - 1}), {result['moves']} moves an episode, "
              f"{result['turns']} turns of up to {result['per_turn']} moves:"), "",
             f"| policy | reads the board | mean success | a {result['states']}-state validation's 95 % range |",
             "|---|---|---:|---:|"]
    for row in result["rows"]:
        lo, hi = row["validation_range"]
        name = row["policy"] + (f" ({row['sequence']})" if "sequence" in row else "")
        lines.append(f"| {name} | {row['reads_board']} | {row['success']:.3f} | {lo:.2f}-{hi:.2f} |")
    lines += ["", (f"The best open-loop sequence is the best of all sequences on these very states (an in-sample "
                   f"maximum); the row after it plays the same sequence on {result['states']} other states (seeds "
                   f"{VAL_SEED_BASE + result['states']}..{VAL_SEED_BASE + 2 * result['states'] - 1}), what a policy "
                   f"that learned it elsewhere would score. Half-width of a gain's 95 % interval around the random "
                   f"policy's rate: {result['gain_half_width_one_run']:.3f} for one run ({result['states']} states "
                   f"each end), {result['gain_half_width_three_seeds']:.3f} for three seeds pooled.")]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="ragen/FrozenLake-v0",
                   help="a FrozenLake or Sokoban env id (default ragen/FrozenLake-v0)")
    p.add_argument("--env-kwargs", default="{}", help="YAML mapping of env arguments (e.g. '{size: 4}')")
    p.add_argument("--states", type=int, default=128, help="validation states (the runs': 128)")
    p.add_argument("--moves", type=int, default=10, help="moves an episode (the protocol's: 10)")
    p.add_argument("--turns", type=int, default=5, help="turns an episode (the protocol's: 5)")
    p.add_argument("--per-turn", type=int, default=5, help="moves a turn at most (the protocol's: 5)")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--md", help="write the table here (Markdown)")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.states < 1 or not 1 <= args.moves <= 12 or args.turns < 1 or args.per_turn < 1:
        parser.error("--states >= 1, 1 <= --moves <= 12 (the search is exhaustive: 4**moves sequences), "
                     "--turns >= 1 and --per-turn >= 1")
    try:
        env_kwargs = load_yaml(args.env_kwargs, "--env-kwargs")
    except ValueError as error:
        parser.error(f"--env-kwargs {args.env_kwargs!r}: {error}")
    if not isinstance(env_kwargs, dict):
        parser.error(f"--env-kwargs {args.env_kwargs!r}: expected a mapping such as '{{size: 4}}'")
    started = time.perf_counter()
    try:
        result = headroom(args.env, args.states, args.moves, args.turns, args.per_turn, env_kwargs,
                          progress=not args.no_progress)
    except (gym.error.Error, TypeError, ValueError, KeyError) as error:
        parser.error(f"--env {args.env} {env_kwargs}: {error} (FrozenLake and Sokoban env ids and their arguments are accepted)")
    result["seconds"] = time.perf_counter() - started
    text = format_markdown(result)
    print(text, end="")
    print(f"done in {result['seconds']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.md:
        Path(args.md).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
