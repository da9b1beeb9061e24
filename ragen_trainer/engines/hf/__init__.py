"""ragen's own decoding loop over a Hugging Face causal LM: the default engine (``"hf"``), on CPU or GPU.

Multi-turn rollouts ask a model for many replies that share most of their context, and ``model.generate`` encodes
every prompt from scratch. This engine does no work twice:

* **KV cache across turns.** When a reply ends, the episode's keys and values stay *parked* under its request key;
  the episode's next prompt (the same tokens plus the env's delta) encodes only the delta. A prompt that departs
  from what is parked (a reply re-tokenised after cleaning, a rewritten history) reuses the keys up to the first
  token where they differ and encodes the rest (keys depend only on earlier tokens); correctness never depends on a
  hit.
* **Shared group prompts.** Requests admitted together with the same prompt (the N rollouts of a GRPO group start
  from one state) are encoded once; each row gets a copy of the cache and samples its own reply.
* **Stop strings and stop tokens** end a row as soon as they appear (``SamplingParams.stop``, e.g. ``"</answer>"``).
* **Continuous batching.** :meth:`HFEngine.session` keeps up to ``batch_size`` rows decoding one token per
  :meth:`~HFSession.step`; finished rows leave at once and waiting requests take their place, so the batch stays full
  while episodes end at different turns and wait for their envs.

The package, one job per module (the split of small serving engines such as nano-vLLM):

* :mod:`.engine` -- :class:`HFEngine`: settings, work counters, :meth:`HFEngine.generate` (a list of prompts in,
  replies out: a session run to completion; identical prompts in the list share their encoding);
* :mod:`.scheduler` -- :class:`HFSession`: admission into free rows, prefill jobs (parked prefixes, shared prompts),
  stop rules, finishing and parking;
* :mod:`.cache` -- the batch cache (left-aligned rows, grown in chunks, never shifted) and the parked caches;
* :mod:`.runner` -- the model's passes: packed prefill, decode steps attending by segments of rows, and the attention
  plans ragen's attention function follows;
* :mod:`.direct_decode` -- a decode step straight over the modules of a Llama / Qwen2 model (the model's equations
  without ``transformers``' forward: fewer calls, the same logits up to float rounding);
* :mod:`.packed_weights` -- packed copies of the linear weights while a session is open (CPU: MKL's in float32,
  oneDNN's in bfloat16);
* :mod:`.sampler` -- per-request seeded sampling (temperature, top-k, top-p, greedy) and the log-probabilities;
* :mod:`.transformers_api` -- everything the engine asks of ``transformers`` (attention interface, cache classes,
  support checks), tested on the lowest and the installed version.

The engine holds the *live* model, so the trainer's updates are used by the next session (on-policy);
:meth:`HFEngine.update_weights` swaps in another object, and every parked cache is dropped whenever the weights may
have changed (a new session starts empty). While a session is open the model is in eval mode and runs ragen's
attention function; closing the session restores both. The engine serves models that call ``transformers``'
attention interface (``is_backend_compatible()``), which is every recent ``transformers`` causal LM whose layers all
use full attention; others are refused by name.
"""

from __future__ import annotations

from ragen_trainer.engines.hf.engine import HFEngine
from ragen_trainer.engines.hf.scheduler import HFSession

__all__ = ["HFEngine", "HFSession"]
