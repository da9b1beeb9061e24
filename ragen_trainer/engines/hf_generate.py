"""Generation with Hugging Face ``model.generate`` (engine ``"hf-generate"``): the engine ragen had before its own
decoding loop (:class:`~ragen_trainer.engines.hf.HFEngine`), kept as the plain baseline and as a reference for tests.

Every call encodes every prompt from scratch (no cache kept across turns, none shared between identical prompts), and
replies run to a stop *token* or ``max_new_tokens``; stop *strings* (``SamplingParams.stop``) are applied afterwards,
by cutting the reply (the tokens after the one that completed the string are dropped), so the text and tokens are
those of :class:`~ragen_trainer.engines.hf.HFEngine` while the work is not saved.

Prompts are token ids; they are sorted by length, cut into batches of ``batch_size``, left-padded, and sampled with
the model's KV cache. A reply ends at the tokenizer's eos or any end-of-turn token of its chat template
(:func:`ragen_trainer.models.stop_token_ids`); that token is kept in the reply (it is the model's own token and is
trained). The log-probability of each sampled token is recorded on the fly by a logits processor (no second forward
pass, no ``batch x steps x vocab`` tensor kept): ``log_softmax(logits / temperature)`` before top-k / top-p, the
quantity TRL's trainers compute for the old policy.

The engine holds the *live* model object, so the trainer's updates are seen by the next ``generate`` call (on-policy);
:meth:`HFEngine.update_weights` swaps in another object (for example the unwrapped model after ``accelerate.prepare``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationResult,
    ModelEngine,
    SamplingParams,
    reply_text,
    stop_string_end,
)


class _SampledLogprobs:
    """Logits processor that records the log-probability of each token ``generate`` samples.

    At step t it sees the logits for position t and the ids sampled so far (up to t-1): it gathers the log-prob of
    token t-1 from the distribution it kept at the previous step, then keeps this step's distribution. The last
    token's log-prob is gathered by :meth:`finish` after ``generate`` returns.
    """

    def __init__(self, temperature: float, prompt_len: int) -> None:
        self.temperature = temperature if temperature > 0 else 1.0
        self.prompt_len = prompt_len
        self.previous = None  # log-softmax of the last step, [batch, vocab]
        self.collected: list[Any] = []  # per generated position, [batch]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.previous is not None:
            last = input_ids[:, -1:]
            self.collected.append(self.previous.gather(-1, last).squeeze(-1))
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: Any) -> Any:
        """``[batch, generated]`` log-probs for the generated part of ``sequences``."""
        import torch

        steps = sequences.shape[1] - self.prompt_len
        if self.previous is not None and len(self.collected) < steps:
            last = sequences[:, self.prompt_len + len(self.collected)].unsqueeze(-1)
            self.collected.append(self.previous.gather(-1, last).squeeze(-1))
        if not self.collected:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.collected[:steps], dim=1)


def left_pad(prompts: list[list[int]], pad_token_id: int) -> tuple[Any, Any]:
    """``(input_ids, attention_mask)`` of ``prompts`` padded on the left, as ``generate`` wants them: every prompt
    ends at the same position (int64 tensors on the CPU)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


class GenerateEngine(ModelEngine):
    """Sample replies with ``model.generate``.

    Args:
        model: a ``transformers`` causal LM (or a ``peft`` model wrapping one); used live, never copied.
        tokenizer: its tokenizer (pad token, decode, stop tokens).
        batch_size: prompts per ``generate`` call (memory vs. speed).
        stop_token_ids: ids that end a reply; default: eos plus known end-of-turn tokens in the vocabulary.
        compute_logprobs: record the sampled tokens' log-probabilities (cheap; turn off to save a little time).
    """

    supports_token_ids = True
    name = "hf-generate"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 8,
        stop_token_ids: list[int] | None = None,
        compute_logprobs: bool = True,
    ) -> None:
        super().__init__(
            model, tokenizer, batch_size=batch_size, stop_token_ids=stop_token_ids, compute_logprobs=compute_logprobs
        )
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else int(self.stop_token_ids[0])

    # ------------------------------------------------------------------------------------------------ generation
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        for i, prompt in enumerate(prompts):
            check_arg(len(prompt) > 0, f"prompts[{i}]", prompt, "a non-empty list of token ids")
        if not prompts:
            return []
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
        results: list[GenerationResult | None] = [None] * len(prompts)
        with self._sampling_mode(params.seed):
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                for idx, res in zip(chunk, self._generate_batch([prompts[i] for i in chunk], params)):
                    results[idx] = res
        return [r for r in results if r is not None]

    @contextlib.contextmanager
    def _sampling_mode(self, seed: int | None) -> Iterator[None]:
        """Eval mode (no dropout), no autograd, and a private RNG stream when seeded (the caller's RNG is untouched)."""
        import torch

        was_training = self.model.training
        self.model.eval()
        devices = []
        device = self._device()
        if device.type == "cuda":
            devices = [device.index if device.index is not None else torch.cuda.current_device()]
        try:
            with torch.random.fork_rng(devices=devices, enabled=seed is not None), torch.inference_mode():
                if seed is not None:
                    torch.manual_seed(seed)
                yield
        finally:
            if was_training:
                self.model.train()

    def _device(self) -> Any:
        import torch

        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device("cpu")

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        from transformers import GenerationConfig, LogitsProcessorList

        ids, mask = left_pad(prompts, self.pad_token_id)
        width = ids.shape[1]
        device = self._device()
        ids, mask = ids.to(device), mask.to(device)

        # Every sampling knob explicit and neutral unless asked for: ``generate`` fills the fields left ``None`` from
        # the model's own generation_config (Qwen2.5-Instruct ships top_k=20, top_p=0.8, repetition_penalty=1.05),
        # which would change the policy being sampled behind the trainer's back.
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=0,
            do_sample=not params.greedy,
            # Greedy decoding applies no warpers, so they are left unset there (set, transformers warns).
            temperature=None if params.greedy else params.temperature,
            top_p=None if params.greedy else params.top_p,
            top_k=None if params.greedy else params.top_k,
            min_p=None if params.greedy else 0.0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=1.0,
            encoder_repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            renormalize_logits=False,
            eos_token_id=self.stop_token_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            return_dict_in_generate=True,
        )
        recorder = _SampledLogprobs(params.temperature, width) if self.compute_logprobs else None
        processors = LogitsProcessorList([recorder]) if recorder is not None else None
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, logits_processor=processors
        )
        sequences = out.sequences if hasattr(out, "sequences") else out
        logprobs = recorder.finish(sequences).cpu() if recorder is not None else None
        generated = sequences[:, width:].cpu().tolist()

        stops = set(self.stop_token_ids)
        results = []
        for row, tokens in enumerate(generated):
            cut = len(tokens)
            finish = FINISH_LENGTH
            for pos, tok in enumerate(tokens):
                if tok in stops:  # the first stop token ends the reply (the rest is padding)
                    cut, finish = pos + 1, FINISH_STOP
                    break
            end = stop_string_end(self.tokenizer, tokens[:cut], params.stop)
            if end is not None:
                cut, finish = end, FINISH_STOP
            reply = tokens[:cut]
            lps = [float(x) for x in logprobs[row, :cut].tolist()] if logprobs is not None else None
            text = reply_text(self.tokenizer, reply, params.stop)
            results.append(GenerationResult(token_ids=reply, text=text, logprobs=lps, finish_reason=finish))
        return results
