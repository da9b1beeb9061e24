"""Merge result files into a leaderboard: a Markdown table and one self-contained static HTML page.

Results are grouped by suite (id and hash: only runs of the very same suite share a table) and, for models, by their
generation hash (``agent.generation_hash``: the generation prefix and who wrote it, stop strings, thinking, decoding
of every env; a model served without the prefix never shares a table with one that continued after it), and ranked
by the overall score. Reference agents (random, oracle) generate nothing: they join every table of their suite.
Results written before the generation hash existed form one table per suite ("generation not recorded"). The HTML
page needs no network (no CDN, no fonts): it holds

* a sortable table per suite (click a column header; numbers sort numerically),
* a bar chart per env (inline SVG) of every agent's success rate with 95% error bars (+-1.96 standard errors),
* a trajectory viewer that replays saved episodes turn by turn (step, play, pause), drawing the grid envs
  (Sokoban, FrozenLake) as pictures on a canvas from the text grids the result files keep for every turn, and
  showing the text games' boards (TicTacToe, ...) as text, with each turn's move, the opponent's answer and the
  game's outcome.

Suites with text games (``games-v1``) get one more table per suite, in Markdown and HTML: per game env and agent the
opponent and seat, the outcome rates (win / draw / loss, deal / no deal) ± standard errors and the game's mean score
(:func:`game_rows`; only where a summary has them, so other suites' tables are unchanged).

Result files are checked against the result schema (:mod:`ragen_trainer.evaluation.schema`) as they are read: a file
that is not JSON, not a result, or fails the schema (a NaN or an out-of-range value, a score that is not the mean of
its envs, a summary its episodes do not reproduce) is skipped with a :class:`ResultFileWarning` naming the file, the
field and what is wrong (or, with ``on_bad="raise"``, raises it). The Markdown and HTML files are written atomically.
"""

from __future__ import annotations

import html
import json
import math
import re
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragen_trainer.evaluation.metrics import env_family, episode_outcome, game_outcomes, outcome_rates, partial_credit
from ragen_trainer.evaluation.runner import load_result
from ragen_trainer.evaluation.schema import ResultFileError, ResultFileWarning
from ragen_trainer.fileio import atomic_write_text

#: Text-grid symbol -> what the cell holds, per grid env vocabulary (the envs' documented symbols).
GRID_LEGENDS: dict[str, dict[str, str]] = {
    "sokoban": {"#": "wall", "_": "floor", "O": "target", "X": "box", "√": "box_on_target", "P": "player",
                "S": "player_on_target"},
    "sokoban_new": {"W": "wall", ".": "floor", "G": "target", "B": "box", "C": "box_on_target", "A": "player",
                    "@": "player_on_target"},
    "frozenlake": {"P": "player", "_": "frozen", "O": "hole", "G": "goal", "X": "player_in_hole",
                   "√": "player_on_goal"},
}

#: Longest text (chars) of one prompt or reply kept in the page; the result file keeps everything.
MAX_TEXT_CHARS = 6000
#: The bar charts: pixels per agent (its bar and the room its label takes under it), the bar's width, and the label's
#: lines (at most this many, of at most this many characters: 14 characters of the 11 px font fit in a slot, and the
#: page's script squeezes a line of unusually wide letters into it).
CHART_SLOT_PX = 104
CHART_BAR_PX = 40
LABEL_LINE_CHARS = 14
LABEL_LINES = 3


# ------------------------------------------------------------------------------------------------------ data
def grid_legend(episode: dict[str, Any]) -> str | None:
    """Which :data:`GRID_LEGENDS` entry draws this episode's grids (``None``: not a grid env)."""
    if not episode.get("initial_state"):
        return None
    family = env_family(episode.get("env_id", ""))
    if family == "FrozenLake":
        return "frozenlake"
    if family == "Sokoban":
        chars = set(episode["initial_state"])
        new = set(GRID_LEGENDS["sokoban_new"])
        return "sokoban_new" if len(chars & new) > len(chars & set(GRID_LEGENDS["sokoban"])) else "sokoban"
    return None


def _label_runs(results: Sequence[dict[str, Any]], paths: Sequence[str]) -> list[str]:
    labels = [str(r["agent"].get("name", "agent")) for r in results]
    for i, label in enumerate(labels):
        if labels.count(label) > 1:
            labels[i] = f"{label} ({Path(paths[i]).stem})"
    return labels


def _rankable_score(score: Any) -> bool:
    """A score the board may rank: ``None`` (nothing scored) or a finite number in [0, 100]."""
    if score is None:
        return True
    return isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score) and 0 <= score <= 100


def build_board(results: Sequence[dict[str, Any]], paths: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Group results by suite and generation settings and rank them:
    ``[{suite, generation, generation_hash, envs, rows: [{label, agent, overall, envs}]}]``.

    A model's table is its suite's (id and hash) and its ``generation_hash`` (``None`` for a file written before it
    existed); reference agents (``kind`` other than ``"model"``) are put in every table of their suite. Results should
    come from :func:`load_results` (schema-checked); as a last guard, a result whose score is not a finite number in
    [0, 100] (a NaN never ranks first, nor at all) is left out with a :class:`ResultFileWarning`, and so is a result
    most of whose episodes failed on the engine (``summary.overall.engine_failed``: a failed endpoint, not a model).
    """
    paths = list(paths or [f"result-{i}" for i in range(len(results))])
    labels = _label_runs(results, paths)
    groups: dict[tuple[str, str, str | None], dict[str, Any]] = {}
    references: list[tuple[tuple[str, str], dict[str, Any], dict[str, Any]]] = []
    for result, label, path in zip(results, labels, paths):
        overall = result["summary"]["overall"]
        score = overall.get("score")
        if not _rankable_score(score):
            warnings.warn(f"skipped result {str(path)!r}: summary.overall.score: {score!r} is not a finite number in "
                          "[0, 100]", ResultFileWarning, stacklevel=2)  # fmt: skip
            continue
        if overall.get("engine_failed"):
            warnings.warn(f"skipped result {str(path)!r}: {overall.get('engine_errors')} of {overall.get('episodes')} "
                          "episodes failed on the engine (the model endpoint failed the requests), so its score is "
                          "not the model's; evaluate again once the endpoint answers", ResultFileWarning,
                          stacklevel=2)  # fmt: skip
            continue
        suite, agent, summary = result["suite"], result["agent"], result["summary"]
        row = {"label": label, "path": str(path), "agent": agent, "overall": summary["overall"],
               "envs": summary["envs"]}
        if agent.get("kind") != "model":
            references.append(((suite["id"], suite["hash"]), suite, row))
            continue
        key = (suite["id"], suite["hash"], agent.get("generation_hash"))
        group = groups.setdefault(key, {"suite": suite, "generation": agent.get("generation"),
                                        "generation_hash": agent.get("generation_hash"), "envs": [], "rows": []})
        group["rows"].append(row)
    for suite_key, suite, row in references:
        targets = [g for k, g in groups.items() if k[:2] == suite_key]
        if not targets:  # no model ran this suite: the references have a table of their own
            targets = [groups.setdefault((*suite_key, None), {"suite": suite, "generation": None,
                                                              "generation_hash": None, "envs": [], "rows": []})]
        for group in targets:
            group["rows"].append(dict(row))
    for group in groups.values():
        for row in group["rows"]:
            for name in row["envs"]:
                if name not in group["envs"]:
                    group["envs"].append(name)
        group["rows"].sort(key=lambda row: (-(row["overall"]["score"] or 0.0), row["label"]))
    return list(groups.values())


def load_results(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Load result files (``ValueError`` naming a bad one, its field and what is wrong); at least one is needed."""
    if not paths:
        raise ValueError("no result files given: pass one or more files written by ragen-trainer eval")
    return [load_result(p) for p in paths]


def load_valid_results(
    paths: Sequence[str | Path], *, on_bad: str = "warn"
) -> tuple[list[dict[str, Any]], list[str], list[ResultFileError]]:
    """Load the result files that pass the schema: ``(results, their paths, the errors of the others)``.

    ``on_bad="warn"`` skips a bad file with a :class:`ResultFileWarning` naming the file, the field and what is wrong;
    ``"skip"`` skips it silently (the errors are returned either way); ``"raise"`` raises its
    :class:`~ragen_trainer.evaluation.schema.ResultFileError`. ``ValueError`` when no path is given or none is valid.
    """
    if on_bad not in ("warn", "skip", "raise"):
        raise ValueError(f"invalid argument on_bad={on_bad!r}: expected 'warn', 'skip' or 'raise'")
    if not paths:
        raise ValueError("no result files given: pass one or more files written by ragen-trainer eval")
    results, kept, bad = [], [], []
    for path in paths:
        try:
            results.append(load_result(path))
            kept.append(str(path))
        except ResultFileError as exc:
            if on_bad == "raise":
                raise
            bad.append(exc)
            if on_bad == "warn":
                warnings.warn(f"skipped {exc}", ResultFileWarning, stacklevel=2)
    if not results:
        raise ValueError(f"none of the {len(paths)} result file(s) is valid: " + "; ".join(str(e) for e in bad[:3]))
    return results, kept, bad


# ------------------------------------------------------------------------------------------------------ markdown
#: Characters that change the structure of a Markdown table or line: a cell's end, inline HTML, links, code, emphasis.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]<>|])")


def markdown_text(value: Any) -> str:
    """``value`` as literal Markdown text on one line: line breaks become spaces and the characters that would end a
    table cell (``|``), open HTML (``<``), a link, code or emphasis are backslash-escaped (CommonMark), so a name from
    a result file is shown as written and can never add a row, a column or markup."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(value).splitlines()))


def markdown_code(value: Any) -> str:
    """``value`` as a Markdown code span on one line (its fence longer than any run of backticks inside it)."""
    text = " ".join(str(value).splitlines())
    runs = [len(m) for m in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _pct(value: float | None, se: float | None = None, scale: float = 100.0) -> str:
    if value is None:
        return "-"
    text = f"{scale * value:.1f}"
    return text if se is None else f"{text} ± {scale * se:.1f}"


def protocol_summary(suite: dict[str, Any]) -> str:
    """One line naming the turn protocol each env of a suite was played with (from its definition).

    Suites from before the protocol settings existed (``*-v1``) did not record them; the line says so.
    """
    entries = suite.get("definition", {}).get("envs", [])
    if not entries or any("protocol" not in e for e in entries):
        return "protocol: not recorded (a suite from before ragen recorded its turn protocol)"
    budgets = ", ".join(
        f"{e['name']} {e['protocol']['max_turns']}/{e['protocol']['actions_per_turn']}/"
        f"{e['protocol']['max_actions_per_episode']}"
        for e in entries
    )
    shared = {k: {str(e["protocol"][k]) for e in entries} for k in ("enable_think", "reply_prefix", "prompt_layout")}
    rest = "; ".join(f"{k} {'/'.join(sorted(v))}" for k, v in shared.items())
    return f"protocol (turns/actions per turn/actions per episode): {budgets}; {rest}"


def generation_summary(group: dict[str, Any]) -> str:
    """One line naming what the models of a table were generated with (their ``agent.generation``, shared by the
    table's models): per env the generation prefix, the stop strings, thinking and the decoding."""
    generation = group.get("generation")
    if not isinstance(generation, dict) or not generation:
        has_models = any(r["agent"].get("kind") == "model" for r in group.get("rows", []))
        return ("generation: not recorded (results from before ragen recorded its generation settings)" if has_models
                else "generation: reference agents only")
    parts: dict[str, list[str]] = {}
    for env, g in generation.items():
        if not isinstance(g, dict):
            continue
        prefix = g.get("generation_prefix")
        decoding = g.get("decoding") or {}
        text = f"prefix {prefix!r}" if prefix else "no prefix"
        text += f", stop {g.get('stop_strings')}, think {g.get('enable_think')}"
        text += ", " + ", ".join(f"{k} {decoding[k]}" for k in ("temperature", "top_p", "max_new_tokens")
                                 if k in decoding)
        parts.setdefault(text, []).append(str(env))
    lines = "; ".join(f"{', '.join(envs)}: {text}" for text, envs in parts.items())
    return f"generation (hash {group.get('generation_hash')}): {lines}"


def markdown_table(board: list[dict[str, Any]]) -> str:
    """The leaderboard as Markdown: one table per suite, success % ± standard error per env."""
    out: list[str] = []
    for group in board:
        suite = group["suite"]
        tail = f", generation {markdown_code(group['generation_hash'])}" if group.get("generation_hash") else ""
        out.append(f"### Suite {markdown_code(suite['id'])} (hash {markdown_code(suite['hash'])}{tail})\n")
        out.append(markdown_text(protocol_summary(suite)) + "\n")
        out.append(markdown_text(generation_summary(group)) + "\n")
        head = ["#", "agent", "kind", "score", "partial"] + [markdown_text(e) for e in group["envs"]] + ["episodes"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join(["---:", ":---", ":---", "---:", "---:"] + ["---:"] * len(group["envs"]) + ["---:"]) + "|")
        for rank, row in enumerate(group["rows"], 1):
            overall = row["overall"]
            cells = [str(rank), markdown_text(row["label"]), markdown_text(row["agent"].get("kind", "")),
                     _pct(overall["score"], overall.get("score_se"), 1.0), _pct(overall.get("partial"), None, 1.0)]  # fmt: skip
            for env in group["envs"]:
                s = row["envs"].get(env)
                cells.append(_pct(s["success_rate"], s["success_rate_se"]) if s else "-")
            cells.append(str(overall["episodes"]))
            out.append("| " + " | ".join(cells) + " |")
        general = [n for n in group["envs"] if _env_meta(suite, n).get("split") == "generalisation"]
        out.append(
            "\nscore: mean success % over the envs (± standard error); partial: mean partial credit % (WebShop "
            "reward, Sokoban boxes on targets), never counted as success."
            + (f" Generalisation splits: {markdown_text(', '.join(general))}." if general else "")
            + "\n"
        )
        words, games = game_rows(group)
        if games:
            out.append(GAMES_NOTE + "\n")
            head = ["agent", "env", "opponent", "seat", *(f"{w} %" for w in words), "score %", "no outcome"]
            out.append("| " + " | ".join(markdown_text(h) for h in head) + " |")
            out.append("|" + "|".join([":---"] * 4 + ["---:"] * (len(head) - 4)) + "|")
            for game in games:
                out.append("| " + " | ".join(markdown_text(c) for c in _game_cells(game, words)) + " |")
            out.append("")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------------ html parts
def chart_label_lines(label: str) -> list[str]:
    """A bar's label as at most :data:`LABEL_LINES` lines of at most :data:`LABEL_LINE_CHARS` characters (broken at
    spaces and hyphens where it can; the last line ends in "…" when the label is longer): the labels of two
    neighbouring bars never run into each other. The chart keeps the whole label as the bar's tooltip."""
    lines = textwrap.wrap(" ".join(label.split()), width=LABEL_LINE_CHARS, break_long_words=True,
                          break_on_hyphens=True) or [""]
    if len(lines) > LABEL_LINES:
        lines = lines[:LABEL_LINES]
        lines[-1] = lines[-1][:LABEL_LINE_CHARS - 1].rstrip() + "…"
    return lines


def _svg_chart(env: str, rows: list[dict[str, Any]]) -> str:
    """Bars of every agent's success rate on ``env`` with +-1.96 SE error bars, as inline SVG. Each bar has a slot of
    :data:`CHART_SLOT_PX`, its label centred under it on up to :data:`LABEL_LINES` lines (the whole label as the
    tooltip of the label and of the bar; the page's script squeezes a line of unusually wide letters into the
    slot)."""
    slot, bar, line_h = CHART_SLOT_PX, CHART_BAR_PX, 13
    left, top = 40, 20
    bottom = 22 + line_h * LABEL_LINES
    width, height = max(240, left + 10 + slot * len(rows)), 170 + bottom
    plot_h = height - bottom - top
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="bars" width="{width}" height="{height}" '
              f'data-slot="{slot}" role="img" aria-label="success rate on {html.escape(env)}">')]  # fmt: skip
    for tick in (0, 25, 50, 75, 100):
        y = top + plot_h * (1 - tick / 100)
        parts.append(f'<line x1="{left}" x2="{width - 5}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" class="tick" text-anchor="end">{tick}</text>')
    for i, row in enumerate(rows):
        s = row["envs"].get(env)
        centre = left + 5 + slot * i + slot // 2
        x = centre - bar // 2
        name = html.escape(row["label"])
        lines = "".join(f'<tspan x="{centre}" dy="{0 if n == 0 else line_h}">{html.escape(text)}</tspan>'
                        for n, text in enumerate(chart_label_lines(row["label"])))
        parts.append(f'<text x="{centre}" y="{height - bottom + 16}" class="label" text-anchor="middle">'
                     f"<title>{name}</title>{lines}</text>")  # fmt: skip
        if not s or s["success_rate"] is None:
            continue
        p, se = 100 * s["success_rate"], 100 * (s["success_rate_se"] or 0.0)
        y = top + plot_h * (1 - p / 100)
        parts.append(
            f'<rect class="bar" data-agent="{name}" x="{x}" y="{y:.1f}" width="{bar}" height="{top + plot_h - y:.1f}">'
            f"<title>{name}: {p:.1f}% ± {se:.1f} (SE), n={s['episodes']}</title></rect>"
        )
        lo, hi = max(0.0, p - 1.96 * se), min(100.0, p + 1.96 * se)
        y_lo, y_hi = top + plot_h * (1 - lo / 100), top + plot_h * (1 - hi / 100)
        parts.append(f'<line class="err" x1="{centre}" x2="{centre}" y1="{y_lo:.1f}" y2="{y_hi:.1f}"/>')
        for yy in (y_lo, y_hi):
            parts.append(f'<line class="err" x1="{centre - 6}" x2="{centre + 6}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        parts.append(f'<text x="{centre}" y="{y_hi - 4:.1f}" class="value" text-anchor="middle">{p:.0f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _env_meta(suite: dict[str, Any], env: str) -> dict[str, Any]:
    """The suite definition's entry of ``env`` (split, note, ...), ``{}`` when absent."""
    for entry in suite.get("definition", {}).get("envs", []):
        if entry.get("name") == env:
            return entry
    return {}


#: What the games table shows (Markdown and HTML).
GAMES_NOTE = (
    "Games: outcome % ± standard error over initial states, per env (game, opponent, seat) and agent; an episode that "
    "ended without an outcome (out of turns -- the forfeit -- or an error) counts as a loss (no deal), and `no outcome` "
    "says how many did. score: the game's own mean score % (its rewards, format penalties excluded) ± standard error."
)


def game_rows(group: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """The text games of a table: ``(outcome words in order, rows)``, a row per game env and agent (``agent``,
    ``env``, ``opponent`` and ``seat`` from the suite's ``env_kwargs``, ``rates``: word -> (rate, se), ``score``,
    ``score_se``, ``no_outcome``); ``([], [])`` when no env of the table is a game."""
    words: list[str] = []
    rows: list[dict[str, Any]] = []
    for env in group["envs"]:
        kwargs = _env_meta(group["suite"], env).get("env_kwargs") or {}
        for row in group["rows"]:
            s = row["envs"].get(env)
            rates = outcome_rates(s) if s else []
            if not rates:
                continue
            words.extend(w for w, _, _ in rates if w not in words)
            rows.append({"agent": row["label"], "env": env, "opponent": str(kwargs.get("opponent", "default")),
                         "seat": str(kwargs.get("seat", "seed % 2")), "rates": {w: (r, se) for w, r, se in rates},
                         "score": s.get("mean_score"), "score_se": s.get("mean_score_se"),
                         "no_outcome": s.get("no_outcome")})  # fmt: skip
    return words, rows


def _game_cells(game: dict[str, Any], words: list[str]) -> list[str]:
    """The cells (text) of a games-table row, for Markdown and HTML alike."""
    cells = [game[k] for k in ("agent", "env", "opponent", "seat")]
    cells += [_pct(*game["rates"].get(word, (None, None))) for word in words]
    cells.append(_pct(game["score"], game["score_se"]))
    cells.append("-" if game["no_outcome"] is None else str(game["no_outcome"]))
    return cells


def _games_table(group: dict[str, Any]) -> str:
    """The games table of a suite (:func:`game_rows`) as HTML; ``""`` when the suite has no game env."""
    words, games = game_rows(group)
    if not games:
        return ""
    head = ["agent", "env", "opponent", "seat", *(f"{w} %" for w in words), "score %", "no outcome"]
    cells = "".join(f"<th>{html.escape(name)}</th>" for name in head)
    rows = "".join(
        f'<tr data-env="{html.escape(game["env"])}">'
        + "".join(f"<td>{html.escape(text)}</td>" for text in _game_cells(game, words))
        + "</tr>"
        for game in games
    )
    return (
        f'<p class="muted">{html.escape(GAMES_NOTE)}</p><div class="tablewrap">'
        f'<table class="board games-table"><thead><tr>{cells}</tr></thead><tbody>{rows}</tbody></table></div>'
    )


def _html_table(index: int, group: dict[str, Any]) -> str:
    head = [("#", "num"), ("agent", "text"), ("kind", "text"), ("score", "num"), ("partial", "num")]
    head += [(env, "num") for env in group["envs"]] + [("invalid %", "num"), ("episodes", "num")]
    cells_html = ["<thead><tr>"]
    for col, (name, kind) in enumerate(head):
        meta = _env_meta(group["suite"], name) if name in group["envs"] else {}
        tip = "; ".join(str(v) for v in (meta.get("env_id"), meta.get("split"), meta.get("note")) if v)
        tip = (tip + " (click to sort)") if tip else "click to sort"
        cells_html.append(f'<th data-type="{kind}" data-col="{col}" title="{html.escape(tip)}">{html.escape(name)}</th>')
    cells_html.append("</tr></thead><tbody>")
    for rank, row in enumerate(group["rows"], 1):
        overall = row["overall"]
        invalid = [s["invalid_action_rate"] for s in row["envs"].values() if s.get("invalid_action_rate") is not None]
        mean_invalid = sum(invalid) / len(invalid) if invalid else None
        agent = row["agent"]
        tip = html.escape(json.dumps(agent, sort_keys=True))
        values: list[tuple[str, Any]] = [
            (str(rank), rank),
            (f'<span title="{tip}">{html.escape(row["label"])}</span>', row["label"]),
            (html.escape(str(agent.get("kind", ""))), str(agent.get("kind", ""))),
            (_pct(overall["score"], overall.get("score_se"), 1.0), overall["score"]),
            (_pct(overall.get("partial"), None, 1.0), overall.get("partial")),
        ]
        for env in group["envs"]:
            s = row["envs"].get(env)
            values.append((_pct(s["success_rate"], s["success_rate_se"]), s["success_rate"]) if s else ("-", None))
        values.append((_pct(mean_invalid), mean_invalid))
        values.append((str(overall["episodes"]), overall["episodes"]))
        cells_html.append(f'<tr data-agent="{html.escape(row["label"])}">')
        for text, value in values:
            sort_value = "" if value is None else html.escape(str(value))
            cells_html.append(f'<td data-value="{sort_value}">{text}</td>')
        cells_html.append("</tr>")
    cells_html.append("</tbody>")
    table = f'<table class="board sortable" id="board-{index}">' + "".join(cells_html) + "</table>"
    return f'<div class="tablewrap">{table}</div>'  # wide suites scroll sideways instead of overflowing the page


_DETAIL_COLUMNS = (
    ("success %", "success_rate", 100.0), ("± se", "success_rate_se", 100.0), ("partial %", "partial_credit", 100.0),
    ("mean reward", "mean_reward", 1.0), ("invalid %", "invalid_action_rate", 100.0),
    ("format err %", "format_error_rate", 100.0), ("turns", "mean_turns", 1.0), ("actions", "mean_actions", 1.0),
    ("reply chars", "mean_reply_chars", 1.0), ("reply tokens", "mean_reply_tokens", 1.0),
    ("think words", "mean_think_words", 1.0), ("errors", "errors", 1.0),
)  # fmt: skip


def _details_table(group: dict[str, Any]) -> str:
    """Every metric of every run and env of a suite (a collapsed block under the main table)."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name in ["agent", "env", *(c[0] for c in _DETAIL_COLUMNS),
                                                                 "pass@k"])  # fmt: skip
    rows = []
    for row in group["rows"]:
        for env in group["envs"]:
            s = row["envs"].get(env)
            if not s:
                continue
            cells = [html.escape(row["label"]), html.escape(env)]
            for _, key, scale in _DETAIL_COLUMNS:
                value = s.get(key)
                cells.append("-" if value is None else f"{scale * value:.3g}" if scale == 1.0 else f"{scale * value:.1f}")
            passk = s.get("pass_at_k") or {}
            cells.append(", ".join(f"@{k}: {100 * v:.1f}" for k, v in passk.items()) or "-")
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        '<details class="details"><summary>all metrics per env</summary><div class="tablewrap">'
        f'<table class="board details-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        "</div></details>"
    )


def _cut(text: Any) -> Any:
    if isinstance(text, str) and len(text) > MAX_TEXT_CHARS:
        return text[:MAX_TEXT_CHARS] + f"\n… ({len(text) - MAX_TEXT_CHARS} more characters in the result file)"
    return text


def _add_game_replay(record: dict[str, Any], episode: dict[str, Any]) -> None:
    """Add what the viewer shows of a text game to an episode's replay ``record`` (nothing for other envs): ``game``
    (the agent's seat, the opponent, the outcome and the game's outcome words) and per turn the agent's ``move``, the
    ``opponent_moves`` answering it and the ``outcome`` (``None`` while the game goes on), from the turns' env info."""
    words = game_outcomes(episode.get("env_id", ""))
    if not words:
        return
    turns = episode.get("turns") or []
    extras = [t.get("info_extra") if isinstance(t.get("info_extra"), dict) else {} for t in turns]
    first = episode.get("reset_info") if isinstance(episode.get("reset_info"), dict) else {}
    record["game"] = {"seat": first.get("seat"), "opponent": first.get("opponent"),
                      "outcome": episode_outcome(episode), "words": list(words)}  # fmt: skip
    for turn, extra in zip(record["turns"], extras):
        turn.update(move=extra.get("move"), opponent_moves=extra.get("opponent_moves") or [],
                    outcome=extra.get("outcome"))  # fmt: skip


def replay_data(results: Sequence[dict[str, Any]], labels: Sequence[str], per_env: int) -> list[dict[str, Any]]:
    """The episodes the viewer replays: the first ``per_env`` episodes of every env of every run, texts cut."""
    runs = []
    for result, label in zip(results, labels):
        envs: dict[str, list[dict[str, Any]]] = {}
        for episode in result["episodes"]:
            bucket = envs.setdefault(episode["env"], [])
            if len(bucket) >= per_env:
                continue
            bucket.append(
                {
                    "seed": episode["seed"],
                    "rollout": episode["rollout"],
                    "success": bool(episode.get("success")),
                    "reward": round(float(episode.get("reward", 0.0)), 4),
                    "partial": round(partial_credit(episode), 4),
                    "legend": grid_legend(episode),
                    "system_prompt": _cut(episode.get("system_prompt", "")),
                    "observation": _cut(episode.get("observation", "")),
                    "initial_state": episode.get("initial_state"),
                    "error": _cut(episode.get("error")),
                    "turns": [
                        {
                            "reply": _cut(t.get("reply", "")),
                            "actions": t.get("actions", []),
                            "reward": t.get("reward", 0.0),
                            "success": t.get("success", False),
                            "reason": t.get("reason"),
                            "state": t.get("state"),
                            "observation": _cut(t.get("observation", "")),
                        }
                        for t in episode.get("turns", [])
                    ],
                }
            )
            _add_game_replay(bucket[-1], episode)
        runs.append({"label": label, "suite": result["suite"]["id"], "agent": result["agent"], "envs": envs})
    return runs


def _json_for_script(data: Any) -> str:
    # "<" escaped so that no text inside can close the <script> element.
    return json.dumps(data, ensure_ascii=False, sort_keys=False).replace("<", "\\u003c").replace("\u2028", "\\u2028")


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#1d232a;max-width:1400px}
h1{margin-bottom:4px} .muted{color:#5c6670;font-size:14px}
.tablewrap{overflow-x:auto;max-width:100%} table.board{border-collapse:collapse;margin:12px 0;font-size:14px}
table.board th,table.board td{border:1px solid #d0d7de;padding:4px 8px;text-align:right;white-space:nowrap}
table.board th{background:#f2f4f7;cursor:pointer;user-select:none}
table.board th.asc::after{content:" ▲"} table.board th.desc::after{content:" ▼"}
table.board td:nth-child(2),table.board td:nth-child(3),table.board th:nth-child(2){text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:12px} figure.chart{margin:0;border:1px solid #e3e7eb;padding:6px}
figure.chart figcaption{font-size:13px;font-weight:600;text-align:center}
svg.bars .bar{fill:#4878c8} svg.bars .err{stroke:#222;stroke-width:1.5} svg.bars .grid{stroke:#e6e9ed}
svg.bars text{font-size:11px;fill:#333}
#viewer .controls{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin:8px 0}
#viewer .panes{display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap}
#viewer pre{background:#f6f8fa;border:1px solid #e3e7eb;padding:8px;white-space:pre-wrap;max-width:820px;
 max-height:360px;overflow:auto;font-size:13px;margin:4px 0}
#grid-canvas{border:1px solid #ccd;image-rendering:pixelated;background:#fff}
.ok{color:#12803c;font-weight:600} .bad{color:#b42318;font-weight:600}
"""

_JS = r"""
(function(){
"use strict";
// ---- bar labels: a line of wide letters ("WWW...") wider than its bar's slot is squeezed into it (the page's font
// decides the width, so it is measured here); the whole label is the tooltip
document.querySelectorAll("svg.bars text.label tspan").forEach(function(line){
  var room = +line.closest("svg").dataset.slot - 8;
  if (line.getComputedTextLength() > room) {
    line.setAttribute("textLength", room); line.setAttribute("lengthAdjust", "spacingAndGlyphs");
  }
});
// ---- sortable tables
document.querySelectorAll("table.sortable").forEach(function(table){
  table.querySelectorAll("th").forEach(function(th){
    th.addEventListener("click", function(){
      var col = +th.dataset.col, numeric = th.dataset.type === "num";
      var asc = !th.classList.contains("asc");
      table.querySelectorAll("th").forEach(function(h){ h.classList.remove("asc","desc"); });
      th.classList.add(asc ? "asc" : "desc");
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function(a, b){
        var x = a.cells[col].dataset.value, y = b.cells[col].dataset.value;
        if (numeric) {
          x = x === "" ? -Infinity : parseFloat(x); y = y === "" ? -Infinity : parseFloat(y);
          return asc ? x - y : y - x;
        }
        return asc ? x.localeCompare(y) : y.localeCompare(x);
      });
      rows.forEach(function(r){ body.appendChild(r); });
    });
  });
});

// ---- trajectory viewer
var RUNS = JSON.parse(document.getElementById("replay-data").textContent);
var LEGENDS = JSON.parse(document.getElementById("legend-data").textContent);
var COLORS = {wall:"#6b4f3a", floor:"#efe6d2", target:"#efe6d2", box:"#efe6d2", box_on_target:"#efe6d2",
  player:"#efe6d2", player_on_target:"#efe6d2", frozen:"#cfe8fb", hole:"#1f3c6e", goal:"#cfe8fb",
  player_in_hole:"#1f3c6e", player_on_goal:"#7cc47c"};
var runSel = document.getElementById("run-select"), envSel = document.getElementById("env-select"),
    epSel = document.getElementById("episode-select"), canvas = document.getElementById("grid-canvas");
var state = {episode: null, step: 0, timer: null};

function option(sel, value, text){ var o = document.createElement("option"); o.value = value; o.textContent = text; sel.appendChild(o); }
function fillRuns(){ runSel.innerHTML = ""; RUNS.forEach(function(r, i){ option(runSel, i, r.label + " — " + r.suite); }); fillEnvs(); }
function fillEnvs(){
  envSel.innerHTML = ""; var run = RUNS[+runSel.value]; if (!run) return;
  Object.keys(run.envs).forEach(function(e){ option(envSel, e, e); }); fillEpisodes();
}
function fillEpisodes(){
  epSel.innerHTML = ""; var run = RUNS[+runSel.value]; if (!run) return;
  (run.envs[envSel.value] || []).forEach(function(ep, i){
    option(epSel, i, "seed " + ep.seed + (ep.rollout ? " #" + ep.rollout : "") + (ep.success ? " ✓ success" : " ✗") +
      (ep.game ? " " + (ep.game.outcome || "no outcome") : "") + " (reward " + ep.reward + ")");
  });
  load();
}
function load(){
  stop(); var run = RUNS[+runSel.value]; var eps = run ? (run.envs[envSel.value] || []) : [];
  state.episode = eps[+epSel.value] || null; state.step = 0; show();
}
function drawShape(ctx, kind, x, y, t){
  var c = t / 2;
  function disc(color, r){ ctx.fillStyle = color; ctx.beginPath(); ctx.arc(x + c, y + c, r * t, 0, 2 * Math.PI); ctx.fill(); }
  function ring(color){ ctx.strokeStyle = color; ctx.lineWidth = Math.max(2, t / 10); ctx.beginPath(); ctx.arc(x + c, y + c, 0.3 * t, 0, 2 * Math.PI); ctx.stroke(); }
  function square(color){ ctx.fillStyle = color; ctx.fillRect(x + 0.18 * t, y + 0.18 * t, 0.64 * t, 0.64 * t); }
  if (kind === "target") ring("#d0312d");
  else if (kind === "box") square("#d98a2b");
  else if (kind === "box_on_target") { square("#3a9d4a"); ring("#d0312d"); }
  else if (kind === "player") disc("#2f6fd0", 0.3);
  else if (kind === "player_on_target") { ring("#d0312d"); disc("#2f6fd0", 0.24); }
  else if (kind === "goal") square("#3a9d4a");
  else if (kind === "player_in_hole") { ctx.strokeStyle = "#e03030"; ctx.lineWidth = Math.max(2, t / 8);
    ctx.beginPath(); ctx.moveTo(x + 0.2 * t, y + 0.2 * t); ctx.lineTo(x + 0.8 * t, y + 0.8 * t);
    ctx.moveTo(x + 0.8 * t, y + 0.2 * t); ctx.lineTo(x + 0.2 * t, y + 0.8 * t); ctx.stroke(); }
  else if (kind === "player_on_goal") disc("#2f6fd0", 0.3);
}
function showText(text, legendName){  // a state without a grid legend (the text games' boards): shown as text
  var pre = document.getElementById("state-text"), shown = !!text && !legendName;
  pre.style.display = shown ? "" : "none"; pre.textContent = shown ? text : "";
}
function drawGrid(text, legendName){
  var ctx = canvas.getContext("2d");
  if (!text || !legendName) { canvas.width = 1; canvas.height = 1; canvas.style.display = "none"; return; }
  var legend = LEGENDS[legendName] || {};
  var rows = text.split("\n").map(function(r){ return Array.from(r); });
  var w = Math.max.apply(null, rows.map(function(r){ return r.length; })), h = rows.length, t = 40;
  canvas.style.display = ""; canvas.width = w * t; canvas.height = h * t;
  rows.forEach(function(row, r){ row.forEach(function(ch, c){
    var kind = legend[ch], x = c * t, y = r * t;
    ctx.fillStyle = kind ? COLORS[kind] : "#bbbbbb"; ctx.fillRect(x, y, t, t);
    ctx.strokeStyle = "rgba(0,0,0,0.15)"; ctx.lineWidth = 1; ctx.strokeRect(x + 0.5, y + 0.5, t - 1, t - 1);
    if (kind) drawShape(ctx, kind, x, y, t);
    else { ctx.fillStyle = "#000"; ctx.font = (t * 0.6) + "px monospace"; ctx.textAlign = "center"; ctx.fillText(ch, x + t / 2, y + t * 0.7); }
  }); });
}
function show(){
  var ep = state.episode, label = document.getElementById("step-label");
  var detail = document.getElementById("turn-detail"), prompt = document.getElementById("prompt-text");
  if (!ep) { label.textContent = "no episode"; detail.innerHTML = ""; prompt.textContent = ""; drawGrid(null, null); showText(null, null); return; }
  var n = ep.turns.length, s = state.step;
  label.textContent = "step " + s + " / " + n;
  var grid = s === 0 ? ep.initial_state : ep.turns[s - 1].state;
  drawGrid(grid, ep.legend); showText(grid, ep.legend);
  prompt.textContent = s === 0 ? ep.system_prompt + "\n\n" + ep.observation : ep.turns[s - 1].observation;
  detail.innerHTML = "";
  function line(name, value, cls){ var p = document.createElement("div"); var b = document.createElement("b"); b.textContent = name + ": ";
    p.appendChild(b); var span = document.createElement("span"); span.textContent = value; if (cls) span.className = cls; p.appendChild(span); detail.appendChild(p); }
  if (s === 0) {
    line("episode", "seed " + ep.seed + ", " + n + " turn(s), reward " + ep.reward + ", partial credit " + ep.partial);
    line("outcome", ep.success ? "success" : "no success", ep.success ? "ok" : "bad");
    if (ep.game) {
      var g = ep.game, words = g.words, result = g.outcome || ("none: counted as " + words[words.length - 1]);
      line("game", "playing " + g.seat + " against the " + g.opponent + " opponent");
      line("result", result, g.outcome === words[0] ? "ok" : (g.outcome === null || g.outcome === words[words.length - 1]) ? "bad" : "");
    }
    if (ep.error) line("error", ep.error, "bad");
  } else {
    var t = ep.turns[s - 1];
    line("turn", s); line("actions", t.actions.join(" || ") || "(none)"); line("reward", t.reward);
    line("success", t.success ? "yes" : "no", t.success ? "ok" : "bad");
    if (ep.game) {
      line("move", t.move || "(none: the turn was invalid)");
      line("opponent's answer", t.opponent_moves.join(", ") || "(none)");
      if (t.outcome) line("game over", t.outcome);
    }
    if (t.reason) line("penalty reason", t.reason, "bad");
    var pre = document.createElement("pre"); pre.className = "reply"; pre.textContent = t.reply; detail.appendChild(pre);
  }
  document.getElementById("prev").disabled = s === 0;
  document.getElementById("next").disabled = s >= n;
}
function step(d){ if (!state.episode) return; state.step = Math.max(0, Math.min(state.episode.turns.length, state.step + d)); show(); }
function stop(){ if (state.timer) { clearInterval(state.timer); state.timer = null; } document.getElementById("play").textContent = "▶ replay"; }
function play(){
  if (state.timer) { stop(); return; }
  if (!state.episode) return;
  state.step = 0; show(); document.getElementById("play").textContent = "❚❚ pause";
  state.timer = setInterval(function(){ if (state.step >= state.episode.turns.length) { stop(); return; } step(1); }, 900);
}
runSel.addEventListener("change", fillEnvs); envSel.addEventListener("change", fillEpisodes); epSel.addEventListener("change", load);
document.getElementById("prev").addEventListener("click", function(){ stop(); step(-1); });
document.getElementById("next").addEventListener("click", function(){ stop(); step(1); });
document.getElementById("play").addEventListener("click", play);
fillRuns();
})();
"""


def render_html(
    board: list[dict[str, Any]],
    results: Sequence[dict[str, Any]],
    labels: Sequence[str],
    *,
    title: str = "ragen leaderboard",
    replays_per_env: int = 8,
) -> str:
    """The whole page as one string (inline CSS, JS, SVG and data; nothing is fetched)."""
    body = [f"<h1>{html.escape(title)}</h1>",
            ('<p class="muted">Offline, seed-pinned evaluation. <b>Success</b> is the env\'s own success flag; '
             "<b>partial</b> credit (WebShop reward, Sokoban boxes on targets) is reported apart and never counted as "
             "success. <b>Score</b> = unweighted mean of the per-env success rates (%), ± its standard error; "
             "per-env cells are success % ± standard error over initial states. Error bars: 95% (±1.96 SE). Click a "
             "column header to sort.</p>")]  # fmt: skip
    for index, group in enumerate(board):
        suite = group["suite"]
        desc = suite.get("definition", {}).get("description", "")
        body.append(f'<section class="suite" id="suite-{index}"><h2>Suite {html.escape(suite["id"])} '
                    f'<span class="muted">hash {html.escape(suite["hash"])}</span></h2>'
                    f'<p class="muted">{html.escape(desc)}</p>'
                    f'<p class="muted">{html.escape(protocol_summary(suite))}</p>'
                    f'<p class="muted">{html.escape(generation_summary(group))}</p>')  # fmt: skip
        body.append(_html_table(index, group))
        body.append(_details_table(group))
        body.append(_games_table(group))
        body.append('<div class="charts">')
        for env in group["envs"]:
            body.append(f'<figure class="chart" data-env="{html.escape(env)}">{_svg_chart(env, group["rows"])}'
                        f"<figcaption>{html.escape(env)}: success %</figcaption></figure>")  # fmt: skip
        body.append("</div></section>")
    body.append(
        '<section id="viewer"><h2>Trajectory viewer</h2>'
        '<div class="controls"><label>run <select id="run-select"></select></label>'
        '<label>env <select id="env-select"></select></label>'
        '<label>episode <select id="episode-select"></select></label>'
        '<button id="prev">◀ prev</button><button id="play">▶ replay</button><button id="next">next ▶</button>'
        '<span id="step-label"></span></div>'
        '<div class="panes"><canvas id="grid-canvas" width="1" height="1"></canvas>'
        '<pre id="state-text" style="display:none"></pre>'
        '<div><div id="turn-detail"></div><h3>prompt</h3><pre id="prompt-text"></pre></div></div></section>'
    )
    data = replay_data(results, labels, replays_per_env)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width\"><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body>"
        + "".join(body)
        + f'<script type="application/json" id="replay-data">{_json_for_script(data)}</script>'
        + f'<script type="application/json" id="legend-data">{_json_for_script(GRID_LEGENDS)}</script>'
        + f"<script>{_JS}</script></body></html>\n"
    )


def build_leaderboard(
    paths: Sequence[str | Path],
    *,
    markdown_path: str | Path | None = None,
    html_path: str | Path | None = None,
    title: str = "ragen leaderboard",
    replays_per_env: int = 8,
    on_bad: str = "warn",
) -> tuple[str, str]:
    """Load result files, write the Markdown and HTML leaderboards where asked (atomically); returns
    ``(markdown, html)``.

    A file that fails the result schema is skipped with a :class:`ResultFileWarning` (``on_bad="warn"``, the default)
    or raises (``on_bad="raise"``); see :func:`load_valid_results`. ``ValueError`` when no file is valid.
    """
    if not (isinstance(replays_per_env, int) and replays_per_env >= 0):
        raise ValueError(f"invalid argument replays_per_env={replays_per_env!r}: expected an int >= 0")
    results, names, _ = load_valid_results(paths, on_bad=on_bad)
    board = build_board(results, names)
    markdown = markdown_table(board)
    page = render_html(board, results, _label_runs(results, names), title=title, replays_per_env=replays_per_env)
    for path, text in ((markdown_path, markdown), (html_path, page)):
        if path is not None:
            atomic_write_text(path, text)
    return markdown, page
