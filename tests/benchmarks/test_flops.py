"""``benchmarks/flops.py``: the update's model-FLOP count, checked against what torch's own FLOP counter sees.

torch's ``FlopCounterMode`` counts the matrix products a forward and backward really ran (not the attention of the
CPU's SDPA, which it does not see), so the linear layers and the LM head are checked against it exactly; the attended
pairs are checked against the attention masks themselves, built position by position.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode

from ragen_trainer.critic import PolicyWithCritic, attach_critic
from ragen_trainer.packing import pack, use_packed_attention
from ragen_trainer.trajectory import Trajectory
from ragen_trainer.update import action_mask, token_logprobs
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from flops import UpdateFlops, matmul_peak, packed_pairs, padded_pairs


def _traj(group: int, ids: list[int], trained: int) -> Trajectory:
    return Trajectory(group_id=group, seed=0, env_id="test", messages=[], input_ids=ids,
                      loss_mask=[0] * (len(ids) - trained) + [1] * trained, turn_spans=[], turn_rewards=[],
                      success=False, replies=[], infos=[])  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture()
def batch():
    """Three rollouts of one group (a 20-token prompt in common) and one of another group."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 300, (20,), generator=g).tolist()
    trajs = [_traj(0, prompt + torch.randint(0, 300, (5 + i,), generator=g).tolist(), 5 + i) for i in range(3)]
    trajs.append(_traj(1, torch.randint(0, 300, (12,), generator=g).tolist(), 4))
    return trajs, action_mask(trajs, max(len(t.input_ids) for t in trajs) - 1)


def _model(tokenizer, critic=None):
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
    if critic:
        attach_critic(model, critic)
    use_packed_attention(model)
    return model


def _norm_params(module) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if "norm" in n)


def _matmul_flops(run) -> int:
    with FlopCounterMode(display=False) as counter:
        run()
    counts = counter.get_flop_counts()["Global"]
    return int(sum(v for k, v in counts.items() if "mm" in str(k)))


def test_packed_update_counts_the_products_ragen_runs(tokenizer, batch):
    trajs, mask = batch
    model = _model(tokenizer)
    packed = pack(trajs, mask)
    flops = UpdateFlops(model)

    def run():
        logp, _, _ = token_logprobs(PolicyWithCritic(model), packed, mask, temperature=1.0, entropy=False, values=False)
        logp.sum().backward()

    ran = _matmul_flops(run)
    got = flops.take()
    dims = flops.dims
    assert got["calls"] == 1
    assert got["tokens"] == packed.length < sum(len(t.input_ids) for t in trajs)  # the prefix once
    assert got["head_positions"] == int(packed.select.sum()) == int(mask.sum())  # replies only: none shared
    attention = 12 * dims.layers * dims.attention_width * got["pairs"]
    norms = 6 * _norm_params(model.get_decoder()) * got["tokens"]  # not matrix products
    recomputed_head = 2 * dims.hidden * dims.vocab * got["head_positions"]  # ragen recomputes its LM-head chunks
    assert got["flops"] - attention - norms + recomputed_head == ran


def test_padded_forward_counts_padding_tokens_but_not_their_attention(tokenizer, batch):
    trajs, _ = batch
    model = _model(tokenizer)
    width = max(len(t.input_ids) for t in trajs)
    ids = torch.zeros(len(trajs), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, t in enumerate(trajs):
        ids[i, : len(t.input_ids)] = torch.tensor(t.input_ids)
        attn[i, : len(t.input_ids)] = 1
    flops = UpdateFlops(model)
    ran = _matmul_flops(lambda: model(input_ids=ids, attention_mask=attn).logits.sum().backward())
    got = flops.take()
    dims = flops.dims
    assert got["tokens"] == got["head_positions"] == ids.numel()
    assert got["pairs"] == sum(len(t.input_ids) * (len(t.input_ids) + 1) // 2 for t in trajs)
    attention = 12 * dims.layers * dims.attention_width * got["pairs"]
    norms = 6 * _norm_params(model.get_decoder()) * got["tokens"]
    assert got["flops"] - attention - norms == ran


def test_a_separate_value_model_adds_its_own_backbone(tokenizer, batch):
    trajs, mask = batch
    model = _model(tokenizer, critic="value_model")
    packed = pack(trajs, mask)
    flops = UpdateFlops(model)
    policy = PolicyWithCritic(model)
    ran = _matmul_flops(lambda: sum(x.sum() for x in token_logprobs(
        policy, packed, mask, temperature=1.0, entropy=False, values=True) if x is not None).backward())
    got = flops.take()
    dims = flops.dims
    assert flops.critic_dims is not None and flops.critic_dims.vocab == 0
    attention = 12 * dims.layers * dims.attention_width * got["pairs"] * 2
    norms = 6 * (_norm_params(model.get_decoder()) + _norm_params(model.ragen_critic.backbone)) * got["tokens"]
    value_bias = 6 * got["tokens"]  # the value head's bias: a parameter of the critic, not a product
    recomputed_head = 2 * dims.hidden * dims.vocab * got["head_positions"]
    assert got["flops"] - attention - norms - value_bias + recomputed_head == ran


def test_no_grad_passes_are_not_counted(tokenizer, batch):
    trajs, mask = batch
    model = _model(tokenizer)
    flops = UpdateFlops(model)
    with torch.no_grad():
        token_logprobs(PolicyWithCritic(model), pack(trajs, mask), mask, temperature=1.0, entropy=False, values=False)
    assert flops.take()["calls"] == 0
    flops.close()
    token_logprobs(PolicyWithCritic(model), pack(trajs, mask), mask, temperature=1.0, entropy=False, values=False)
    assert flops.take()["calls"] == 0  # the hook is gone


def _allowed(blocks, length):
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for b in blocks:
        for q in range(b.start, b.end):
            allowed[q, b.prefix_start:b.prefix_end] = True
            allowed[q, b.start:q + 1] = True
    return allowed


def test_packed_pairs_are_the_mask_the_attention_uses(batch):
    trajs, mask = batch
    for share in (True, False):
        packed = pack(trajs, mask, share_prefixes=share)
        assert packed_pairs(packed) == int(_allowed(packed.blocks, packed.length).sum())


def test_padded_pairs_of_left_and_right_padding():
    attn = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert padded_pairs(attn, 2, 6) == 6 + 21
    assert padded_pairs(None, 2, 6) == 42


def test_trl_fused_head_scores_every_position_on_cpu(tokenizer):
    pytest.importorskip("trl")
    from trl.trainer.utils import add_fused_lm_head

    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
    add_fused_lm_head(model)
    flops = UpdateFlops(model)
    ids = torch.randint(0, 300, (3, 10))
    labels = ids.clone()
    labels[:, :6] = -100  # TRL labels the completion only
    model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
    assert flops.take()["head_positions"] == 3 * 9  # every next-token position: the CPU path is not compact


def test_matmul_peak_is_a_rate():
    assert matmul_peak(n=128, repeats=2) > 0
    assert matmul_peak(n=128, repeats=2, dtype=torch.bfloat16) > 0


def test_matmul_peak_stops_growing_its_product_once_one_product_is_slow(monkeypatch):
    """A dtype the CPU emulates (bfloat16 on AVX2: ~1 GFLOP/s) must not time 2048-square products for minutes: with a
    zero time limit the first size (256) is the one measured, however large ``n`` is."""
    calls = []
    real_mm = torch.mm

    def counting_mm(a, b, **kwargs):
        calls.append(a.shape[0])
        return real_mm(a, b, **kwargs)

    monkeypatch.setattr(torch, "mm", counting_mm)
    assert matmul_peak(n=1 << 16, repeats=2, max_product_s=0.0) > 0
    assert set(calls) == {64, 256} and len(calls) == 4  # set-up, the first product, then two timed ones
    calls.clear()
    matmul_peak(n=512, repeats=1)  # fast: grows to n (256 -> 512 on any CPU this suite runs on)
    assert max(calls) == 512
