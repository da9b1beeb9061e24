"""Seed-pinned evaluation suites: which envs, which initial states, how many rollouts, which decoding.

A suite is a named, versioned JSON file (``benchmarks/suites/<name>-v<version>.json``)::

    {
      "name": "paper", "version": 1,
      "description": "...",
      "decoding": {"temperature": 0.5, "top_p": 1.0, "max_new_tokens": 400, "seed": 0},
      "rollouts_per_state": 1,
      "envs": [
        {"name": "Bandit", "env_id": "ragen/Bandit-v0", "env_kwargs": {},
         "seeds": {"start": 1000000, "count": 256}, "split": "train"},
        ...
      ]
    }

Every initial state is ``env.reset(seed=s)`` for a pinned seed ``s`` (a ``{"start", "count"}`` range or an explicit
list), so two runs of the same suite see exactly the same states. Per env entries may override ``decoding`` (merged
over the suite's), ``rollouts_per_state`` and ``reset_options`` (passed to ``reset``; the string ``"{index}"`` inside
a value is replaced by the state's index, which lets WebShop pick goal ``i`` of its split).

Turn protocol. Each env plays with its id's reference :class:`~ragen_envs.settings.ProtocolSettings`, changed by a
suite-level ``"protocol"`` object and an env-level one (a field set in both to different values is an error naming
both, as is a protocol field inside ``env_kwargs`` that disagrees). The loaded definition records every env's
*resolved* settings under ``"protocol"``, generation prefix included, so the hash covers them.

The suite's identity is ``name``, ``version`` and ``hash`` (sha256 of its canonical JSON), all written into every
result file: a result can only be compared with results of the same hash.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_envs.factory import check_user_env_kwargs
from ragen_envs.registration import reference_settings
from ragen_envs.settings import FIELD_NAMES, ProtocolSettings, merge_settings
from ragen_trainer.fileio import read_text_bounded

#: Decoding settings a suite pins; the model agent reads exactly these.
DECODING_KEYS: tuple[str, ...] = ("temperature", "top_p", "max_new_tokens", "seed")
DEFAULT_DECODING: dict[str, Any] = {"temperature": 0.5, "top_p": 1.0, "max_new_tokens": 400, "seed": 0}

#: Largest suite file read (the bundled ones are a few KB; a suite lists seeds, not episodes).
MAX_SUITE_BYTES = 16 * 1024 * 1024
#: Where the suites shipped with the repository live (``benchmarks/suites`` next to the packages).
SUITES_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "suites"

_ENV_KEYS = {"name", "env_id", "env_kwargs", "seeds", "rollouts_per_state", "decoding", "split", "reset_options", "note",
             "protocol"}
_SUITE_KEYS = {"name", "version", "description", "decoding", "rollouts_per_state", "envs", "subset_of", "protocol",
               "variant_of"}


@dataclass(frozen=True)
class SuiteEnv:
    """One env of a suite: the id and kwargs of ``gymnasium.make``, the pinned seeds and the rollouts per seed."""

    name: str
    env_id: str
    env_kwargs: dict[str, Any]
    seeds: tuple[int, ...]
    rollouts_per_state: int
    decoding: dict[str, Any]
    split: str = "train"
    reset_options: dict[str, Any] | None = None
    note: str = ""
    protocol: ProtocolSettings = field(default_factory=ProtocolSettings)
    """The resolved turn-protocol settings this env is played with."""

    @property
    def num_episodes(self) -> int:
        return len(self.seeds) * self.rollouts_per_state

    def make_kwargs(self) -> dict[str, Any]:
        """``gymnasium.make`` keyword arguments: the env's own ``env_kwargs`` and exactly :attr:`protocol`."""
        kwargs = {k: v for k, v in self.env_kwargs.items() if k not in FIELD_NAMES}
        kwargs["protocol"] = self.protocol
        return kwargs

    def options_for(self, index: int) -> dict[str, Any] | None:
        """The ``reset`` options of state ``index`` (``"{index}"`` placeholders filled in)."""
        if self.reset_options is None:
            return None
        return {k: (index if v == "{index}" else v) for k, v in self.reset_options.items()}


@dataclass(frozen=True)
class Suite:
    """A loaded suite. ``definition`` is the JSON it was loaded from (normalised); ``hash`` identifies it."""

    name: str
    version: int
    description: str
    envs: tuple[SuiteEnv, ...]
    definition: dict[str, Any] = field(repr=False)

    @property
    def suite_id(self) -> str:
        """``name-vN``; a sub-suite made by :meth:`select` is ``name-vN+subset``, a protocol variant made by
        :meth:`with_protocol` ``name-vN+variant`` (each has its own hash)."""
        marks = ("+subset" if self.definition.get("subset_of") else "") + (
            "+variant" if self.definition.get("variant_of") else ""
        )
        return f"{self.name}-v{self.version}{marks}"

    @property
    def hash(self) -> str:
        return suite_hash(self.definition)

    @property
    def num_episodes(self) -> int:
        return sum(e.num_episodes for e in self.envs)

    def env(self, name: str) -> SuiteEnv:
        for entry in self.envs:
            if entry.name == name:
                return entry
        raise KeyError(f"suite {self.suite_id} has no env {name!r}; it has {[e.name for e in self.envs]}")

    def identity(self) -> dict[str, Any]:
        """What a result file stores about the suite: its id, hash and whole definition."""
        return {"name": self.name, "version": self.version, "id": self.suite_id, "hash": self.hash,
                "definition": copy.deepcopy(self.definition)}

    def select(self, env_names: list[str] | None = None, max_states: int | None = None) -> Suite:
        """A sub-suite: only ``env_names`` and/or the first ``max_states`` seeds of each env.

        The sub-suite gets its own hash and its id a ``+subset`` mark, so it is never mistaken for the full suite on a
        leaderboard.
        """
        if env_names is None and max_states is None:
            return self
        definition = copy.deepcopy(self.definition)
        if env_names is not None:
            known = [e["name"] for e in definition["envs"]]
            unknown = [n for n in env_names if n not in known]
            if unknown:
                raise ValueError(f"invalid argument envs={unknown}: expected names from suite {self.suite_id}: {known}")
            definition["envs"] = [e for e in definition["envs"] if e["name"] in env_names]
        if max_states is not None:
            if not (isinstance(max_states, int) and max_states >= 1):
                raise ValueError(f"invalid argument max_states={max_states!r}: expected an int >= 1")
            for entry in definition["envs"]:
                entry["seeds"] = list(_expand_seeds(entry["seeds"], entry["name"]))[:max_states]
        definition["subset_of"] = self.definition.get("subset_of") or f"{self.name}-v{self.version}"
        return suite_from_dict(definition)

    def with_protocol(self, overrides: dict[str, Any] | None) -> Suite:
        """A variant of the suite whose envs all play with ``overrides`` applied to their protocol settings (e.g.
        ``{"reply_prefix": ""}``). It has its own hash and a ``+variant`` mark in its id."""
        if not overrides:
            return self
        definition = copy.deepcopy(self.definition)
        for entry in definition["envs"]:
            entry["protocol"] = {**entry.get("protocol", {}), **overrides}
        definition["variant_of"] = self.definition.get("variant_of") or f"{self.name}-v{self.version}"
        return suite_from_dict(definition)


def suite_hash(definition: dict[str, Any]) -> str:
    """sha256 (first 16 hex digits) of the canonical JSON of a suite definition."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def generation_hash(generation: dict[str, Any]) -> str:
    """sha256 (first 16 hex digits) of the canonical JSON of a model's effective generation settings, per env (what a
    result's ``agent.generation`` records: the generation prefix and who added it, stop strings, thinking, decoding,
    context; see :meth:`ragen_trainer.evaluation.agents.ModelAgent.generation_settings`). Two model results share a
    leaderboard table only when their suite hash and this hash agree."""
    return suite_hash(generation)


def _expand_seeds(spec: Any, env_name: str) -> tuple[int, ...]:
    if isinstance(spec, dict):
        if set(spec) != {"start", "count"}:
            raise ValueError(
                f"invalid seeds {spec!r} for env {env_name!r}: expected {{'start': int, 'count': int}} or a list of ints"
            )
        start, count = spec["start"], spec["count"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, count)) or start < 0 or count < 1:
            raise ValueError(f"invalid seeds {spec!r} for env {env_name!r}: start must be an int >= 0, count >= 1")
        return tuple(range(start, start + count))
    if isinstance(spec, list) and spec and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in spec):
        if len(set(spec)) != len(spec):
            raise ValueError(f"invalid seeds for env {env_name!r}: the list repeats a seed")
        return tuple(spec)
    raise ValueError(
        f"invalid seeds {spec!r} for env {env_name!r}: expected {{'start': int, 'count': int}} or a non-empty list of "
        "ints >= 0"
    )


def _check_decoding(decoding: Any, where: str) -> dict[str, Any]:
    if not isinstance(decoding, dict):
        raise ValueError(f"invalid decoding {decoding!r} in {where}: expected an object with keys {DECODING_KEYS}")
    unknown = set(decoding) - set(DECODING_KEYS)
    if unknown:
        raise ValueError(f"invalid decoding keys {sorted(unknown)} in {where}: expected some of {DECODING_KEYS}")
    t, p, n, s = (decoding.get(k) for k in DECODING_KEYS)
    if t is not None and not (isinstance(t, (int, float)) and t >= 0):
        raise ValueError(f"invalid temperature={t!r} in {where}: expected a number >= 0 (0 = greedy)")
    if p is not None and not (isinstance(p, (int, float)) and 0 < p <= 1):
        raise ValueError(f"invalid top_p={p!r} in {where}: expected a number in (0, 1]")
    if n is not None and not (isinstance(n, int) and n >= 1):
        raise ValueError(f"invalid max_new_tokens={n!r} in {where}: expected an int >= 1")
    if s is not None and not (isinstance(s, int) and s >= 0):
        raise ValueError(f"invalid seed={s!r} in {where}: expected an int >= 0")
    return dict(decoding)


def suite_from_dict(data: dict[str, Any]) -> Suite:
    """Validate a suite definition and build a :class:`Suite`; raises ``ValueError`` naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"a suite must be a JSON object, got {type(data).__name__}")
    unknown = set(data) - _SUITE_KEYS
    if unknown:
        raise ValueError(f"invalid suite keys {sorted(unknown)}: expected some of {sorted(_SUITE_KEYS)}")
    name, version = data.get("name"), data.get("version")
    if not (isinstance(name, str) and name.strip()):
        raise ValueError(f"invalid suite name={name!r}: expected a non-empty string")
    if not (isinstance(version, int) and not isinstance(version, bool) and version >= 1):
        raise ValueError(f"invalid suite version={version!r}: expected an int >= 1")
    decoding = {**DEFAULT_DECODING, **_check_decoding(data.get("decoding", {}), f"suite {name}")}
    rollouts = data.get("rollouts_per_state", 1)
    if not (isinstance(rollouts, int) and rollouts >= 1):
        raise ValueError(f"invalid rollouts_per_state={rollouts!r} in suite {name}: expected an int >= 1")
    raw_envs = data.get("envs")
    if not (isinstance(raw_envs, list) and raw_envs):
        raise ValueError(f"suite {name} needs a non-empty 'envs' list")
    envs: list[SuiteEnv] = []
    for raw in raw_envs:
        if not isinstance(raw, dict):
            raise ValueError(f"invalid env entry {raw!r} in suite {name}: expected an object")
        bad = set(raw) - _ENV_KEYS
        if bad:
            raise ValueError(f"invalid env keys {sorted(bad)} in suite {name}: expected some of {sorted(_ENV_KEYS)}")
        env_name, env_id = raw.get("name"), raw.get("env_id")
        if not (isinstance(env_name, str) and env_name.strip() and isinstance(env_id, str) and env_id.strip()):
            raise ValueError(f"invalid env entry {raw!r} in suite {name}: 'name' and 'env_id' must be non-empty strings")
        if any(e.name == env_name for e in envs):
            raise ValueError(f"suite {name} lists env name {env_name!r} twice")
        env_kwargs = raw.get("env_kwargs", {})
        if not isinstance(env_kwargs, dict):
            raise ValueError(f"invalid env_kwargs {env_kwargs!r} for env {env_name!r}: expected an object")
        check_user_env_kwargs(env_kwargs, f"env_kwargs of env {env_name!r}")
        reset_options = raw.get("reset_options")
        if reset_options is not None and not isinstance(reset_options, dict):
            raise ValueError(f"invalid reset_options {reset_options!r} for env {env_name!r}: expected an object")
        protocol = _resolve_protocol(name, env_name, env_id, data.get("protocol"), raw.get("protocol"), env_kwargs)
        env_rollouts = raw.get("rollouts_per_state", rollouts)
        if not (isinstance(env_rollouts, int) and env_rollouts >= 1):
            raise ValueError(f"invalid rollouts_per_state={env_rollouts!r} for env {env_name!r}: expected an int >= 1")
        envs.append(
            SuiteEnv(
                name=env_name,
                env_id=env_id,
                env_kwargs=dict(env_kwargs),
                seeds=_expand_seeds(raw.get("seeds"), env_name),
                rollouts_per_state=env_rollouts,
                decoding={**decoding, **_check_decoding(raw.get("decoding", {}), f"env {env_name}")},
                split=str(raw.get("split", "train")),
                reset_options=reset_options,
                note=str(raw.get("note", "")),
                protocol=protocol,
            )
        )
    definition = copy.deepcopy(data)
    definition.pop("protocol", None)  # folded into each env's resolved settings below
    for raw_env, entry in zip(definition["envs"], envs):
        raw_env["protocol"] = entry.protocol.to_dict()
    return Suite(
        name=name, version=version, description=str(data.get("description", "")), envs=tuple(envs),
        definition=definition,
    )


def _resolve_protocol(
    suite: str, env_name: str, env_id: str, suite_level: Any, env_level: Any, env_kwargs: dict[str, Any]
) -> ProtocolSettings:
    """The env's reference settings with the suite's and the env entry's changes; disagreements name both places."""
    for where, value in ((f"suite {suite} protocol", suite_level), (f"env {env_name!r} protocol", env_level)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"invalid {where} {value!r}: expected an object of protocol settings")
    try:
        base = reference_settings(env_id)
    except ValueError as exc:
        raise ValueError(f"invalid env entry {env_name!r} in suite {suite}: {exc}") from None
    in_kwargs = {k: v for k, v in env_kwargs.items() if k in FIELD_NAMES}
    # A loaded definition already holds each env's resolved settings: those are the env level, exact.
    return merge_settings(base, [(f"suite {suite} protocol", suite_level), (f"env {env_name!r} protocol", env_level),
                                 (f"env {env_name!r} env_kwargs", in_kwargs)])


def _suite_dirs() -> list[Path]:
    # The checkout's suites (editable install), else ./benchmarks/suites (a wheel does not ship benchmarks/).
    dirs = [SUITES_DIR, Path.cwd() / "benchmarks" / "suites"]
    return [d for i, d in enumerate(dirs) if d.is_dir() and d.resolve() not in [x.resolve() for x in dirs[:i]]]


def _suite_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for directory in _suite_dirs():
        for path in sorted(directory.glob("*.json")):
            files.setdefault(path.stem, path)
    return files


def available_suites(directory: Path | None = None) -> list[str]:
    """The ids (``name-vN``) of the suites in ``directory`` (default: the repository's ``benchmarks/suites``)."""
    if directory is not None:
        return sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []
    return sorted(_suite_files())


def load_suite(name_or_path: str | Path) -> Suite:
    """Load a suite by id (``"paper-v2"``), by name (``"paper"``: its highest version) or from a JSON file path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or (path.exists() and not path.is_dir()):
        if not path.exists():
            raise ValueError(f"suite file {str(path)!r} does not exist")
        try:
            data = json.loads(read_text_bounded(path, MAX_SUITE_BYTES, "suite file"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"suite file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except OSError as exc:
            raise ValueError(f"suite file {str(path)!r} cannot be read ({exc.strerror or exc})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"suite file {str(path)!r} is not valid JSON: {exc}") from exc
        except RecursionError:
            raise ValueError(f"suite file {str(path)!r} is not valid JSON for ragen: nested too deeply") from None
        return suite_from_dict(data)
    key = str(name_or_path)
    files = _suite_files()
    known = sorted(files)
    if key in files:
        return load_suite(files[key])
    versions = sorted(
        (int(k.rsplit("-v", 1)[1]), k) for k in known if k.rsplit("-v", 1)[0] == key and k.rsplit("-v", 1)[1].isdigit()
    )
    if versions:
        return load_suite(files[versions[-1][1]])
    raise ValueError(f"unknown suite {key!r}: expected a JSON file path or one of {known}")
