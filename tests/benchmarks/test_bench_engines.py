"""``benchmarks/bench_engines.py``: the plumbing on the tiny test model (hf and plain generate, batch 2, 4 tokens,
one round: every row written, tokens counted the same way on both paths), and a missing vLLM gives a row that says
how to install it instead of a crash. Timings are not checked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_engines


def _run(tmp_path, model_dir, *extra):
    out_json, out_md = tmp_path / "engines.json", tmp_path / "engines.md"
    argv = ["--model", model_dir, "--batches", "2", "--max-new-tokens", "4", "--rounds", "1", "--threads", "1",
            "--dtypes", "float32", "--peak-size", "128", "--json", str(out_json), "--md", str(out_md),
            "--worker-logs", str(tmp_path / "logs"), *extra]  # fmt: skip
    assert bench_engines.main(argv) == 0
    result = json.loads(out_json.read_text(encoding="utf-8"))
    return result, out_md.read_text(encoding="utf-8")


def test_hf_and_generate_rows_on_the_tiny_model(tmp_path, tiny_model_dir, capsys):
    result, md = _run(tmp_path, tiny_model_dir, "--paths", "hf", "generate")
    rows = {(r["path"], r["workload"]): r for r in result["rows"]}
    assert set(rows) == {(p, w) for p in ("hf", "generate") for w in ("first-turn", "five-turn", "training-step")}
    hf, plain = rows[("hf", "first-turn")], rows[("generate", "first-turn")]
    for row in (hf, plain, rows[("hf", "five-turn")], rows[("generate", "five-turn")]):
        assert row["status"] == "ok" and row["dtype"] == "float32" and row["batch"] == 2 and row["threads"] == 1
        assert row["tokens"] > 0 and row["seconds"] > 0 and row["tokens_per_s"] > 0
        assert row["matmul_peak_gflops_per_s"] > 0 and row["gflops_per_s"] > 0 and 0 < row["peak_fraction"]
        assert row["flops_per_token"] > 0 and len(row["rounds_s"]) == 1
        assert "vs_vllm" not in row  # no vLLM row to compare with
    # first turn: no stop token, no stop string, so both write exactly batch x max_new_tokens
    assert hf["tokens"] == plain["tokens"] == 2 * 4
    five = rows[("hf", "five-turn")]
    assert five["episodes"] == 2 and 2 <= five["turns"] <= 10 and five["tokens"] <= five["turns"] * 4
    # plain generate plays the same episodes (GenerateEngine: every turn's whole conversation re-encoded)
    five_plain = rows[("generate", "five-turn")]
    assert five_plain["episodes"] == 2 and 2 <= five_plain["turns"] <= 10
    assert five_plain["tokens"] <= five_plain["turns"] * 4
    step = rows[("hf", "training-step")]  # one initial state, its group of two episodes (the batch)
    assert step["status"] == "ok" and step["episodes"] == 2 and 2 <= step["turns"] <= 10
    plain_step = rows[("generate", "training-step")]
    assert plain_step["status"] == "ok" and plain_step["episodes"] == 2
    for row in rows.values():  # every row over plain generate's in its cell
        plain_speed = rows[("generate", row["workload"])]["tokens_per_s"]
        assert row["vs_generate"] == pytest.approx(row["tokens_per_s"] / plain_speed)
    # the same prompt token ids for every path: distinct initial states
    assert len(set(result["settings"]["prompt_seeds"])) == 2
    assert result["machine"]["cpu"] and len(result["load_average_before"]) == 3
    assert result["versions"]["parent"]["torch"] and result["date"]
    for text in (md, capsys.readouterr().out, result["table"]):
        assert "hf (ragen HFEngine)" in text and "plain generate" in text and "first-turn" in text
    assert "| hf (ragen HFEngine) | float32 | 2 | first-turn | 8 |" in md
    assert result["complete"] is True and "Incomplete" not in md


@pytest.mark.parametrize(("path", "workload", "label"), [
    ("hf-unshared", "training-step", "hf, no shared attention"),
    ("hf-onednn", "five-turn", "hf, oneDNN packs"),
])  # fmt: skip
def test_an_option_of_the_engine_is_timed_beside_it_on_the_same_rollouts(tmp_path, tiny_model_dir, path, workload,
                                                                          label):
    result, md = _run(tmp_path, tiny_model_dir, "--paths", "hf", path, "--workloads", workload, "--batches", "4")
    rows = {r["path"]: r for r in result["rows"]}
    assert rows["hf"]["status"] == rows[path]["status"] == "ok"
    # The same seeded rollouts: shared attention and the packs' library change how the same numbers are computed,
    # not what is written.
    assert rows["hf"]["tokens"] == rows[path]["tokens"] and rows["hf"]["turns"] == rows[path]["turns"]
    assert f"| {label} | float32 | 4 | {workload} |" in md


def test_direct_decode_is_timed_beside_decoding_through_transformers(tmp_path, tiny_model_dir):
    result, md = _run(tmp_path, tiny_model_dir, "--paths", "hf", "hf-transformers", "--workloads", "first-turn",
                      "--batches", "4")  # fmt: skip
    rows = {r["path"]: r for r in result["rows"]}
    assert rows["hf"]["status"] == rows["hf-transformers"]["status"] == "ok"
    assert rows["hf"]["tokens"] == rows["hf-transformers"]["tokens"]
    assert "| hf, decode through transformers | float32 | 4 | first-turn |" in md


def test_every_round_is_written_as_it_is_timed(tmp_path, tiny_model_dir, monkeypatch):
    # A run stopped midway (its wall-clock limit) keeps the rounds it timed, marked incomplete.
    seen = []
    real = bench_engines.write_outputs

    def spy(args, result):
        seen.append((result["complete"], sum(r["status"] == "ok" for r in result["rows"])))
        return real(args, result)

    monkeypatch.setattr(bench_engines, "write_outputs", spy)
    _run(tmp_path, tiny_model_dir, "--paths", "hf", "hf-before", "--workloads", "first-turn")
    assert seen == [(False, 1), (False, 2), (True, 2)]
    partial = {**json.loads((tmp_path / "engines.json").read_text()), "complete": False}
    assert "**Incomplete**" in bench_engines.format_markdown(partial)


def test_first_turn_prompts_are_the_rollouts_first_prompts(tiny_model_dir):
    from ragen_trainer.config import load_config
    from ragen_trainer.engines import SamplingParams
    from ragen_trainer.engines.hf import HFEngine
    from ragen_trainer.models import load_model_and_tokenizer
    from ragen_trainer.rollout import collect_rollouts

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype="float32", device="cpu")
    seeds, prompts = bench_engines.first_turn_prompts(tokenizer, bench_engines.ENV_ID, 3)
    assert len({tuple(p) for p in prompts}) == 3
    batch = collect_rollouts(HFEngine(model, tokenizer, batch_size=3), tokenizer, bench_engines.ENV_ID, seeds, 1,
                             settings=load_config().replace(reply_tokens="sampled").rollout_settings(),
                             sampling=SamplingParams(max_new_tokens=2, seed=0))  # fmt: skip
    for traj, prompt in zip(batch.trajectories, prompts):
        assert traj.input_ids[: len(prompt)] == prompt  # the generation prefix is prompt under "sampled"


@pytest.mark.parametrize("python", ["missing", "without-vllm"])
def test_a_missing_vllm_gives_a_not_installed_row(tmp_path, tiny_model_dir, python):
    import importlib.util

    if python == "without-vllm":
        if importlib.util.find_spec("vllm") is not None:
            pytest.skip("this Python has vLLM")
        vllm_python = sys.executable  # starts a worker whose `import vllm` fails
    else:
        vllm_python = str(tmp_path / "no-venv" / "bin" / "python")
    result, md = _run(tmp_path, tiny_model_dir, "--paths", "vllm", "generate", "--workloads", "first-turn",
                      "--vllm-python", vllm_python)  # fmt: skip
    rows = {r["path"]: r for r in result["rows"]}
    assert rows["vllm"]["status"] == bench_engines.NOT_INSTALLED == "not installed: bash scripts/vllm_lane.sh --setup-only"
    assert rows["generate"]["status"] == "ok" and rows["generate"]["tokens"] == 8  # the rest still runs
    assert bench_engines.NOT_INSTALLED in md and bench_engines.NOT_INSTALLED in result["table"]


def test_skip_vllm_and_dtype_aliases():
    args = bench_engines.build_parser().parse_args(["--dtypes", "fp32", "bf16", "--skip-vllm"])
    assert args.dtypes == ["float32", "bfloat16"] and args.skip_vllm
    with pytest.raises(SystemExit):
        bench_engines.main(["--paths", "vllm", "--skip-vllm"])
