"""``engine: auto`` (the default): the engine measured faster for the machine, and the reason printed."""

from __future__ import annotations

import pytest

from ragen_trainer.engines import choice
from ragen_trainer.engines.choice import choose_engine


@pytest.mark.parametrize("name", ["hf", "hf-generate", "vllm"])
def test_an_engine_named_is_used_as_given(name, monkeypatch):
    monkeypatch.setattr(choice, "vllm_installed", lambda: True)
    assert choose_engine(name, "cuda") == (name, "asked for")


def test_auto_is_hf_on_a_cpu_even_with_vllm_installed(monkeypatch):
    monkeypatch.setattr(choice, "vllm_installed", lambda: True)
    engine, why = choose_engine("auto", "cpu")
    assert engine == "hf" and "CPU" in why


@pytest.mark.parametrize(("installed", "expected"), [(True, "vllm"), (False, "hf")])
def test_auto_on_a_gpu_is_vllm_where_installed(installed, expected, monkeypatch):
    monkeypatch.setattr(choice, "vllm_installed", lambda: installed)
    engine, why = choose_engine("auto", "cuda")
    assert engine == expected and why.startswith("auto:")


def test_auto_with_a_server_url_is_vllm(monkeypatch):
    monkeypatch.setattr(choice, "vllm_installed", lambda: False)
    assert choose_engine("auto", "cpu", engine_url="http://127.0.0.1:8000")[0] == "vllm"


def test_a_torch_device_is_accepted():
    torch = pytest.importorskip("torch")
    assert choose_engine("auto", torch.device("cpu"))[0] == "hf"


def test_the_training_default_is_auto_and_builds_the_hf_engine_on_a_cpu(tiny_model, tiny_tokenizer, monkeypatch):
    from ragen_trainer.config import StarPOConfig
    from ragen_trainer.engines.factory import make_training_engine, training_engine_choice
    from ragen_trainer.engines.hf import HFEngine

    monkeypatch.setattr(choice, "vllm_installed", lambda: True)  # installed or not: a CPU policy gets hf
    cfg = StarPOConfig()
    assert cfg.engine == "auto"
    assert type(make_training_engine(cfg, tiny_model, tiny_tokenizer)) is HFEngine
    assert training_engine_choice(cfg, tiny_model)[0] == "hf"


def test_auto_server_urls_are_checked_like_vllm_ones():
    from ragen_trainer.config import StarPOConfig

    with pytest.raises(ValueError, match="engine_url"):
        StarPOConfig(engine="auto", engine_url="http://192.168.1.5:8000").validate()


def test_auto_in_several_processes_without_a_server_is_hf(monkeypatch):
    monkeypatch.setattr(choice, "vllm_installed", lambda: True)
    monkeypatch.setenv("WORLD_SIZE", "4")
    engine, why = choose_engine("auto", "cuda")
    assert engine == "hf" and "4 processes" in why
    assert choose_engine("auto", "cuda", engine_url="http://127.0.0.1:8000")[0] == "vllm"
