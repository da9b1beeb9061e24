"""Packed micro-batches (:mod:`ragen_trainer.packing`): one row without padding, each group's prefix computed once.

The packed forward must give what a padded batch gives -- log-probs, entropies, values and gradients -- to float
tolerance, on one-turn (Bandit: the whole prompt shared) and multi-turn (FrozenLake: the first turn's prompt shared)
batches, with the policy's and a separate critic's backbone, and a training step must move the weights the same with
``share_prefixes`` on and off (PPO with a critic and GRPO, several micro-batches).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.config import load_config
from ragen_trainer.critic import PolicyWithCritic, attach_critic
from ragen_trainer.packing import pack, shared_prefix_length, use_packed_attention
from ragen_trainer.trainer import StarPOTrainer
from ragen_trainer.update import action_mask, token_logprobs
from tests.trainer.conftest import ScriptedEngine, build_tiny_model, padded_batch

_BANDIT = ["<answer>Dragon</answer>", "<answer>Phoenix</answer>", "nonsense", "<answer>Dragon</answer>"]
_LAKE = ["Right || Down", "Down || Right", "Left", "nonsense"]


def _config(tmp_path, env, preset="starpo-s", **changes):
    base = dict(
        env_id=env, env_groups=2, group_size=3, max_turns=3, max_new_tokens=12, max_context_tokens=1024,
        enable_think=False, reply_prefix="", bare_answers=True, total_steps=1, save_steps=0, val_every=0,
        micro_batch_size=2, ppo_mini_batch_size=3, generation_batch_size=8, actor_lr=1e-3, critic_lr=1e-3,
        filter_ratio=1.0, report_to=["jsonl"], output_dir=str(tmp_path / "run"),
    )  # fmt: skip
    base.update(changes)
    return load_config(preset).replace(**base).validate()


def _rollouts(tmp_path, tokenizer, env, loss_mask="replies"):
    replies = _BANDIT if env == "ragen/Bandit-v0" else _LAKE
    engine = ScriptedEngine(tokenizer, lambda prompt, call, row: replies[(row + call) % len(replies)])
    cfg = _config(tmp_path, env, loss_mask=loss_mask)
    trainer = StarPOTrainer(cfg, build_tiny_model(tokenizer), tokenizer, engine=engine)
    trajs = trainer.rollout(0).trajectories
    return trajs


def _padded_reference(model, trajs, mask, *, values):
    """Log-probs (temperature 1), entropies and values at ``mask`` from an ordinary padded forward (and the critic's
    own pass on the same padded batch)."""
    ids, attn = padded_batch(trajs)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1) * mask
    ent = -(logp_all.exp() * logp_all).sum(-1) * mask
    critic_values = PolicyWithCritic(model).values({"input_ids": ids, "attention_mask": attn}) if values else None
    vals = critic_values[:, :-1].float() * mask if values else None
    return logp, ent, vals


@pytest.mark.parametrize("env,critic,loss_mask", [
    ("ragen/Bandit-v0", "value_model", "replies"), ("ragen/Bandit-v0", "value_head", "after_system"),
    ("ragen/FrozenLake-v0", "value_model", "after_system"), ("ragen/FrozenLake-v0", "value_head", "replies"),
])  # fmt: skip
def test_packed_forward_and_gradients_match_the_padded_batch(tmp_path, tiny_tokenizer, env, critic, loss_mask):
    trajs = _rollouts(tmp_path, tiny_tokenizer, env, loss_mask)
    assert len({t.group_id for t in trajs}) == 2 and len(trajs) == 6
    mask = action_mask(trajs, max(len(t.input_ids) for t in trajs) - 1)
    packed = pack(trajs, mask)
    unshared = pack(trajs, mask, share_prefixes=False)
    # no padding, and the prefixes shared, trained positions in them included (after_system trains the prompt)
    assert packed.length < unshared.length <= packed.padded_tokens
    assert int(packed.select.sum()) < packed.gather.numel() or loss_mask == "replies"  # prompt positions read twice
    if env == "ragen/Bandit-v0":  # one turn: almost the whole trajectory is the shared prompt
        assert packed.length < 0.6 * unshared.length

    grads = {}
    results = {}
    for name in ("padded", "packed", "unshared"):
        torch.manual_seed(0)
        model = build_tiny_model(tiny_tokenizer)
        attach_critic(model, critic)
        with torch.no_grad():  # a non-zero critic head, so the values carry a gradient signal
            for p in model.ragen_critic.parameters():
                p.normal_(0, 0.1)
        use_packed_attention(model)
        if name == "padded":
            logp, ent, vals = _padded_reference(model, trajs, mask, values=True)
        else:
            layout = packed if name == "packed" else unshared
            logp, ent, vals = token_logprobs(PolicyWithCritic(model), layout, mask, temperature=1.0, entropy=True,
                                             values=True)
        loss = (logp * torch.linspace(-1, 1, logp.shape[1])).sum() + ent.sum() * 0.1 + (vals ** 2).sum()
        loss.backward()
        results[name] = (logp.detach(), ent.detach(), vals.detach())
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    for name in ("packed", "unshared"):
        for got, want in zip(results[name], results["padded"]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        assert grads[name].keys() == grads["padded"].keys()
        for key, want in grads["padded"].items():
            scale = max(float(want.abs().max()), 1.0)  # float32 sums of many trained positions: relative to the largest
            torch.testing.assert_close(grads[name][key], want, rtol=1e-3, atol=1e-5 * scale, msg=f"{name}: {key}")


def test_shared_prefix_is_the_common_prefix_but_its_last_token():
    rows = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8], [1, 2, 3, 9, 9, 9]]
    assert shared_prefix_length(rows) == 2  # common: 1 2 3; token 3 predicts 4 / 9, so each row keeps its own copy
    assert shared_prefix_length(rows[:2]) == 3
    assert shared_prefix_length(rows[:1]) == 0  # alone: nothing to share


class GradientRecorder(StarPOTrainer):
    """Keeps the gradients of every update, before clipping and the optimizer step (whose first act is to clip)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded = []
        clip = self.adamw.clip_gradients

        def record_then_clip():
            self.recorded.append({n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None})
            return clip()

        self.adamw.clip_gradients = record_then_clip


@pytest.mark.parametrize("env,preset", [("ragen/Bandit-v0", "starpo-s"), ("ragen/FrozenLake-v0", "starpo-s"),
                                        ("ragen/FrozenLake-v0", "grpo")])
def test_a_training_step_is_the_same_with_and_without_shared_prefixes(tmp_path, tiny_tokenizer, env, preset):
    """The same gradients at every update of a step (two mini-batches of micro-batches), and the same losses. (The
    weights after AdamW are not compared: Adam divides by the gradient's size, so a gradient of 1e-12 and one of
    -1e-12 in an untouched embedding row both move it by the whole learning rate.)"""
    replies = _BANDIT if env == "ragen/Bandit-v0" else _LAKE
    runs = {}
    for share in (True, False):
        torch.manual_seed(0)
        model = build_tiny_model(tiny_tokenizer)
        engine = ScriptedEngine(tiny_tokenizer, lambda prompt, call, row: replies[(row + call) % len(replies)])
        cfg = _config(tmp_path / str(share), env, preset, share_prefixes=share, kl_coef=0.0)
        trainer = GradientRecorder(cfg, model, tiny_tokenizer, engine=engine)
        trainer.train()
        assert trainer.optimizer_steps == 2  # 6 trajectories, mini-batches of 3, micro-batches of 2
        runs[share] = trainer
    shared, unshared = runs[True], runs[False]
    for update, (got, want) in enumerate(zip(shared.recorded, unshared.recorded)):
        assert got.keys() == want.keys()
        for key in want:
            scale = float(want[key].abs().max())
            torch.testing.assert_close(got[key], want[key], rtol=1e-3, atol=1e-5 * max(scale, 1e-3),
                                       msg=f"update {update}: {key}")
    for key in ("loss/policy", "policy/entropy", "policy/ratio_max", "optim/grad_norm"):
        assert shared.history[-1][key] == pytest.approx(unshared.history[-1][key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_chunked_log_probs_match_whole_logits_and_keep_their_gradient(temperature):
    """The LM head in chunks (recomputed in the backward pass) gives what whole logits give, values and gradients:
    ``log_softmax`` and ``-sum(p log p)`` written out, against ragen's ``z_t - logsumexp(z)`` and shared ``logsumexp``."""
    from ragen_trainer.critic import chunked_token_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(37, 16, requires_grad=True)
    targets = torch.randint(0, 50, (37,))
    logits = head(hidden).float() / temperature
    log_probs = torch.log_softmax(logits, -1)
    want_lp = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    want_ent = -(log_probs.exp() * log_probs).sum(-1)
    (want_lp.sum() + 0.3 * want_ent.sum()).backward()
    want_grads = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    lp, ent = chunked_token_logprobs(hidden, head, targets, vocab=50, temperature=temperature, entropy=True,
                                     chunk_elements=8 * 50)  # 8 positions a chunk: 5 chunks
    (lp.sum() + 0.3 * ent.sum()).backward()
    torch.testing.assert_close(lp, want_lp)
    torch.testing.assert_close(ent, want_ent)
    torch.testing.assert_close(hidden.grad, want_grads[0])
    torch.testing.assert_close(head.weight.grad, want_grads[1])


def test_a_packed_forward_builds_no_attention_mask(tmp_path, tiny_tokenizer):
    """The packed attention masks block by block, so a packed forward must not make ``transformers`` build the
    ``[L, L]`` mask it would for the row's restarting position ids (memory quadratic in the row); an ordinary padded
    forward of the same model still gets SDPA's mask."""
    from transformers import AttentionInterface

    from ragen_trainer.packing import ATTENTION_NAME, packed_attention

    trajs = _rollouts(tmp_path, tiny_tokenizer, "ragen/FrozenLake-v0")
    mask = action_mask(trajs, max(len(t.input_ids) for t in trajs) - 1)
    model = build_tiny_model(tiny_tokenizer).eval()
    use_packed_attention(model)
    masks = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        masks.append(attention_mask)
        return packed_attention(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(ATTENTION_NAME, recording)
    try:
        with torch.no_grad():
            token_logprobs(PolicyWithCritic(model), pack(trajs, mask), mask, temperature=1.0, entropy=False,
                           values=False)
            packed_masks, masks[:] = list(masks), []
            ids, attn = padded_batch(trajs)
            model(input_ids=ids, attention_mask=attn)
    finally:
        AttentionInterface.register(ATTENTION_NAME, packed_attention)
    assert packed_masks and all(m is None for m in packed_masks)
    assert masks and all(isinstance(m, torch.Tensor) for m in masks)  # the padded rows need theirs
