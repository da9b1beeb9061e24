"""Every preset's fields against the reference code's effective values, and docs/presets.md against both.

The reference is RAGEN (RAGEN-AI/RAGEN at 5eb79b8: ``config/*.yaml``, ``train_all.sh``, ``train.py``, ``ragen/...``)
with its verl submodule at 1e47e412 (paths starting with ``verl/``). :data:`REFERENCE` holds, per preset, each
compared field's *effective* reference value and where it comes from; :data:`RAGEN_DEVIATIONS` the few fields where a
ragen preset deliberately differs. ``docs/presets.md`` holds the same tables; the doc tests parse its Markdown, so the
doc, this file and ``ragen_trainer.config`` cannot drift apart.
"""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

import pytest

from ragen_trainer.config import PRESETS, StarPOConfig, field_names, preset

DOC = Path(__file__).resolve().parents[2] / "docs" / "presets.md"

Entry = tuple[Any, str]  # (effective reference value, where it comes from)

_BASE = "`config/base.yaml`"
_VERL = "`verl/trainer/config/ppo_trainer.yaml`"
_CTX = "`ragen/llm_agent/ctx_manager.py`"

#: StarPO-S: RAGEN's ``config/base.yaml`` over verl's ``ppo_trainer.yaml``, no overrides (``python train.py
#: --config-name _2_sokoban``; ``_1_bandit`` / ``_3_frozen_lake`` change only env settings, see the doc).
STARPO_S: dict[str, Entry] = {
    "env_groups": (8, f"{_BASE} `es_manager.train.env_groups`"),
    "group_size": (16, f"{_BASE} `es_manager.train.group_size`"),
    "filter_ratio": (0.25, f"{_BASE} `actor_rollout_ref.rollout.rollout_filter_ratio`"),
    "filter_mode": ("std", f"{_BASE} `actor_rollout_ref.rollout.rollout_filter_type`"),
    "filter_round": ("floor", ("`ragen/trainer/agent_trainer.py` `_filter_rollout`: "
                              "`topk(int(rollout_filter_ratio * num_groups))`")),
    "adv_estimator": ("gae", f"{_BASE} `algorithm.adv_estimator` (`algorithm.bi_level_gae: False`)"),
    "gamma": (1.0, f"{_BASE} `algorithm.gamma`"),
    "lam": (1.0, f"{_BASE} `algorithm.lam`"),
    "turn_gamma": (0.95, f"{_BASE} `algorithm.high_level_gamma` (used only with `bi_level_gae`)"),
    "turn_lam": (1.0, (f"{_BASE} `algorithm.lam` (bi-level GAE uses one lam for both levels: "
                      "`ragen/trainer/core_algos.py` `compute_bi_level_gae_advantage_return`)")),
    "whiten_advantages": (True, ("`verl/trainer/ppo/core_algos.py` `compute_gae_advantage_return`: `masked_whiten` "
                                "(always on, no key)")),
    "grpo_norm_by_std": (True, f"{_VERL} `algorithm.norm_adv_by_std_in_grpo` (unused with gae)"),
    "reward_placement": ("trajectory", (f"{_BASE} `agent_proxy.use_turn_scores: False` (turn rewards summed onto "
                                       "the last token)")),
    "group_randomness": ("shared", ("`ragen/llm_agent/es_manager.py` `reset`: `_expand_seed` gives all envs of a "
                                   "group one seed")),
    "reply_tokens": ("cleaned", (f"{_CTX} `_parse_response` and `get_lm_inputs` (the cleaned reply, re-tokenised "
                                "with the chat template)")),
    "clip_low": (0.2, f"{_BASE} `actor_rollout_ref.actor.clip_ratio_low`"),
    "clip_high": (0.28, f"{_BASE} `actor_rollout_ref.actor.clip_ratio_high`"),
    "clip_ratio_c": (3.0, f"{_VERL} `actor_rollout_ref.actor.clip_ratio_c`"),
    "kl_coef": (0.0, f"{_BASE} `actor_rollout_ref.actor.use_kl_loss: False` (`kl_loss_coef: 0.000`)"),
    "kl_reward_coef": (0.0, (f"{_VERL} `algorithm.use_kl_in_reward: False` (so `algorithm.kl_ctrl.kl_coef` is "
                            "unused; base.yaml sets it to 0.000)")),
    "kl_estimator": ("k1", (f"{_BASE} `actor_rollout_ref.actor.kl_loss_type: kl` and `algorithm.kl_penalty: kl` "
                           "(verl's default `low_var_kl` is k3)")),
    "entropy_coef": (0.001, f"{_BASE} `actor_rollout_ref.actor.entropy_coeff`"),
    "loss_agg_mode": ("seq-mean-token-mean", (f"{_VERL} `actor_rollout_ref.actor.loss_agg_mode: token-mean` over "
                                             f"micro-batches of one sequence ({_BASE} `micro_batch_size_per_gpu: 1`), "
                                             "each divided by `gradient_accumulation` "
                                             "(`ragen/workers/actor/dp_actor.py` `update_policy`)")),
    "ppo_mini_batch_size": (32, (f"{_BASE} `ppo_mini_batch_size` (`actor_rollout_ref.actor.ppo_mini_batch_size` "
                                "and `critic.ppo_mini_batch_size`)")),
    "ppo_epochs": (1, f"{_VERL} `actor_rollout_ref.actor.ppo_epochs` (`critic.ppo_epochs` follows it)"),
    "critic": ("value_model", ("`ragen/workers/fsdp_workers.py` `CriticWorker._build_critic_model_optimizer`: "
                              f"`AutoModelForTokenClassification` from {_BASE} `critic.model.path: ${{model_path}}`")),
    "value_clip": (0.5, f"{_VERL} `critic.cliprange_value`"),
    "value_loss_coef": (1.0, ("`verl/trainer/ppo/core_algos.py` `compute_value_loss`: `0.5 * masked_mean(max(...))` "
                             "with no coefficient (the critic has its own optimizer)")),
    "critic_max_grad_norm": (1.0, f"{_VERL} `critic.grad_clip`"),
    "max_grad_norm": (1.0, f"{_VERL} `actor_rollout_ref.actor.grad_clip`"),
    "actor_lr": (1e-6, f"{_VERL} `actor_rollout_ref.actor.optim.lr`"),
    "critic_lr": (1e-5, f"{_VERL} `critic.optim.lr`"),
    "weight_decay": (0.01, f"{_VERL} `actor_rollout_ref.actor.optim.weight_decay` and `critic.optim.weight_decay`"),
    "warmup_steps": (0, (f"{_VERL} `actor_rollout_ref.actor.optim.lr_warmup_steps: -1`, so "
                        "`lr_warmup_steps_ratio: 0.` (the critic likewise)")),
    "lr_scheduler_type": ("constant", (f"{_VERL} `actor_rollout_ref.actor.optim.warmup_style` and "
                                      "`critic.optim.warmup_style`")),
    "total_steps": (200, f"{_BASE} `trainer.total_training_steps`"),
    "val_every": (10, f"{_BASE} `trainer.test_freq`"),
    "val_groups": (256, f"{_BASE} `es_manager.val.env_groups` (with `es_manager.val.group_size: 1`)"),
    "val_temperature": (0.5, f"{_BASE} `actor_rollout_ref.rollout.val_kwargs.temperature`"),
    "temperature": (1.0, f"{_BASE} `actor_rollout_ref.rollout.temperature`"),
    "top_p": (1.0, f"{_VERL} `actor_rollout_ref.rollout.top_p`"),
    "max_new_tokens": (400, f"{_BASE} `actor_rollout_ref.rollout.response_length`"),
    "max_context_tokens": (3600, f"{_BASE} `actor_rollout_ref.rollout.max_model_len`"),
    "lora_rank": (0, f"{_BASE} `lora.rank`"),
    "lora_target_modules": ("all-linear", f"{_BASE} `lora.target_modules`"),
    "protocol.enable_think": (True, f"{_BASE} `agent_proxy.enable_think`"),
}

#: ``$USE_PPO $USE_BASE`` of ``train_all.sh`` (vanilla StarPO, PPO backbone).
VANILLA_PPO: dict[str, Entry] = {
    **STARPO_S,
    "filter_ratio": (1.0, "`train_all.sh` `USE_BASE`: `actor_rollout_ref.rollout.rollout_filter_ratio=1`"),
    "adv_estimator": ("gae", "`train_all.sh` `USE_PPO`: `algorithm.adv_estimator=gae`"),
    "clip_high": (0.2, "`train_all.sh` `USE_BASE`: `actor_rollout_ref.actor.clip_ratio_high=0.2`"),
    "kl_coef": (0.0, (f"{_BASE} `actor_rollout_ref.actor.use_kl_loss: False`; `USE_PPO` leaves it off, so "
                     "`USE_BASE`'s `actor_rollout_ref.actor.kl_loss_coef=0.001` is unused")),
    "kl_reward_coef": (0.0, (f"{_VERL} `algorithm.use_kl_in_reward: False`, so `USE_BASE`'s "
                            "`algorithm.kl_ctrl.kl_coef=0.001` is unused")),
}

_CRITIC_NONE: Entry = ("none", ("`verl/trainer/ppo/ray_trainer.py` `RayPPOTrainer.__init__`: `use_critic = False` "
                               "for grpo"))
_WHITEN_GRPO: Entry = (True, ("unused with grpo (GAE only: `verl/trainer/ppo/core_algos.py` "
                             "`compute_gae_advantage_return`); the reference's GRPO advantages are not whitened"))

#: ``$USE_GRPO $USE_BASE`` of ``train_all.sh`` (vanilla StarPO, GRPO backbone).
VANILLA_GRPO: dict[str, Entry] = {
    **VANILLA_PPO,
    "adv_estimator": ("grpo", "`train_all.sh` `USE_GRPO`: `algorithm.adv_estimator=grpo`"),
    "critic": _CRITIC_NONE,
    "kl_coef": (0.001, ("`train_all.sh` `USE_GRPO`: `actor_rollout_ref.actor.use_kl_loss=True` with `USE_BASE`: "
                       "`actor_rollout_ref.actor.kl_loss_coef=0.001`")),
    "grpo_norm_by_std": (True, ("`train_all.sh` `USE_GRPO`: `agent_proxy.reward_normalization.method=mean_std` "
                               f"({_CTX} `_normalize_score_tensor`)")),
    "whiten_advantages": _WHITEN_GRPO,
}

#: ``train_all.sh``'s ``sokoban-s-grpo`` run: StarPO-S with the GRPO backbone.
STARPO_S_GRPO: dict[str, Entry] = {
    **STARPO_S,
    "adv_estimator": ("grpo", "`train_all.sh` `sokoban-s-grpo`: `algorithm.adv_estimator=grpo`"),
    "critic": _CRITIC_NONE,
    "grpo_norm_by_std": (True, ("`train_all.sh` `sokoban-s-grpo`: `agent_proxy.reward_normalization.method=mean_std` "
                               f"({_CTX} `_normalize_score_tensor`)")),
    "whiten_advantages": _WHITEN_GRPO,
}

#: preset -> field -> (effective reference value, source). Fields not listed here are in RAGEN_ONLY or NOT_COMPARED.
REFERENCE: dict[str, dict[str, Entry]] = {
    "starpo-s": STARPO_S,
    "starpo": VANILLA_PPO,
    "ppo": VANILLA_PPO,
    "grpo": VANILLA_GRPO,
    "starpo-s-grpo": STARPO_S_GRPO,
    "starpo-s-std-rev": {
        **STARPO_S,
        "filter_mode": ("std_rev", ("override `actor_rollout_ref.rollout.rollout_filter_type=std_rev` "
                                   "(`ragen/trainer/agent_trainer.py` `_filter_rollout`; no `train_all.sh` command)")),
    },
    "starpo-s-bilevel": {
        **STARPO_S,
        "adv_estimator": ("bilevel_gae", ("`train_all.sh` bi-level command: `algorithm.bi_level_gae=True` "
                                         "(with `algorithm.adv_estimator: gae`)")),
        "turn_gamma": (0.95, "`train_all.sh` bi-level command: `algorithm.high_level_gamma=0.95`"),
        "reward_placement": ("trajectory", ("`train.py` `add_dependency_and_validate_config` asserts "
                                           "`use_turn_scores` is False with `bi_level_gae` (the bi-level command's "
                                           "`agent_proxy.use_turn_scores=True` fails it)")),
    },
    "starpo-s-no-think": {
        **STARPO_S,
        "protocol.enable_think": (False, ("`train_all.sh` Section 5.1 `*-nothink` runs: "
                                         "`agent_proxy.enable_think=False`")),
    },
    "starpo-s-no-clip-higher": {
        **STARPO_S,
        "clip_high": (0.2, (f"override `actor_rollout_ref.actor.clip_ratio_high=0.2` on {_BASE} (no `train_all.sh` "
                           "command keeps the filter with it)")),
    },
    "starpo-s-kl": {
        **STARPO_S,
        "kl_coef": (0.001, ("override `actor_rollout_ref.actor.use_kl_loss=True` "
                           "`actor_rollout_ref.actor.kl_loss_coef=0.001` (no `train_all.sh` command)")),
    },
    "starpo-s-value-head": STARPO_S,
}

#: preset -> field -> (ragen's value, why it differs from the reference). The doc's ragen column shows these.
RAGEN_DEVIATIONS: dict[str, dict[str, tuple[Any, str]]] = {
    "starpo-s-value-head": {
        "critic": ("value_head", ("ragen's cheaper critic (a linear head on the policy's last hidden state); the "
                                 "reference always trains a separate value model")),
    },
}

#: Config fields with no counterpart in the reference.
RAGEN_ONLY: frozenset[str] = frozenset({
    "output_dir", "engine", "engine_url", "generation_batch_size", "logging_steps", "report_to", "save_steps",
    "save_total_limit", "resume", "deepspeed", "opponent_pool", "opponent_snapshot_every", "opponent_pool_size",
})

#: Config fields whose reference counterpart differs by design (the doc says why); not compared per preset.
NOT_COMPARED: frozenset[str] = frozenset({
    "env_id", "env_kwargs", "model", "seed", "protocol", "micro_batch_size", "gradient_checkpointing", "dtype",
    "master_dtype", "share_prefixes", "old_logprob_pass",
    "lora_alpha",
})

PRESET_NAMES = list(REFERENCE)


def expected_ragen(name: str, key: str) -> Any:
    """The value ragen's preset should hold: the reference's, unless a deviation is documented."""
    deviation = RAGEN_DEVIATIONS.get(name, {}).get(key)
    return deviation[0] if deviation is not None else REFERENCE[name][key][0]


@functools.cache
def _config(name: str) -> StarPOConfig:
    return preset(name)


def ragen_value(cfg: StarPOConfig, key: str) -> Any:
    if key == "protocol.enable_think":
        return cfg.protocol_settings().enable_think
    if not hasattr(cfg, key):
        pytest.fail(f"StarPOConfig has no field {key!r}")
    return getattr(cfg, key)


def same(a: Any, b: Any) -> bool:
    """Equal values; a bool equals only a bool, numbers compare as floats (1 == 1.0)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return a == b


def render(value: Any) -> str:
    """How a value is written in docs/presets.md (``parse_cell`` reads it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e6:
            return f"{value:.1f}"
        return re.sub(r"e([+-])0*(\d)", r"e\1\2", repr(value))
    return str(value)


def parse_cell(text: str) -> Any:
    text = text.strip().strip("`").strip()
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


# ------------------------------------------------------------------------------------------------- the presets
def test_every_preset_has_a_reference_table() -> None:
    assert set(REFERENCE) == set(PRESETS), (
        f"presets without a reference table: {sorted(set(PRESETS) - set(REFERENCE))}; "
        f"tables without a preset: {sorted(set(REFERENCE) - set(PRESETS))}"
    )


def test_every_field_is_classified() -> None:
    compared = {key.split(".")[0] for table in REFERENCE.values() for key in table}
    names = set(field_names())
    unclassified = names - compared - RAGEN_ONLY - NOT_COMPARED
    assert not unclassified, f"config fields neither compared nor listed as ragen-only / not compared: {unclassified}"
    assert not (compared & RAGEN_ONLY), f"fields both compared and ragen-only: {compared & RAGEN_ONLY}"
    stale = (RAGEN_ONLY | NOT_COMPARED) - names
    assert not stale, f"ragen-only / not-compared names that are not config fields: {sorted(stale)}"


def test_sources_fit_in_a_markdown_table() -> None:
    for name, table in REFERENCE.items():
        for key, (_, source) in table.items():
            assert "|" not in source and "\n" not in source, (name, key)


@pytest.mark.parametrize(
    ("name", "key"),
    [pytest.param(name, key, id=f"{name}:{key}") for name, table in REFERENCE.items() for key in table],
)
def test_preset_field_matches_reference(name: str, key: str) -> None:
    if name not in PRESETS:
        pytest.fail(f"preset {name!r} is not in ragen_trainer.config.PRESETS")
    reference, source = REFERENCE[name][key]
    want = expected_ragen(name, key)
    got = ragen_value(_config(name), key)
    why = RAGEN_DEVIATIONS.get(name, {}).get(key)
    detail = f"documented deviation: {why[1]}" if why else f"reference: {render(reference)} from {source}"
    assert same(got, want), f"preset {name!r} field {key!r}: ragen has {got!r}, expected {want!r} ({detail})"


# ------------------------------------------------------------------------------------------------- the document
_PRESET_HEADING = re.compile(r"^#{2,4} `([a-z0-9-]+)`")
_HEADER = ["field", "ragen", "reference", "from"]


def _doc_lines() -> list[str]:
    return DOC.read_text(encoding="utf-8").splitlines()


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def doc_tables() -> dict[str, dict[str, tuple[str, str, str]]]:
    """preset -> field -> (ragen cell, reference cell, from cell): the first 4-column table under each preset
    heading (``## `name` ``)."""
    tables: dict[str, dict[str, tuple[str, str, str]]] = {}
    current: str | None = None
    in_table = False
    for line in _doc_lines():
        heading = _PRESET_HEADING.match(line)
        if heading:
            current, in_table = heading.group(1), False
            continue
        if line.startswith("#"):
            current, in_table = None, False
            continue
        if current is None or not line.strip().startswith("|"):
            if in_table:  # the table ended: later tables under the same heading are not the preset's
                current, in_table = None, False
            continue
        cells = _cells(line)
        if [c.lower() for c in cells] == _HEADER:
            assert current not in tables, f"docs/presets.md has two tables for preset {current!r}"
            tables[current] = {}
            in_table = True
            continue
        if not in_table or set("".join(cells)) <= set("-: "):
            continue
        assert len(cells) == 4, f"docs/presets.md, preset {current!r}: a row without 4 cells: {line!r}"
        key = cells[0].strip("`")
        assert key not in tables[current], f"docs/presets.md, preset {current!r}: field {key!r} twice"
        tables[current][key] = (cells[1], cells[2], cells[3])
    return tables


def doc_field_list(heading: str) -> set[str]:
    """The `field` names of the bullet list under the section whose heading starts with ``heading``."""
    out: set[str] = set()
    inside = False
    for line in _doc_lines():
        if line.startswith("#"):
            inside = line.lstrip("#").strip().lower().startswith(heading.lower())
            continue
        bullet = re.match(r"^\s*[-*] `([a-z_.]+)`", line)
        if inside and bullet:
            out.add(bullet.group(1))
    return out


def test_doc_has_a_table_per_preset() -> None:
    tables = doc_tables()
    assert set(tables) == set(REFERENCE), (
        f"docs/presets.md lacks tables for {sorted(set(REFERENCE) - set(tables))}, "
        f"has tables for unknown presets {sorted(set(tables) - set(REFERENCE))}"
    )


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_doc_table_matches(name: str) -> None:
    table = doc_tables().get(name)
    assert table is not None, f"docs/presets.md has no table for preset {name!r}"
    expected = REFERENCE[name]
    assert set(table) == set(expected), (
        f"preset {name!r}: fields only in the doc {sorted(set(table) - set(expected))}, "
        f"only in the test {sorted(set(expected) - set(table))}"
    )
    problems = []
    for key, (reference, source) in expected.items():
        ragen_cell, reference_cell, from_cell = table[key]
        if not same(parse_cell(ragen_cell), expected_ragen(name, key)):
            problems.append(f"{key}: ragen cell {ragen_cell!r}, expected {render(expected_ragen(name, key))!r}")
        if not same(parse_cell(reference_cell), reference):
            problems.append(f"{key}: reference cell {reference_cell!r}, expected {render(reference)!r}")
        if from_cell != source:
            problems.append(f"{key}: from cell {from_cell!r}, expected {source!r}")
    assert not problems, f"docs/presets.md, preset {name!r}:\n" + "\n".join(problems)


@pytest.mark.parametrize(("heading", "names"), [("ragen only", RAGEN_ONLY), ("not compared", NOT_COMPARED)])
def test_doc_lists_uncompared_fields(heading: str, names: frozenset[str]) -> None:
    listed = doc_field_list(heading)
    assert listed == set(names), (
        f"docs/presets.md section {heading!r}: listed but not in the test {sorted(listed - names)}, "
        f"in the test but not listed {sorted(names - listed)}"
    )
