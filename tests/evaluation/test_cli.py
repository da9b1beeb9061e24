"""The eval / leaderboard subcommands (through the trainer's ``ragen-trainer`` when present)."""

from __future__ import annotations

import json

import pytest

from ragen_trainer.evaluation.cli import main
from ragen_trainer.evaluation.runner import load_result


def _trainer_main():
    cli = pytest.importorskip("ragen_trainer.cli")
    return cli.main


def test_eval_reference_agents_then_leaderboard(tmp_path, capsys):
    out_o, out_r = tmp_path / "oracle.json", tmp_path / "random.json"
    common = ["--suite", "quick-v2", "--envs", "Bandit,Countdown,FrozenLake", "--max-states", "4", "--no-progress"]
    assert main(["eval", "--agent", "oracle", *common, "-o", str(out_o)]) == 0
    assert main(["eval", "--agent", "random", "--name", "coin-flip", *common, "-o", str(out_r)]) == 0
    printed = capsys.readouterr().out
    assert "overall score" in printed and "result written" in printed
    assert load_result(out_r)["agent"]["name"] == "coin-flip"
    md, page = tmp_path / "lb.md", tmp_path / "lb.html"
    # a folder works too, and only result files are picked from it
    (tmp_path / "notes.json").write_text(json.dumps({"hello": "world"}))
    assert main(["leaderboard", str(tmp_path), "--markdown", str(md), "--html", str(page)]) == 0
    text = md.read_text()
    assert text.index("| oracle") < text.index("| coin-flip") and "quick-v2+subset" in text
    assert "Trajectory viewer" in page.read_text()


def test_rescore_prints_the_table_and_checks_the_stored_summary(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["eval", "--agent", "random", "--suite", "quick-v2", "--envs", "Bandit", "--max-states", "2",
                 "--no-progress", "-o", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", "--rescore", str(out), "-o", str(tmp_path / "re.json")]) == 0
    assert "matches the re-scored one" in capsys.readouterr().out
    assert load_result(tmp_path / "re.json")["summary"] == load_result(out)["summary"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "--agent", "random", "--suite", "no-such-suite"], "unknown suite"),
        (["eval", "--agent", "random", "--suite", "quick-v2", "--envs", "Chess"], "Chess"),
        (["eval", "--agent", "random", "--suite", "quick-v2", "--batch-size", "0"], "batch-size"),
        (["eval", "--agent", "model", "--engine", "openai", "--suite", "quick-v2"], "base_url"),
        (["leaderboard", "missing.json"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_ragen_trainer_dispatches_eval_and_leaderboard(tmp_path, capsys):
    trainer_main = _trainer_main()
    out = tmp_path / "o.json"
    code = trainer_main(["eval", "--agent", "oracle", "--suite", "quick-v2", "--envs", "Bandit", "--max-states", "2",
                         "--no-progress", "-o", str(out)])  # fmt: skip
    assert code == 0 and load_result(out)["summary"]["envs"]["Bandit"]["success_rate"] == 1.0
    code = trainer_main(["leaderboard", str(out), "--markdown", str(tmp_path / "m.md"), "--html",
                         str(tmp_path / "h.html")])  # fmt: skip
    assert code == 0 and (tmp_path / "h.html").is_file()


def test_run_leaderboard_script_evaluates_the_reference_agents(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "run_leaderboard.py"
    spec = importlib.util.spec_from_file_location("run_leaderboard", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--suite", "quick-v2", "--envs", "Bandit,Countdown", "--out", str(tmp_path),
                        "--no-progress"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "| 1 | oracle |" in printed and "seconds" in printed
    assert (tmp_path / "leaderboard.html").is_file()
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["oracle__quick-v2-subset.json",
                                                               "random__quick-v2-subset.json"]  # fmt: skip
