"""``benchmarks/compare_hot_paths.py``: ratios from a pytest-benchmark report, held against saved baselines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compare_hot_paths


def _report(path: Path, **groups: list[float]) -> str:
    """A report as pytest-benchmark writes it from ``benchmarks/test_hot_paths.py``: per group the paired rounds'
    ratios (and each path's time per call: the reference 1 s, ragen the ratio)."""
    benches = [{"group": g, "name": f"test_{g}", "stats": {"min": 1.0},
                "extra_info": {"ratios": rounds, "ragen_s": rounds, "reference_s": [1.0] * len(rounds)}}
               for g, rounds in groups.items()]
    benches.append({"group": "other", "name": "test_without_rounds", "stats": {"min": 1.0}, "extra_info": {}})
    path.write_text(json.dumps({"benchmarks": benches}), encoding="utf-8")
    return str(path)


def test_ratio_is_the_median_of_the_rounds_ratios(tmp_path):
    report = json.loads(Path(_report(tmp_path / "r.json", update=[0.2, 0.5, 0.21, 0.19, 0.2])).read_text())
    row = compare_hot_paths.ratios(report)["update"]
    assert row["ratio"] == 0.2 and row["rounds"] == 5  # the one round hit by load (0.5) moves nothing
    assert row["low"] <= 0.2 <= row["high"] and row["reference"] == 1.0 and row["ragen"] == 0.2
    assert "other" not in compare_hot_paths.ratios(report)


def test_update_saves_then_compare_passes_within_tolerance_and_fails_beyond(tmp_path, capsys):
    baselines = str(tmp_path / "baselines" / "hot.json")
    first = _report(tmp_path / "a.json", update=[0.2, 0.2, 0.2], decode=[0.5])
    assert compare_hot_paths.main([first, "--baselines", baselines, "--update"]) == 0
    assert json.loads(Path(baselines).read_text()) == {"decode": 0.5, "update": 0.2}
    within = _report(tmp_path / "b.json", update=[0.23, 0.23, 0.9], decode=[0.4])  # +15 %, -20 %
    assert compare_hot_paths.main([within, "--baselines", baselines]) == 0
    assert "every ratio within 20%" in capsys.readouterr().out
    slower = _report(tmp_path / "c.json", update=[0.25, 0.25, 0.1], decode=[0.5])  # update +25 %
    assert compare_hot_paths.main([slower, "--baselines", baselines]) == 1
    captured = capsys.readouterr()
    assert "regression of more than 20% in: update" in captured.err
    assert "REGRESSION" in captured.out and "middle half" in captured.out


def test_several_reports_give_the_median_of_their_ratios(tmp_path, capsys):
    """A run-wide shift (one report's every round slower) is what the rounds cannot absorb: baselines saved from
    several reports take the median of the reports' ratios, and only groups every report has."""
    baselines = str(tmp_path / "hot.json")
    reports = [_report(tmp_path / "a.json", scoring=[0.19, 0.19, 0.2], decode=[0.4]),
               _report(tmp_path / "b.json", scoring=[0.23, 0.22, 0.22]),
               _report(tmp_path / "c.json", scoring=[0.21, 0.21, 0.5], decode=[0.4])]
    assert compare_hot_paths.main([*reports, "--baselines", baselines, "--update"]) == 0
    assert json.loads(Path(baselines).read_text()) == {"scoring": 0.21}
    assert "from 3 report(s)" in capsys.readouterr().out
    assert compare_hot_paths.main([reports[1], "--baselines", baselines]) == 0  # +4.8 %
    disjoint = _report(tmp_path / "d.json", decode=[0.4])
    assert compare_hot_paths.main([reports[1], disjoint, "--baselines", baselines]) == 2
    assert "no benchmark group is in all of" in capsys.readouterr().err


def test_a_report_without_rounds_or_bad_baselines_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"benchmarks": []}), encoding="utf-8")
    assert compare_hot_paths.main([str(empty), "--baselines", str(tmp_path / "none.json")]) == 2
    assert "holds no paired rounds" in capsys.readouterr().err
    assert compare_hot_paths.main([str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    not_a_report = tmp_path / "list.json"
    not_a_report.write_text("[1, 2]", encoding="utf-8")
    assert compare_hot_paths.main([str(not_a_report)]) == 2
    assert "is not a pytest-benchmark report" in capsys.readouterr().err
    good = _report(tmp_path / "good.json", update=[0.2])
    torn = tmp_path / "torn.json"
    torn.write_text('{"update": 0.2', encoding="utf-8")
    assert compare_hot_paths.main([good, "--baselines", str(torn)]) == 2
    assert "cannot read the baselines" in capsys.readouterr().err
    negative = tmp_path / "negative.json"
    negative.write_text('{"update": -1}', encoding="utf-8")
    assert compare_hot_paths.main([good, "--baselines", str(negative)]) == 2
    assert "not a JSON object of positive ratios" in capsys.readouterr().err
