"""HFEngine: ragen's own decoding loop over a Hugging Face causal LM (the package docstring says what it does)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import GenerationRequest, GenerationResult, ModelEngine, SamplingParams
from ragen_trainer.engines.hf import transformers_api
from ragen_trainer.engines.hf.direct_decode import unsupported_reason
from ragen_trainer.engines.hf.packed_weights import FLOAT32_PACKS, can_pack
from ragen_trainer.engines.hf.scheduler import HFSession


class HFEngine(ModelEngine):
    """Sample replies from a ``transformers`` causal LM with a KV cache kept per episode and continuous batching.

    Args:
        model: a ``transformers`` causal LM (or a ``peft`` model wrapping one); used live, never copied.
        tokenizer: its tokenizer (decode, stop tokens).
        batch_size: rows decoded together (memory vs. speed).
        stop_token_ids: ids that end a reply (kept in it); default: eos plus known end-of-turn tokens.
        compute_logprobs: record the sampled tokens' log-probabilities (turn off to save a little time).
        max_parked_tokens: most tokens of finished replies' caches kept for their episodes' next turns; a reply that
            finishes beyond it is not parked (its episode re-encodes its next prompt in full).
        prefill_tokens: most new prompt tokens encoded together in one packed forward pass (memory vs. speed; a
            longer prompt runs alone).
        pack_weights: multiply by packed copies of the linear weights (``float32_packs``) while a session is open
            (the same products up to float rounding, faster on a CPU at any batch size; a second copy of the weights
            in memory meanwhile, kept between sessions for a model in eval mode and reused while its weights are
            unchanged); ``None``: when the model is float32 or bfloat16 on a CPU and ``torch`` has oneDNN
            (:func:`~ragen_trainer.engines.hf.packed_weights.can_pack`).
        float32_packs: with ``pack_weights``, whose packed product float32 weights use: ``"mkl"`` (where ``torch``
            has MKL; faster than oneDNN's at a decode step's row counts, 1.35-1.6x at 1-32 rows) or ``"onednn"``
            (:mod:`~ragen_trainer.engines.hf.packed_weights`). bfloat16 weights always use oneDNN's.
        share_prefixes: encode the common head of distinct prompts admitted together once (the system prompt and the
            rules every state of an env starts with) and reuse it, as a parked cache is reused; ``False`` encodes
            every distinct prompt in full.
        share_attention: decode attention reads the columns rows hold as copies of one computation (a group's first
            prompt, the shared head) once per group of rows and merges by log-sum-exp ("cascade" attention,
            :class:`~ragen_trainer.engines.hf.runner.DecodePlan`); ``False`` reads every row's own copy. The same
            attention up to float rounding.
        direct_decode: run decode steps straight over the model's modules, without ``transformers``' forward
            (:mod:`~ragen_trainer.engines.hf.direct_decode`: the same arithmetic in fewer calls, equal up to float
            rounding); ``None``: wherever the model is one it supports (Llama and Qwen2 families), ``True`` refuses a
            model it does not support, ``False`` always decodes through ``transformers``.
    """

    supports_token_ids = True
    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 32,
        stop_token_ids: list[int] | None = None,
        compute_logprobs: bool = True,
        max_parked_tokens: int = 65_536,
        prefill_tokens: int = 16_384,
        pack_weights: bool | None = None,
        float32_packs: str = "mkl",
        share_prefixes: bool = True,
        share_attention: bool = True,
        direct_decode: bool | None = None,
    ) -> None:
        super().__init__(
            model, tokenizer, batch_size=batch_size, stop_token_ids=stop_token_ids, compute_logprobs=compute_logprobs
        )
        transformers_api.check_supported(model)
        check_arg(
            isinstance(max_parked_tokens, int) and max_parked_tokens >= 0,
            "max_parked_tokens",
            max_parked_tokens,
            "an int >= 0 (0: keep no cache between turns)",
        )
        self.max_parked_tokens = max_parked_tokens
        check_arg(
            isinstance(prefill_tokens, int) and prefill_tokens >= 1, "prefill_tokens", prefill_tokens, "an int >= 1"
        )
        self.prefill_tokens = prefill_tokens
        check_arg(pack_weights in (None, True, False), "pack_weights", pack_weights, "True, False or None (auto)")
        check_arg(float32_packs in FLOAT32_PACKS, "float32_packs", float32_packs, " or ".join(map(repr, FLOAT32_PACKS)))
        self.float32_packs = float32_packs
        check_arg(isinstance(share_prefixes, bool), "share_prefixes", share_prefixes, "True or False")
        self.share_prefixes = share_prefixes
        check_arg(isinstance(share_attention, bool), "share_attention", share_attention, "True or False")
        self.share_attention = share_attention
        check_arg(direct_decode in (None, True, False), "direct_decode", direct_decode, "True, False or None (auto)")
        reason = unsupported_reason(model)
        if direct_decode and reason is not None:
            raise ValueError(
                f"invalid argument direct_decode=True: the model cannot be decoded directly ({reason}); "
                "use direct_decode=None (auto) or False"
            )
        self.direct_decode = reason is None if direct_decode is None else direct_decode
        self.pack_weights = can_pack(model) if pack_weights is None else bool(pack_weights and can_pack(model))
        #: Work done, for benchmarks and tests: tokens run through the model (prefill), tokens reused from a parked
        #: or shared cache, decode steps, rows decoded summed over steps, and the key columns decode attended to
        #: (rows x window of each segment) against those the rows hold (the rest is padding of shorter rows).
        self.stats = {
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "decode_steps": 0,
            "decoded_rows": 0,
            "attended_columns": 0,
            "cached_columns": 0,
        }

    def session(self, params: SamplingParams, *, keep_cache: bool = True) -> HFSession:
        """A continuous-batching session; ``keep_cache=False`` parks nothing between turns (one-shot batches)."""
        return HFSession(self, params, keep_cache=keep_cache)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        for i, prompt in enumerate(prompts):
            check_arg(len(prompt) > 0, f"prompts[{i}]", prompt, "a non-empty list of token ids")
        results: list[GenerationResult | None] = [None] * len(prompts)
        with self.session(params, keep_cache=False) as session:
            for row, prompt in enumerate(prompts):
                session.submit(GenerationRequest(key=row, prompt=list(prompt), seed=_row_seed(params.seed, row)))
            while session.busy:
                for key, result in session.step():
                    results[key] = result  # type: ignore[index]
        return [r for r in results if r is not None]


def _row_seed(seed: int | None, row: int) -> int | None:
    """One seed per row of a seeded batch: identical prompts (a group's first turn) must sample different replies."""
    return None if seed is None else int(np.random.SeedSequence([seed, row]).generate_state(1)[0])
