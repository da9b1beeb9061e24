"""Everything :class:`~ragen_trainer.engines.hf.HFEngine` asks of ``transformers``, in one place.

The engine runs the model with its own attention function and its own cache; these are the points where it meets
``transformers``, each through the public API:

* the attention function is registered with ``AttentionInterface.register`` and switched on and off with
  ``PreTrainedModel.set_attn_implementation`` (the model's layers then call it in place of their own);
* the cache handed to the model is a public ``Cache`` built from layers that subclass the public ``CacheLayerMixin``;
* support is read from ``PreTrainedModel.is_backend_compatible()`` (the model calls the attention interface) and the
  config's ``layer_types``; the cache keyword from the signature of the model's ``forward``.

One thing has no public form: *reading* which attention implementation a model uses (to restore it afterwards;
``set_attn_implementation`` only writes). :func:`attention_implementation` reads ``config._attn_implementation``, the
attribute ``set_attn_implementation`` writes and the model's layers read. ``tests/trainer/test_hf_transformers_api.py``
pins every behaviour this module relies on, and ``scripts/check_lower_bounds.sh`` runs it on the lowest supported
``transformers`` as well as the installed one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from transformers import AttentionInterface, Cache, CacheLayerMixin

#: The name ragen's attention function is registered under.
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


def register_attention(function: Callable[..., Any]) -> None:
    """Make ``function`` the attention implementation named :data:`ATTENTION_NAME` (idempotent).

    ``transformers`` calls it as ``function(module, query, key, value, attention_mask, scaling=..., dropout=...,
    **kwargs)`` with ``query`` / ``key`` / ``value`` ``[batch, heads, tokens, dim]`` and expects
    ``(output [batch, tokens, heads, dim], attention weights or None)``."""
    AttentionInterface.register(ATTENTION_NAME, function)


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
