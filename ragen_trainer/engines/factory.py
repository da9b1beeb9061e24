"""The rollout engine a training run's config asks for (``engine`` / ``engine_url``), built in one place.

    engine = make_training_engine(config, model, tokenizer)
    ...
    engine.update_weights(policy)   # before every rollout, training and validation alike

``hf`` and ``hf-generate`` run on the policy itself. ``vllm`` without ``engine_url`` is a
:class:`~ragen_trainer.engines.vllm.VLLMEngine` in colocate mode: a ``vllm.LLM`` in the trainer's process that loads
``config.model`` (the base model of a LoRA folder) once, then receives the policy's weights through
``update_weights``: before the first rollout too, so a resumed run samples from its checkpoint's weights, not from
``config.model``'s. With ``engine_url`` it is server mode against that vLLM server, with ``weight_sync="auto"`` (NCCL
from a CUDA policy to a server with a weight-transfer engine; else the weights are written to
``<output_dir>/vllm-weights/`` for the server to reload, which needs the server to see that folder).
"""

from __future__ import annotations

import os
from typing import Any

from ragen_trainer.checkpoints.layout import VLLM_WEIGHTS_DIR
from ragen_trainer.config import StarPOConfig
from ragen_trainer.engines.base import GenerationEngine
from ragen_trainer.engines.choice import choose_engine
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf_generate import GenerateEngine
from ragen_trainer.engines.vllm import VLLMEngine
from ragen_trainer.models import base_model_source
from ragen_trainer.precision import compute_dtype


def training_engine_choice(config: StarPOConfig, model: Any) -> tuple[str, str]:
    """The engine ``config.engine`` resolves to for the policy ``model`` (``auto``: :mod:`~ragen_trainer.engines.choice`'s
    rule), and why."""
    return choose_engine(config.engine, next(iter(model.parameters())).device, engine_url=config.engine_url)


def make_training_engine(config: StarPOConfig, model: Any, tokenizer: Any) -> GenerationEngine:
    """The generation engine ``config.engine`` names (``auto`` resolved by :func:`training_engine_choice`), for the
    policy ``model`` and its ``tokenizer``.

    The caller must call ``engine.update_weights(policy)`` before every rollout (the policy without its critic, its
    float32 master weights; a peft model is merged for the push by the vLLM engine). For ``hf`` that is a no-op, for
    ``vllm`` it is what keeps the rollouts on-policy."""
    name, _ = training_engine_choice(config, model)
    if name in ("hf", "hf-generate"):
        engine_cls = GenerateEngine if name == "hf-generate" else HFEngine
        return engine_cls(model, tokenizer, batch_size=config.generation_batch_size)
    if name != "vllm":
        raise ValueError(f"invalid config field engine={config.engine!r}: expected auto, hf, hf-generate or vllm")
    if config.engine_url:
        return VLLMEngine(
            config.model,
            tokenizer,
            mode="server",
            base_url=config.engine_url,
            weight_sync="auto",
            weights_dir=os.path.join(config.output_dir, VLLM_WEIGHTS_DIR),
        )
    device = next(iter(model.parameters())).device
    return VLLMEngine(
        base_model_source(config.model),
        tokenizer,
        mode="colocate",
        # A whole conversation (its context limit) plus the reply being written.
        max_model_len=config.max_context_tokens + config.max_new_tokens,
        # vLLM generates in the run's compute dtype (bf16 on a GPU, as the reference's rollouts); it gets the float32
        # master weights at every push and casts them.
        dtype=str(compute_dtype(config.dtype, device)).removeprefix("torch."),
        llm_kwargs={"seed": config.seed},
    )
