"""MKL-packed linear weights while an HFEngine session samples: the same floats as ``F.linear``, packed once for a run
of sessions on a model in eval mode, repacked where a weight changed, nothing kept for a model in training mode."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.hf import HFEngine, packed_weights
from ragen_trainer.engines.hf.packed_weights import PackedWeights, can_pack

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available() or not hasattr(torch.ops.mkl, "_mkl_linear"),
                                reason="torch built without MKL: nothing is packed")  # fmt: skip


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.ReLU(), torch.nn.Linear(40, 8, bias=False))


def test_packed_layers_give_the_floats_of_f_linear_and_give_their_forward_back():
    model = _model()
    x = torch.randn(5, 24)
    with torch.no_grad():
        expected = model(x)
        packed = PackedWeights(model)
        got = model(x)
    assert packed.packed == 2 and torch.equal(got, expected)
    with torch.enable_grad():  # the packed product has no backward: with gradients on, F.linear runs
        assert model(x.requires_grad_()).requires_grad
    packed.restore()
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_a_model_in_eval_mode_is_packed_once_and_a_changed_weight_again():
    model = _model().eval()
    x = torch.randn(3, 24)
    first = PackedWeights(model, keep=True)
    first.restore()
    again = PackedWeights(model, keep=True)  # nothing changed: every packed copy reused
    assert (first.packed, again.packed) == (2, 0)
    again.restore()
    with torch.no_grad():
        model[0].weight.add_(0.5)  # an in-place write (an optimizer step, load_state_dict) bumps the version
        plain = torch.nn.functional.linear(x, model[0].weight, model[0].bias)
        changed = PackedWeights(model, keep=True)
        assert changed.packed == 1 and torch.equal(model[0](x), plain)  # the new weight, not the stale pack
    changed.restore()
    PackedWeights(model, keep=False).restore()  # not kept: the next session packs everything
    assert PackedWeights(model, keep=True).packed == 2


def test_sessions_keep_packs_only_for_a_model_in_eval_mode(tiny_model, tiny_tokenizer, monkeypatch):
    if not can_pack(tiny_model):
        pytest.skip("the tiny model is not a float32 CPU model")
    calls = []
    reorder = torch.ops.mkl._mkl_reorder_linear_weight
    monkeypatch.setattr(packed_weights.torch.ops.mkl, "_mkl_reorder_linear_weight",
                        lambda w, hint: calls.append(1) or reorder(w, hint), raising=False)  # fmt: skip
    params = SamplingParams(temperature=0, max_new_tokens=3)
    prompt = [[1, 2, 3, 4]]
    layers = sum(isinstance(m, torch.nn.Linear) for m in tiny_model.modules())
    tiny_model.train()
    engine = HFEngine(tiny_model, tiny_tokenizer, pack_weights=True)
    engine.generate(prompt, params)
    engine.generate(prompt, params)
    assert len(calls) == 2 * layers and tiny_model.training  # training mode: packed every session, mode restored
    calls.clear()
    tiny_model.eval()
    replies = [engine.generate(prompt, params)[0].token_ids for _ in range(3)]
    assert len(calls) == layers and replies[0] == replies[1] == replies[2]  # packed once for three sessions
    tiny_model.train()
