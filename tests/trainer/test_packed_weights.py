"""oneDNN-packed linear weights while an HFEngine session samples: the products of ``F.linear`` up to float rounding
(float32) or the same (bfloat16), at any row count, packed once for a run of sessions on a model in eval mode,
repacked where a weight changed, nothing kept for a model in training mode."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.hf import HFEngine, packed_weights
from ragen_trainer.engines.hf.packed_weights import PackedWeights, can_pack

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"),
    reason="torch built without oneDNN: nothing is packed",
)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.ReLU(), torch.nn.Linear(40, 8, bias=False))


@pytest.mark.parametrize("rows", [1, 5, 8, 13, 32, 33])
def test_packed_layers_give_the_products_of_f_linear_at_any_row_count_and_give_their_forward_back(rows):
    model = _model()
    x = torch.randn(rows, 24)
    with torch.no_grad():
        expected = model(x)
        packed = PackedWeights(model)
        got = model(x)
        batched = model(x.reshape(1, rows, 24))  # a [batch, tokens, features] input, as the decoder's
    assert packed.packed == 2 and got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched[0], got)
    with torch.enable_grad():  # the packed product has no backward: with gradients on, F.linear runs
        assert model(x.requires_grad_()).requires_grad
    packed.restore()
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU has no oneDNN bfloat16")
def test_a_bfloat16_model_is_packed_and_gives_the_same_products():
    model = _model().to(torch.bfloat16)
    x = torch.randn(7, 24, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
        packed = PackedWeights(model)
        got = model(x)
    assert packed.packed == 2 and got.dtype == torch.bfloat16 and torch.equal(got, expected)
    with torch.no_grad(), pytest.raises(RuntimeError):
        model(x.float())  # another dtype than the pack's goes to F.linear, which refuses it as it did unpacked
    packed.restore()


def test_layers_of_other_dtypes_or_devices_are_left_alone_and_can_pack_says_so():
    model = _model().to(torch.float16)
    assert PackedWeights(model).packed == 0 and not can_pack(model)
    assert can_pack(_model()) and not can_pack(torch.nn.ReLU())


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
        assert changed.packed == 1  # the new weight, not the stale pack
        torch.testing.assert_close(model[0](x), plain, rtol=1e-5, atol=1e-5)
    changed.restore()
    PackedWeights(model, keep=False).restore()  # not kept: the next session packs everything
    kept = PackedWeights(model, keep=True)
    assert kept.packed == 2
    kept.restore()
    if packed_weights.has_mkl_packs():  # the other library's packs are not reused
        assert PackedWeights(model, keep=True, float32_packs="onednn").packed == 2


def test_sessions_keep_packs_only_for_a_model_in_eval_mode(tiny_model, tiny_tokenizer, monkeypatch):
    if not can_pack(tiny_model):
        pytest.skip("the tiny model is not a float32 CPU model")
    calls = []
    pack = packed_weights._pack
    monkeypatch.setattr(packed_weights, "_pack", lambda weight, mkl: calls.append(1) or pack(weight, mkl))
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



needs_mkl = pytest.mark.skipif(not packed_weights.has_mkl_packs(), reason="torch built without MKL: oneDNN packs only")


@needs_mkl
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 13, 32, 33, 300])
def test_one_mkl_pack_serves_every_row_count_with_the_products_of_a_pack_made_for_that_count(rows):
    # What the float32 path rests on: MKL's pack does not depend on the row count it was made for, so the one pack
    # (made for 32) multiplies any number of rows; torch runs it when told that number. Were that to change in a
    # later MKL, this fails.
    torch.manual_seed(rows)
    weight, x = torch.randn(40, 24), torch.randn(rows, 24)
    pack = torch.ops.mkl._mkl_reorder_linear_weight(weight, packed_weights.PACK_ROWS_HINT)
    got = torch.ops.mkl._mkl_linear(x, pack, weight, None, rows)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)
    if rows > 2:  # a single row or two may take another MKL kernel: equal up to rounding (above), not bit for bit
        exact = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        assert torch.equal(got, torch.ops.mkl._mkl_linear(x, exact, weight, None, rows))


@needs_mkl
def test_float32_weights_use_mkl_packs_and_bfloat16_and_onednn_when_asked_use_onednn(monkeypatch):
    calls = []
    mkl, onednn = torch.ops.mkl._mkl_linear, torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed_weights.torch.ops.mkl, "_mkl_linear",
                        lambda x, p, w, b, rows: calls.append(("mkl", x.shape[0], rows)) or mkl(x, p, w, b, rows),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(packed_weights.torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: calls.append(("onednn",)) or onednn(*a), raising=False)  # fmt: skip
    with torch.no_grad():
        model = _model()
        x = torch.randn(2, 5, 24)  # [batch, tokens, features]: 10 rows
        expected = model(x)
        PackedWeights(model)
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
        assert calls == [("mkl", 10, 10)] * 2  # told its own row count, so the pack runs
        calls.clear()
        PackedWeights(model, float32_packs="onednn")
        model(x)
        assert calls == [("onednn",)] * 2
        if torch.ops.mkldnn._is_mkldnn_bf16_supported():
            calls.clear()
            model = _model().to(torch.bfloat16)
            PackedWeights(model)
            model(x.to(torch.bfloat16))
            assert calls == [("onednn",)] * 2
    with pytest.raises(ValueError, match="float32_packs"):
        PackedWeights(_model(), float32_packs="blas")


def test_the_engine_samples_the_same_greedy_replies_with_either_library_and_checks_the_choice(tiny_model,
                                                                                               tiny_tokenizer):
    params = SamplingParams(temperature=0, max_new_tokens=6)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    mkl = HFEngine(tiny_model, tiny_tokenizer).generate(prompts, params)
    onednn = HFEngine(tiny_model, tiny_tokenizer, float32_packs="onednn").generate(prompts, params)
    assert [r.token_ids for r in mkl] == [r.token_ids for r in onednn]
    with pytest.raises(ValueError, match="float32_packs"):
        HFEngine(tiny_model, tiny_tokenizer, float32_packs="mkldnn")
