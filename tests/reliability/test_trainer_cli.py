"""``ragen-trainer train`` fails early on bad input: every row of the table below exits with status 2, names the field
and what it accepts, prints no traceback, and no model is loaded (``load_model_and_tokenizer`` is replaced by a
function that fails the test).

Then the output-folder rules from the command line: a changed config in a folder that holds a run is refused (exit
2, the differing fields listed) unless ``--resume`` (continue with the new config) or ``--overwrite`` (start over).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragen_trainer import cli

#: Files the table's rows may refer to, created in the test's temporary folder (``{tmp}`` in an argument).
FILES: dict[str, str] = {
    "file.txt": "not a model, not JSON\n",
    "empty_model/README": "a folder without config.json\n",
    "bad_syntax.yaml": "env_groups: [8\n",
    "list.yaml": "- env_groups\n- 8\n",
    "list_for_int.yaml": "group_size: [4]\n",
    "int_env_kwargs.yaml": "env_kwargs: 3\n",
    "bool_for_int.yaml": "total_steps: true\n",
    "null_float.yaml": "filter_ratio: null\n",
    "unknown_key.yaml": "filter_ratoi: 0.5\n",
    "protocol_list.yaml": "protocol: [1, 2]\n",
    "text_float.yaml": "temperature: hot\n",
    "dict_report.yaml": "report_to: {console: true}\n",
    "bad_preset.yaml": "preset: no-such-preset\n",
    # 306 bytes whose aliases expand to 9**9 (387 million) values: it once printed a 624 MB error at 2.2 GB of memory.
    "alias_bomb.yaml": "".join(f"{a}: &{a} [" + ",".join([f"*{p}" if p else "x"] * 9) + "]\n"
                               for p, a in zip(["", *"abcdefgh"], "abcdefghi")),
    # 50,000 levels of nesting: it once ended in a RecursionError traceback.
    "too_deep.yaml": "env_kwargs: " + "[" * 50_000 + "]" * 50_000 + "\n",
}

#: (row id, arguments after ``train``, text the error must contain: the field's name). Every row gets
#: ``--output_dir {tmp}/run`` unless it sets ``--output_dir`` itself.
BAD_INPUTS: list[tuple[str, list[str], str]] = [
    # the env
    ("env-unknown-id", ["--env", "ragen/Nope-v0"], "env_id"),
    ("env-not-ragen", ["--env", "CartPole-v1"], "env_id"),
    ("env-empty", ["--env_id", ""], "env_id"),
    ("env-kwargs-unknown-key", ["--env", "ragen/FrozenLake-v0", "--set", "env_kwargs={nonsense: 1}"], "env_kwargs"),
    ("env-kwargs-bad-value", ["--env", "ragen/FrozenLake-v0", "--set", "env_kwargs={size: -1}"], "env_kwargs"),
    ("env-kwargs-sokoban-room", ["--env", "ragen/Sokoban-v0", "--set", "env_kwargs={dim_room: 5}"], "env_kwargs"),
    ("env-kwargs-bandit-name", ["--set", "env_kwargs={low_risk_name: 3}"], "env_kwargs"),
    ("env-kwargs-list", ["--set", "env_kwargs=[1, 2]"], "env_kwargs"),
    # the model
    ("model-missing-path", ["--model", "{tmp}/no/such/model"], "model"),
    ("model-missing-relative", ["--model", "./no-such-folder"], "model"),
    ("model-is-a-file", ["--model", "{tmp}/file.txt"], "model"),
    ("model-folder-without-config", ["--model", "{tmp}/empty_model"], "model"),
    ("model-hub-id-not-cached", ["--model", "nobody-ragen-test/not-a-cached-model"], "model"),
    ("model-invalid-id", ["--model", "not a valid id!!"], "model"),
    ("model-empty", ["--model", ""], "model"),
    # ranges and types of numbers
    ("seed-negative", ["--seed", "-1"], "seed"),
    ("seed-too-large", ["--seed", "99999999999"], "seed"),
    ("seed-float", ["--seed", "1.5"], "seed"),
    ("total-steps-zero", ["--total_steps", "0"], "total_steps"),
    ("env-groups-negative", ["--env_groups", "-2"], "env_groups"),
    ("group-size-text", ["--group_size", "many"], "group_size"),
    ("group-size-one-grpo", ["--config", "grpo", "--group_size", "1"], "group_size"),
    ("max-new-tokens-over-context", ["--max_new_tokens", "5000"], "max_new_tokens"),
    ("filter-ratio-zero", ["--filter_ratio", "0"], "filter_ratio"),
    ("clip-high-one", ["--clip_high", "1.0"], "clip_high"),
    ("actor-lr-nan", ["--actor_lr", "nan"], "actor_lr"),
    ("actor-lr-negative", ["--actor_lr", "-1e-5"], "actor_lr"),
    ("temperature-zero", ["--temperature", "0"], "temperature"),
    ("val-temperature-negative", ["--val_temperature", "-1"], "val_temperature"),
    ("top-p-over-one", ["--top_p", "1.5"], "top_p"),
    ("gamma-over-one", ["--gamma", "1.5"], "gamma"),
    ("kl-coef-negative", ["--kl_coef", "-0.1"], "kl_coef"),
    ("entropy-coef-inf", ["--entropy_coef", "inf"], "entropy_coef"),
    ("value-clip-negative", ["--value_clip", "-1"], "value_clip"),
    ("weight-decay-negative", ["--weight_decay", "-0.1"], "weight_decay"),
    ("max-grad-norm-zero", ["--max_grad_norm", "0"], "max_grad_norm"),
    ("ppo-epochs-zero", ["--ppo_epochs", "0"], "ppo_epochs"),
    ("micro-batch-zero", ["--micro_batch_size", "0"], "micro_batch_size"),
    ("warmup-negative", ["--warmup_steps", "-1"], "warmup_steps"),
    ("save-steps-negative", ["--save_steps", "-1"], "save_steps"),
    ("save-total-limit-negative", ["--save_total_limit", "-1"], "save_total_limit"),
    ("val-groups-zero", ["--val_groups", "0"], "val_groups"),
    ("logging-steps-zero", ["--logging_steps", "0"], "logging_steps"),
    # names and switches
    ("adv-estimator-unknown", ["--adv_estimator", "reinforce"], "adv_estimator"),
    ("critic-none-with-gae", ["--critic", "none"], "critic"),
    ("filter-mode-unknown", ["--filter_mode", "variance"], "filter_mode"),
    ("kl-estimator-unknown", ["--kl_estimator", "k2"], "kl_estimator"),
    ("loss-agg-unknown", ["--loss_agg_mode", "sum"], "loss_agg_mode"),
    ("scheduler-unknown", ["--lr_scheduler_type", "cosine_with_restarts"], "lr_scheduler_type"),
    ("dtype-unknown", ["--dtype", "int8"], "dtype"),
    ("bool-field-text", ["--gradient_checkpointing", "maybe"], "gradient_checkpointing"),
    ("resume-field-text", ["--resume", "maybe"], "resume"),
    ("report-to-unknown", ["--report_to", "slack"], "report_to"),
    ("engine-vllm-without-url", ["--engine", "vllm"], "engine_url"),
    ("engine-url-bad-scheme", ["--engine", "vllm", "--engine_url", "ftp://127.0.0.1:8000"], "engine_url"),
    # LoRA
    ("lora-rank-negative", ["--lora_rank", "-1"], "lora_rank"),
    ("lora-alpha-zero", ["--lora_rank", "4", "--lora_alpha", "0"], "lora_alpha"),
    ("lora-targets-empty", ["--lora_rank", "4", "--lora_target_modules", ""], "lora_target_modules"),
    ("lora-targets-bad-separator", ["--lora_rank", "4", "--lora_target_modules", "q_proj;v_proj"],
     "lora_target_modules"),
    # files and folders
    ("deepspeed-missing", ["--deepspeed", "{tmp}/no-such-ds.json"], "deepspeed"),
    ("deepspeed-not-json", ["--deepspeed", "{tmp}/file.txt"], "deepspeed"),
    ("output-dir-is-a-file", ["--output_dir", "{tmp}/file.txt"], "output_dir"),
    ("output-dir-empty", ["--output_dir", ""], "output_dir"),
    # the turn protocol
    ("max-turns-zero", ["--max_turns", "0"], "max_turns"),
    ("enable-think-text", ["--enable_think", "maybe"], "enable_think"),
    ("protocol-conflict", ["--max_turns", "2", "--set", "env_kwargs={max_turns: 3}"], "max_turns"),
    # --set, --config and YAML files
    ("set-unknown-field", ["--set", "filter_ratoi=0.5"], "filter_ratio"),
    ("set-without-equals", ["--set", "filter_ratio"], "--set"),
    ("config-unknown-preset", ["--config", "no-such-preset"], "config"),
    ("config-missing-file", ["--config", "{tmp}/missing.yaml"], "config"),
    ("yaml-syntax-error", ["--config", "{tmp}/bad_syntax.yaml"], "config"),
    ("yaml-top-level-list", ["--config", "{tmp}/list.yaml"], "config"),
    ("yaml-list-for-int", ["--config", "{tmp}/list_for_int.yaml"], "group_size"),
    ("yaml-int-for-mapping", ["--config", "{tmp}/int_env_kwargs.yaml"], "env_kwargs"),
    ("yaml-bool-for-int", ["--config", "{tmp}/bool_for_int.yaml"], "total_steps"),
    ("yaml-null-for-float", ["--config", "{tmp}/null_float.yaml"], "filter_ratio"),
    ("yaml-unknown-key", ["--config", "{tmp}/unknown_key.yaml"], "filter_ratio"),
    ("yaml-list-for-protocol", ["--config", "{tmp}/protocol_list.yaml"], "protocol"),
    ("yaml-text-for-float", ["--config", "{tmp}/text_float.yaml"], "temperature"),
    ("yaml-mapping-for-list", ["--config", "{tmp}/dict_report.yaml"], "report_to"),
    ("yaml-unknown-preset", ["--config", "{tmp}/bad_preset.yaml"], "preset"),
    ("yaml-alias-bomb", ["--config", "{tmp}/alias_bomb.yaml"], "aliases"),
    ("yaml-nested-too-deep", ["--config", "{tmp}/too_deep.yaml"], "nested deeper than 64"),
    ("yaml-not-a-regular-file", ["--config", "/dev/zero"], "config"),
    ("set-alias-bomb", ["--set", ("env_kwargs={a: &a [1,1,1,1,1,1,1,1,1,1], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                                  "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], d: [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]}")],
     "aliases"),
    # the command line itself
    ("resume-and-overwrite", ["--resume", "--overwrite"], "--overwrite"),
    ("unknown-flag", ["--nonsense", "1"], "unrecognized arguments"),
]

try:  # float16 training needs a GPU; on a CPU-only machine it is a bad input
    import torch

    if not torch.cuda.is_available():
        BAD_INPUTS.append(("dtype-float16-on-cpu", ["--dtype", "float16"], "dtype"))
except ImportError:  # pragma: no cover
    pass


def make_files(tmp: Path) -> None:
    for name, text in FILES.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def expand(argv: list[str], tmp: Path) -> list[str]:
    out = [a.replace("{tmp}", str(tmp)) for a in argv]
    if "--output_dir" not in out:
        out += ["--output_dir", str(tmp / "run")]
    return out


def run_cli(argv: list[str]) -> int:
    """``cli.main`` with argparse's own exits turned into return codes."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


class ModelLoaded(AssertionError):
    pass


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny random model + tokenizer (tests/trainer/conftest.py's builders; never the real SmolLM2)."""
    pytest.importorskip("torch")
    from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test."""
    import ragen_trainer.models

    def boom(*args, **kwargs):
        raise ModelLoaded("a model was loaded for a bad input")

    monkeypatch.setattr(ragen_trainer.models, "load_model_and_tokenizer", boom)
    monkeypatch.setattr(ragen_trainer.models, "convert_default_model", boom)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub-id row must not try the network


def test_the_table_is_large_enough():
    assert len(BAD_INPUTS) >= 30
    assert len({row[0] for row in BAD_INPUTS}) == len(BAD_INPUTS)


@pytest.mark.parametrize("row_id,argv,needle", BAD_INPUTS, ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_exits_2_before_any_model_loads(tmp_path, capsys, no_model_load, row_id, argv, needle):
    make_files(tmp_path)
    rc = run_cli(["train", *expand(argv, tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2, f"{row_id}: exit status {rc}\n{err[-2000:]}"
    assert needle in err, f"{row_id}: the message does not name {needle!r}:\n{err}"
    assert "error" in err and "Traceback" not in err, err
    assert len(err) < 20_000, f"{row_id}: a {len(err):,}-character error message"
    if row_id.startswith("model-hub"):
        assert "cache" in err  # says that hub ids must be in the local Hugging Face cache


def test_good_input_passes_the_checks_dry_run(tmp_path, capsys, no_model_load):
    """The checks do not refuse good configs: the quick CPU config and a few flags pass (dry run loads nothing)."""
    rc = run_cli(["train", "--config", "configs/quick/bandit-smollm2-cpu.yaml", "--seed", "3",
                  "--env", "ragen/FrozenLake-v0", "--set", "env_kwargs={size: 4}", "--output_dir",
                  str(tmp_path / "run"), "--dry-run"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "seed: 3" in out.out


def test_preflight_model_checks_accept_local_folders_and_the_bundled_model(tmp_path, tiny_model_dir):
    from ragen_trainer.cli import check_model_source

    check_model_source("smollm2")  # the bundled GGUF (no conversion, no load)
    check_model_source(str(tiny_model_dir))
    with pytest.raises(ValueError, match="model"):
        check_model_source(str(tmp_path / "nope"))


# ------------------------------------------------------------------------------------ the output folder rules
def _train_args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--config", "starpo-s-grpo", "--env", "ragen/Bandit-v0", "--model", str(model_dir),
        "--output_dir", str(out), "--total_steps", "1", "--env_groups", "2", "--group_size", "2",
        "--max_new_tokens", "4", "--max_context_tokens", "1024", "--max_turns", "1", "--val_every", "0",
        "--save_steps", "1", "--report_to", "jsonl", "--set", "actor_lr=1e-4", *extra,
    ]


def _steps(path: Path) -> list[int]:
    from ragen_trainer.monitor import read_metrics

    return [int(r["step"]) for r in read_metrics(path)]


def test_changed_config_is_refused_then_resume_or_overwrite(tmp_path, tiny_model_dir, capsys, monkeypatch):
    pytest.importorskip("trl")
    out = tmp_path / "run"
    assert run_cli(_train_args(tiny_model_dir, out)) == 0
    assert (out / "checkpoint-1").is_dir() and _steps(out / "metrics.jsonl") == [1]
    capsys.readouterr()

    # A changed config is refused, naming the differing fields; nothing in the folder changes and no model loads.
    import ragen_trainer.models

    real_load = ragen_trainer.models.load_model_and_tokenizer

    def boom(*args, **kwargs):
        raise ModelLoaded("a model was loaded for a refused run")

    monkeypatch.setattr(ragen_trainer.models, "load_model_and_tokenizer", boom)
    before = sorted(p.name for p in out.iterdir())
    rc = run_cli(_train_args(tiny_model_dir, out, "--clip_high", "0.25", "--seed", "4", "--total_steps", "2"))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "clip_high" in err and "seed" in err and "total_steps" not in err.split("--resume")[0], err
    assert "--resume" in err and "--overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == before
    monkeypatch.setattr(ragen_trainer.models, "load_model_and_tokenizer", real_load)

    # The same config with more steps continues the run (total_steps may change without --resume).
    assert run_cli(_train_args(tiny_model_dir, out, "--total_steps", "2")) == 0
    assert _steps(out / "metrics.jsonl") == [1, 2]

    # --resume: continue with the changed config.
    assert run_cli(_train_args(tiny_model_dir, out, "--clip_high", "0.25", "--total_steps", "3", "--resume")) == 0
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]
    assert json.loads((out / "summary.json").read_text())["steps"] == 3
    # ... and from then on the new config is the folder's config: a plain rerun with it is not refused.
    assert run_cli(_train_args(tiny_model_dir, out, "--clip_high", "0.25", "--total_steps", "3")) == 0
    capsys.readouterr()

    # --overwrite: the old run's checkpoints and metrics go, the new run starts at step 1.
    (out / "my-notes.txt").write_text("kept\n")
    assert run_cli(_train_args(tiny_model_dir, out, "--seed", "4", "--overwrite")) == 0
    assert _steps(out / "metrics.jsonl") == [1]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert (out / "my-notes.txt").read_text() == "kept\n"  # files that are not the run's are left alone
    from ragen_trainer.checkpoints.layout import read_checkpoint_info

    assert read_checkpoint_info(out / "checkpoint-1")["config"]["seed"] == 4


def test_resume_false_starts_over_like_overwrite(tmp_path, tiny_model_dir, capsys, caplog):
    """``resume: false`` (in a YAML file, or --resume false) means start over: the old run is removed first, so the
    folder never mixes two runs' checkpoints and metrics."""
    pytest.importorskip("trl")
    out = tmp_path / "run"
    assert run_cli(_train_args(tiny_model_dir, out, "--total_steps", "2")) == 0
    assert _steps(out / "metrics.jsonl") == [1, 2]
    assert run_cli(_train_args(tiny_model_dir, out, "--resume", "false", "--seed", "9")) == 0
    assert _steps(out / "metrics.jsonl") == [1]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert "starting over" in caplog.text


def test_dry_run_never_touches_the_output_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", "--output_dir", str(out), "--dry-run"]) == 0
    assert not out.exists()
