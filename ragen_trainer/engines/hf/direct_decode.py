"""A decode step run straight over a Llama-family model's modules, without ``transformers``' forward: the same
arithmetic in fewer calls.

Why. A decode step of a small model on a CPU is mostly overhead, not arithmetic: for SmolLM2-135M at batch 8 about
a third of a step (one thread) went to ~1,500 small kernels and the Python between them (``transformers``' forward
builds masks and cache wrappers, dispatches through decorators, hooks and output recorders, and writes RMSNorm as six
kernels and rotary embedding as a dozen). This module runs the step as the model's own equations, layer by layer:

    h_0 = E[x_t]
    for each layer l:
        a = RMSNorm_l(h)                                    (one fused kernel, ``F.rms_norm``, in float32)
        q, k, v = a W_q, a W_k, a W_v                       (the model's own linear modules: packed, LoRA, ... apply)
        q, k = RoPE(q, t), RoPE(k, t)                       (cos / sin from the model's own rotary module, once a step)
        K[:, t], V[:, t] = k, v                             (written in place in the batch cache)
        h = h + softmax(q K^T / sqrt(d)) V W_o             (attention by the step's DecodePlan: segments, cascade)
        b = RMSNorm'_l(h)
        h = h + (act(b W_gate) * b W_up) W_down
    logits = RMSNorm(h) W_lm_head

which is what ``LlamaModel`` / ``Qwen2Model`` compute for one token per row: the results equal the ``transformers``
forward's up to float rounding (the fused RMSNorm sums in another order; tests compare the two on the same cache).
Prefill (many tokens a pass, matmul-bound) still runs through ``transformers``' forward.

Which models (:func:`unsupported_reason`): ``model_type`` ``llama`` or ``qwen2`` (SmolLM2, Qwen2.5: the paper's
models), every layer full attention, no query / key norms, RMSNorm layers with a weight and ``variance_epsilon``,
parameters not partitioned by DeepSpeed ZeRO-3. Any other model decodes through ``transformers``' forward as before.

Hooks. The linear, embedding and activation modules are called as modules, so their hooks run (LoRA layers, packed
weights, quantised linears all work). The modules this step does not call -- the model, its decoder, the decoder
layers, attention, MLP and norm modules -- would silently skip a forward hook registered on them (a logits processor
hooked on the model, a probe on a layer): while any has one, the engine decodes through ``transformers``' forward
(:func:`bypassed_hooks`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ragen_trainer.engines.hf import transformers_api
from ragen_trainer.engines.hf.cache import BatchCache, DecodeStep

#: ``config.model_type`` values whose decoder layers :class:`DirectDecoder` computes: pre-norm RMSNorm, rotary
#: embedding, grouped-query attention (biases on q / k / v for Qwen2 live in the linear modules), SwiGLU MLP.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def unsupported_reason(model: Any) -> str | None:
    """Why :class:`DirectDecoder` cannot run ``model`` (``None`` when it can)."""
    base = transformers_api.base_model(model)
    config = transformers_api.text_config(model)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    decoder = getattr(base, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if decoder is None or not all(hasattr(decoder, name) for name in needed):
        return f"{type(base).__name__} has no .model with {', '.join(needed)}"
    if base.get_output_embeddings() is None:
        return f"{type(base).__name__} has no output embeddings (LM head)"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "it has layers other than full attention"
    norms = [decoder.norm]
    for layer in decoder.layers:
        attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attention is None or mlp is None:
            return f"{type(layer).__name__} has no self_attn / mlp"
        if not all(hasattr(attention, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")):
            return f"{type(attention).__name__} is not q / k / v / o projections"
        if hasattr(attention, "q_norm") or hasattr(attention, "k_norm"):
            return f"{type(attention).__name__} normalises queries and keys"
        if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return f"{type(mlp).__name__} is not a gated MLP"
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
    if not all(isinstance(getattr(n, "weight", None), torch.Tensor) and hasattr(n, "variance_epsilon") for n in norms):
        return "its norms are not RMSNorm layers with a weight and variance_epsilon"
    if any(hasattr(p, "ds_id") for p in base.parameters()):
        return "its parameters are partitioned by DeepSpeed ZeRO-3"
    return None


def bypassed_hooks(model: Any) -> list[str]:
    """The modules of ``model`` with forward hooks that :class:`DirectDecoder` would not run: every module it does not
    call as a module (the model and its wrappers, the decoder, its layers, their attention / MLP / norm modules), by
    name, plus ``"global"`` when a global module hook is registered."""
    called = set()
    base = transformers_api.base_model(model)
    decoder = base.model
    for layer in decoder.layers:
        attention, mlp = layer.self_attn, layer.mlp
        called.update(id(m) for m in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj))
        called.update(id(m) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn))
    called.update((id(decoder.embed_tokens), id(decoder.rotary_emb), id(base.get_output_embeddings())))
    hooked = [name or type(model).__name__ for name, module in _modules_outside(model, called)
              if module._forward_hooks or module._forward_pre_hooks]  # fmt: skip
    globals_ = torch.nn.modules.module
    if globals_._global_forward_hooks or globals_._global_forward_pre_hooks:
        hooked.append("global")
    return hooked


def _modules_outside(model: Any, called: set[int]) -> list[tuple[str, Any]]:
    """``model``'s named modules that are not inside a module this step calls (``called``: their ids)."""
    out, skip = [], []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in skip):
            continue
        if id(module) in called:
            skip.append(name + ".")
            continue
        out.append((name, module))
    return out


class DirectDecoder:
    """One decode step of a Llama-family ``model`` (:func:`unsupported_reason` is ``None``) over ragen's batch cache:
    the module docstring's equations, read from the model's live modules at every step (a training step between
    sessions, LoRA adapters, packed weights are all seen)."""

    def __init__(self, model: Any) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"invalid argument model={type(model).__name__}: direct decode cannot run it ({reason})")
        base = transformers_api.base_model(model)
        decoder = base.model
        self.embed = decoder.embed_tokens
        self.layers = list(decoder.layers)
        self.norm = decoder.norm
        self.rotary = decoder.rotary_emb
        self.head = base.get_output_embeddings()
        config = transformers_api.text_config(model)
        self.heads = config.num_attention_heads
        self.kv_heads, self.head_dim, _ = transformers_api.attention_shape(model)

    def step(self, cache: BatchCache, inputs: torch.Tensor, step: DecodeStep, plan: Any) -> torch.Tensor:
        """Run ``inputs`` ``[rows]`` (one token per row of ``cache``) at the rows' positions, write their keys and
        values at ``step``'s columns, attend as ``plan`` (a :class:`~ragen_trainer.engines.hf.runner.DecodePlan`)
        says; return the logits ``[rows, vocab]``."""
        rows, heads, kv_heads, dim = inputs.shape[0], self.heads, self.kv_heads, self.head_dim
        hidden = self.embed(inputs)  # [rows, hidden]
        cos, sin = self.rotary(hidden, step.positions)  # [rows, 1, dim]: broadcast over the heads
        for index, layer in enumerate(self.layers):
            attention, mlp = layer.self_attn, layer.mlp
            normed = rms_norm(layer.input_layernorm, hidden)
            query = rotate(attention.q_proj(normed).view(rows, heads, dim), cos, sin)
            key = rotate(attention.k_proj(normed).view(rows, kv_heads, dim), cos, sin)
            value = attention.v_proj(normed).view(rows, kv_heads, dim)
            keys, values = cache.keys[index], cache.values[index]
            keys[step.rows, :, step.lengths] = key
            values[step.rows, :, step.lengths] = value
            attended = plan.attend(
                attention, query[:, :, None], keys[:rows, :, : step.window], values[:rows, :, : step.window], None,
                attention.scaling,
            )  # fmt: skip
            hidden = hidden + attention.o_proj(attended.reshape(rows, heads * dim))
            normed = rms_norm(layer.post_attention_layernorm, hidden)
            hidden = hidden + mlp.down_proj(mlp.act_fn(mlp.gate_proj(normed)) * mlp.up_proj(normed))
        return self.head(rms_norm(self.norm, hidden))


def rms_norm(norm: Any, hidden: torch.Tensor) -> torch.Tensor:
    """``transformers``' ``LlamaRMSNorm``: normalised in float32, rounded to the input's dtype, times the weight
    (fused into one kernel when everything is float32)."""
    shape = (hidden.shape[-1],)
    if hidden.dtype == torch.float32 and norm.weight.dtype == torch.float32:
        return F.rms_norm(hidden, shape, norm.weight, norm.variance_epsilon)
    return norm.weight * F.rms_norm(hidden.float(), shape, None, norm.variance_epsilon).to(hidden.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, ``transformers``' ``apply_rotary_pos_emb``: ``x cos + rotate_half(x) sin`` with
    ``rotate_half([x1, x2]) = [-x2, x1]``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
