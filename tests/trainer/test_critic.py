"""The critic and :class:`~ragen_trainer.critic.PolicyWithCritic` (:mod:`ragen_trainer.critic`): the policy's log-probs
at the selected positions are its full forward's, the critic's values come from the policy's hidden state (value head)
or from a separate value model that runs alone, the model's ``forward`` stays the ``transformers`` one, and the
critic's weights keep their ``ragen_critic.`` keys (what checkpoints hold)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.critic import (
    CRITIC_ATTR,
    PolicyWithCritic,
    attach_critic,
    get_critic,
    load_critic,
    policy_copy,
    save_critic,
    split_state_dict,
)
from tests.trainer.conftest import build_tiny_model


def _ids(tokenizer, rows=2, length=7):
    return torch.randint(0, len(tokenizer), (rows, length), generator=torch.Generator().manual_seed(0))


def test_logprobs_at_the_selected_positions_are_the_full_forwards_and_a_copy_is_independent(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer).eval()
    ids = _ids(tiny_tokenizer)
    full = model(input_ids=ids).logits
    attach_critic(model, "value_head")
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[0, 2:5] = True
    mask[1, 6] = True
    targets = torch.tensor([3, 9, 27, 5])
    scores = PolicyWithCritic(model).logprobs({"input_ids": ids}, mask, targets, temperature=0.7, entropy=True,
                                              values=True)
    want = torch.log_softmax(full[mask].float() / 0.7, -1)
    torch.testing.assert_close(scores.logprobs, want.gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(scores.entropy, -(want.exp() * want).sum(-1))
    assert scores.values.shape == (2, 7) and torch.all(scores.values == 0)  # zero-initialised head
    assert "forward" not in vars(model)  # the transformers forward, not a patched one
    ref = policy_copy(model)
    assert get_critic(ref) is None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert torch.allclose(ref(input_ids=ids).logits, full, atol=1e-5)  # the copy runs its own weights


def test_the_logits_get_the_models_final_scale_and_soft_cap(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer).eval()
    model.config.logit_scale, model.config.final_logit_softcapping = 3.0, 0.5
    policy = PolicyWithCritic(model)
    hidden = torch.randn(4, model.config.hidden_size)
    want = torch.tanh(model.lm_head(hidden) * 3.0 / 0.5) * 0.5
    torch.testing.assert_close(policy.lm_head(hidden), want)


def test_a_value_head_reads_the_policys_last_hidden_state(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer).eval()
    head = attach_critic(model, "value_head")
    with torch.no_grad():
        head.summary.weight.normal_()
    ids = _ids(tiny_tokenizer)
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    torch.testing.assert_close(PolicyWithCritic(model).values({"input_ids": ids}), head(hidden))


def test_a_separate_value_model_runs_alone_without_the_policy(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer).eval()
    critic = attach_critic(model, "value_model")
    with torch.no_grad():
        critic.head.summary.weight.normal_()
    calls = []
    hook = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    ids = _ids(tiny_tokenizer)
    values = PolicyWithCritic(model).values({"input_ids": ids})
    hook.remove()
    assert calls == []
    torch.testing.assert_close(values, critic.head(critic.backbone(input_ids=ids).last_hidden_state))


def test_values_without_a_critic_say_how_to_attach_one(tiny_tokenizer):
    model = build_tiny_model(tiny_tokenizer)
    with pytest.raises(ValueError, match="attach_critic"):
        PolicyWithCritic(model).values({"input_ids": _ids(tiny_tokenizer)})


@pytest.mark.parametrize("kind", ["value_head", "value_model"])
def test_the_critics_weights_keep_their_checkpoint_keys(tmp_path, tiny_tokenizer, kind):
    """Checkpoints hold the policy's keys in ``model.safetensors`` and the critic's, without ``ragen_critic.``, in
    ``critic.safetensors``: attaching a critic adds exactly those keys, and they load back."""
    model = build_tiny_model(tiny_tokenizer)
    policy_keys = set(model.state_dict())
    attach_critic(model, kind)
    state = model.state_dict()
    critic_keys = {k for k in state if k.startswith(CRITIC_ATTR + ".")}
    assert set(state) == policy_keys | critic_keys and critic_keys
    policy_state, critic_state = split_state_dict(state)
    assert set(policy_state) == policy_keys
    assert {CRITIC_ATTR + "." + k for k in critic_state} == critic_keys
    saved = {k: v + 1 for k, v in critic_state.items()}
    save_critic(saved, tmp_path)
    assert load_critic(model, tmp_path)
    for key, value in get_critic(model).state_dict().items():
        torch.testing.assert_close(value, saved[key])
