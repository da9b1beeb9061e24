"""``benchmarks/grid_perception.py``: the boards and answers are the env's, the two renderings differ only in the
spaces between cells, answers are parsed as the question asks, and a run on the tiny model writes its table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import grid_perception as gp


def test_boards_are_the_envs_and_renderings_differ_only_by_spaces():
    rows, cell, thought = gp.board(5)
    assert rows[cell[0]][cell[1]] == "P" and len(rows) == 4 and all(len(r) == 4 for r in rows)
    reference, spaced = gp.render(rows, "reference"), gp.render(rows, "spaced")
    assert reference.splitlines() == rows and spaced.replace(" ", "") == reference
    assert spaced.splitlines()[cell[0]].split(" ")[cell[1]] == "P"
    for rendering, separator in gp.RENDERINGS.items():  # what the env itself shows with that option
        env = gp.gym.make(gp.ENV_ID, cell_separator=separator)
        env.reset(seed=5)
        assert gp.render(rows, rendering) == env.unwrapped.state_text()
    assert gp.question(rows, "spaced")[0]["content"].endswith(gp.QUESTIONS["player"])
    assert thought.startswith(f"I am at ({cell[0]}, {cell[1]}), the goal at (")  # the warm-up's state thought
    assert gp.answer((rows, cell, thought), "state") == thought and gp.answer((rows, cell, thought), "player") == (
        f"({cell[0]}, {cell[1]})")
    with pytest.raises(ValueError, match="rendering"):
        gp.render(rows, "pixels")
    assert len({tuple(gp.board(s)[0]) for s in range(20)}) > 10  # the seeds give different boards


def test_answers_are_parsed_as_cells():
    assert gp.parse_cell("(2, 3)") == (2, 3) and gp.parse_cell("It is at ( 0 ,1 ).") == (0, 1)
    assert gp.parse_cell("row 2, column 3") is None


def test_a_run_on_the_tiny_model_writes_its_table(tmp_path, tiny_model_dir, capsys):
    out_json, out_md = tmp_path / "p.json", tmp_path / "p.md"
    argv = ["--model", tiny_model_dir, "--renderings", "spaced", "--train", "4", "--test", "3", "--epochs", "1",
            "--batch-size", "2", "--json", str(out_json), "--md", str(out_md)]  # fmt: skip
    assert gp.main(argv) == 0
    result = json.loads(out_json.read_text(encoding="utf-8"))["results"][0]
    assert result["rendering"] == "spaced" and len(result["losses"]) == 1
    for name in ("before", "after"):
        s = result[name]
        assert 0 <= s["exact"] <= s["row"] + 1e-9 <= 1 + 1e-9 and 0 <= s["col"] <= 1
        assert s["exact_ci"][0] <= s["exact"] <= s["exact_ci"][1]
    assert "| spaced | after |" in out_md.read_text(encoding="utf-8") and "| spaced | before |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gp.main(["--train", "0"])


def test_the_state_task_saves_a_model_the_warm_up_can_start_from(tmp_path, tiny_model_dir):
    save = tmp_path / "perception"
    argv = ["--model", tiny_model_dir, "--renderings", "spaced", "--task", "state", "--train", "3", "--test", "2",
            "--epochs", "1", "--batch-size", "2", "--save", str(save), "--json", str(tmp_path / "p.json")]  # fmt: skip
    assert gp.main(argv) == 0
    result = json.loads((tmp_path / "p.json").read_text(encoding="utf-8"))["results"][0]
    assert result["task"] == "state" and 0 <= result["after"]["whole_answer"] <= 1
    assert (save / "config.json").is_file() and any(save.glob("*.safetensors"))
    model, _ = gp.load_model_and_tokenizer(str(save), dtype="float32", device="cpu")
    assert model.config.vocab_size > 0
    stamp = (save / "config.json").stat().st_mtime_ns
    assert gp.main(argv + ["--resume"]) == 0 and (save / "config.json").stat().st_mtime_ns == stamp  # done: skipped
    with pytest.raises(SystemExit):
        gp.main(["--resume"])  # nothing to resume into
