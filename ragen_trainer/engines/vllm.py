"""Generation with vLLM, the way TRL drives it: ``colocate`` (a ``vllm.LLM`` in the trainer's process, sharing the
GPU) or ``server`` (a ``trl vllm-serve`` process, reached through TRL's ``VLLMClient``).

Optional extra (``pip install 'ragen[vllm]'``, GPU only): nothing here imports vLLM until an engine is made, and a
missing vLLM gives a clear error.

Token ids in, token ids out: prompts are sent as ``prompt_token_ids`` and the completion's ``token_ids`` come back
verbatim (vLLM keeps the stop / eos token in them), with the sampled tokens' log-probabilities (``logprobs=0``).
Per-prompt seeds are ``seed + row``: with one seed for the whole batch, the N identical first prompts of a group would
sample identical replies.

On-policy weights: :meth:`VLLMEngine.update_weights` pushes the trainer model's current weights into vLLM after each
optimiser step (colocate: ``model_runner.model.load_weights``; server: TRL's NCCL weight transfer, which needs a CUDA
device), then resets vLLM's prefix cache. A ``peft`` model is merged for the push and unmerged after.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import FINISH_LENGTH, FINISH_STOP, GenerationEngine, GenerationResult, SamplingParams

VLLM_MODES = ("colocate", "server")


def require_vllm() -> Any:
    """Import and return ``vllm``, or raise an ``ImportError`` that says how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "VLLMEngine needs vLLM, which is not installed: pip install 'ragen[vllm]' (Linux with a CUDA GPU). "
            "Without a GPU use HFEngine (the default), or OpenAIEngine to evaluate a served model."
        ) from exc
    return vllm


def vllm_sampling_kwargs(params: SamplingParams, stop_token_ids: list[int], seed: int | None) -> dict[str, Any]:
    """The ``vllm.SamplingParams`` keyword arguments for one prompt."""
    return {
        "n": 1,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # -1 = off (every vLLM version accepts it)
        "max_tokens": params.max_new_tokens,
        "seed": seed,
        "logprobs": 0,  # only the sampled token's log-prob
        "stop_token_ids": list(stop_token_ids),
        "skip_special_tokens": True,
    }


def named_weights_for_vllm(model: Any) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` pairs vLLM's ``load_weights`` understands; a peft model must already be merged.

    peft prefixes names with ``base_model.model.`` and wraps adapted layers in ``.base_layer``; the LoRA matrices
    themselves are skipped (merged into the base weights), and so is the critic's value head (``ragen_critic.*``),
    which is not part of the language model vLLM serves.
    """
    for name, tensor in model.state_dict().items():
        if "lora_" in name or ("modules_to_save" in name and "original_module" in name) or "ragen_critic." in name:
            continue
        clean = name.removeprefix("base_model.model.").replace(".base_layer", "")
        clean = clean.replace("modules_to_save.default.", "")
        yield clean, tensor.detach()


def _finish_reason(reason: str | None, token_ids: list[int], stops: set[int], max_tokens: int) -> str:
    if reason in (FINISH_STOP, FINISH_LENGTH):
        return reason
    if token_ids and token_ids[-1] in stops:
        return FINISH_STOP
    return FINISH_LENGTH if len(token_ids) >= max_tokens else FINISH_STOP


class VLLMEngine(GenerationEngine):
    """Sample with vLLM (colocate or server mode).

    Args:
        model: the model to serve: a Hugging Face id or folder, ``None`` for the bundled default (its converted cache
            folder), or a loaded model (its ``name_or_path`` is used).
        tokenizer: the policy's tokenizer (stop tokens, decoding); ``None`` loads the one of ``model``.
        mode: ``"colocate"`` (a ``vllm.LLM`` in this process) or ``"server"`` (``trl vllm-serve`` elsewhere).
        gpu_memory_utilization, tensor_parallel_size, max_model_len, dtype, enable_sleep_mode: ``vllm.LLM`` settings
            (colocate); ``llm_kwargs`` passes any other.
        base_url / host / server_port / group_port / connection_timeout: where the server is (server mode; see
            ``trl.generation.vllm_client.VLLMClient``).
        stop_token_ids: ids that end a reply; default: eos plus known end-of-turn tokens.
        llm / client / sampling_params_factory: ready objects to use instead of building them (tests, custom setups).
    """

    supports_token_ids = True
    name = "vllm"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        mode: str = "colocate",
        gpu_memory_utilization: float = 0.3,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enable_sleep_mode: bool = False,
        llm_kwargs: dict[str, Any] | None = None,
        base_url: str | None = None,
        host: str = "127.0.0.1",
        server_port: int = 8000,
        group_port: int = 51216,
        connection_timeout: float = 0.0,
        stop_token_ids: list[int] | None = None,
        concurrency: int = 16,
        llm: Any = None,
        client: Any = None,
        sampling_params_factory: Callable[..., Any] | None = None,
    ) -> None:
        from ragen_trainer.models import stop_token_ids as default_stops

        check_arg(mode in VLLM_MODES, "mode", mode, f"one of {VLLM_MODES}")
        check_arg(
            0 < gpu_memory_utilization <= 1, "gpu_memory_utilization", gpu_memory_utilization, "a number in (0, 1]"
        )
        check_arg(
            isinstance(tensor_parallel_size, int) and tensor_parallel_size >= 1,
            "tensor_parallel_size",
            tensor_parallel_size,
            "an int >= 1",
        )
        needs_vllm = (
            (mode == "colocate" and llm is None)
            or (mode == "server" and client is None)
            or sampling_params_factory is None
        )
        vllm = require_vllm() if needs_vllm else None  # before anything slow: a missing vLLM fails first
        self.mode = mode
        from ragen_trainer.models import convert_default_model, is_default_model

        if model is None or (isinstance(model, str) and is_default_model(model)):
            model = str(convert_default_model())  # the bundled SmolLM2, as a Hugging Face folder vLLM can read
        self.model_path = model if isinstance(model, str) else str(getattr(model, "name_or_path", ""))
        check_arg(self.model_path != "", "model", model, "a model id / folder, or a model with name_or_path")
        if tokenizer is None:
            from ragen_trainer.models import load_tokenizer

            tokenizer = load_tokenizer(self.model_path)
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids is not None else default_stops(tokenizer)
        self.concurrency = concurrency
        self.enable_sleep_mode = enable_sleep_mode
        self.llm = llm
        self.client = client
        self._communicator_ready = False
        self._sampling_params = sampling_params_factory or vllm.SamplingParams
        if mode == "colocate" and self.llm is None:
            kwargs: dict[str, Any] = {
                "model": self.model_path,
                "tensor_parallel_size": tensor_parallel_size,
                "gpu_memory_utilization": gpu_memory_utilization,
                "max_model_len": max_model_len,
                "dtype": dtype,
                "enable_sleep_mode": enable_sleep_mode,
                # Temperature applied before the log-probs are taken, matching what the trainer recomputes.
                "logprobs_mode": "processed_logprobs",
            }
            kwargs.update(llm_kwargs or {})
            try:
                self.llm = vllm.LLM(**kwargs)
            except TypeError:  # vLLM older than logprobs_mode
                kwargs.pop("logprobs_mode", None)
                self.llm = vllm.LLM(**kwargs)
        if mode == "server" and self.client is None:
            from trl.generation.vllm_client import VLLMClient

            self.client = VLLMClient(
                base_url=base_url,
                host=host,
                server_port=server_port,
                group_port=group_port,
                connection_timeout=connection_timeout,
            )

    # ------------------------------------------------------------------------------------------------ generation
    def _seeds(self, params: SamplingParams, n: int) -> list[int | None]:
        return [None if params.seed is None else params.seed + row for row in range(n)]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        if not prompts:
            return []
        if self.mode == "colocate":
            return self._generate_colocate(prompts, params)
        return self._generate_server(prompts, params)

    def _generate_colocate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        sampling = [
            self._sampling_params(**vllm_sampling_kwargs(params, self.stop_token_ids, seed))
            for seed in self._seeds(params, len(prompts))
        ]
        if self.enable_sleep_mode:
            self.llm.wake_up(tags=["kv_cache"])
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sampling_params=sampling, use_tqdm=False
        )
        if self.enable_sleep_mode:
            self.llm.sleep(level=1)
        stops = set(self.stop_token_ids)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            logprobs = None
            if completion.logprobs:
                # One dict per position, {token_id: Logprob}; the sampled token is always in it.
                logprobs = [float(step[tok].logprob) for step, tok in zip(completion.logprobs, ids)]
            results.append(
                GenerationResult(
                    token_ids=ids,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    logprobs=logprobs,
                    finish_reason=_finish_reason(completion.finish_reason, ids, stops, params.max_new_tokens),
                )
            )
        return results

    def _generate_server(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        def request(batch: list[list[int]], seed: int | None) -> dict[str, Any]:
            kwargs = vllm_sampling_kwargs(params, self.stop_token_ids, seed)
            extra = {"stop_token_ids": kwargs["stop_token_ids"], "skip_special_tokens": True}
            if seed is not None:
                extra["seed"] = seed
            return self.client.generate(
                prompts=batch,
                n=1,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=params.max_new_tokens,
                logprobs=0,
                generation_kwargs=extra,
            )

        if params.seed is None:  # one request for the whole batch
            answers = [request([list(p) for p in prompts], None)]
            completions = answers[0]["completion_ids"]
            logprob_rows = answers[0].get("logprobs")
        else:  # one request per prompt, each with its own seed, several in flight
            with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(prompts)))) as pool:
                answers = list(
                    pool.map(
                        lambda pair: request([list(pair[0])], pair[1]), zip(prompts, self._seeds(params, len(prompts)))
                    )
                )
            completions = [a["completion_ids"][0] for a in answers]
            logprob_rows = [a["logprobs"][0] if a.get("logprobs") else None for a in answers]
        stops = set(self.stop_token_ids)
        results = []
        for row, ids in enumerate(completions):
            ids = [int(t) for t in ids]
            lps = None
            if logprob_rows is not None and logprob_rows[row] is not None:
                lps = [float(step[0]) for step in logprob_rows[row]]  # logprobs=0: the sampled token only
            results.append(
                GenerationResult(
                    token_ids=ids,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    logprobs=lps,
                    finish_reason=_finish_reason(None, ids, stops, params.max_new_tokens),
                )
            )
        return results

    # ------------------------------------------------------------------------------------------------ weights
    def update_weights(self, model: Any) -> None:
        """Push ``model``'s current weights into vLLM and reset its prefix cache (call after each optimiser step)."""
        merged = hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")
        if merged:
            model.merge_adapter()
        try:
            if self.mode == "colocate":
                if self.enable_sleep_mode:
                    self.llm.wake_up(tags=["weights"])
                runner_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
                runner_model.load_weights(named_weights_for_vllm(model))
                self.llm.reset_prefix_cache()
            else:
                if not self._communicator_ready:
                    device = next(model.parameters()).device
                    self.client.init_communicator(device=device)
                    self._communicator_ready = True
                weights = list(named_weights_for_vllm(model))
                metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in weights]
                self.client.update_named_params(metadata, iter(weights))
                self.client.reset_prefix_cache()
        finally:
            if merged:
                model.unmerge_adapter()

    def close(self) -> None:
        if self.mode == "server" and self.client is not None and self._communicator_ready:
            self.client.close_communicator()
            self._communicator_ready = False
        if self.mode == "colocate" and self.llm is not None:
            self.llm = None
            gc.collect()
            try:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except ImportError:
                pass
