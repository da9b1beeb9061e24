"""``make_training_engine`` (the engine a run's config asks for) and the server weight sync that works without CUDA
(``weight_sync="reload"``), against a local stand-in for vLLM's development endpoints. vLLM itself runs in its own
lane (``tests/vllm/``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.checkpoints.layout import run_files
from ragen_trainer.config import StarPOConfig  # noqa: E402
from ragen_trainer.engines.factory import make_training_engine  # noqa: E402
from ragen_trainer.engines.hf import HFEngine  # noqa: E402
from ragen_trainer.engines.hf_generate import GenerateEngine  # noqa: E402
from ragen_trainer.engines.openai import OpenAIEngineError  # noqa: E402
from ragen_trainer.engines.vllm import VLLMEngine, named_weights_for_vllm  # noqa: E402
from tests.trainer.conftest import JSONServer  # noqa: E402


def _dev_endpoints(dev_mode: bool = True, chunked: bool = False) -> JSONServer:
    """A stand-in for a CPU vLLM server with ``VLLM_SERVER_DEV_MODE=1``: ``/server_info``, ``/collective_rpc``,
    ``/reset_prefix_cache`` (all 404 with ``dev_mode=False``)."""

    def respond(path: str, body: dict | None) -> tuple[int, dict]:
        if not dev_mode or (body is None and not path.startswith("/server_info")):
            return 404, {"detail": "Not Found"}
        if body is None:
            return 200, {"vllm_config": {"device_config": {"device": "cpu"}, "weight_transfer_config": None,
                                         "scheduler_config": {"enable_chunked_prefill": chunked}}}  # fmt: skip
        return 200, {"results": [None]} if path == "/collective_rpc" else {"success": True}

    return JSONServer(respond)


def _server_engine(url, tokenizer, weights_dir):
    client = SimpleNamespace(base_url=url)  # TRL's VLLMClient, as far as the weight sync is concerned
    return VLLMEngine("tiny", tokenizer, mode="server", client=client, sampling_params_factory=dict,
                      weights_dir=weights_dir, max_retries=0)  # fmt: skip


def test_reload_sync_writes_the_weights_and_asks_the_server_to_reload_them(tiny_model, tiny_tokenizer, tmp_path):
    from safetensors.torch import load_file

    with _dev_endpoints() as server:
        engine = _server_engine(server.root, tiny_tokenizer, str(tmp_path / "w"))
        assert engine.resolved_weight_sync(tiny_model) == "reload"  # a CPU policy
        engine.update_weights(tiny_model)
    assert [r["path"] for r in server.requests] == ["/collective_rpc", "/reset_prefix_cache"]
    assert server.requests[0]["body"] == {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "w")}}
    saved = load_file(str(tmp_path / "w" / "model.safetensors"))
    expected = dict(named_weights_for_vllm(tiny_model))
    assert set(saved) == set(expected)  # tied weights included: vLLM's reload keeps a head it is not given
    assert all(torch.equal(saved[name], expected[name]) for name in expected)
    assert not list((tmp_path / "w").glob("*.partial"))


def test_reload_sync_says_what_the_server_lacks(tiny_model, tiny_tokenizer, tmp_path):
    with _dev_endpoints(dev_mode=False) as server:
        engine = _server_engine(server.root, tiny_tokenizer, str(tmp_path / "w"))
        with pytest.raises(OpenAIEngineError, match="VLLM_SERVER_DEV_MODE=1"):
            engine.update_weights(tiny_model)
    with _dev_endpoints() as server:
        engine = _server_engine(server.root, tiny_tokenizer, None)
        with pytest.raises(ValueError, match="weights_dir"):
            engine.update_weights(tiny_model)
    with _dev_endpoints(chunked=True) as server, pytest.raises(ValueError, match="--no-enable-chunked-prefill"):
        _server_engine(server.root, tiny_tokenizer, str(tmp_path / "w"))


def test_factory_builds_the_engine_the_config_names(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    cfg = StarPOConfig(output_dir=str(tmp_path / "run"), generation_batch_size=4)
    assert type(make_training_engine(cfg, tiny_model, tiny_tokenizer)) is HFEngine
    cfg.engine = "hf-generate"
    assert type(make_training_engine(cfg, tiny_model, tiny_tokenizer)) is GenerateEngine

    built: list[dict] = []
    fake_vllm = SimpleNamespace(LLM=lambda **kw: built.append(kw) or SimpleNamespace(), SamplingParams=dict)
    monkeypatch.setattr("ragen_trainer.engines.vllm.require_vllm", lambda: fake_vllm)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    cfg = StarPOConfig(engine="vllm", model=str(model_dir), max_context_tokens=1000, max_new_tokens=50, seed=7,
                       dtype="float32")  # fmt: skip
    engine = make_training_engine(cfg, tiny_model, tiny_tokenizer)
    assert engine.mode == "colocate"
    assert built[0]["model"] == str(model_dir) and built[0]["max_model_len"] == 1050
    assert built[0]["dtype"] == "float32" and built[0]["seed"] == 7

    class FakeClient:
        def __init__(self, base_url, **kwargs):
            self.base_url = base_url

    monkeypatch.setattr("trl.generation.vllm_client.VLLMClient", FakeClient)
    cfg = StarPOConfig(engine="vllm", engine_url="http://127.0.0.1:9", output_dir=str(tmp_path / "run"),
                       model=str(model_dir))
    engine = make_training_engine(cfg, tiny_model, tiny_tokenizer)
    assert engine.mode == "server" and engine.weight_sync == "auto"
    assert Path(engine.weights_dir) == tmp_path / "run" / "vllm-weights"
    (tmp_path / "run" / "vllm-weights").mkdir(parents=True)
    assert [p.name for p in run_files(tmp_path / "run")] == ["vllm-weights"]  # --overwrite removes it with the run
