"""The pieces that make a saved policy folder portable (:mod:`ragen_trainer.model_card`, the template helpers of
:mod:`ragen_trainer.models`), each on its own and fast: no training, no server."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
yaml = pytest.importorskip("yaml")

from ragen_envs.settings import ProtocolSettings
from ragen_trainer import models
from ragen_trainer.checkpoints.layout import write_checkpoint_marker
from ragen_trainer.config import load_config
from ragen_trainer.model_card import (
    GENERATION_CONFIG_KEY,
    ServingSettings,
    fix_adapter_base,
    fix_config_name,
    generation_prompt,
    matching_presets,
    model_card_text,
    read_serving_settings,
    response_template,
    serving_generation_config,
    serving_settings,
    serving_tokenizer,
)
from tests.trainer.conftest import build_tiny_tokenizer

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Arms: Dragon, Phoenix."}]


def _settings(prefix: str = "<answer>", stop: tuple[str, ...] = ("</answer>",), temperature: float = 0.0,
              **protocol) -> ServingSettings:  # fmt: skip
    return ServingSettings(env_id="ragen/Bandit-v0", generation_prefix=prefix, stop_strings=stop, max_new_tokens=16,
                           temperature=temperature, top_p=0.9, protocol=ProtocolSettings(**protocol).to_dict())


@pytest.mark.parametrize("prefix", ["<answer>", "<think>", 'a "quoted" \\ back\nslash }}{% x %}{# y #} é ☃'])
def test_prefixed_template_renders_the_prefix_only_in_the_generation_prompt_and_splits_back(prefix):
    tokenizer = build_tiny_tokenizer()
    plain = tokenizer.chat_template
    prefixed = models.add_prefix_to_template(plain, prefix)
    assert models.split_prefixed_template(prefixed) == (plain, prefix)
    assert models.add_prefix_to_template(prefixed, "<x>") == models.add_prefix_to_template(plain, "<x>")  # replaced
    assert models.add_prefix_to_template(prefixed, "") == plain
    render = tokenizer.apply_chat_template
    assert render(MESSAGES, chat_template=prefixed, tokenize=False, add_generation_prompt=True) == (
        render(MESSAGES, tokenize=False, add_generation_prompt=True) + prefix)
    chat = MESSAGES + [{"role": "assistant", "content": "<answer>Dragon</answer>"}]
    assert render(chat, chat_template=prefixed, tokenize=False) == render(chat, tokenize=False)
    assert render(chat, chat_template=prefixed, tokenize=False, continue_final_message=True) == render(
        chat, tokenize=False, continue_final_message=True)


def test_a_template_without_the_mark_is_left_alone():
    plain = build_tiny_tokenizer().chat_template
    assert models.split_prefixed_template(plain) == (plain, None)
    lookalike = plain + "{% if add_generation_prompt %}{{ '<answer>' }}{% endif %}"  # someone's own suffix
    assert models.split_prefixed_template(lookalike) == (lookalike, None)
    assert models.template_prefix(plain) is None and models.split_prefixed_template(None) == (None, None)


def test_loading_takes_the_prefix_off_so_ragen_adds_it_once(tmp_path):
    tokenizer = build_tiny_tokenizer()
    plain = tokenizer.chat_template
    with serving_tokenizer(tokenizer, _settings()):
        tokenizer.save_pretrained(tmp_path)
    assert tokenizer.chat_template == plain and getattr(tokenizer, "response_template", None) is None  # restored
    assert models.saved_template_prefix(tmp_path) == "<answer>"
    from transformers import AutoTokenizer

    loaded = models.prepare_tokenizer(AutoTokenizer.from_pretrained(tmp_path))  # what every ragen loader does
    assert loaded.chat_template == plain and loaded.ragen_template_prefix == "<answer>"
    assert models.template_prefix(loaded) == "<answer>"
    assert models.saved_template_prefix(tmp_path / "missing") is None


def test_serving_tokenizer_restores_the_live_tokenizer_when_the_save_fails():
    tokenizer = build_tiny_tokenizer()
    plain = tokenizer.chat_template
    with pytest.raises(OSError), serving_tokenizer(tokenizer, _settings()):
        assert tokenizer.chat_template.endswith('{{ "<answer>" }}{% endif %}')
        raise OSError("disk full")
    assert tokenizer.chat_template == plain and getattr(tokenizer, "response_template", None) is None


def test_response_template_gives_the_reply_ragen_gives_the_env():
    tokenizer = build_tiny_tokenizer()
    assert generation_prompt(tokenizer) == "<|im_start|>assistant\n"
    parser = response_template(tokenizer, _settings())
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) + "<answer>"
    cases = {
        "Dragon</answer><|im_end|><|endoftext|><|endoftext|>": "<answer>Dragon</answer>",  # padded batch row
        "Dragon</answer>\nmore</answer> text<|im_end|>": "<answer>Dragon</answer>",  # cut after the first stop
        " Dragon \n<|im_end|>": "<answer> Dragon \n",  # no stop string: to the end of turn, nothing stripped
        "Drag": "<answer>Drag",  # cut by the length limit
    }
    for generated, expected in cases.items():
        assert tokenizer.parse_response(generated, parser, prefix=prompt) == {"role": "assistant", "content": expected}
    # Thinking on, no stop strings (stop_after_answer=False): the <think> prefix is kept, the reply runs to its end.
    think = response_template(tokenizer, _settings("<think>", ()))
    text = tokenizer.parse_response("x</think><answer>Dragon</answer> bye<|im_end|>", think, prefix=prompt[:-8] +
                                    "<think>")
    assert text["content"] == "<think>x</think><answer>Dragon</answer> bye"


def test_generation_config_greedy_and_sampling(tmp_path):
    tokenizer = build_tiny_tokenizer()
    model = SimpleNamespace(generation_config=SimpleNamespace(bos_token_id=None))
    greedy = serving_generation_config(model, tokenizer, _settings())
    assert greedy.do_sample is False and greedy.temperature is None and greedy.max_new_tokens == 16
    assert greedy.eos_token_id == models.stop_token_ids(tokenizer)  # what ragen's engines stop at
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in greedy.eos_token_id
    assert greedy.pad_token_id == tokenizer.pad_token_id and greedy.stop_strings is None
    sampled = serving_generation_config(model, tokenizer, _settings(temperature=0.5))
    assert (sampled.do_sample, sampled.temperature, sampled.top_p, sampled.top_k) == (True, 0.5, 0.9, 0)
    sampled.save_pretrained(tmp_path)
    block = read_serving_settings(tmp_path)
    assert block == getattr(sampled, GENERATION_CONFIG_KEY)
    assert block["generation_prefix"] == "<answer>" and block["stop_strings"] == ["</answer>"]
    assert read_serving_settings(tmp_path / "nothing") is None


def test_serving_settings_come_from_the_run_config_and_its_validation_decoding():
    cfg = load_config("starpo-s").replace(env_id="ragen/Sokoban-v0", val_temperature=0.0, max_new_tokens=64)
    settings = serving_settings(cfg.validate())
    assert settings.generation_prefix == "<think>" and settings.stop_strings == ("</answer>",)
    assert settings.temperature == 0.0 and settings.max_new_tokens == 64 and settings.protocol["enable_think"]
    cfg = load_config("starpo-s").replace(reply_prefix="", stop_after_answer=False).validate()
    assert serving_settings(cfg).generation_prefix == "" and serving_settings(cfg).stop_strings == ()


def test_gguf_model_name_in_a_saved_config_is_replaced_by_the_hub_id(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"_model_name_or_path": "Smollm2 135M 8k Lc100K Mix1 Ep2",
                                                      "model_type": "llama"}))  # fmt: skip
    assert fix_config_name(tmp_path, models.DEFAULT_MODEL)
    assert json.loads((tmp_path / "config.json").read_text())["_model_name_or_path"] == models.DEFAULT_MODEL
    assert not fix_config_name(tmp_path, models.DEFAULT_MODEL)  # already right
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not fix_config_name(tmp_path, models.DEFAULT_MODEL)  # transformers 5 writes no name: nothing to fix


def test_base_model_name_is_the_hub_id_not_the_gguf_or_the_cache_path(tmp_path):
    for alias in (None, "smollm2", "bundled", models.DEFAULT_MODEL):
        assert models.base_model_name(alias) == models.DEFAULT_MODEL
    assert models.base_model_name("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    converted = tmp_path / "SmolLM2-135M-Instruct.Q4_1-1-2"
    converted.mkdir()
    (converted / "ragen_converted.json").write_text(json.dumps({"model": models.DEFAULT_MODEL}))
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(converted)}))
    assert models.base_model_name(str(adapter)) == models.DEFAULT_MODEL
    checkpoint = tmp_path / "final"
    checkpoint.mkdir()
    write_checkpoint_marker(checkpoint, {"model": str(adapter)})
    assert models.base_model_name(str(checkpoint)) == models.DEFAULT_MODEL  # a run started from a ragen run
    plain = tmp_path / "plain"
    plain.mkdir()
    assert models.base_model_name(str(plain)) == str(plain)


def test_matching_presets():
    assert matching_presets(load_config("grpo").validate()) == ["grpo"]
    assert matching_presets(load_config("starpo").validate()) == ["starpo", "ppo"]
    assert matching_presets(load_config("starpo-s").validate()) == ["starpo-s"]
    assert matching_presets(load_config("starpo-s").replace(enable_think=False).validate()) == ["starpo-s-no-think"]
    assert matching_presets(load_config("starpo-s").replace(clip_high=0.3).validate()) == []


def test_model_card_of_an_adapter_on_a_local_base_and_without_validation():
    cfg = load_config("starpo-s-grpo").replace(lora_rank=8).validate()
    text = model_card_text(config=cfg, settings=serving_settings(cfg), base_model="/models/my-base", step=3,
                           kind="checkpoint", validation=None, adapter=True)  # fmt: skip
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["library_name"] == "peft" and meta["base_model"] == "/models/my-base"
    assert meta["license"] == "other" and "license_link" not in meta and "model-index" not in meta
    assert "starpo-s" in meta["tags"] and meta["ragen"]["kind"] == "checkpoint"
    assert "did not validate" in text and "checkpoint of step 3" in text and "LoRA adapter" in text
    assert "`starpo-s-grpo`" in text


def test_an_adapter_on_the_bundled_model_names_its_base_by_the_hub_id(tmp_path):
    converted = tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1-1-2"
    converted.mkdir(parents=True)
    (converted / "ragen_converted.json").write_text(json.dumps({"model": models.DEFAULT_MODEL}))
    adapter = tmp_path / "final"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(converted), "r": 4}))
    assert fix_adapter_base(adapter)
    saved = json.loads((adapter / "adapter_config.json").read_text())
    assert saved == {"base_model_name_or_path": models.DEFAULT_MODEL, "r": 4}
    assert not fix_adapter_base(adapter)  # a hub id already
    other = tmp_path / "other-base"
    other.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(other)}))
    assert not fix_adapter_base(adapter)  # any other base stays as it is
