"""``benchmarks/compare_hot_paths.py``: ratios from a pytest-benchmark report, held against saved baselines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compare_hot_paths


def _report(path: Path, **groups: tuple[float, list[float]]) -> str:
    """A report as pytest-benchmark writes it: per group ragen's rounds' fastest and the reference's rounds."""
    benches = [{"group": g, "name": f"test_{g}", "stats": {"min": ragen}, "extra_info": {"reference_s": reference}}
               for g, (ragen, reference) in groups.items()]
    benches.append({"group": "other", "name": "test_without_reference", "stats": {"min": 1.0}, "extra_info": {}})
    path.write_text(json.dumps({"benchmarks": benches}), encoding="utf-8")
    return str(path)


def test_ratio_is_ragen_fastest_over_reference_fastest(tmp_path):
    report = json.loads(Path(_report(tmp_path / "r.json", update=(0.2, [1.5, 1.0, 1.2]))).read_text())
    assert compare_hot_paths.ratios(report) == {"update": {"ragen": 0.2, "reference": 1.0, "ratio": 0.2}}


def test_update_saves_then_compare_passes_within_tolerance_and_fails_beyond(tmp_path, capsys):
    baselines = str(tmp_path / "baselines" / "hot.json")
    first = _report(tmp_path / "a.json", update=(0.2, [1.0]), decode=(0.5, [1.0]))
    assert compare_hot_paths.main([first, "--baselines", baselines, "--update"]) == 0
    assert json.loads(Path(baselines).read_text()) == {"decode": 0.5, "update": 0.2}
    within = _report(tmp_path / "b.json", update=(0.23, [1.0]), decode=(0.4, [1.0]))  # +15 %, -20 %
    assert compare_hot_paths.main([within, "--baselines", baselines]) == 0
    slower = _report(tmp_path / "c.json", update=(0.25, [1.0]), decode=(0.5, [1.0]))  # update +25 %
    assert compare_hot_paths.main([slower, "--baselines", baselines]) == 1
    assert "regression of more than 20% in: update" in capsys.readouterr().err


def test_a_report_without_pairs_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"benchmarks": []}), encoding="utf-8")
    assert compare_hot_paths.main([str(empty), "--baselines", str(tmp_path / "none.json")]) == 2
    assert "holds no ragen/reference pair" in capsys.readouterr().err
    assert compare_hot_paths.main([str(tmp_path / "missing.json")]) == 2
