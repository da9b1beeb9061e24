"""The critic of StarPO's PPO backbone, and :class:`PolicyWithCritic`: what the update asks of policy and critic.

The critic is registered as a sub-module ``ragen_critic`` of the policy model (:func:`attach_critic`): one module, so
``accelerate``/DDP/DeepSpeed wrap, shard and all-reduce policy and critic alike, and the critic's weights sit in the
model's ``state_dict`` under ``ragen_critic.``. The checkpoint code saves the policy without the critic in Hugging Face
format and the critic next to it (:data:`CRITIC_FILE`).

* ``value_head``: one linear layer on the policy's last hidden state (shared backbone, like TRL's old
  ``AutoModelForCausalLMWithValueHead``); the value loss also shapes the backbone.
* ``value_model``: a deep copy of the policy's backbone with its own head (the reference code's separate critic);
  twice the memory, no interference with the policy.

The model's ``forward`` stays the ``transformers`` one. :class:`PolicyWithCritic` asks explicitly for what the update
needs: :meth:`~PolicyWithCritic.logprobs` (with the critic's values) and :meth:`~PolicyWithCritic.values`. A value at
position ``t`` is the value of the state *after* reading token ``t``, so ``values[:, t-1]`` is the baseline of token
``t``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils.checkpoint
from accelerate.utils import extract_model_from_parallel
from torch import nn

from ragen_trainer.engines.hf.transformers_api import last_hidden_state, text_config
from ragen_trainer.losses import entropy_from_logits
from ragen_trainer.packing import LAYOUT_KWARG, packed_forward

#: Name of the critic sub-module on the policy model, and prefix of its keys in ``state_dict``.
CRITIC_ATTR = "ragen_critic"
#: File the critic's weights are saved to, inside a checkpoint folder.
CRITIC_FILE = "critic.safetensors"
CRITIC_KINDS: tuple[str, ...] = ("value_head", "value_model")


def _hidden_size(model: nn.Module) -> int:
    cfg = text_config(model)
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
    """Register a critic of ``kind`` on ``model`` (a transformers causal LM) as its sub-module :data:`CRITIC_ATTR`.
    Idempotent: an existing critic is kept. Returns the critic."""
    if kind not in CRITIC_KINDS:
        raise ValueError(f"invalid argument critic={kind!r}: expected one of {list(CRITIC_KINDS)}")
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


@dataclass(frozen=True)
class TokenScores:
    """What :meth:`PolicyWithCritic.logprobs` computes."""

    logprobs: torch.Tensor
    """``[n]`` float32: ``log pi(target | tokens <= t)`` at each selected position ``t``, in the row-major order of
    ``select``, at the sampling temperature."""
    entropy: torch.Tensor | None
    """``[n]`` float32: the entropy of ``pi(. | tokens <= t)`` at those positions; ``None`` unless asked."""
    values: torch.Tensor | None
    """``[B, L]``: the critic's value at every position; ``None`` unless asked."""


class PolicyWithCritic:
    """The policy and its critic, asked for what the update needs: :meth:`logprobs` (with the critic's values, in the
    same pass) and :meth:`values` (the critic alone).

    ``model`` is what the trainer calls: the causal LM, or DDP / DeepSpeed's engine around it. Every pass starts with
    one ordinary call of it (:func:`~ragen_trainer.engines.hf.transformers_api.last_hidden_state`): DDP needs that
    call to all-reduce the gradients in the backward pass that follows, ZeRO-3 to gather and release the weights. The
    LM head and the critic then run as what they are, sub-modules of that model: ZeRO-3 gathers a sub-module's weights
    whenever it runs (the LM head's chunks run again in the backward pass anyway), and DDP reduces the gradient of every
    parameter the backward pass reaches.

    Only the trained positions go through the LM head. Multi-turn conversations are mostly prompt and environment
    text, and vocabularies are large (Qwen: 151k), so this keeps the trainer's memory proportional to the model's own
    tokens (TRL's fused LM head does the same for its single-turn case); the head runs in chunks recomputed in the
    backward pass (:func:`chunked_token_logprobs`), so the memory of the logits does not grow with the number of
    trained tokens either (thousands per trajectory when the prompt is trained, ``loss_mask="after_system"``).
    """

    def __init__(self, model: nn.Module, module: nn.Module | None = None) -> None:
        """``module``: the causal LM inside ``model`` (default: ``model`` unwrapped from DDP / DeepSpeed)."""
        self.model = model
        self.module = extract_model_from_parallel(model) if module is None else module
        self.critic = get_critic(self.module)
        config = text_config(self.module)
        # what some models apply to their logits after the LM head (Cohere, Gemma 2); transformers' forward does it
        self.logit_scale = getattr(config, "logit_scale", None)
        self.logit_softcap = getattr(config, "final_logit_softcapping", None)

    def hidden_states(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        """The policy's last hidden state ``[B, L, d]`` on ``inputs`` (the model's keyword arguments: ``input_ids``,
        and ``attention_mask`` or a packed layout, :meth:`ragen_trainer.packing.PackedBatch.model_inputs`)."""
        with _forward_context(inputs):
            return last_hidden_state(self.model, self.module.get_decoder(), dict(inputs))

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The policy's logits ``[..., vocab]`` from hidden states ``[..., d]``: the LM head, then the model's scale
        and soft-cap: ``logits = c * tanh(s * W h / c)``."""
        logits = self.module.get_output_embeddings()(hidden)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.logit_softcap is not None:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def logprobs(self, inputs: Mapping[str, Any], select: torch.Tensor, targets: torch.Tensor, *,
                 temperature: float = 1.0, entropy: bool = False, values: bool = False) -> TokenScores:
        """``log softmax(lm_head(h_t) / temperature)[target]`` at the positions ``t`` of ``select`` (bool ``[B, L]``;
        ``targets`` ``[n]``: the token each selected position predicts, in row-major order), the entropy there with
        ``entropy``, and with ``values`` the critic's values at every position (:meth:`values`, from the same pass
        when the critic is a value head on the policy)."""
        hidden = self.hidden_states(inputs)
        vocab = self.module.get_output_embeddings().weight.shape[0]
        logp, ent = chunked_token_logprobs(hidden[select.bool()], self.lm_head, targets, vocab=vocab,
                                           temperature=temperature, entropy=entropy)
        return TokenScores(logprobs=logp, entropy=ent, values=self._values(inputs, hidden) if values else None)

    def values(self, inputs: Mapping[str, Any]) -> torch.Tensor:
        """The critic's values ``[B, L]`` on ``inputs``, without the policy's LM head: a value head reads the policy's
        last hidden state; a separate value model runs alone, without the policy."""
        return self._values(inputs, None)

    def _values(self, inputs: Mapping[str, Any], hidden: torch.Tensor | None) -> torch.Tensor:
        if self.critic is None:
            raise ValueError("the critic's values need a critic: call attach_critic(model, kind) first")
        if isinstance(self.critic, ValueHead):
            return self.critic(self.hidden_states(inputs) if hidden is None else hidden)
        with _forward_context(inputs):
            return self.critic(**inputs)


def _forward_context(inputs: Mapping[str, Any]) -> AbstractContextManager[None]:
    """A packed row's forward builds no attention mask (:func:`ragen_trainer.packing.packed_forward`)."""
    return packed_forward() if LAYOUT_KWARG in inputs else nullcontext()


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
        logits = lm_head(h).float()
        if temperature != 1.0:
            logits = logits / temperature
        # log p(t) = z_t - logsumexp(z): the same value as log_softmax(z)[t] without writing a [chunk, vocab]
        # log_softmax (30-40 % of this function's time on SmolLM2's vocabulary, benchmarks/test_hot_paths.py scoring)
        log_z = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, t.unsqueeze(-1)).squeeze(-1) - log_z
        return logp, entropy_from_logits(logits, log_z) if entropy else logp.new_zeros(())

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
    """A deep copy of the policy without its critic (e.g. the frozen reference). Whole weights under ZeRO-3
    (:func:`whole_copy`)."""
    clone = whole_copy(model)
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
