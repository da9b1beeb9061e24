"""Everything ragen asks of ``transformers`` beyond its model classes, in one place.

Three parts of ragen run a model in ways ``transformers`` offers no ready-made call for, and each meets it here:

* :class:`~ragen_trainer.engines.hf.HFEngine` runs the model with its own attention function and its own cache: the
  attention function is registered with ``AttentionInterface.register`` and switched on and off with
  ``PreTrainedModel.set_attn_implementation`` (the model's layers then call it in place of their own); the cache
  handed to the model is a public ``Cache`` built from layers that subclass the public ``CacheLayerMixin``; support is
  read from ``PreTrainedModel.is_backend_compatible()`` (the model calls the attention interface) and the config's
  ``layer_types``; the cache keyword from the signature of the model's ``forward``.
* the trainer's packed micro-batches (:mod:`ragen_trainer.packing`) register a second attention function, with the
  masks ``transformers`` builds for SDPA (``AttentionMaskInterface``, ``sdpa_mask``) and ``transformers``' own SDPA
  attention (``sdpa_attention_forward``) for calls without a packed layout;
* the policy's log-probs and values (:class:`ragen_trainer.critic.PolicyWithCritic`) start from the last hidden state
  of the model's own ``forward`` with its LM head on no position (``logits_to_keep``): :func:`last_hidden_state`.

Two things have no public form: *reading* which attention implementation a model uses (to restore it afterwards;
``set_attn_implementation`` only writes), which :func:`attention_implementation` reads from
``config._attn_implementation``, the attribute ``set_attn_implementation`` writes and the model's layers read; and the
two functions of ``transformers``' sub-modules the packed attention builds on (``sdpa_mask``,
``sdpa_attention_forward``). ``tests/trainer/test_hf_transformers_api.py`` pins every behaviour this module relies
on, and ``scripts/check_lower_bounds.sh`` runs it on the lowest supported ``transformers`` as well as the installed
one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface, Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

#: The name HFEngine's attention function is registered under (the default of :func:`register_attention`).
ATTENTION_NAME = "ragen"


def base_model(model: Any) -> Any:
    """The ``transformers`` model itself (a ``peft`` model wraps one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def text_config(model: Any) -> Any:
    """The config of ``model``'s language model (the text part of a multimodal config)."""
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def check_supported(model: Any) -> None:
    """Refuse, with the engine that handles them, models HFEngine would run wrong: the batch cache gives every layer
    the whole sequence (no sliding-window or linear-attention layers), and the engine attends through
    ``transformers``' attention interface, which the model must call."""
    other = sorted({t for t in (getattr(text_config(model), "layer_types", None) or []) if t != "full_attention"})
    if other:
        raise ValueError(
            f"invalid argument model={type(model).__name__}: it has {', '.join(other)} layers; HFEngine supports "
            "models whose layers all use full attention. Use the hf-generate engine (GenerateEngine) or vllm."
        )
    base = base_model(model)
    compatible = getattr(base, "is_backend_compatible", None)
    if not (callable(compatible) and compatible()):
        raise ValueError(
            f"invalid argument model={type(base).__name__}: it does not use transformers' attention interface "
            "(is_backend_compatible() is false), which HFEngine needs. Use the hf-generate engine (GenerateEngine) "
            "or vllm."
        )


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes a cache under: ``cache`` in recent ``transformers`` (where
    ``past_key_values``, the older name, warns that it is deprecated), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(base_model(model).forward).parameters else "past_key_values"


def attention_shape(model: Any) -> tuple[int, int, int]:
    """Key/value heads, head dimension and layer count of ``model``'s attention."""
    config = text_config(model)
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, dim, config.num_hidden_layers


def register_attention(function: Callable[..., Any], name: str = ATTENTION_NAME, *, sdpa_masks: bool = False,
                       skip_masks: Callable[[], bool] | None = None) -> None:
    """Make ``function`` the attention implementation named ``name`` (idempotent).

    ``transformers`` calls it as ``function(module, query, key, value, attention_mask, scaling=..., dropout=...,
    **kwargs)`` with ``query`` / ``key`` / ``value`` ``[batch, heads, tokens, dim]`` and expects
    ``(output [batch, tokens, heads, dim], attention weights or None)``. With ``sdpa_masks`` the model builds the
    ``attention_mask`` it passes as it would for SDPA (so the function can hand unusual calls to
    :func:`sdpa_attention_forward`), except while ``skip_masks()`` is true: then it builds none and passes ``None``
    (for calls the function masks by itself); without ``sdpa_masks``, ``transformers``' default for a name it does
    not know."""
    AttentionInterface.register(name, function)
    if sdpa_masks:
        AttentionMaskInterface.register(name, sdpa_mask if skip_masks is None else _sdpa_mask_unless(skip_masks))


def _sdpa_mask_unless(skip: Callable[[], bool]) -> Callable[..., Any]:
    def mask(*args: Any, **kwargs: Any) -> Any:
        return None if skip() else sdpa_mask(*args, **kwargs)

    return mask


def attention_implementation(model: Any) -> str | None:
    """The attention implementation ``model`` runs with (``"sdpa"``, ``"eager"``, a registered name...).

    The one read of a private attribute: ``transformers`` has no public getter, and this is the attribute
    ``set_attn_implementation`` writes and every attention layer reads."""
    return base_model(model).config._attn_implementation


def set_attention_implementation(model: Any, name: str | None) -> None:
    """Switch ``model`` (and its sub-models) to the attention implementation ``name``; a registered name must be
    registered first (:func:`register_attention`). Raises ``ValueError`` when the model did not switch (a model
    class that ``transformers`` cannot switch dynamically only logs a warning)."""
    base = base_model(model)
    base.set_attn_implementation(name)
    if name is not None and attention_implementation(base) != name:
        raise ValueError(
            f"invalid argument model={type(base).__name__}: transformers could not switch its attention "
            f"implementation to {name!r} (set_attn_implementation left it at {attention_implementation(base)!r}), "
            "which HFEngine needs. Use the hf-generate engine (GenerateEngine) or vllm."
        )


def last_hidden_state(model: Any, decoder: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """The last hidden state ``[batch, tokens, hidden]`` of a causal LM on ``inputs`` (after the final norm: what its
    LM head reads), from one ordinary call of ``model`` -- the causal LM itself, or DDP / DeepSpeed's engine around
    it, which need that call (DDP to all-reduce the gradients in the backward pass, ZeRO-3 to gather the weights).

    The model's own LM head runs on no position (``logits_to_keep``, an empty index), and the hidden state is caught
    on its way out of ``decoder`` (the model's transformer, ``get_decoder()``) by a forward hook; asking for it with
    ``output_hidden_states`` would keep every layer's hidden state until the call returns."""
    caught: list[torch.Tensor] = []
    # registered after DeepSpeed's hooks, so it catches the output the model goes on with (ZeRO-3 wraps a module's
    # outputs to gather its weights again in the backward pass)
    hook = decoder.register_forward_hook(lambda module, args, output: caught.append(output.last_hidden_state))
    try:
        no_position = torch.empty(0, dtype=torch.long, device=inputs["input_ids"].device)
        model(**inputs, use_cache=False, logits_to_keep=no_position)
    finally:
        hook.remove()
    return caught[0]


class CacheLayer(CacheLayerMixin):
    """A layer of a cache that HFEngine keeps itself: its storage exists before the pass (nothing to initialise
    lazily), it holds the whole sequence (no sliding window) and has no fixed length. Subclasses implement
    ``update``, ``get_seq_length`` and ``get_mask_sizes``."""

    is_sliding = False
    is_compileable = False

    def __init__(self) -> None:
        super().__init__()
        self.is_initialized = True

    def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
        """Nothing to do: the engine allocated the storage."""

    def get_max_length(self) -> int:
        return -1


def cache_of(layers: list[CacheLayer]) -> Any:
    """A ``transformers`` cache made of ``layers`` (one per model layer), to pass to the model's forward."""
    return Cache(layers=layers)


__all__ = [
    "ATTENTION_NAME",
    "CacheLayer",
    "attention_implementation",
    "attention_shape",
    "base_model",
    "cache_keyword",
    "cache_of",
    "check_supported",
    "last_hidden_state",
    "register_attention",
    "sdpa_attention_forward",
    "set_attention_implementation",
    "text_config",
]
