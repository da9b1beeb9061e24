"""Game steps/s of ragen's text games, next to TextArena's same games, in one run.

One step is one seat's reply processed by the env. Both seats are played by a scripted random-legal-move player that
writes its move as text (ragen: ``<think>..</think><answer>5</answer>`` through each seat's turn protocol; TextArena:
its bracketed action, ``[4]``), so the figures measure the envs, not a model. Game ``g`` is reset with seed
``--seed + g``, which also seeds the players' moves, so every run plays the same games; the reset is inside the
timing, building the env object is not (ragen's envs are made once and reset per game; TextArena's are made per game,
since its default observation wrapper keeps the previous games' messages across resets). One untimed game warms each
one up; then the games are played ``--repeat`` times (default 3) and the fastest play counts, which keeps a shared
machine's noise out of the figures.

* ragen PettingZoo: ``aec_env(game)`` (TicTacToe, ConnectFour, the negotiation) or ``parallel_env(game)`` (the
  Prisoner's Dilemma: one Parallel step is two replies, so two steps);
* ragen view: the single-agent ``gymnasium.make("ragen/<Game>-v0", opponent="random")``; its steps are the agent's
  turns, each with the opponent's answer inside it;
* TextArena: ``ta.make(id)`` in a virtual environment of its own (``.venv-textarena``, made by this script on first
  use with ``python -m venv`` and ``pip install textarena==0.7.4``; TextArena is no dependency of ragen), run in a
  subprocess that prints its figures back as JSON.

Rates are per CPU second of the process that plays the games (what one core does, even on a shared machine); the
JSON also has them per wall second.

    python benchmarks/bench_games.py                      # 200 games of each; builds .venv-textarena on first use
    python benchmarks/bench_games.py --no-textarena       # ragen only
    python benchmarks/bench_games.py --games 50 --game tictactoe --json results/bench_games.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.games import GAMES, aec_env, parallel_env

ROOT = Path(__file__).resolve().parents[1]
TEXTARENA_REQUIREMENT = "textarena==0.7.4"
DEFAULT_TEXTARENA_VENV = ROOT / ".venv-textarena"

#: ragen game -> TextArena's id of the same game (its default wrappers: what an LLM agent plays).
TEXTARENA_IDS: dict[str, str] = {
    "tictactoe": "TicTacToe-v0",
    "connect_four": "ConnectFour-v0",
    "prisoners_dilemma": "IteratedPrisonersDilemma-v0",
    "negotiation": "SimpleNegotiation-v0",
}
#: Where TextArena's game differs from ragen's (printed under the table).
TEXTARENA_NOTES: dict[str, str] = {
    "prisoners_dilemma": "TextArena's has a free-text chat turn per player before each round's choice: 4 steps a "
    "round, ragen's 2",
    "negotiation": "TextArena registers no Deal-or-No-Deal game; SimpleNegotiation-v0 (trading five resources, 10 "
    "turns, no early end) is its nearest two-player negotiation: different rules",
}


# ------------------------------------------------------------------------------------------------ measurements
@dataclass
class Measurement:
    """Steps played, games, and the wall and CPU seconds they took (resets included): the fastest of ``repeats``
    plays of the same games."""

    steps: int
    games: int
    wall_s: float
    cpu_s: float
    repeats: int = 1

    @property
    def steps_per_s(self) -> float:
        """Steps per CPU second of the process that played them."""
        return self.steps / max(self.cpu_s, 1e-9)

    @property
    def steps_per_wall_s(self) -> float:
        return self.steps / max(self.wall_s, 1e-9)

    @property
    def steps_per_game(self) -> float:
        return self.steps / max(self.games, 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "steps_per_s": self.steps_per_s,
            "steps_per_wall_s": self.steps_per_wall_s,
            "steps_per_game": self.steps_per_game,
        }


def _timed(
    play_game: Callable[[int], int], games: int, seed: int, repeats: int, advance: Callable[[], None]
) -> Measurement:
    """Play one untimed warm-up game, then ``repeats`` times the ``games`` games of seeds ``seed``, ``seed + 1``, ...
    (a seed fixes the whole game, the players' moves included); the fastest repetition."""
    play_game(seed + games)  # warm-up: first imports, caches, allocations
    best: Measurement | None = None
    for _ in range(repeats):
        steps, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
        for g in range(games):
            steps += play_game(seed + g)
            advance()
        run = Measurement(steps, games, time.perf_counter() - wall0, time.process_time() - cpu0, repeats)
        best = run if best is None or run.cpu_s < best.cpu_s else best
    assert best is not None
    return best


def _reply(move: str) -> str:
    """A model reply in the games' registered protocol (thinking on)."""
    return f"<think>I play this.</think><answer>{move}</answer>"


def _random_player(game: str) -> Callable[[dict[str, Any], np.random.Generator], str]:
    """The game's random legal mover (its ``random`` opponent): view -> move text."""
    return GAMES[game].env.opponents["random"]().act


def bench_pettingzoo(
    game: str, games: int, seed: int = 0, repeats: int = 1, advance: Callable[[], None] = lambda: None
) -> Measurement:
    """Both seats of ragen's PettingZoo env played by the random legal mover; one step per reply."""
    act = _random_player(game)
    if GAMES[game].api == "aec":
        env = aec_env(game)
        core = env.unwrapped.core

        def play_game(s: int) -> int:
            env.reset(seed=s)
            rng = np.random.default_rng(s)  # the players' moves: fixed by the game's seed
            steps = 0
            for agent in env.agent_iter():
                _, _, terminated, truncated, _ = env.last()
                if terminated or truncated:
                    env.step(None)
                    continue
                env.step(_reply(act(core.state_view(int(agent[-1])), rng)))
                steps += 1
            return steps

    else:
        env = parallel_env(game)
        core = env.core

        def play_game(s: int) -> int:
            env.reset(seed=s)
            rng = np.random.default_rng(s)  # the players' moves: fixed by the game's seed
            steps = 0
            while env.agents:
                replies = {a: _reply(act(core.state_view(int(a[-1])), rng)) for a in env.agents}
                env.step(replies)
                steps += len(replies)
            return steps

    return _timed(play_game, games, seed, repeats, advance)


def bench_view(
    game: str, games: int, seed: int = 0, repeats: int = 1, advance: Callable[[], None] = lambda: None
) -> Measurement:
    """ragen's single-agent view against its ``random`` opponent; one step per agent turn."""
    act = _random_player(game)
    env = gym.make(GAMES[game].env_id, opponent="random")
    base = env.unwrapped

    def play_game(s: int) -> int:
        env.reset(seed=s)
        rng = np.random.default_rng(s)
        steps, done = 0, False
        while not done:
            _, _, terminated, truncated, _ = env.step(_reply(act(base.core.state_view(base.seat), rng)))
            steps += 1
            done = terminated or truncated
        return steps

    return _timed(play_game, games, seed, repeats, advance)


# ------------------------------------------------------------------------------------------------ TextArena
# Run by the TextArena venv's Python: argv[1] is {"env_id", "game", "games", "seed", "repeats"}; prints one JSON line
# per game
# played ({"game_done": n}) and then {"result": {...}} (or {"error": "..."}).
TEXTARENA_SCRIPT = r"""
import json, random, sys, time
from importlib.metadata import version

args = json.loads(sys.argv[1])
try:
    import textarena as ta
except Exception as exc:
    print(json.dumps({"error": f"import textarena: {type(exc).__name__}: {exc}"}), flush=True)
    sys.exit(0)


def tictactoe(env, rng):
    board = env.state.game_state["board"]
    return f"[{rng.choice([r * 3 + c for r in range(3) for c in range(3) if board[r][c] == ''])}]"


def connect_four(env, rng):
    top = env.state.game_state["board"][0]
    return f"[col {rng.choice([c for c, cell in enumerate(top) if cell == '.'])}]"


def prisoners_dilemma(env, rng):
    if env.state.game_state["phase"] == "conversation":
        return "Let us both cooperate."
    return rng.choice(["[Cooperate]", "[Defect]"])


def negotiation(env, rng):  # as ragen's random negotiator: accept a standing offer with p 0.3, else a random offer
    state = env.state.game_state
    me = env.state.current_player_id
    mine = state["player_resources"][me]
    offer = state["current_offer"]
    if offer and offer["to_player"] == me and rng.random() < 0.3:
        if all(mine.get(res, 0) >= n for res, n in offer["requested_resources"].items()):
            return "[Accept]"
    give = rng.choice([res for res, n in mine.items() if n > 0])
    get = rng.choice([res for res in mine if res != give])
    return f"[Offer: {rng.randint(1, min(3, mine[give]))} {give} -> {rng.randint(1, 3)} {get}]"


player = globals()[args["game"]]


def play_game(seed):
    env = ta.make(args["env_id"])  # a new env per game: the default observation wrapper keeps messages over resets
    env.reset(num_players=2, seed=seed)
    rng = random.Random(seed)  # the players' moves: fixed by the game's seed
    steps, done = 0, False
    while not done:
        _player_id, _observation = env.get_observation()
        done, _info = env.step(action=player(env, rng))
        steps += 1
    env.close()
    return steps


best = None
try:
    play_game(args["seed"] + args["games"])  # warm-up
    for _ in range(args["repeats"]):
        steps, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
        for g in range(args["games"]):
            steps += play_game(args["seed"] + g)
            print(json.dumps({"game_done": 1}), flush=True)
        run = {"steps": steps, "wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0}
        best = run if best is None or run["cpu_s"] < best["cpu_s"] else best
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    sys.exit(0)
result = {**best, "games": args["games"], "repeats": args["repeats"]}
print(json.dumps({"result": result, "textarena": version("textarena"), "python": sys.version.split()[0]}), flush=True)
"""


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _textarena_version(python: Path) -> str | None:
    """TextArena's version in ``python``'s environment, ``None`` if it does not import."""
    code = "import textarena; from importlib.metadata import version; print(version('textarena'))"
    try:
        done = subprocess.run([str(python), "-I", "-c", code], check=False, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def setup_command(venv: Path) -> str:
    """The shell command that builds the TextArena venv by hand."""
    py = _venv_python(venv)
    return f"{Path(sys.executable).name} -m venv {venv} && {py} -m pip install '{TEXTARENA_REQUIREMENT}'"


def ensure_textarena(venv: Path, log: Callable[[str], None] = print) -> tuple[Path | None, str]:
    """The TextArena venv's Python and TextArena's version, building the venv on first use; ``(None, why)`` when it
    cannot be built (no network, ...)."""
    python = _venv_python(venv)
    if python.exists():
        found = _textarena_version(python)
        if found is not None:
            return python, found
    state = "has no working textarena" if python.exists() else "not found"
    log(f"TextArena venv: {venv} {state}; building it ({TEXTARENA_REQUIREMENT}, from PyPI; a minute or so)")
    steps = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps.append([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", TEXTARENA_REQUIREMENT])
    for cmd in steps:
        log("  $ " + " ".join(cmd))
        try:
            done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"could not build the TextArena venv ({type(exc).__name__}); by hand: {setup_command(venv)}"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"could not build the TextArena venv ({tail[0]}); by hand: {setup_command(venv)}"
    found = _textarena_version(python)
    if found is None:
        return None, f"textarena does not import in {venv}; rebuild it: rm -r {venv} && {setup_command(venv)}"
    log(f"TextArena venv: ready, textarena {found}")
    return python, found


def bench_textarena(
    python: Path, game: str, games: int, seed: int = 0, repeats: int = 1, advance: Callable[[], None] = lambda: None
) -> tuple[Measurement | None, str | None]:
    """TextArena's same game, played in ``python`` (the TextArena venv) by the same kind of random legal mover;
    ``(None, why)`` when it cannot run."""
    env_id = TEXTARENA_IDS.get(game)
    if env_id is None:
        return None, "no such game in TextArena"
    args = json.dumps({"env_id": env_id, "game": game, "games": games, "seed": seed, "repeats": repeats})
    proc = subprocess.Popen(  # -I: none of this checkout's paths or PYTHON* settings; -u: lines in the order written
        [str(python), "-I", "-u", "-c", TEXTARENA_SCRIPT, args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one pipe: read as it comes, it never fills up
        text=True,
        cwd=str(ROOT),
    )
    assert proc.stdout is not None
    result: dict[str, Any] | None = None
    error: str | None = None
    other = ""  # the last line that is not the script's (a traceback's last line, a library's print)
    for line in proc.stdout:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            message = None
        if not isinstance(message, dict):
            other = line.strip() or other
        elif "game_done" in message:
            advance()
        elif "result" in message:
            result = message["result"]
        elif "error" in message:
            error = message["error"]
    proc.wait()
    if result is not None:
        return Measurement(**result), None
    if error is None:
        error = other or f"exit status {proc.returncode}"
    return None, error


# ------------------------------------------------------------------------------------------------ the run
class _Progress:
    """rich's progress bars on stderr (plain lines without rich, nothing when off)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._rich: Any = None

    @contextlib.contextmanager
    def running(self) -> Iterator[_Progress]:
        if self.enabled:
            try:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            except ImportError:
                pass
            else:
                columns = (TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
                with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
                    self._rich = progress
                    yield self
                self._rich = None
                return
        yield self

    def log(self, text: str) -> None:
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def task(self, description: str, total: int) -> Callable[[], None]:
        """Announce a measurement of ``total`` games; the callable advances it by one game."""
        if self._rich is not None:
            task_id = self._rich.add_task(description, total=total)
            return lambda: self._rich.advance(task_id)
        self.log(f"{description} ({total} games) ...")
        return lambda: None


def run_benchmark(
    games: int = 200,
    *,
    seed: int = 0,
    repeats: int = 3,
    only: list[str] | None = None,
    view: bool = True,
    textarena: bool = True,
    textarena_venv: Path = DEFAULT_TEXTARENA_VENV,
    textarena_python: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure every game (those in ``only``, if given); the results as a JSON-ready dict."""
    names = [g for g in GAMES if not only or g in only]
    bars = _Progress(progress)
    ta_python: Path | None = None
    ta_status = "skipped (--no-textarena)"
    ta_version: str | None = None
    rows: list[dict[str, Any]] = []
    with bars.running():
        if textarena:
            if textarena_python is not None:
                ta_version = _textarena_version(textarena_python)
                ta_python = textarena_python if ta_version is not None else None
                ta_status = "ok" if ta_version is not None else f"textarena does not import in {textarena_python}"
            else:
                ta_python, found = ensure_textarena(textarena_venv, bars.log)
                ta_version, ta_status = (found, "ok") if ta_python is not None else (None, found)
        for name in names:
            row: dict[str, Any] = {"game": name, "api": GAMES[name].api, "textarena_id": TEXTARENA_IDS.get(name)}
            try:
                advance = bars.task(f"ragen PettingZoo  {name}", games * repeats)
                row["ragen_pettingzoo"] = bench_pettingzoo(name, games, seed, repeats, advance).to_dict()
                if view:
                    advance = bars.task(f"ragen view        {name}", games * repeats)
                    row["ragen_view"] = bench_view(name, games, seed, repeats, advance).to_dict()
            except Exception as exc:  # noqa: BLE001 - a broken game must not hide the others' figures
                row["error"] = f"{type(exc).__name__}: {exc}"
                bars.log(f"{name}: ragen failed: {row['error']}")
            row["textarena"], row["textarena_na"] = None, None
            if ta_python is not None and name in TEXTARENA_IDS:
                advance = bars.task(f"TextArena         {TEXTARENA_IDS[name]}", games * repeats)
                measured, why = bench_textarena(ta_python, name, games, seed, repeats, advance)
                row["textarena"] = measured.to_dict() if measured is not None else None
                row["textarena_na"] = why
            elif textarena:
                # the whole of TextArena is missing: the reason is long and the same for every game (under the table)
                row["textarena_na"] = "TextArena not available, see below" if ta_python is None else "no such game"
            ours, theirs = row.get("ragen_pettingzoo"), row["textarena"]
            row["ratio"] = ours["steps_per_s"] / theirs["steps_per_s"] if ours and theirs else None
            row["textarena_note"] = TEXTARENA_NOTES.get(name)
            rows.append(row)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "benchmark": "bench_games",
        "games": games,
        "seed": seed,
        "repeats": repeats,
        "rate": "steps per CPU second of the process that played them (steps_per_wall_s: per wall second)",
        "results": rows,
        "textarena": {"requirement": TEXTARENA_REQUIREMENT, "version": ta_version, "status": ta_status},
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_1min": load,
        },
    }


# ------------------------------------------------------------------------------------------------ output
def _rate(m: dict[str, Any] | None) -> str:
    return f"{m['steps_per_s']:,.0f}" if m else "-"


def table_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows."""
    header = [
        "game",
        "ragen PettingZoo steps/s",
        "ragen view steps/s",
        "TextArena id",
        "TextArena steps/s",
        "ragen PZ / TextArena",
        "steps/game ragen PZ | view | TextArena",
    ]
    rows = []
    for r in results["results"]:
        pz, vw, ta = r.get("ragen_pettingzoo"), r.get("ragen_view"), r["textarena"]
        if ta:
            ta_rate = _rate(ta)
        elif r["textarena_na"]:
            ta_rate = f"n/a ({r['textarena_na']})"
        else:
            ta_rate = "-"
        per_game = " | ".join(f"{m['steps_per_game']:.1f}" if m else "-" for m in (pz, vw, ta))
        rows.append(
            [
                f"{r['game']} ({'AEC' if r['api'] == 'aec' else 'Parallel'})"
                + (f" FAILED: {r['error']}" if r.get("error") else ""),
                _rate(pz),
                _rate(vw),
                r["textarena_id"] or "-",
                ta_rate,
                f"{r['ratio']:.2f}x" if r["ratio"] else "-",
                per_game,
            ]
        )
    return header, rows


def print_table(results: dict[str, Any]) -> None:
    header, rows = table_rows(results)
    title = (
        f"Game steps/s: {results['games']} games each (seeds {results['seed']}..), fastest of {results['repeats']} "
        "plays; per CPU second"
    )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(f"\n{title}")
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        print(" | ".join(h.ljust(w) for h, w in zip(header, widths)))
        print("-+-".join("-" * w for w in widths))
        for row in rows:
            print(" | ".join(c.ljust(w) for c, w in zip(row, widths)))
        return
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="left" if h in ("game", "TextArena id") else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=200).print(table)


def summary(results: dict[str, Any]) -> str:
    """The lines under the table: what was compared, the notes, the machine."""
    lines = []
    ratios = [r["ratio"] for r in results["results"] if r["ratio"]]
    if ratios:
        lo, hi = min(ratios), max(ratios)
        line = f"ragen PettingZoo / TextArena steps/s: {lo:.2f}x to {hi:.2f}x on the {len(ratios)} games run in both"
        if hi < 1:
            line += f" (TextArena's steps are {1 / hi:.1f}x to {1 / lo:.1f}x faster)"
        elif lo > 1:
            line += f" (ragen's steps are {lo:.1f}x to {hi:.1f}x faster)"
        lines.append(line + ".")
    ta = results["textarena"]
    lines.append(f"TextArena: {ta['requirement']} -> {ta['version'] or '-'} ({ta['status']})")
    for r in results["results"]:
        if r["textarena_note"] and r["textarena_id"]:
            lines.append(f"  {r['game']} vs {r['textarena_id']}: {r['textarena_note']}")
    m = results["machine"]
    load = f"load average {m['load_average_1min']:.1f}" if m["load_average_1min"] is not None else "load n/a"
    lines.append(
        f"Rates per CPU second of the playing process (wall-second rates in --json); resets included. "
        f"Python {m['python']}, {m['cpu_count']} cores, {load}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=200, help="timed games per game and engine (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first game; game g uses seed + g")
    parser.add_argument("--repeat", type=int, default=3, help="play the games this many times; keep the fastest")
    parser.add_argument("--game", action="append", choices=sorted(GAMES), help="only this game (repeatable)")
    parser.add_argument("--no-view", action="store_true", help="skip ragen's single-agent views")
    parser.add_argument("--no-textarena", action="store_true", help="skip TextArena")
    parser.add_argument(
        "--textarena-venv",
        type=Path,
        default=Path(os.environ.get("TEXTARENA_VENV", DEFAULT_TEXTARENA_VENV)),
        help="TextArena's virtual environment, built here on first use (default .venv-textarena; $TEXTARENA_VENV)",
    )
    parser.add_argument("--textarena-python", type=Path, help="a Python that has textarena installed (no venv built)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if args.games < 1 or args.repeat < 1:
        parser.error("--games and --repeat must be at least 1")
    results = run_benchmark(
        args.games,
        seed=args.seed,
        repeats=args.repeat,
        only=args.game,
        view=not args.no_view,
        textarena=not args.no_textarena,
        textarena_venv=args.textarena_venv,
        textarena_python=args.textarena_python,
        progress=not args.no_progress,
    )
    print_table(results)
    print(summary(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 1 if any(r.get("error") for r in results["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
