"""A trained checkpoint behaves the same everywhere: ``transformers.pipeline``, ``transformers serve`` + ragen's
``openai`` engine, and ``ragen-trainer eval`` give the same replies and the same successes (greedy).

The tiny test model is first taught (a few dozen supervised steps) to answer the Bandit prompt with
``Dragon</answer>`` after the ``<answer>`` generation prefix, then trained one StarPO-S step by the trainer, which
writes ``final/``. Without the prefix in the prompt it does not know what to say, and without the prefix in its reply
the env cannot parse it: a path that loses the prefix fails its episodes, one that adds it twice changes the prompt.

Also: ``final/`` holds what serving needs (chat template with the prefix, response template, generation config,
model card) and no training state; a checkpoint saved before this (no prefix in its template, no ragen block in its
generation config) still evaluates exactly as before; served without the prefix, a model gets its own leaderboard
table (the generation hash), where it scores 0.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")
yaml = pytest.importorskip("yaml")

import gymnasium as gym

import ragen_envs  # noqa: F401  (registers the ragen/* envs)
from ragen_trainer import models
from ragen_trainer.checkpoints.layout import read_checkpoint_info
from ragen_trainer.checkpoints.verify import checkpoint_problems
from ragen_trainer.config import load_config
from ragen_trainer.critic import CRITIC_FILE
from ragen_trainer.engines.local_server import serve_missing, transformers_serve
from ragen_trainer.evaluation.agents import ModelAgent
from ragen_trainer.evaluation.cli import main as eval_cli
from ragen_trainer.evaluation.leaderboard import build_board, markdown_table
from ragen_trainer.evaluation.runner import load_result, run_suite
from ragen_trainer.evaluation.suites import load_suite
from ragen_trainer.model_card import GENERATION_CONFIG_KEY
from ragen_trainer.rollout import ChatTokens
from ragen_trainer.trainer import StarPOTrainer
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

ENV_ID = "ragen/Bandit-v0"
SEEDS = list(range(1000, 1016))  # 16 episodes, as the report
MAX_NEW_TOKENS = 8
TAUGHT = "Dragon</answer>"


def _bandit_messages(seed: int) -> list[dict[str, str]]:
    env = gym.make(ENV_ID, enable_think=False)
    observation, info = env.reset(seed=seed)
    return [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": observation}]


def _teach(model: Any, tokenizer: Any, steps: int = 80) -> None:
    """Fit ``model`` to continue the Bandit prompt + ``<answer>`` with ``Dragon</answer><|im_end|>`` (supervised,
    loss on the answer only), so that its greedy replies are the format's and depend on the prefix."""
    chat = ChatTokens(tokenizer)
    target = chat.encode(TAUGHT) + [tokenizer.eos_token_id]
    rows = [chat.prompt_ids(_bandit_messages(seed)) + chat.encode("<answer>") for seed in range(6)]
    width = max(len(r) for r in rows) + len(target)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, prompt in enumerate(rows):
        row = prompt + target
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, len(prompt) : len(row)] = torch.tensor(target)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05, f"the tiny model did not learn its answer (loss {loss.item():.3f})"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One StarPO-S step (separate critic, greedy validation) from the taught tiny model: ``final/`` and
    ``checkpoint-1``, plus an old-style copy of ``final/`` (as ragen saved it before: plain template, no ragen
    generation settings, no response template)."""
    work = tmp_path_factory.mktemp("portability")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=1)
    _teach(model, tokenizer)
    cfg = load_config("starpo-s").replace(
        env_id=ENV_ID, enable_think=False, env_groups=2, group_size=2, max_new_tokens=MAX_NEW_TOKENS,
        max_context_tokens=1024, total_steps=1, save_steps=1, val_every=1, val_groups=4, val_temperature=0.0,
        micro_batch_size=2, generation_batch_size=8, report_to=["jsonl"], output_dir=str(work / "run"),
    ).validate()  # fmt: skip
    trainer = StarPOTrainer(cfg, model, tokenizer)
    result = trainer.train()
    assert result.final_model is not None
    final = Path(result.final_model)
    old = work / "old-style"
    shutil.copytree(final, old)
    _make_old_style(old)
    return SimpleNamespace(final=final, checkpoint=work / "run" / "checkpoint-1", old=old, work=work,
                           tokenizer=tokenizer, trainer=trainer)  # fmt: skip


def _make_old_style(folder: Path) -> None:
    """Turn a saved folder into what ragen wrote before generation settings travelled with it."""
    template = (folder / "chat_template.jinja").read_text()
    plain, prefix = models.split_prefixed_template(template)
    assert prefix == "<answer>"
    (folder / "chat_template.jinja").write_text(plain)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("response_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    generation = json.loads((folder / "generation_config.json").read_text())
    generation.pop(GENERATION_CONFIG_KEY)
    generation["do_sample"] = False
    (folder / "generation_config.json").write_text(json.dumps(generation))
    for name in ("README.md",):
        (folder / name).unlink()


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Bandit (thinking off) on 16 pinned seeds, greedy, the run's reply length."""
    path = tmp_path_factory.mktemp("suite") / "portability-v1.json"
    path.write_text(json.dumps({
        "name": "portability", "version": 1,
        "decoding": {"temperature": 0, "top_p": 1.0, "max_new_tokens": MAX_NEW_TOKENS, "seed": 0},
        "envs": [{"name": "Bandit", "env_id": ENV_ID, "seeds": SEEDS, "protocol": {"enable_think": False}}],
    }))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def server(run: SimpleNamespace) -> Iterator[SimpleNamespace]:
    """``transformers serve`` on 127.0.0.1 with no model forced: each request loads the folder it names."""
    reason = serve_missing()
    if reason:
        pytest.skip(reason)
    with transformers_serve(run.work, threads=1) as served:
        yield served


def _pipeline_episodes(folder: Path) -> list[tuple[str, bool]]:
    """(reply, success) per seed through a plain ``transformers.pipeline``: the env's messages in, the assistant
    message's content to ``env.step`` as it is -- nothing ragen-specific."""
    from transformers import pipeline

    pipe = pipeline("text-generation", model=str(folder), device="cpu")
    out = []
    for seed in SEEDS:
        env = gym.make(ENV_ID, enable_think=False)
        observation, info = env.reset(seed=seed)
        messages = [{"role": "system", "content": info["system_prompt"]}, {"role": "user", "content": observation}]
        reply = pipe(messages)[0]["generated_text"][-1]["content"]
        _, _, _, _, info = env.step(reply)
        out.append((reply, bool(info["success"])))
    return out


def _episodes(result: dict[str, Any]) -> list[tuple[str, bool]]:
    by_seed = {e["seed"]: e for e in result["episodes"]}
    return [(by_seed[s]["turns"][0]["reply"], bool(by_seed[s]["success"])) for s in SEEDS]


def _served(folder: Path, server: SimpleNamespace, suite_file: Path) -> dict[str, Any]:
    # transformers serve keeps stop strings in the text (restore_stop=False) and seeds torch globally (one at a time).
    agent = ModelAgent.load(str(folder), engine="openai", base_url=server.url,
                            engine_kwargs={"restore_stop": False, "concurrency": 1, "max_retries": 0, "timeout": 120})
    try:
        return run_suite(load_suite(suite_file), agent, batch_size=4, progress=False)
    finally:
        agent.close()


def _evaluated(folder: Path, suite_file: Path, out: Path) -> dict[str, Any]:
    code = eval_cli(["eval", "--model", str(folder), "--suite", str(suite_file), "--device", "cpu", "--batch-size",
                     "4", "--no-progress", "-o", str(out)])  # fmt: skip
    assert code == 0
    return load_result(out)


# ------------------------------------------------------------------------------------------------ what final/ holds
def test_final_holds_what_serving_needs_and_no_training_state(run):
    final, checkpoint = run.final, run.checkpoint
    names = {p.name for p in final.iterdir()}
    for absent in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin",
                   CRITIC_FILE, "echo_trap_monitor.json"):  # fmt: skip
        assert absent not in names, absent
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "README.md", "ragen_checkpoint.json", "ragen_config.yaml"} <= names  # fmt: skip
    assert checkpoint_problems(final, training_state=False) == []
    marker = read_checkpoint_info(final)
    assert marker["kind"] == "final" and marker["critic"] is None
    assert marker["serving"]["generation_prefix"] == "<answer>"
    # The resumable checkpoint keeps everything training needs, the critic included.
    assert checkpoint_problems(checkpoint) == []
    assert (checkpoint / CRITIC_FILE).is_file() and (checkpoint / "optimizer.pt").is_file()
    assert read_checkpoint_info(checkpoint)["critic"] == "value_model"
    final_bytes = sum(p.stat().st_size for p in final.iterdir())
    assert final_bytes < (final / "model.safetensors").stat().st_size * 1.5  # weights, not a second copy for a critic


def test_final_chat_template_prewrites_the_prefix_and_nothing_else_changes(run):
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(run.final)
    messages = _bandit_messages(SEEDS[0])
    prompt = saved.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n<answer>") and not prompt.endswith("<answer><answer>")
    plain = run.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == plain + "<answer>"
    chat = messages + [{"role": "assistant", "content": "<answer>Dragon</answer>"}]
    assert saved.apply_chat_template(chat, tokenize=False) == run.tokenizer.apply_chat_template(chat, tokenize=False)
    assert run.tokenizer.chat_template == models.split_prefixed_template(saved.chat_template)[0]  # live one untouched
    # The response template: the assistant message holds the prefix and ends after the first stop string.
    parsed = saved.parse_response("Dragon</answer> and more<|im_end|>", prefix=prompt)
    assert parsed == {"role": "assistant", "content": "<answer>Dragon</answer>"}


def test_final_generation_config_carries_the_validation_decoding_and_the_protocol(run):
    from transformers import GenerationConfig

    config = GenerationConfig.from_pretrained(run.final)
    assert config.do_sample is False and config.max_new_tokens == MAX_NEW_TOKENS  # val_temperature 0: greedy
    im_end = run.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in (config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id])
    block = getattr(config, GENERATION_CONFIG_KEY)
    assert block["generation_prefix"] == "<answer>" and block["stop_strings"] == ["</answer>"]
    assert block["protocol"]["enable_think"] is False and block["env_id"] == ENV_ID
    # Not as generate()'s stop_strings: a plain pipeline() would raise (it does not hand generate the tokenizer).
    assert config.stop_strings is None


def test_final_model_card_has_hub_metadata_and_the_validation_table(run):
    text = (run.final / "README.md").read_text()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["base_model"] == models.DEFAULT_MODEL and meta["library_name"] == "transformers"
    assert meta["license"] == "apache-2.0" and meta["pipeline_tag"] == "text-generation"
    assert {"ragen", "reinforcement-learning", "starpo", "starpo-s", "bandit"} <= set(meta["tags"])
    assert meta["ragen"]["env_id"] == ENV_ID and meta["ragen"]["generation_prefix"] == "<answer>"
    final_success = 100.0 * run.trainer.val_history[-1]["val/success"]
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == pytest.approx(final_success)
    assert "| step | success % |" in text and f"| 1 | {final_success:.1f} |" in text
    assert "`starpo-s-no-think`" in text  # the preset the config matches
    assert 'pipeline("text-generation", model=' in text and "transformers serve" in text
    assert "--suite bandit-bare-v2 --envs Bandit" in text  # a shipped suite that plays the trained prefix


# ------------------------------------------------------------------------------------------------ three ways, one result
def test_pipeline_served_and_eval_agree(run, server, suite_file, tmp_path):
    piped = _pipeline_episodes(run.final)
    served = _served(run.final, server, suite_file)
    evaluated = _evaluated(run.final, suite_file, tmp_path / "eval.json")
    assert _episodes(served) == piped
    assert _episodes(evaluated) == piped
    replies = {reply for reply, _ in piped}
    assert replies == {"<answer>Dragon</answer>"}, replies  # the taught answer, with its prefix, once
    assert all(success for _, success in piped)
    # Same effective generation settings, so the served run and ragen's ranks in one table.
    assert served["agent"]["template_prefix"] == "<answer>"
    assert served["agent"]["generation"]["Bandit"]["generation_prefix"] == "<answer>"
    assert served["agent"]["generation_hash"] == evaluated["agent"]["generation_hash"]
    assert served["summary"]["overall"]["score"] == evaluated["summary"]["overall"]["score"] == 100.0


def test_old_style_checkpoint_evaluates_as_before_and_served_without_prefix_gets_its_own_table(
    run, server, suite_file, tmp_path
):
    new = _evaluated(run.final, suite_file, tmp_path / "new.json")
    old = _evaluated(run.old, suite_file, tmp_path / "old.json")
    assert models.saved_template_prefix(run.old) is None and models.saved_template_prefix(run.final) == "<answer>"
    assert _episodes(old) == _episodes(new)  # ragen adds the prefix itself, once, for both styles
    assert old["agent"]["generation_hash"] == new["agent"]["generation_hash"]
    # The same prompt ids from both folders (and from the saved template itself): never a doubled prefix.
    messages = _bandit_messages(SEEDS[1])
    prefix = ChatTokens(run.tokenizer).encode("<answer>")
    for folder in (run.final, run.old):
        chat = ChatTokens(models.load_tokenizer(str(folder)))
        assert chat.prompt_ids(messages) + prefix == ChatTokens(run.tokenizer).prompt_ids(messages) + prefix
    from transformers import AutoTokenizer

    rendered = AutoTokenizer.from_pretrained(run.final).apply_chat_template(messages, add_generation_prompt=True)
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    assert rendered == ChatTokens(run.tokenizer).prompt_ids(messages) + prefix

    # Served as ragen saved it before: the server's prompt lacks the prefix, the reply too -- the 0.0.
    unprefixed = _served(run.old, server, suite_file)
    assert unprefixed["agent"]["generation"]["Bandit"]["generation_prefix"] is None
    assert not any(reply.startswith("<answer>") for reply, _ in _episodes(unprefixed))
    assert unprefixed["summary"]["overall"]["score"] == 0.0
    board = build_board([new, old, unprefixed], ["new.json", "old.json", "served-old.json"])
    assert sorted(len(group["rows"]) for group in board) == [1, 2]  # never ranked against the prefixed runs
    # Markdown-escaped (a bare <answer> is an HTML tag renderers drop): it shows as <answer>.
    assert "no prefix" in markdown_table(board) and "prefix '\\<answer\\>'" in markdown_table(board)


def test_an_old_style_checkpoint_can_be_given_the_serving_files(run, tmp_path):
    from ragen_trainer.model_card import write_serving_folder

    # As the issue saw it: through a pipeline, a folder without the prefix in its template fails every episode.
    assert not any(success for _, success in _pipeline_episodes(run.old))
    upgraded = write_serving_folder(run.old, tmp_path / "upgraded")
    assert models.saved_template_prefix(upgraded) == "<answer>" and (upgraded / "README.md").is_file()
    assert models.saved_template_prefix(run.old) is None  # the original is left as it was
    assert _pipeline_episodes(upgraded) == _pipeline_episodes(run.final)
    assert (upgraded / "model.safetensors").read_bytes() == (run.final / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="exists"):
        write_serving_folder(run.old, upgraded)
    with pytest.raises(ValueError, match="not a ragen checkpoint"):
        write_serving_folder(tmp_path)
