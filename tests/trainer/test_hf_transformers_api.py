"""What ragen relies on in ``transformers`` (:mod:`ragen_trainer.engines.hf.transformers_api`), pinned: the
attention interface, switching a model's attention implementation and reading it back, the cache layer protocol, and
the support checks (HFEngine); an attention function given SDPA's masks, with ``transformers``' SDPA attention behind
it (the packed micro-batches); the last hidden state of the model's own forward with its LM head on no position (the
policy's log-probs and values). ``scripts/check_lower_bounds.sh`` runs this file on the lowest supported
``transformers`` too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from ragen_trainer.engines.hf import transformers_api as api


def _attention_of_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain causal attention in the layout the interface promises (GQA heads repeated, ``[b, t, heads, dim]`` out)."""
    group = query.shape[1] // key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1), is_causal=True, scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


def test_a_registered_attention_function_replaces_the_models_own_while_switched_on(tiny_model):
    model = tiny_model.eval()
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    with torch.no_grad():
        expected = model(ids).logits
    calls = []

    def recording(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        calls.append((module.layer_idx, tuple(query.shape), tuple(key.shape), scaling))
        return _attention_of_sdpa(module, query, key, value, attention_mask, scaling)

    before = api.attention_implementation(model)
    assert before == "sdpa"
    api.register_attention(recording)
    api.register_attention(recording)  # idempotent
    api.set_attention_implementation(model, api.ATTENTION_NAME)
    try:
        assert api.attention_implementation(model) == api.ATTENTION_NAME
        with torch.no_grad():
            got = model(ids).logits
    finally:
        api.set_attention_implementation(model, before)
    assert api.attention_implementation(model) == before
    # Every layer called it once, with [batch, heads, tokens, dim] queries and [batch, kv_heads, tokens, dim] keys.
    assert [c[0] for c in calls] == [0, 1]
    assert all(c[1] == (1, 4, 6, 8) and c[2] == (1, 2, 6, 8) and c[3] == pytest.approx(8**-0.5) for c in calls)
    assert torch.allclose(got, expected, atol=1e-5)
    calls.clear()
    with torch.no_grad():
        model(ids)
    assert calls == []  # switched off: the model's own attention again


def test_a_model_that_cannot_switch_is_refused_by_name(tiny_model, monkeypatch):
    # transformers only logs a warning when a model class cannot switch its implementation dynamically.
    monkeypatch.setattr(type(tiny_model), "_can_set_attn_implementation", classmethod(lambda cls: False))
    api.register_attention(_attention_of_sdpa)
    with pytest.raises(ValueError, match="could not switch its attention implementation.*hf-generate"):
        api.set_attention_implementation(tiny_model, api.ATTENTION_NAME)
    assert api.attention_implementation(tiny_model) == "sdpa"


class _GrowingLayer(api.CacheLayer):
    """A cache layer that appends like ``DynamicLayer``, recording how the model calls it."""

    def __init__(self, calls):
        super().__init__()
        self.keys_held = self.values_held = None
        self.calls = calls

    def update(self, key_states, value_states, *args, **kwargs):
        self.calls.append(("update", tuple(key_states.shape)))
        if self.keys_held is None:
            self.keys_held, self.values_held = key_states, value_states
        else:
            self.keys_held = torch.cat([self.keys_held, key_states], dim=-2)
            self.values_held = torch.cat([self.values_held, value_states], dim=-2)
        return self.keys_held, self.values_held

    def get_seq_length(self):
        return 0 if self.keys_held is None else self.keys_held.shape[-2]

    def get_mask_sizes(self, query_length):
        self.calls.append(("mask", query_length))
        return self.get_seq_length() + query_length, 0


def test_a_cache_of_engine_layers_is_written_and_read_by_the_model(tiny_model):
    model = tiny_model.eval()
    ids = [5, 17, 42, 8, 99, 3]
    calls = []
    cache = api.cache_of([_GrowingLayer(calls) for _ in range(2)])
    keyword = api.cache_keyword(model)
    assert keyword in ("cache", "past_key_values")
    with torch.no_grad():
        full = model(torch.tensor([ids])).logits[0, -1]
        model(input_ids=torch.tensor([ids[:-1]]), use_cache=True, **{keyword: cache})
        last = model(input_ids=torch.tensor([ids[-1:]]), position_ids=torch.tensor([[len(ids) - 1]]), use_cache=True,
                     **{keyword: cache}).logits[0, -1]  # fmt: skip
    assert torch.allclose(last, full, atol=1e-5)
    # Each layer got its new keys [batch, kv_heads, new tokens, dim]; masks were sized through get_mask_sizes.
    assert ("update", (1, 2, 5, 8)) in calls and ("update", (1, 2, 1, 8)) in calls
    assert ("mask", 5) in calls and ("mask", 1) in calls


def test_support_checks_and_the_attention_shape(tiny_model, tiny_tokenizer, monkeypatch):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    api.check_supported(tiny_model)
    assert api.attention_shape(tiny_model) == (2, 8, 2)  # kv heads, head dim, layers of the tiny Llama
    config = Qwen2Config(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=16,
                         layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    with pytest.raises(ValueError, match="sliding_attention"):
        api.check_supported(Qwen2ForCausalLM(config))
    assert type(tiny_model).is_backend_compatible()
    monkeypatch.setattr(type(tiny_model), "_supports_attention_backend", False)  # what is_backend_compatible reads
    with pytest.raises(ValueError, match="attention interface"):
        api.check_supported(tiny_model)


def test_an_attention_function_with_sdpas_masks_can_hand_its_calls_to_sdpa(tiny_model):
    """Registered with ``sdpa_masks``, a function gets the masks SDPA would, so passing them on to ``transformers``'
    SDPA attention gives the model's own outputs, padded rows included."""
    model = tiny_model.eval()
    ids = torch.tensor([[5, 17, 42, 8, 99, 3], [7, 7, 21, 60, 2, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        expected = model(ids, attention_mask=attention_mask).logits
    calls = []

    def passing_on(module, query, key, value, attention_mask, **kwargs):
        calls.append(module.layer_idx)
        return api.sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    before = api.attention_implementation(model)
    api.register_attention(passing_on, "ragen_test_sdpa_masks", sdpa_masks=True)
    api.set_attention_implementation(model, "ragen_test_sdpa_masks")
    try:
        with torch.no_grad():
            got = model(ids, attention_mask=attention_mask).logits
    finally:
        api.set_attention_implementation(model, before)
    assert calls == [0, 1]
    torch.testing.assert_close(got[attention_mask.bool()], expected[attention_mask.bool()])


def test_the_last_hidden_state_comes_from_the_models_own_forward_without_logits(tiny_model):
    model = tiny_model.train()
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    decoder = model.get_decoder()
    expected = decoder(input_ids=ids).last_hidden_state  # after the final norm: what the LM head reads
    calls, head_rows = [], []
    decoder_hooks = dict(decoder._forward_hooks)
    hooks = [model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs), with_kwargs=True),
             model.lm_head.register_forward_pre_hook(lambda module, args: head_rows.append(args[0].shape[1]))]
    try:
        hidden = api.last_hidden_state(model, decoder, {"input_ids": ids})
    finally:
        for hook in hooks:
            hook.remove()
    assert torch.equal(hidden, expected)
    assert len(calls) == 1 and head_rows == [0]  # one ordinary call of the model, its LM head on no position
    assert decoder._forward_hooks == decoder_hooks  # the catching hook is gone
    hidden.sum().backward()  # the gradient reaches the weights through the model's call
    assert decoder.layers[0].self_attn.q_proj.weight.grad is not None


def test_skip_masks_makes_the_model_build_no_mask_while_it_is_true(tiny_model):
    """Registered with ``skip_masks``, a function gets ``None`` for a mask while ``skip_masks()`` is true -- even for
    position ids that restart, which ``transformers`` would read as packed sequences and build an ``[L, L]`` mask for
    -- and SDPA's masks otherwise."""
    model = tiny_model.eval()
    ids = torch.tensor([[5, 17, 42, 8, 99, 3]])
    positions = torch.tensor([[0, 1, 2, 0, 1, 2]])  # two packed sequences of three
    skip = [False]
    masks = []

    def recording(module, query, key, value, attention_mask, **kwargs):
        masks.append(attention_mask)
        return api.sdpa_attention_forward(module, query, key, value, None, is_causal=True, **kwargs)

    before = api.attention_implementation(model)
    api.register_attention(recording, "ragen_test_skip_masks", sdpa_masks=True, skip_masks=lambda: skip[0])
    api.set_attention_implementation(model, "ragen_test_skip_masks")
    try:
        with torch.no_grad():
            model(ids, position_ids=positions, use_cache=False)
            built, masks[:] = list(masks), []
            skip[0] = True
            model(ids, position_ids=positions, use_cache=False)
    finally:
        api.set_attention_implementation(model, before)
    assert built and all(isinstance(m, torch.Tensor) and m.shape[-2:] == (6, 6) for m in built)
    assert masks and all(m is None for m in masks)
