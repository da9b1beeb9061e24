"""``benchmarks/serving_agreement.py`` on a tiny trained checkpoint: the pipeline, ``transformers serve`` (when it can
run here) and the ``hf`` eval give the same replies and successes, the JSON holds the three rows, and a folder that is
not a ragen checkpoint is refused with a clear message.

The checkpoint is the one of ``tests/trainer/test_checkpoint_portability.py`` (its ``run`` fixture: the tiny model
taught to answer the Bandit with ``Dragon</answer>`` after the ``<answer>`` prefix, then one StarPO-S step), so a path
that loses or doubles the prefix fails its episodes and shows in the table.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from ragen_trainer.engines.local_server import serve_missing
from tests.trainer import test_checkpoint_portability as portability

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serving_agreement.py"
EPISODES = 4  # enough to compare the paths; the test stays well under 30 s with the server's start-up

# The trained checkpoint, built once for this module by the portability tests' fixture.
run = portability.run


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread (their matmuls are too small to split; see tests/trainer/conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serving_agreement_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_the_three_paths_agree_and_the_json_has_three_rows(script, run, tmp_path, capsys):
    missing = serve_missing()
    out = tmp_path / "agreement.json"
    argv = [str(run.final), "--episodes", str(EPISODES), "--device", "cpu", "--json", str(out), "--no-progress"]
    code = script.main(argv + (["--no-serve"] if missing else []))
    printed = capsys.readouterr().out
    assert code == 0, printed

    report = json.loads(out.read_text())
    table = report["rows"]
    assert [row["path"] for row in table] == ["pipeline", "served", "hf eval"]
    assert table[1]["status"] == ("skipped" if missing else "ok")
    ran = [row for row in table if row["status"] == "ok"]
    assert len(ran) == (2 if missing else 3)
    for row in ran:
        # Greedy: every reply identical to the hf eval's, and every episode won with the taught answer.
        assert (row["identical_replies"], row["compared_replies"]) == (EPISODES, EPISODES), row
        assert row["successes"] == row["episodes"] == EPISODES, row
        assert row["seconds"] > 0
    assert report["all_agree"] is True
    assert report["generation_prefix"] == "<answer>" and report["decoding"]["sample"] is False
    assert report["seeds"] == list(range(1_000_000, 1_000_000 + EPISODES))

    assert "| path | success (k / n, %) | replies identical to the hf eval (k / n) | seconds |" in printed
    assert f"| {EPISODES} / {EPISODES} (100.0%) | {EPISODES} / {EPISODES} |" in printed
    assert "All paths agree" in printed


def test_a_folder_that_is_not_a_ragen_checkpoint_is_refused(script, tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")  # a model folder, but not one ragen saved
    assert script.main([str(tmp_path), "--no-serve"]) == 2
    assert "is not a ragen checkpoint" in capsys.readouterr().err
    assert script.main([str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
