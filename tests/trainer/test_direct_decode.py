"""HFEngine's direct decode step (``ragen_trainer.engines.hf.direct_decode``): the logits of ``transformers``' forward
without its forward, for the models it supports; every other model, and a model with hooks the step would skip,
decodes through ``transformers`` as before."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines.base import GenerationRequest, SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf.direct_decode import DirectDecoder, bypassed_hooks, unsupported_reason
from ragen_trainer.engines.hf.scheduler import HFSession
from ragen_trainer.rollout import collect_rollouts
from tests.trainer.conftest import latest_rollout


def _prompt(tokenizer, text):
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(chat, add_special_tokens=False)["input_ids"])


def _qwen2(tokenizer, dtype=torch.float32):
    """A random 2-layer Qwen2 (biases on q / k / v, the paper's model family)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(config)
        for layer in model.model.layers:  # random biases: zeros would not show a missing one
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    return model.to(dtype)


def _count_direct_steps(monkeypatch):
    calls = []
    real = DirectDecoder.step

    def step(self, *args, **kwargs):
        calls.append(len(args[1]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DirectDecoder, "step", step)
    return calls


def _prompts(tokenizer):
    # rows of very different lengths (decode segments with masks) and a repeated prompt (a group sharing columns)
    long = _prompt(tokenizer, "Turn 1:\nState:\n_ _ P O\n" * 12 + "Go left or right?")
    return [long, _prompt(tokenizer, "reward"), long, long, _prompt(tokenizer, "think, then answer")]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("share_attention", [True, False])
def test_direct_decode_samples_the_replies_of_the_transformers_forward(
    tiny_model, tiny_tokenizer, monkeypatch, family, dtype, share_attention
):
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no bfloat16 kernels")
    model = (tiny_model if family == "llama" else _qwen2(tiny_tokenizer)).to(dtype)
    assert unsupported_reason(model) is None
    prompts = _prompts(tiny_tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=7)
    options = {"batch_size": 4, "share_attention": share_attention, "stop_token_ids": [-1]}
    expected = HFEngine(model, tiny_tokenizer, direct_decode=False, **options).generate(prompts, params)
    steps = _count_direct_steps(monkeypatch)
    engine = HFEngine(model, tiny_tokenizer, **options)
    assert engine.direct_decode  # chosen by default for a supported model
    replies = engine.generate(prompts, params)
    assert steps, "the direct step never ran"
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert [r.token_ids for r in replies] == [r.token_ids for r in expected]
    for a, b in zip(expected, replies):
        assert b.logprobs == pytest.approx(a.logprobs, abs=tolerance)


def test_direct_decode_gives_the_logits_of_the_transformers_forward(tiny_tokenizer):
    """One decode step's logits, directly and through transformers, over the same batch cache: equal to float
    rounding in float32 (rows of different lengths, the shared columns of a repeated prompt read once)."""
    model = _qwen2(tiny_tokenizer).eval()
    logits = {}
    for direct in (False, True):
        engine = HFEngine(model, tiny_tokenizer, batch_size=8, direct_decode=direct)
        session = HFSession(engine, SamplingParams(temperature=0, max_new_tokens=4))
        try:
            for key, prompt in enumerate(_prompts(tiny_tokenizer)):
                session.submit(GenerationRequest(key=key, prompt=prompt))
            session.step()  # prefill and a first decode step
            cache, runner = session._cache, session._runner
            tokens = [3 + row for row in range(len(cache.lengths))]
            with torch.inference_mode():
                logits[direct] = runner.decode(cache, tokens).clone()
        finally:
            session.close()
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-5, atol=1e-5)


def test_direct_decode_runs_lora_adapters(tiny_model, tiny_tokenizer, monkeypatch):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:  # non-zero adapters, or LoRA would change nothing
            torch.nn.init.normal_(parameter, std=0.5)
    prompts = _prompts(tiny_tokenizer)[:3]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=2)
    expected = HFEngine(model, tiny_tokenizer, batch_size=4, direct_decode=False).generate(prompts, params)
    steps = _count_direct_steps(monkeypatch)
    replies = HFEngine(model, tiny_tokenizer, batch_size=4).generate(prompts, params)
    assert steps
    assert [r.token_ids for r in replies] == [r.token_ids for r in expected]
    for a, b in zip(expected, replies):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


def test_multi_turn_rollouts_are_the_same_decoded_directly(tiny_model, tiny_tokenizer):
    settings = latest_rollout(reply_tokens="sampled")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    kwargs = {"protocol": {"stop_after_answer": False, "max_turns": 4}}
    batches = [
        collect_rollouts(HFEngine(tiny_model, tiny_tokenizer, batch_size=4, direct_decode=direct), tiny_tokenizer,
                         "ragen/FrozenLake-v0", [0, 1], 2, sampling=sampling, settings=settings, env_kwargs=kwargs)
        for direct in (False, True)
    ]  # fmt: skip
    old, new = (b.trajectories for b in batches)
    assert [t.input_ids for t in new] == [t.input_ids for t in old]
    assert any(len(t.turn_spans) > 1 for t in new)
    for a, b in zip(old, new):
        assert b.old_logprobs == pytest.approx(a.old_logprobs, abs=1e-4)


def test_a_forward_hook_the_direct_step_would_skip_makes_the_engine_decode_through_transformers(
    tiny_model, tiny_tokenizer, monkeypatch
):
    layer = tiny_model.model.layers[1]
    seen = []
    handle = layer.register_forward_hook(lambda module, args, output: seen.append(1))
    try:
        assert bypassed_hooks(tiny_model) == ["model.layers.1"]
        steps = _count_direct_steps(monkeypatch)
        HFEngine(tiny_model, tiny_tokenizer, batch_size=2).generate(
            [_prompt(tiny_tokenizer, "hi")], SamplingParams(temperature=0, max_new_tokens=3)
        )
    finally:
        handle.remove()
    assert not steps and len(seen) >= 3  # the prefill and every decode step ran the layer's hook
    # hooks on the modules the step calls itself (its linear layers) do not count
    handle = tiny_model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *a: None)
    try:
        assert bypassed_hooks(tiny_model) == []
    finally:
        handle.remove()


def test_models_it_does_not_support_decode_through_transformers_and_asking_for_it_fails(tiny_tokenizer):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)  # fmt: skip
    model = Qwen3ForCausalLM(config)
    assert "qwen3" in unsupported_reason(model)
    assert HFEngine(model, tiny_tokenizer).direct_decode is False
    with pytest.raises(ValueError, match="direct_decode=True.*qwen3.*direct_decode=None"):
        HFEngine(model, tiny_tokenizer, direct_decode=True)


def test_direct_decode_is_a_checked_option(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="direct_decode.*True, False or None"):
        HFEngine(tiny_model, tiny_tokenizer, direct_decode="yes")
    assert HFEngine(tiny_model, tiny_tokenizer, direct_decode=False).direct_decode is False
