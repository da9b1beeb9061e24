"""The critic of StarPO's PPO backbone: a value head on the policy's backbone, or a separate value model.

The critic is registered as a sub-module ``ragen_critic`` of the policy model, and the policy's ``forward`` learns an
extra keyword, ``return_values=True``, which adds a values tensor ``[B, L]`` (key ``critic_values``) to the output
(the value of the state *after* reading token ``t``, so ``values[:, t-1]`` is the baseline of token ``t``); see
:func:`install_policy_forward`, which also adds the memory-saving ``logits_mask``. Keeping policy and critic
in one module, called through one ``forward``, is what lets ``accelerate``/DDP/DeepSpeed wrap, shard and
all-reduce both without any special case (this is how TRL adds its fused LM head, too). The checkpoint code saves the
policy without the critic in Hugging Face format and the critic next to it (:data:`CRITIC_FILE`).

* ``value_head``: one linear layer on the policy's last hidden state (shared backbone, like TRL's old
  ``AutoModelForCausalLMWithValueHead``); the value loss also shapes the backbone.
* ``value_model``: a deep copy of the policy's backbone with its own head (the reference code's separate critic);
  twice the memory, no interference with the policy.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from transformers.utils import ModelOutput

from ragen_trainer.losses import entropy_from_logits

#: Name of the critic sub-module on the policy model, and prefix of its keys in ``state_dict``.
CRITIC_ATTR = "ragen_critic"
#: File the critic's weights are saved to, inside a checkpoint folder.
CRITIC_FILE = "critic.safetensors"
CRITIC_KINDS: tuple[str, ...] = ("value_head", "value_model")
#: The output key of the critic's values. Not ``values``: a ``ModelOutput`` is a mapping, and a key named ``values``
#: would shadow its ``.values()`` method, which DeepSpeed's engine calls on forward outputs.
VALUES_KEY = "critic_values"


def _hidden_size(model: nn.Module) -> int:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(cfg, name, None):
            return int(getattr(cfg, name))
    raise ValueError(f"cannot find the hidden size of {type(model).__name__} (no hidden_size/n_embd/d_model)")


class ValueHead(nn.Module):
    """``V(s_t) = w . h_t + b`` on the policy's last hidden state. Zero-initialised: every value starts at 0."""

    kind = "value_head"

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.summary = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.summary.weight)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.summary(hidden_states.to(self.summary.weight.dtype)).squeeze(-1)


class ValueModel(nn.Module):
    """A separate value network: a copy of the policy's backbone (transformer without LM head) plus a linear head."""

    kind = "value_model"

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = ValueHead(hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        """Values ``[B, L]``; ``kwargs`` (``position_ids``, a packed layout) go to the backbone as to the policy's."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        return self.head(out.last_hidden_state)


def whole_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` with every weight whole. Under DeepSpeed ZeRO-3 ``from_pretrained`` loads the weights
    partitioned (each process holds a shard and the tensor the module shows is empty), and a plain ``deepcopy`` would
    copy the empty tensors: the critic's backbone would have no weights. The shards are gathered for the copy; the
    engine partitions the copy's weights again when it wraps the model."""
    partitioned = [p for p in module.parameters() if hasattr(p, "ds_id")]
    if not partitioned:
        return copy.deepcopy(module)
    import deepspeed  # optional dependency: only a model already partitioned by DeepSpeed gets here

    with deepspeed.zero.GatheredParameters(partitioned):
        return copy.deepcopy(module)


def attach_critic(model: nn.Module, kind: str) -> nn.Module:
    """Register a critic of ``kind`` on ``model`` (a transformers causal LM) and install the policy forward that
    can return values (:func:`install_policy_forward`). Idempotent: an existing critic is kept. Returns the critic."""
    if kind not in CRITIC_KINDS:
        raise ValueError(f"invalid argument critic={kind!r}: expected one of {list(CRITIC_KINDS)}")
    install_policy_forward(model)
    existing = getattr(model, CRITIC_ATTR, None)
    if existing is not None:
        return existing
    hidden = _hidden_size(model)
    if kind == "value_head":
        critic: nn.Module = ValueHead(hidden)
    else:
        critic = ValueModel(whole_copy(model.get_decoder() if hasattr(model, "get_decoder") else model.base_model),
                            hidden)
    param = next(model.parameters())
    critic.to(device=param.device, dtype=param.dtype if kind == "value_model" else torch.float32)
    model.add_module(CRITIC_ATTR, critic)
    return critic


def install_policy_forward(model: nn.Module) -> None:
    """Teach ``model.forward`` two keywords (idempotent; without them the forward is the original one):

    * ``logits_mask`` (bool ``[B, L]``): run the backbone, then the LM head only on the selected positions, and
      return ``selected_logits`` ``[n, vocab]`` (row-major order of the mask) instead of ``[B, L, vocab]`` logits.
      Multi-turn conversations are mostly prompt and environment text, and vocabularies are large (Qwen: 151k), so
      this is what keeps the trainer's memory proportional to the model's own tokens (TRL's fused LM head does the
      same for its single-turn case).
    * ``token_targets`` (``[n]``, with ``logits_mask``): instead of the logits, return ``selected_logprobs`` (each
      selected position's log-prob of its target at ``temperature``) and, with ``token_entropy=True``,
      ``selected_entropy``, computed in chunks of positions whose ``[chunk, vocab]`` logits are recomputed in the
      backward pass rather than kept (:func:`chunked_token_logprobs`): the memory of the logits no longer grows with
      the number of trained tokens (thousands per trajectory when the prompt is trained, ``loss_mask="after_system"``).
    * ``return_values=True``: add the critic's values ``[B, L]`` (key :data:`VALUES_KEY`); ``values_only=True``:
      return only them (a separate value model then runs alone, without the policy).

    Both happen inside ``forward``, so DDP / DeepSpeed see one ordinary forward call.
    """
    if getattr(model, "_ragen_forward_installed", False):
        return
    original_forward = model.forward
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    softcap = getattr(text_config, "final_logit_softcapping", None)
    scale = getattr(text_config, "logit_scale", None)

    def lm_head(hidden: torch.Tensor) -> torch.Tensor:
        logits = model.get_output_embeddings()(hidden)
        if scale is not None:
            logits = logits * scale
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    @functools.wraps(type(model).forward)
    def forward(*args: Any, return_values: bool = False, logits_mask: torch.Tensor | None = None,
                values_only: bool = False, token_targets: torch.Tensor | None = None, temperature: float = 1.0,
                token_entropy: bool = False, **kwargs: Any) -> Any:
        if logits_mask is None and not return_values and not values_only:
            return original_forward(*args, **kwargs)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        head = getattr(model, CRITIC_ATTR, None)
        # what the backbones take besides the ids and the mask: position ids, a packed layout (ragen_trainer.packing)
        extra = {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask", "output_hidden_states")}
        if values_only:
            if head is None:
                raise ValueError("values_only=True needs a critic: call attach_critic(model, kind) first")
            if isinstance(head, ValueHead):
                hidden = model.get_decoder()(input_ids=input_ids, attention_mask=kwargs.get("attention_mask"),
                                             use_cache=False, **extra).last_hidden_state
                return ModelOutput({VALUES_KEY: head(hidden)})
            return ModelOutput({VALUES_KEY: head(input_ids, kwargs.get("attention_mask"), **extra)})
        if logits_mask is None:  # full logits plus values
            kwargs["output_hidden_states"] = True
            out = original_forward(*args, **kwargs)
            hidden = out.hidden_states[-1]
        else:
            decoder = model.get_decoder()
            out = decoder(input_ids=input_ids, attention_mask=kwargs.get("attention_mask"), use_cache=False, **extra)
            hidden = out.last_hidden_state
            selected = hidden[logits_mask.bool()]
            if token_targets is not None:
                logprobs, entropy = chunked_token_logprobs(
                    selected, lm_head, token_targets, vocab=model.get_output_embeddings().weight.shape[0],
                    temperature=temperature, entropy=token_entropy)
                out = ModelOutput(selected_logprobs=logprobs)
                if entropy is not None:
                    out["selected_entropy"] = entropy
            else:
                out = ModelOutput(selected_logits=lm_head(selected))
        if return_values:
            if head is None:
                raise ValueError("return_values=True needs a critic: call attach_critic(model, kind) first")
            if isinstance(head, ValueHead):
                out[VALUES_KEY] = head(hidden)
            else:
                out[VALUES_KEY] = head(input_ids, kwargs.get("attention_mask"), **extra)
        return out

    model.forward = forward
    model._ragen_forward_installed = True


#: Logit entries (positions x vocabulary) computed at once by :func:`chunked_token_logprobs`: 2**25 float32 values,
#: 128 MB (about 680 positions of SmolLM2's 49k vocabulary, 220 of Qwen2.5's 152k).
LOGITS_CHUNK_ELEMENTS = 2**25


def chunked_token_logprobs(hidden: torch.Tensor, lm_head: Callable[[torch.Tensor], torch.Tensor],
                           targets: torch.Tensor, *, vocab: int, temperature: float = 1.0, entropy: bool = False,
                           chunk_elements: int = LOGITS_CHUNK_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(lm_head(hidden) / temperature)[target]`` per row of ``hidden`` (``[n, d]``), and the entropy of
    that distribution, chunk by chunk: each chunk's ``[chunk, vocab]`` logits live only inside it, and with gradients
    on, the chunk is recomputed in the backward pass (activation checkpointing of the LM head), so memory is one
    chunk's logits whatever ``n`` is. Returns float32 ``[n]`` tensors (entropy ``None`` unless asked)."""

    def piece(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = lm_head(h).float() / temperature
        logp = torch.log_softmax(logits, dim=-1).gather(-1, t.unsqueeze(-1)).squeeze(-1)
        return logp, entropy_from_logits(logits) if entropy else logp.new_zeros(())

    n = hidden.shape[0]
    rows = max(1, chunk_elements // max(vocab, 1))
    logps, ents = [], []
    for start in range(0, max(n, 1), rows):
        h, t = hidden[start:start + rows], targets[start:start + rows]
        if torch.is_grad_enabled() and h.requires_grad:
            logp, ent = torch.utils.checkpoint.checkpoint(piece, h, t, use_reentrant=False)
        else:
            logp, ent = piece(h, t)
        logps.append(logp)
        ents.append(ent)
    logp = torch.cat(logps) if len(logps) > 1 else logps[0]
    return logp, (torch.cat(ents) if len(ents) > 1 else ents[0]) if entropy else None


def policy_copy(model: nn.Module) -> nn.Module:
    """A deep copy of the policy without its critic and with the plain ``forward`` (e.g. the frozen reference):
    a copied patched ``forward`` would still call the original model. Whole weights under ZeRO-3 (:func:`whole_copy`)."""
    clone = whole_copy(model)
    clone.__dict__.pop("forward", None)
    clone.__dict__.pop("_ragen_forward_installed", None)
    if getattr(clone, CRITIC_ATTR, None) is not None:
        delattr(clone, CRITIC_ATTR)
    return clone


def get_critic(model: nn.Module) -> nn.Module | None:
    return getattr(model, CRITIC_ATTR, None)


def split_state_dict(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(policy_state, critic_state)``: the critic's keys (prefix ``ragen_critic.``) go to the second, unprefixed."""
    prefix = CRITIC_ATTR + "."
    policy = {k: v for k, v in state_dict.items() if not k.startswith(prefix) and f".{prefix}" not in k}
    critic = {}
    for k, v in state_dict.items():
        if k.startswith(prefix):
            critic[k[len(prefix):]] = v
        elif f".{prefix}" in k:  # wrapped (e.g. a PEFT base_model.model.ragen_critic...)
            critic[k.split(f".{prefix}", 1)[1]] = v
    return policy, critic


def save_critic(critic_state: dict[str, torch.Tensor], folder: str | Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in critic_state.items()}, str(Path(folder) / CRITIC_FILE))


def load_critic(model: nn.Module, folder: str | Path) -> bool:
    """Load ``critic.safetensors`` from ``folder`` into ``model``'s critic; ``False`` when either is missing."""
    critic = get_critic(model)
    path = Path(folder) / CRITIC_FILE
    if critic is None or not path.is_file():
        return False
    from safetensors.torch import load_file

    critic.load_state_dict(load_file(str(path), device=str(next(critic.parameters()).device)))
    return True
