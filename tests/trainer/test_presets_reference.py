"""Every preset at both references against a record of the reference's files, and the record against the files.

``docs/reference-settings.json`` records, for each setting a preset holds, the file, line, text and value at RAGEN
``3059df8`` (with verl ``797f999``: the paper's runs) and at RAGEN ``5eb79b8`` (verl ``1e47e41``: today's code). It is
written by ``scripts/extract_reference_settings.py`` from the reference's git history, so no number here is typed
twice: the presets are compared with the record, the record with a fresh extraction (where the mirrors exist), and
``docs/presets.md``'s tables with the record.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from ragen_trainer.config import PRESETS, field_names, preset

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "docs" / "reference-settings.json").read_text(encoding="utf-8"))
REFERENCES = ("paper", "latest")

#: Fields the record holds no value for, and why (docs/presets.md, "Not recorded").
NOT_RECORDED: dict[str, str] = {
    "preset": "the preset's name",
    "reference": "the switch itself",
    "env_id": "chosen per run",
    "env_kwargs": "the env's own settings (config/envs.yaml in the reference)",
    "model": "the reference trains Qwen2.5-0.5B-Instruct; ragen's default is the bundled SmolLM2",
    "seed": "the reference seeds resets from seed.train / seed.val",
    "protocol": "per env (ragen_envs ProtocolSettings, docs/fidelity.md); enable_think is recorded",
    "micro_batch_size": "a memory knob (the loss's micro-batch is loss_agg_micro_size)",
    "gradient_checkpointing": "a memory knob (on, as verl)",
    "dtype": "the compute dtype (bfloat16 under the reference's FSDP mixed precision on a GPU)",
    "master_dtype": "the stored dtype: float32, as the reference's FSDP parameters and AdamW state",
    "share_prefixes": "how a micro-batch is laid out (packed), not what is computed",
    "release_freed_memory": "host memory policy (glibc's mmap threshold), not what is computed",
    "old_logprob_pass": "skips a scoring pass whose log-probs equal the update's own (one update per step)",
    "lora_alpha": "unused at rank 0",
    "lora_rank": "full fine-tuning in both (lora.enabled False / lora.rank 0)",
    "lora_target_modules": "unused at rank 0",
    "filter_round": "code, not a value: topk(int(ratio x groups)) in _filter_rollout at both commits",
    "turn_gamma": "bi-level GAE only (not in the paper's code)",
    "turn_lam": "bi-level GAE only (not in the paper's code)",
    "whiten_advantages": "code: masked_whiten in verl's compute_gae_advantage_return at both commits",
    "grpo_norm_by_std": "code: reward_normalization mean_std in ctx_manager at both commits",
    "reward_placement": "use_turn_scores False at both commits (the episode reward on the last token)",
    "group_randomness": "code: es_manager gives a group one seed at both commits",
    "reply_tokens": "code: the cleaned reply re-tokenised (ctx_manager) at both commits",
    "critic": "a separate value model at both commits (value_head is ragen's cheaper option)",
    "value_loss_coef": "the critic has its own optimizer and no weight at both commits",
    "warmup_steps": "verl's lr_warmup_steps_ratio 0 at both commits",
    "lr_scheduler_type": "verl's warmup_style constant at both commits",
    "val_envs": "es_manager.val env_configs tags: per env file (config/_1_bandit.yaml: Bandit + BanditTest), not base",
    "dist_timeout_minutes": "torch's default process-group timeout (30 min) at both commits; ragen's 10 min",
}
#: ragen's own fields (no reference counterpart).
RAGEN_ONLY: frozenset[str] = frozenset({
    "output_dir", "engine", "engine_url", "generation_batch_size", "logging_steps", "report_to", "save_steps",
    "save_total_limit", "resume", "deepspeed", "opponent_pool", "opponent_snapshot_every", "opponent_pool_size",
    "allow_remote_engine",
})


def expected(name: str, reference: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    """field -> (value, source) the record gives preset ``name`` at ``reference``: the entries for every preset, then
    the preset's own (an era without the setting, ``None``, is left out)."""
    out: dict[str, tuple[Any, dict[str, Any]]] = {}
    for own in (False, True):
        for entry in RECORD["settings"]:
            applies = name in entry["presets"] if own else entry["presets"] == "*"
            if not applies:
                continue
            source = entry[reference]
            if source is None:
                out.pop(entry["field"], None)
            else:
                out[entry["field"]] = (source["value"], source)
    return out


def value_of(cfg: Any, key: str) -> Any:
    if key == "protocol.enable_think":
        return cfg.protocol_settings().enable_think
    return getattr(cfg, key)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-12)
    return a == b


@pytest.mark.parametrize("reference", REFERENCES)
@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_matches_the_record(name: str, reference: str) -> None:
    cfg = preset(name, reference)
    problems = []
    for key, (want, source) in expected(name, reference).items():
        got = value_of(cfg, key)
        if not same(got, want):
            problems.append(f"{key}: preset has {got!r}, the reference {want!r} ({source['repo']} {source['commit']} "
                            f"{source['file']}:{source['line']} `{source['text']}`)")
    assert not problems, f"preset {name!r} at reference {reference!r}:\n" + "\n".join(problems)


def test_every_config_field_is_recorded_or_listed() -> None:
    recorded = {e["field"].split(".")[0] for e in RECORD["settings"]}
    names = set(field_names())
    unclassified = names - recorded - set(NOT_RECORDED) - RAGEN_ONLY
    assert not unclassified, f"config fields neither in the record nor listed here: {sorted(unclassified)}"
    stale = (set(NOT_RECORDED) | RAGEN_ONLY) - names
    assert not stale, f"listed names that are not config fields: {sorted(stale)}"


def test_every_recorded_preset_exists() -> None:
    named = {p for e in RECORD["settings"] if e["presets"] != "*" for p in e["presets"]}
    assert named <= set(PRESETS), sorted(named - set(PRESETS))
    assert RECORD["commits"]["paper"]["RAGEN"] == "3059df8" and RECORD["commits"]["latest"]["RAGEN"] == "5eb79b8"


def test_the_references_differ_where_the_paper_runs_did() -> None:
    # the fields whose StarPO-S value the two commits give differently are exactly the config's REFERENCE_BASE
    from ragen_trainer.config import REFERENCE_BASE

    differing = {e["field"] for e in RECORD["settings"] if e["presets"] == "*"
                 and not same(e["paper"]["value"], e["latest"]["value"])}  # fmt: skip
    assert differing == set(REFERENCE_BASE)


def _extractor() -> Any:
    path = ROOT / "scripts" / "extract_reference_settings.py"
    spec = importlib.util.spec_from_file_location("extract_reference_settings", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_docs_tables_are_the_records() -> None:
    tables = _extractor().render_tables(RECORD)
    assert tables in (ROOT / "docs" / "presets.md").read_text(encoding="utf-8"), (
        "docs/presets.md's tables differ from docs/reference-settings.json: run scripts/extract_reference_settings.py"
    )


def test_the_record_is_what_the_reference_files_say() -> None:
    extractor = _extractor()
    if not all((path / "HEAD").exists() or (path / "config").exists() for path in extractor.MIRRORS.values()):
        pytest.skip("the reference mirrors are not on this machine (scripts/extract_reference_settings.py --ragen ...)")
    fresh = json.loads(json.dumps(extractor.extract()))
    assert fresh == RECORD, "docs/reference-settings.json is stale: run scripts/extract_reference_settings.py"
