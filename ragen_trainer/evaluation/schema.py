"""The schema of evaluation result files (and of the ``.partial`` checkpoints of a running evaluation), in pydantic.

A result file is read back by the leaderboard and by ``ragen-trainer eval --rescore``; nothing in it is trusted. The
schema checks, in this order:

1. **the file**: UTF-8 JSON holding one object whose ``format`` is ``"ragen-eval-result"`` and ``format_version`` 1;
2. **every field**: its type (strict: ``"95"`` is not a number, ``1.0`` is not a count, ``true`` is not a rate),
   that every number anywhere in the file is finite (no ``NaN``, ``Infinity``, nor ``1e999``, which JSON readers turn
   into infinity), and ranges: rates (success, partial credit, invalid actions, pass@k, the games' win / draw / loss
   and deal rates) in ``[0, 1]``, the score and partial score in ``[0, 100]``, counts and standard errors ``>= 0``;
3. **consistency** (``consistency=True``, the default): the score is the mean of the per-env success rates it claims
   (x 100), episode counts match the ``episodes`` list and the suite definition (seeds x rollouts per env, each
   (seed, rollout) once), the suite ``hash`` is that of its definition, every episode's ``success`` and ``reward``
   are those of its turns (and a turn's reward the sum of its ``reward_parts``), a game env's outcome rates come
   together and sum to 1, and the stored ``summary`` is what re-scoring the episodes gives
   (:func:`ragen_trainer.evaluation.metrics.summarize`; metrics newer than the file, absent from its summary, are not
   required).

A problem is reported as ``(path inside the JSON, what is wrong)``, e.g. ``("summary.overall.score", "Input should be a
finite number (got nan)")``; :class:`ResultFileError` carries them with the file's name.

Files of older suite versions stay readable: the per-env ``protocol`` of a suite definition (recorded since the ``-v2``
suites) is optional, and so is every episode or turn field that older versions did not write. The suite ``hash`` is
checked against the definition (:func:`ragen_trainer.evaluation.suites.suite_hash`) for every suite version.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from ragen_trainer.evaluation.metrics import GAME_OUTCOMES, outcome_rate_key, summarize
from ragen_trainer.evaluation.suites import generation_hash, suite_hash
from ragen_trainer.fileio import BoundedReadError, read_text_bounded

RESULT_FORMAT = "ragen-eval-result"
RESULT_FORMAT_VERSION = 1
CHECKPOINT_FORMAT = "ragen-eval-checkpoint"

#: Largest count accepted (counts must survive the page's JavaScript numbers exactly).
MAX_COUNT = 2**53
#: Largest seed accepted (numpy seeds).
MAX_SEED = 2**63 - 1
#: Relative and absolute tolerance of the consistency checks (the writer's own arithmetic, JSON round trip exact).
TOLERANCE = 1e-9
#: Largest result or checkpoint file read (the full paper-v2 suite's result of a model is some tens of MB).
MAX_FILE_BYTES = 256 * 1024 * 1024
#: At most this many problems are kept per file (a file broken everywhere would otherwise give thousands).
MAX_PROBLEMS = 20


# ------------------------------------------------------------------------------------------------------ problems
class ResultFileError(ValueError):
    """A result file that cannot be used: ``path`` and ``problems`` (``[(field path, what is wrong)]``)."""

    def __init__(self, path: str | Path | None, problems: Sequence[tuple[str, str]], what: str = "result file"):
        self.path = None if path is None else str(path)
        self.problems = list(problems)
        where = f"{what} {self.path!r}" if self.path is not None else what
        shown = "; ".join(f"{field}: {message}" if field else message for field, message in self.problems[:5])
        more = f" (and {len(self.problems) - 5} more)" if len(self.problems) > 5 else ""
        super().__init__(f"{where}: {shown}{more}")


class ResultFileWarning(UserWarning):
    """A result file the leaderboard skipped (the message names the file, the field and what is wrong)."""


def _problem(at: Sequence[str | int], message: str) -> tuple[list[str | int], str]:
    return list(at), message


def _raise(problems: list[tuple[list[str | int], str]]) -> None:
    """Raise the consistency problems found by a model validator as one pydantic error (expanded by
    :func:`problems_of`)."""
    if problems:
        text = "; ".join(message for _, message in problems)
        raise PydanticCustomError("inconsistent", "{text}", {"text": text, "problems": problems[:MAX_PROBLEMS]})


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def _finite_json(value: Any) -> Any:
    """Free-form JSON (agent identity, env extras, views): every number in it must be finite."""
    stack: list[tuple[list[str | int], Any]] = [([], value)]
    while stack:
        at, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise PydanticCustomError("finite_number", "Input should be a finite number (got {got})",
                                      {"got": repr(item), "at": at})  # fmt: skip
        if isinstance(item, dict):
            stack.extend((at + [str(k)], v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((at + [i], v) for i, v in enumerate(item))
    return value


# ------------------------------------------------------------------------------------------------------ types
Json = Annotated[Any, AfterValidator(_finite_json)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Rate = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
RateSE = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Percent = Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Positive = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Name = Annotated[str, Field(min_length=1)]


class _Record(BaseModel):
    """Strict types, no NaN; keys the schema does not name are kept (newer writers) but must be finite JSON too."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")
    __pydantic_extra__: dict[str, Json] = Field(init=False)


def _consistency(info: ValidationInfo) -> bool:
    return bool((info.context or {}).get("consistency", True))


# ------------------------------------------------------------------------------------------------------ episodes
class TurnRecord(_Record):
    reward: Finite
    success: bool
    reply: str = ""
    reply_tokens: Count | None = None
    think: str | None = None
    actions: list[str] = Field(default_factory=list)
    reward_parts: dict[str, Finite] = Field(default_factory=dict)
    format_ok: bool = False
    action_is_valid: bool = False
    invalid_actions: Json = None
    dropped_actions: Json = None
    reason: str | None = None
    observation: str = ""
    state: str | None = None
    info_extra: Json = None

    @model_validator(mode="after")
    def _parts_sum_to_the_reward(self, info: ValidationInfo) -> TurnRecord:
        if self.reward_parts and _consistency(info):
            total = float(sum(self.reward_parts.values()))
            if not _close(self.reward, total):
                _raise([_problem(["reward"], f"{self.reward!r} is not the sum of its reward_parts ({total!r})")])
        return self


class EpisodeRecord(_Record):
    env: Name
    env_id: Name
    seed: Seed
    rollout: Count
    turns: list[TurnRecord]
    success: bool
    reward: Finite
    state_index: Count | None = None
    system_prompt: str = ""
    observation: str = ""
    initial_state: str | None = None
    reset_info: Json = None
    terminated: bool = False
    truncated: bool = False
    final_view: Json = None
    error: str | None = None
    error_kind: Literal["engine"] | None = None

    @model_validator(mode="after")
    def _matches_its_turns(self, info: ValidationInfo) -> EpisodeRecord:
        if not _consistency(info):
            return self
        problems = []
        last = self.turns[-1].success if self.turns else False
        if self.success != last:
            problems.append(_problem(["success"], f"{self.success} but its last turn's success is {last} (success is "
                                                  "the env's flag after the last turn)"))  # fmt: skip
        total = float(sum(t.reward for t in self.turns))
        if not _close(self.reward, total):
            problems.append(_problem(["reward"], f"{self.reward!r} is not the sum of its turn rewards ({total!r})"))
        if self.error_kind is not None and not self.error:
            problems.append(_problem(["error_kind"], f"{self.error_kind!r} but the episode has no error"))
        _raise(problems)
        return self


# ------------------------------------------------------------------------------------------------------ summary
class EnvSummary(_Record):
    episodes: Count
    success_rate: Rate | None
    success_rate_se: RateSE | None
    states: Count | None = None
    rollouts_per_state: Positive | list[Positive] | None = None
    partial_credit: Rate | None = None
    partial_credit_se: RateSE | None = None
    mean_reward: Finite | None = None
    mean_reward_se: NonNegative | None = None
    invalid_action_rate: Rate | None = None
    format_error_rate: Rate | None = None
    mean_actions: NonNegative | None = None
    mean_turns: NonNegative | None = None
    mean_reply_chars: NonNegative | None = None
    mean_reply_tokens: NonNegative | None = None
    mean_think_words: NonNegative | None = None
    errors: Count = 0
    engine_errors: Count | None = None
    pass_at_k: dict[str, Rate] | None = None
    # Game envs only (metrics.GAME_OUTCOMES): one rate per outcome word of the game, the game's mean score.
    win_rate: Rate | None = None
    win_rate_se: RateSE | None = None
    draw_rate: Rate | None = None
    draw_rate_se: RateSE | None = None
    loss_rate: Rate | None = None
    loss_rate_se: RateSE | None = None
    deal_rate: Rate | None = None
    deal_rate_se: RateSE | None = None
    no_deal_rate: Rate | None = None
    no_deal_rate_se: RateSE | None = None
    no_outcome: Count | None = None
    mean_score: Finite | None = None
    mean_score_se: NonNegative | None = None

    @model_validator(mode="after")
    def _coherent(self, info: ValidationInfo) -> EnvSummary:
        if not _consistency(info):
            return self
        problems = []
        if self.states is not None and self.states > self.episodes:
            problems.append(_problem(["states"], f"{self.states} states but only {self.episodes} episodes"))
        if self.errors > self.episodes:
            problems.append(_problem(["errors"], f"{self.errors} errors but only {self.episodes} episodes"))
        if self.engine_errors is not None and self.engine_errors > self.errors:
            problems.append(_problem(["engine_errors"], f"{self.engine_errors} engine errors but only {self.errors} "
                                                        "errors"))  # fmt: skip
        if self.no_outcome is not None and self.no_outcome > self.episodes:
            problems.append(_problem(["no_outcome"], f"{self.no_outcome} but only {self.episodes} episodes"))
        problems.extend(self._outcome_problems())
        if (self.success_rate is None) != (self.episodes == 0):
            problems.append(_problem(["success_rate"], f"{self.success_rate!r} with {self.episodes} episodes"))
        for k in self.pass_at_k or {}:
            if not (k.isdigit() and int(k) >= 1):
                problems.append(_problem(["pass_at_k", k], "the key must be a k >= 1"))
        _raise(problems)
        return self

    def _outcome_problems(self) -> list[tuple[list[str | int], str]]:
        """A game's outcome rates come all together and sum to 1 (every episode counts as exactly one outcome)."""
        problems = []
        for words in dict.fromkeys(GAME_OUTCOMES.values()):
            keys = [outcome_rate_key(w) for w in words]
            rates = {k: getattr(self, k, None) for k in keys if getattr(self, k, None) is not None}
            if not rates:
                continue
            if len(rates) < len(keys):
                missing = [k for k in keys if k not in rates]
                message = f"comes without {missing} (a game reports all of {keys})"
                problems.append(_problem([next(iter(rates))], message))
            elif not _close(sum(rates.values()), 1.0):
                problems.append(_problem([keys[0]], f"the outcome rates {keys} sum to {sum(rates.values())!r}, not 1"))
        return problems


class OverallSummary(_Record):
    score: Percent | None
    envs: Count
    episodes: Count
    score_se: Percent | None = None
    partial: Percent | None = None
    partial_se: Percent | None = None
    definition: str | None = None
    engine_errors: Count | None = None
    engine_failed: bool | None = None


class Summary(_Record):
    envs: dict[str, EnvSummary]
    overall: OverallSummary

    @model_validator(mode="after")
    def _overall_is_the_mean_of_the_envs(self, info: ValidationInfo) -> Summary:
        if not _consistency(info):
            return self
        problems = []
        overall, envs = self.overall, self.envs.values()
        if overall.envs != len(self.envs):
            problems.append(_problem(["overall", "envs"], f"{overall.envs} but the summary lists {len(self.envs)}"))
        total = sum(s.episodes for s in envs)
        if overall.episodes != total:
            problems.append(_problem(["overall", "episodes"],
                                     f"{overall.episodes} but the per-env episode counts sum to {total}"))  # fmt: skip
        rates = [s.success_rate for s in envs if s.success_rate is not None]
        expected = 100.0 * sum(rates) / len(rates) if rates else None
        if (overall.score is None) != (expected is None) or (
            expected is not None and overall.score is not None and not _close(overall.score, expected)
        ):
            problems.append(_problem(["overall", "score"], f"{overall.score!r} is not the mean of the per-env success "
                                                           f"rates it claims (x 100 = {expected!r})"))  # fmt: skip
        ses = [s.success_rate_se for s in envs]
        expected_se = 100.0 * math.sqrt(sum(se * se for se in ses)) / len(ses) if ses and None not in ses else None
        if overall.score_se is not None and (expected_se is None or not _close(overall.score_se, expected_se)):
            problems.append(_problem(["overall", "score_se"], f"{overall.score_se!r} is not sqrt(sum se_i^2) / "
                                                              f"n_envs of the per-env standard errors "
                                                              f"({expected_se!r})"))  # fmt: skip
        _raise(problems)
        return self


# ------------------------------------------------------------------------------------------------------ suite, agent
class SeedRange(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    start: Seed
    count: Positive


class SuiteEnvDefinition(_Record):
    name: Name
    env_id: Name
    seeds: SeedRange | Annotated[list[Seed], Field(min_length=1)]
    rollouts_per_state: Positive | None = None
    protocol: dict[str, Json] | None = None
    """The resolved turn protocol; absent in suites from before ragen recorded it (``*-v1``)."""

    def seed_list(self) -> list[int]:
        if isinstance(self.seeds, SeedRange):
            return list(range(self.seeds.start, self.seeds.start + self.seeds.count))
        return list(self.seeds)


class SuiteDefinition(_Record):
    name: Name
    version: Count
    envs: Annotated[list[SuiteEnvDefinition], Field(min_length=1)]
    rollouts_per_state: Positive = 1

    @model_validator(mode="after")
    def _unique_env_names(self, info: ValidationInfo) -> SuiteDefinition:
        names = Counter(e.name for e in self.envs)
        _raise([_problem(["envs"], f"env name {n!r} is listed {c} times") for n, c in names.items() if c > 1])
        return self


class SuiteIdentity(_Record):
    name: Name
    version: Count
    id: Name
    hash: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
    definition: SuiteDefinition

    @model_validator(mode="wrap")
    @classmethod
    def _id_and_hash_name_the_suite(cls, data: Any, handler: Any, info: ValidationInfo) -> SuiteIdentity:
        model = handler(data)
        if not _consistency(info):
            return model
        problems = []
        base = f"{model.name}-v{model.version}"
        if not model.id.startswith(base):
            problems.append(_problem(["id"], f"{model.id!r} does not name suite {model.name!r} version "
                                             f"{model.version} (expected {base!r}, with +subset / +variant marks)"))
        for key, mark in (("subset_of", "+subset"), ("variant_of", "+variant")):
            if (model.definition.model_extra or {}).get(key) and mark not in model.id:
                problems.append(_problem(["id"], f"{model.id!r} lacks {mark!r} but the definition is a {key}"))
        actual = suite_hash(data["definition"])  # every suite version stores the hash of the definition it holds
        if actual != model.hash:
            problems.append(_problem(["hash"], f"{model.hash!r} is not the hash of the suite definition the "
                                               f"file holds ({actual!r}): the definition was edited after the run"))
        _raise(problems)
        return model


class AgentIdentity(_Record):
    name: Name
    kind: str | None = None
    generation: dict[str, Json] | None = None
    """A model's effective generation settings per env (written since the generation hash exists)."""
    generation_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")] | None = None

    @model_validator(mode="after")
    def _generation_hash_names_the_settings(self) -> AgentIdentity:
        if (self.generation is None) != (self.generation_hash is None):
            raise ValueError("generation and generation_hash come together (one is missing)")
        if self.generation is not None and generation_hash(self.generation) != self.generation_hash:
            raise ValueError(f"generation_hash {self.generation_hash!r} is not the hash of the generation settings "
                             f"the file holds ({generation_hash(self.generation)!r}): the file was edited")
        return self


class Timings(_Record):
    started: str | None = None
    wall_seconds: NonNegative | None = None
    env_seconds: dict[str, NonNegative] | None = None
    batch_size: Positive | None = None


# ------------------------------------------------------------------------------------------------------ files
def _check_format(data: Any, tag: str, version: int | None) -> None:
    if not isinstance(data, dict):
        raise PydanticCustomError("not_an_object", "not a ragen evaluation result: expected a JSON object, got {got}",
                                  {"got": _json_type(data), "at": []})  # fmt: skip
    if data.get("format") != tag:
        what = "a ragen evaluation result" if tag == RESULT_FORMAT else "a ragen evaluation checkpoint"
        raise PydanticCustomError("wrong_format", "not " + what + " (expected format {want}, got {got})",
                                  {"want": repr(tag), "got": _short(data.get("format")), "at": ["format"]})
    if version is not None and data.get("format_version") != version:
        raise PydanticCustomError("wrong_version", "result format version {got}; this ragen reads {want}",
                                  {"got": _short(data.get("format_version")), "want": version,
                                   "at": ["format_version"]})  # fmt: skip


def _rescore_problems(data: dict[str, Any]) -> list[tuple[list[str | int], str]]:
    """Where the stored summary differs from the one re-scoring the episodes gives (newer metrics not required)."""
    order = [e["name"] for e in data["suite"]["definition"]["envs"]]
    rescored = summarize(data["episodes"], order)
    differences = _differences(data["summary"], rescored, ["summary"], only_stored=True)
    return [_problem(at, message) for at, message in differences]


def _differences(stored: Any, rescored: Any, at: list[str | int], *, only_stored: bool) -> list[tuple[list, str]]:
    if isinstance(stored, dict) and isinstance(rescored, dict):
        out = []
        for key in sorted(set(stored) | set(rescored), key=str):
            if key not in rescored:
                out.append((at + [key], "not a metric that re-scoring the episodes gives"))
            elif key not in stored:
                if not only_stored:
                    out.append((at + [key], "missing; re-scoring the episodes gives it"))
            else:
                out.extend(_differences(stored[key], rescored[key], at + [key], only_stored=only_stored))
        return out
    numbers = (int, float)
    if isinstance(stored, numbers) and isinstance(rescored, numbers) and not isinstance(stored, bool):
        if _close(float(stored), float(rescored)):
            return []
    elif stored == rescored:
        return []
    return [(at, f"stored {stored!r}, re-scoring the episodes gives {rescored!r}")]


class ResultFile(_Record):
    """One evaluation result (see :mod:`ragen_trainer.evaluation.runner`)."""

    format: Literal["ragen-eval-result"]
    format_version: Literal[1]
    suite: SuiteIdentity
    agent: AgentIdentity
    episodes: list[EpisodeRecord]
    summary: Summary
    versions: dict[str, str] = Field(default_factory=dict)
    timings: Timings | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _whole_file(cls, data: Any, handler: Any, info: ValidationInfo) -> ResultFile:
        _check_format(data, RESULT_FORMAT, RESULT_FORMAT_VERSION)
        model = handler(data)
        if not _consistency(info):
            return model
        problems = _episode_problems(model.suite.definition, model.episodes, model.summary)
        if not problems:  # only a file whose counts agree is worth re-scoring
            problems = _rescore_problems(data)
        _raise(problems)
        return model


def _episode_problems(definition: SuiteDefinition, episodes: list[EpisodeRecord], summary: Summary) -> list:
    """The episodes list against the suite (which envs, how many, which seeds) and the summary's counts."""
    problems = []
    entries = {e.name: e for e in definition.envs}
    per_env = Counter(e.env for e in episodes)
    seen: dict[tuple[str, int, int], int] = {}
    for i, episode in enumerate(episodes):
        entry = entries.get(episode.env)
        if entry is None:
            problems.append(_problem(["episodes", i, "env"], f"{episode.env!r} is not an env of the suite "
                                                             f"({sorted(entries)})"))  # fmt: skip
            continue
        if episode.env_id != entry.env_id:
            problems.append(_problem(["episodes", i, "env_id"], f"{episode.env_id!r} but the suite plays "
                                                                f"{episode.env!r} as {entry.env_id!r}"))  # fmt: skip
        rollouts = entry.rollouts_per_state or definition.rollouts_per_state
        if episode.rollout >= rollouts:
            problems.append(_problem(["episodes", i, "rollout"], f"{episode.rollout} but the suite plays {rollouts} "
                                                                 "rollout(s) per state"))  # fmt: skip
        key = (episode.env, episode.seed, episode.rollout)
        if key in seen:
            problems.append(_problem(["episodes", i], f"repeats episode {seen[key]} ({episode.env}, seed "
                                                      f"{episode.seed}, rollout {episode.rollout})"))  # fmt: skip
        seen.setdefault(key, i)
    for name, entry in entries.items():
        seeds = set(entry.seed_list())
        rollouts = entry.rollouts_per_state or definition.rollouts_per_state
        expected = len(seeds) * rollouts
        if name in per_env and per_env[name] != expected:
            problems.append(_problem(["episodes"], f"{per_env[name]} {name} episodes, but the suite pins {len(seeds)} "
                                                   f"seed(s) x {rollouts} rollout(s) = {expected}"))  # fmt: skip
        strays = sorted({e.seed for e in episodes if e.env == name} - seeds)
        if strays:
            problems.append(_problem(["episodes"], f"{name} episodes with seeds the suite does not pin: {strays[:5]}"))
    for name, s in summary.envs.items():
        if s.episodes != per_env.get(name, 0):
            problems.append(_problem(["summary", "envs", name, "episodes"], f"{s.episodes} but the file holds "
                                                                            f"{per_env.get(name, 0)} {name} episodes"))
    for name in per_env:
        if name not in summary.envs and name in entries:
            problems.append(_problem(["summary", "envs"], f"no entry for env {name!r}, which has {per_env[name]} "
                                                          "episodes"))  # fmt: skip
    if summary.overall.episodes != len(episodes):
        message = f"{summary.overall.episodes} but the episodes list holds {len(episodes)}"
        problems.append(_problem(["summary", "overall", "episodes"], message))
    return problems


class CheckpointFile(_Record):
    """The finished envs of an interrupted run (``<result>.partial``)."""

    format: Literal["ragen-eval-checkpoint"]
    suite_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]
    agent: dict[str, Json]
    env_seconds: dict[str, NonNegative]
    episodes: list[EpisodeRecord]

    @model_validator(mode="wrap")
    @classmethod
    def _whole_file(cls, data: Any, handler: Any, info: ValidationInfo) -> CheckpointFile:
        _check_format(data, CHECKPOINT_FORMAT, None)
        model = handler(data)
        strays = sorted({e.env for e in model.episodes} - set(model.env_seconds))
        _raise([_problem(["episodes"], f"episodes of envs {strays} that env_seconds does not list as finished")]
               if strays and _consistency(info) else [])  # fmt: skip
        return model


# ------------------------------------------------------------------------------------------------------ entry points
def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)  # fmt: skip


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_path(at: Sequence[str | int]) -> str:
    """``["episodes", 3, "turns", 0, "reward"]`` -> ``"episodes[3].turns[0].reward"``; ``[]`` -> ``"(top level)"``."""
    out = ""
    for part in at:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _json_path(data: Any, loc: Sequence[str | int], missing: bool) -> list[str | int]:
    """The part of a pydantic error location that is a path inside ``data`` (union member tags dropped)."""
    at: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        if (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        ):
            node = node[part]
            at.append(part)
        elif missing and i == len(loc) - 1:
            at.append(part)
    return at


def problems_of(error: ValidationError, data: Any) -> list[tuple[str, str]]:
    """``[(field path, what is wrong)]`` of a pydantic error (one line per field; union alternatives joined)."""
    merged: dict[str, list[str]] = {}
    for item in error.errors(include_url=False):
        ctx = item.get("ctx") or {}
        base = _json_path(data, item["loc"], item["type"] == "missing")
        if item["type"] == "inconsistent":
            entries = [(base + list(at), message) for at, message in ctx.get("problems", [])]
        else:
            message = item["msg"]
            quiet = item["type"] in ("missing", "wrong_format", "wrong_version", "not_an_object") or "got" in ctx
            if not quiet and "input" in item:
                message += f" (got {_short(item['input'])})"
            entries = [(base + list(ctx.get("at", [])), message)]
        for at, message in entries:
            messages = merged.setdefault(format_path(at), [])
            if message not in messages:
                messages.append(message)
    return [(path, " or ".join(messages)) for path, messages in merged.items()][:MAX_PROBLEMS]


def validate_result(data: Any, *, consistency: bool = True) -> list[tuple[str, str]]:
    """The problems of a result (a parsed JSON value); ``[]`` when it is a valid result."""
    try:
        ResultFile.model_validate(data, context={"consistency": consistency})
    except ValidationError as exc:
        return problems_of(exc, data)
    return []


def validate_checkpoint(data: Any) -> list[tuple[str, str]]:
    """The problems of a ``.partial`` checkpoint; ``[]`` when it is valid."""
    try:
        CheckpointFile.model_validate(data)
    except ValidationError as exc:
        return problems_of(exc, data)
    return []


def read_json(path: str | Path, what: str = "result file", max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Parse a JSON file; :class:`ResultFileError` when it is missing, unreadable, not a regular file (a FIFO, a
    device such as ``/dev/zero`` behind a symbolic link), larger than ``max_bytes``, not UTF-8 or not JSON."""
    path = Path(path)
    try:
        text = read_text_bounded(path, max_bytes, what)
    except FileNotFoundError:
        raise ResultFileError(path, [("", "the file does not exist")], what) from None
    except BoundedReadError as exc:
        reason = str(exc).split(f"{str(path)!r} ", 1)[-1]
        raise ResultFileError(path, [("", reason)], what) from None
    except UnicodeDecodeError as exc:
        raise ResultFileError(path, [("", f"not UTF-8 text ({exc.reason} at byte {exc.start})")], what) from None
    except OSError as exc:
        raise ResultFileError(path, [("", f"cannot be read ({exc.strerror or exc})")], what) from None
    if not text.strip():
        raise ResultFileError(path, [("", "not valid JSON: the file is empty")], what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFileError(path, [("", f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")],
                              what) from None  # fmt: skip
    except RecursionError:
        raise ResultFileError(path, [("", "not valid JSON for ragen: nested too deeply")], what) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ResultFileError(path, [("", f"not valid JSON for ragen: {exc}")], what) from None


__all__ = [
    "CHECKPOINT_FORMAT",
    "MAX_FILE_BYTES",
    "RESULT_FORMAT",
    "RESULT_FORMAT_VERSION",
    "CheckpointFile",
    "ResultFile",
    "ResultFileError",
    "ResultFileWarning",
    "format_path",
    "problems_of",
    "read_json",
    "validate_checkpoint",
    "validate_result",
]
