"""The reply-format warm-up: reference agents' chats, the mask over their replies, and a fine-tune that learns them."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

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
