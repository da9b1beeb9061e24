"""The reply-format warm-up: reference agents' chats, the mask over their replies, a fine-tune that learns them, its
folder (keyed by every setting, written whole with its record last, a damaged record named) and its command (every bad
value a message before any model loads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer import warmup
from ragen_trainer.config import StarPOConfig
from ragen_trainer.models import activation_checkpointing_on
from ragen_trainer.rollout import ChatTokens
from ragen_trainer.warmup import reference_chats, supervised_warmup, tokenize_chat, warmup_model
from tests.trainer.conftest import build_tiny_model


def _kwargs(env_id: str, **protocol):
    return StarPOConfig(env_id=env_id, protocol=protocol).env_make_kwargs()


def test_reference_chats_are_well_formed_episodes_without_the_final_state():
    chats = reference_chats("ragen/Sokoban-v0", _kwargs("ragen/Sokoban-v0", enable_think=False), episodes=3)
    assert len(chats) == 3
    for chat in chats:
        assert chat[0]["role"] == "system" and chat[-1]["role"] == "assistant"
        replies = [m["content"] for m in chat if m["role"] == "assistant"]
        assert replies and all(r.startswith("<answer>") and r.endswith("</answer>") for r in replies)
    again = reference_chats("ragen/Sokoban-v0", _kwargs("ragen/Sokoban-v0", enable_think=False), episodes=3)
    assert again == chats  # seeded: the same episodes every time
    with pytest.raises(ValueError, match="agent"):
        reference_chats("ragen/Bandit-v0", _kwargs("ragen/Bandit-v0"), episodes=1, agent="oracle")


def test_the_mixed_agents_chats_have_one_thinking_sentence_and_oracle_actions_in_part():
    """The ``mixed`` warm-up's teacher: one thinking sentence on every turn, and between the random agent's actions
    and the oracle's (on FrozenLake, a share of 0 plays no oracle turn and a share of 1 no random one)."""
    kwargs = _kwargs("ragen/FrozenLake-v0")
    chats = reference_chats("ragen/FrozenLake-v0", kwargs, episodes=6, agent="mixed", oracle_share=0.5)
    replies = [m["content"] for chat in chats for m in chat if m["role"] == "assistant"]
    assert replies and all(r.startswith("<think>I choose my next actions.</think><answer>") for r in replies)
    assert chats == reference_chats("ragen/FrozenLake-v0", kwargs, episodes=6, agent="mixed", oracle_share=0.5)
    assert chats != reference_chats("ragen/FrozenLake-v0", kwargs, episodes=6, agent="mixed", oracle_share=0.9)
    random_record = warmup.warmup_settings("m", "ragen/FrozenLake-v0", kwargs, agent="random")
    assert "oracle_share" not in random_record  # the random warm-ups' cached folders keep their records
    assert warmup.warmup_settings("m", "ragen/FrozenLake-v0", kwargs, agent="mixed", oracle_share=0.25)[
        "oracle_share"] == 0.25
    with pytest.raises(ValueError, match="oracle_share"):
        reference_chats("ragen/FrozenLake-v0", kwargs, episodes=1, agent="mixed", oracle_share=2.0)


def test_the_mixed_agents_state_thinking_names_the_state_and_is_recorded_only_when_chosen():
    """``think="state"``: each reply's thinking names the player's and the goal's cells (the same actions as the fixed
    sentence's chats: only the thinking differs); the record holds ``think`` only when it is not the default, so the
    earlier mixed warm-ups' cached folders keep their records."""
    kwargs = _kwargs("ragen/FrozenLake-v0")
    fixed = reference_chats("ragen/FrozenLake-v0", kwargs, episodes=4, agent="mixed")
    state = reference_chats("ragen/FrozenLake-v0", kwargs, episodes=4, agent="mixed", think="state")
    replies = [m["content"] for chat in state for m in chat if m["role"] == "assistant"]
    assert replies and all(r.startswith("<think>I am at (") and ", the goal at (" in r for r in replies)
    assert [r.split("<answer>")[1] for r in replies] == [
        m["content"].split("<answer>")[1] for chat in fixed for m in chat if m["role"] == "assistant"]
    assert "think" not in warmup.warmup_settings("m", "ragen/FrozenLake-v0", kwargs, agent="mixed")
    assert warmup.warmup_settings("m", "ragen/FrozenLake-v0", kwargs, agent="mixed", think="state")["think"] == "state"
    with pytest.raises(ValueError, match="think"):
        warmup.check_warmup_args(agent="random", episodes=1, epochs=1, lr=1e-4, batch_size=1, seed=0, think="state")


def test_the_mask_covers_each_reply_and_its_end_of_turn_token(tiny_tokenizer):
    chat = ChatTokens(tiny_tokenizer)
    messages = reference_chats("ragen/Bandit-v0", _kwargs("ragen/Bandit-v0"), episodes=1)[0]
    ids, mask = tokenize_chat(chat, messages)
    trained = tiny_tokenizer.decode([t for t, m in zip(ids, mask) if m])
    reply = messages[-1]["content"]
    assert trained == reply + "<|im_end|>"
    assert tiny_tokenizer.decode(ids) == tiny_tokenizer.apply_chat_template(messages, tokenize=False)


def test_supervised_warmup_learns_the_replies(tiny_tokenizer):
    torch.manual_seed(0)
    model = build_tiny_model(tiny_tokenizer)
    chats = reference_chats("ragen/Bandit-v0", _kwargs("ragen/Bandit-v0", enable_think=False), episodes=8)
    losses = supervised_warmup(model, tiny_tokenizer, chats, epochs=4, lr=3e-3, progress=False)
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.5 and losses == sorted(losses, reverse=True)
    with pytest.raises(ValueError, match="epochs"):
        supervised_warmup(model, tiny_tokenizer, chats, epochs=0)


def test_warmup_model_saves_and_reuses_its_folder(tiny_model_dir, tmp_path):
    kwargs = _kwargs("ragen/Bandit-v0", enable_think=False)
    out = warmup_model(str(tiny_model_dir), "ragen/Bandit-v0", kwargs, tmp_path / "w", episodes=2, epochs=1,
                       progress=False)  # fmt: skip
    record = json.loads((out / "ragen_warmup.json").read_text())
    assert record["settings"]["agent"] == "random" and record["chats"] == 2
    stamp = (out / "ragen_warmup.json").stat().st_mtime_ns
    assert warmup_model(str(tiny_model_dir), "ragen/Bandit-v0", kwargs, tmp_path / "w", episodes=2, epochs=1,
                        progress=False) == out  # fmt: skip
    assert (out / "ragen_warmup.json").stat().st_mtime_ns == stamp  # reused, not trained again


def test_the_warmup_loss_is_the_labels_cross_entropy_and_checkpointing_changes_nothing(tiny_tokenizer):
    """The loss through the trained positions only (chunked LM head) is what ``labels`` gives with full logits, and
    activation checkpointing trains the same weights."""
    chats = reference_chats("ragen/Sokoban-v0", _kwargs("ragen/Sokoban-v0", enable_think=False), episodes=3)
    chat = ChatTokens(tiny_tokenizer)
    rows = [tokenize_chat(chat, messages) for messages in chats]
    width = max(len(ids) for ids, _ in rows)
    pad = tiny_tokenizer.pad_token_id if tiny_tokenizer.pad_token_id is not None else tiny_tokenizer.eos_token_id
    ids = torch.tensor([row + [pad] * (width - len(row)) for row, _ in rows])
    attn = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row, _ in rows])
    labels = torch.tensor([[t if m else -100 for t, m in zip(row, mask)] + [-100] * (width - len(row))
                           for row, mask in rows])
    models = []
    for checkpointing in (True, False):
        torch.manual_seed(0)
        model = build_tiny_model(tiny_tokenizer)
        with torch.no_grad():
            expected = float(model(input_ids=ids, attention_mask=attn, labels=labels).loss)
        # one batch holding every chat: the epoch's loss is the loss at the initial weights
        losses = supervised_warmup(model, tiny_tokenizer, chats, epochs=1, lr=1e-3, batch_size=len(chats),
                                   progress=False, activation_checkpointing=checkpointing)
        assert losses[0] == pytest.approx(expected, rel=1e-5)
        assert not activation_checkpointing_on(model)  # switched back off
        models.append(model.state_dict())
    for name, value in models[0].items():
        assert torch.allclose(value, models[1][name], atol=1e-6), name


# ------------------------------------------------------------------------------------------ the warm-up's folder
def _warm(model_dir, out, **settings):
    return warmup_model(str(model_dir), "ragen/Bandit-v0", _kwargs("ragen/Bandit-v0", enable_think=False), out,
                        episodes=settings.pop("episodes", 2), epochs=1, progress=False, **settings)  # fmt: skip


def test_another_model_or_seed_is_another_warmup_and_is_named_when_it_replaces_one(tiny_model_dir, tmp_path,
                                                                                    capsys):
    out = _warm(tiny_model_dir, tmp_path / "w", seed=0)
    first = json.loads((out / warmup.RECORD).read_text())["settings"]
    assert first["model"] == str(tiny_model_dir) and first["seed"] == 0 and first["batch_size"] == 4
    capsys.readouterr()
    _warm(tiny_model_dir, out, seed=1)  # another seed in the same folder: trained again, not served the seed-0 one
    err = capsys.readouterr().err
    assert "other settings" in err and "seed: 0 -> 1" in err, err
    assert json.loads((out / warmup.RECORD).read_text())["settings"]["seed"] == 1
    assert not list(tmp_path.glob(".tmp-*")) and not list(tmp_path.glob(".replaced-*"))
    # the cache key holds every setting: the model and the seed too
    base = warmup.warmup_settings("smollm2", "ragen/Bandit-v0", {}, seed=0)
    keys = {warmup.settings_key(base), warmup.settings_key({**base, "seed": 1}),
            warmup.settings_key({**base, "model": "other"})}
    assert len(keys) == 3


def test_a_kill_before_the_record_is_written_leaves_the_old_warmup_whole(tiny_model_dir, tmp_path, monkeypatch):
    out = _warm(tiny_model_dir, tmp_path / "w", seed=0)
    record = (out / warmup.RECORD).read_bytes()
    weights = (out / "model.safetensors").read_bytes()

    def killed(path, data, **kw):
        raise KeyboardInterrupt  # the kill lands after the new weights are written, before their record

    monkeypatch.setattr(warmup, "atomic_write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        _warm(tiny_model_dir, out, seed=1)
    # the old warm-up is untouched: its weights still match its record, nothing half-written is left
    assert (out / warmup.RECORD).read_bytes() == record and (out / "model.safetensors").read_bytes() == weights
    assert not list(tmp_path.glob(".tmp-*"))
    monkeypatch.undo()

    real_replace = os.replace

    def rename_fails(src, dst):
        if Path(dst) == out and Path(src).name.startswith(".tmp-"):  # the new folder cannot be renamed into place
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(warmup.os, "replace", rename_fails)
    with pytest.raises(OSError):
        _warm(tiny_model_dir, out, seed=1)
    # the old one was put back
    assert (out / warmup.RECORD).read_bytes() == record and (out / "model.safetensors").read_bytes() == weights


@pytest.mark.parametrize("damage", ["{torn", "[]", '{"losses": [1.0]}', ""], ids=["torn", "list", "no-settings",
                                                                               "empty"])
def test_a_damaged_record_is_named_and_the_warmup_done_again(tiny_model_dir, tmp_path, capsys, damage):
    out = _warm(tiny_model_dir, tmp_path / "w")
    (out / warmup.RECORD).write_text(damage)
    capsys.readouterr()
    _warm(tiny_model_dir, out)
    err = capsys.readouterr().err
    assert f"{out / warmup.RECORD} is damaged" in err and "done again" in err, err
    assert json.loads((out / warmup.RECORD).read_text())["settings"]["agent"] == "random"


def test_a_folder_that_is_not_a_warmup_is_refused_not_deleted(tiny_model_dir, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="no warm-up record"):
        _warm(tiny_model_dir, mine)
    assert (mine / "notes.txt").read_text() == "keep me"


def _cli_cases(tmp_path, model_dir):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    not_a_warmup = tmp_path / "theirs"
    not_a_warmup.mkdir()
    (not_a_warmup / "data.bin").write_text("x")
    base = ["--env", "ragen/Bandit-v0", "--model", str(model_dir), "--out", str(tmp_path / "out")]
    return {  # case -> (extra arguments, what the message must name)
        "episodes-0": (["--episodes", "0"], "--episodes=0"),
        "episodes-negative": (["--episodes", "-3"], "--episodes=-3"),
        "episodes-not-a-number": (["--episodes", "many"], "--episodes"),
        "epochs-0": (["--epochs", "0"], "--epochs=0"),
        "lr-0": (["--lr", "0"], "--lr=0"),
        "lr-negative": (["--lr=-1e-4"], "--lr=-0.0001"),
        "lr-nan": (["--lr", "nan"], "--lr=nan"),
        "lr-inf": (["--lr", "inf"], "--lr=inf"),
        "lr-huge": (["--lr", "5"], "--lr=5"),
        "batch-size-0": (["--batch-size", "0"], "--batch-size=0"),
        "seed-negative": (["--seed", "-1"], "--seed=-1"),
        "seed-too-large": (["--seed", str(2**40)], "--seed="),
        "agent-unknown": (["--agent", "oracle"], "--agent"),
        "oracle-share-above-1": (["--agent", "mixed", "--oracle-share", "1.5"], "--oracle-share=1.5"),
        "oracle-share-negative": (["--agent", "mixed", "--oracle-share=-0.1"], "--oracle-share=-0.1"),
        "oracle-share-nan": (["--agent", "mixed", "--oracle-share", "nan"], "--oracle-share=nan"),
        "think-unknown": (["--agent", "mixed", "--think", "free"], "--think='free'"),
        "think-with-random": (["--think", "state"], "--think='state'"),
        "think-no-state-thought": (["--agent", "mixed", "--think", "state"], "has no state thought"),
        "env-unknown": (["--env", "ragen/Nope-v0"], "--env='ragen/Nope-v0'"),
        "env-empty": (["--env", ""], "--env=''"),
        "protocol-not-yaml": (["--protocol", "{enable_think: [false"], "--protocol"),
        "protocol-not-a-mapping": (["--protocol", "[1, 2]"], "--protocol"),
        "protocol-unknown-setting": (["--protocol", "{no_such_setting: 1}"], "no_such_setting"),
        "protocol-bad-value": (["--protocol", "{enable_think: maybe}"], "enable_think"),
        "env-kwargs-unknown": (["--env-kwargs", "{bogus: 1}"], "--env-kwargs"),
        "env-kwargs-bad-value": (["--env-kwargs", "{low_risk_name: ''}"], "low_risk_name"),
        "model-missing": (["--model", str(tmp_path / "no-model")], "--model="),
        "model-a-file": (["--model", str(a_file)], "--model="),
        "out-a-file": (["--out", str(a_file)], "--out="),
        "out-not-a-warmup": (["--out", str(not_a_warmup)], "no warm-up record"),
        "out-under-a-file": (["--out", str(a_file / "sub")], "--out="),
    }, base


CLI_CASES = ["episodes-0", "episodes-negative", "episodes-not-a-number", "epochs-0", "lr-0", "lr-negative", "lr-nan",
             "lr-inf", "lr-huge", "batch-size-0", "seed-negative", "seed-too-large", "agent-unknown", "oracle-share-above-1",
             "oracle-share-negative", "oracle-share-nan", "think-unknown", "think-with-random", "think-no-state-thought",
             "env-unknown",
             "env-empty", "protocol-not-yaml", "protocol-not-a-mapping", "protocol-unknown-setting",
             "protocol-bad-value", "env-kwargs-unknown", "env-kwargs-bad-value", "model-missing", "model-a-file",
             "out-a-file", "out-not-a-warmup", "out-under-a-file"]  # fmt: skip


@pytest.mark.parametrize("case", CLI_CASES)
def test_every_bad_value_of_the_command_is_a_message_before_any_model_loads(case, tmp_path, tiny_model_dir,
                                                                            monkeypatch, capsys):
    cases, base = _cli_cases(tmp_path, tiny_model_dir)
    extra, named = cases[case]

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(warmup, "load_model_and_tokenizer", no_load)
    with pytest.raises(SystemExit) as exit_info:
        warmup.main(base + extra)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "error:" in err and named in err and "Traceback" not in err, err
    assert len(err) < 3000, err


def test_the_command_without_a_traceback_as_a_process(tmp_path):
    """The whole command as a user runs it: a bad value exits 2 with the message and nothing else."""
    command = [sys.executable, "-m", "ragen_trainer.warmup", "--env", "ragen/Bandit-v0", "--out", str(tmp_path / "w"),
               "--lr", "nan"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2 and "--lr=nan" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "w").exists()


def test_the_command_warms_up_into_its_folder(tmp_path, tiny_model_dir, capsys):
    argv = ["--env", "ragen/Bandit-v0", "--protocol", "{enable_think: false}", "--model", str(tiny_model_dir),
            "--episodes", "2", "--epochs", "1", "--batch-size", "2", "--out", str(tmp_path / "w")]  # fmt: skip
    assert warmup.main(argv) == 0
    record = json.loads((tmp_path / "w" / warmup.RECORD).read_text())
    assert record["settings"]["batch_size"] == 2 and record["chats"] == 2
    assert "warmed-up model in" in capsys.readouterr().out
