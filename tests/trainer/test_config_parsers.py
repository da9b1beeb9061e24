"""StarPOConfig through the ecosystem's parsers: transformers' ``HfArgumentParser`` and TRL's ``TrlParser`` (flags,
YAML via ``--config``), and the ``report_to`` backends checked when the config is read."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import fields

import pytest
import yaml

from ragen_trainer import cli
from ragen_trainer.config import REPORTERS, StarPOConfig, field_kinds, load_config

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")


def test_hf_argument_parser_reads_every_kind_of_field():
    parser = transformers.HfArgumentParser(StarPOConfig)
    (cfg,) = parser.parse_args_into_dataclasses([
        "--env_id", "ragen/FrozenLake-v0",
        "--filter_ratio", "0.5",                      # float
        "--group_size", "4",                          # int
        "--adv_estimator", "grpo", "--critic", "none",  # str
        "--report_to", "jsonl", "tensorboard",        # list: separate words
        "--protocol", '{"max_turns": 3}',             # mapping as JSON
        "--env_kwargs", "{size: 6}",                  # mapping as YAML
        "--no_resume",                                # bool with a True default
    ])
    cfg.validate()
    expected = load_config().replace(env_id="ragen/FrozenLake-v0", filter_ratio=0.5, group_size=4,
                                     adv_estimator="grpo", critic="none", report_to=["jsonl", "tensorboard"],
                                     protocol={"max_turns": 3}, env_kwargs={"size": 6}, resume=False).validate()
    assert cfg == expected


def test_hf_argument_parser_defaults_are_the_dataclass_defaults():
    (cfg,) = transformers.HfArgumentParser(StarPOConfig).parse_args_into_dataclasses([])
    assert cfg == StarPOConfig()
    assert cfg.protocol == {} and cfg.env_kwargs == {} and isinstance(cfg.report_to, list)


def test_every_field_has_help_text_and_a_parsed_kind():
    kinds = field_kinds()
    for f in fields(StarPOConfig):
        assert f.metadata.get("help"), f"field {f.name} has no help text"
        assert kinds[f.name] in (bool, int, float, str, list, dict), f.name
    assert kinds["protocol"] is dict and kinds["env_kwargs"] is dict and kinds["report_to"] is list


def test_trl_parser_reads_a_yaml_config_and_flags_win(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"env_id": "ragen/Sokoban-v0", "protocol": {"max_turns": 3}, "seed": 1,
                                    "report_to": ["jsonl"], "filter_ratio": 0.5}))
    (cfg,) = trl.TrlParser(StarPOConfig).parse_args_and_config(["--config", str(path), "--seed", "7"])
    cfg.validate()
    assert (cfg.env_id, cfg.protocol, cfg.report_to, cfg.filter_ratio) == (
        "ragen/Sokoban-v0", {"max_turns": 3}, ["jsonl"], 0.5)
    assert cfg.seed == 7


def test_a_runs_saved_config_round_trips_through_trl_parser(tmp_path):
    """The ``config.yaml`` a run writes (every field) is a TrlParser config that rebuilds the same config."""
    cfg = load_config("grpo").replace(env_id="ragen/FrozenLake-v0", protocol={"max_turns": 2},
                                      env_kwargs={"size": 4}).validate()
    path = tmp_path / "config.yaml"
    cfg.save(path)
    (again,) = trl.TrlParser(StarPOConfig).parse_args_and_config(["--config", str(path)])
    assert again.validate() == cfg


@pytest.mark.parametrize("text", ["[1, 2]", "{unclosed", "3"])
def test_mapping_text_that_is_not_a_mapping_names_the_field(text):
    parser = transformers.HfArgumentParser(StarPOConfig)
    with pytest.raises(ValueError, match=r"invalid config field env_kwargs=.*expected a mapping"):
        parser.parse_args_into_dataclasses(["--env_kwargs", text])


def test_report_to_defaults_to_tensorboard_as_the_readme_says():
    assert "tensorboard" in StarPOConfig().report_to
    assert set(StarPOConfig().report_to) <= set(REPORTERS)


@pytest.mark.parametrize("backend", ["wandb", "tensorboard"])
def test_a_missing_report_to_backend_fails_when_the_config_is_read(monkeypatch, backend):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == backend else real(name, *a))
    cfg = StarPOConfig(report_to=["jsonl", backend])
    with pytest.raises(ValueError, match=rf"report_to=.*needs the {backend} package \(pip install {backend}\)"):
        cfg.validate()
    StarPOConfig(report_to=["jsonl"]).validate()  # leaving it out is fine


@pytest.mark.parametrize("words", [["jsonl", "console"], ["jsonl,console"], ["[jsonl, console]"]])
def test_cli_list_fields_take_words_or_text(capsys, words):
    assert cli.main(["train", "--report_to", *words, "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["report_to"] == ["jsonl", "console"]


def test_cli_reads_a_mapping_given_as_json(capsys):
    assert cli.main(["train", "--env", "ragen/FrozenLake-v0", "--env_kwargs", json.dumps({"size": 4}),
                     "--dry-run"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["env_kwargs"] == {"size": 4}
