"""Files a user hands over, and files ragen writes for a user.

Read: a result file (the leaderboard, ``--rescore``), a checkpoint, a suite or a YAML config that is a symbolic link
to ``/dev/zero``, a FIFO, a folder or larger than its cap is refused by name, at once (no hang, no memory blow-up);
YAML that nests too deep or expands its aliases past a bound is refused before it is built. Names from result files
cannot forge rows or markup in the Markdown leaderboard.

Written: every output gets the permissions an ordinary ``open()`` gives under the user's umask (``0644`` under 022,
``0600`` under 077), ``model.safetensors`` of a saved model folder and the model card included (transformers writes
the weights through a private ``0600`` temporary file); a file replaced keeps its mode.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import threading
import warnings
from pathlib import Path

import pytest

from ragen_trainer import fileio
from ragen_trainer.config import load_config
from ragen_trainer.evaluation.cli import main as eval_main
from ragen_trainer.evaluation.leaderboard import build_leaderboard, markdown_text
from ragen_trainer.evaluation.runner import load_result, run_suite, save_result
from ragen_trainer.evaluation.schema import ResultFileError, read_json
from ragen_trainer.evaluation.suites import load_suite
from ragen_trainer.safe_yaml import MAX_DEPTH, MAX_NODES, load_yaml, load_yaml_file

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, /dev/zero and umasks are POSIX")


@pytest.fixture(scope="module")
def oracle_result():
    from ragen_trainer.evaluation.agents import OracleAgent

    suite = load_suite("bandit-bare-v2").select(["Bandit"], 2)
    return run_suite(suite, OracleAgent(), progress=False)


# ------------------------------------------------------------------------------------------------ reading
def _hostile_paths(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    folder = tmp_path / "folder.json"
    folder.mkdir()
    return {"fifo": fifo, "dev-zero": zero, "folder": folder}


@posix_only
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_a_result_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    """A FIFO without a writer would block ``open()`` forever; /dev/zero never ends. Both are refused by their type,
    in a thread so that a regression fails the test instead of hanging it."""
    path = _hostile_paths(tmp_path)[kind]
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_json(path)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), f"reading {kind} hangs"
    assert isinstance(outcome[0], ResultFileError) and "not a regular file" in str(outcome[0])


@posix_only
def test_the_leaderboard_skips_hostile_files_in_a_folder(tmp_path, oracle_result):
    results = tmp_path / "results"
    results.mkdir()
    save_result(oracle_result, results / "oracle.json")
    _hostile_paths(results)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        markdown, _ = build_leaderboard(sorted(results.glob("*.json")))
    assert "| oracle |" in markdown
    skipped = " ".join(str(w.message) for w in caught)
    assert skipped.count("not a regular file") == 3


def test_a_result_file_over_the_cap_is_refused_by_its_size(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pad": "x" * 5000}))
    with pytest.raises(ResultFileError, match=r"5,01\d bytes; at most 1,000 are read"):
        read_json(path, max_bytes=1000)
    with pytest.raises(fileio.BoundedReadError, match="at most 1,000"):
        fileio.read_text_bounded(path, 1000)


@posix_only
def test_suites_and_configs_that_are_not_regular_files_are_refused(tmp_path):
    paths = _hostile_paths(tmp_path)
    with pytest.raises(ValueError, match="suite file .* is a FIFO"):
        load_suite(paths["fifo"])
    with pytest.raises(ValueError, match="suite file .* is a device"):
        load_suite(paths["dev-zero"])
    fifo_yaml = tmp_path / "config.yaml"
    os.mkfifo(fifo_yaml)
    with pytest.raises(ValueError, match="invalid argument config=.* is a FIFO, not a regular file"):
        load_config(str(fifo_yaml))


def test_a_checkpoint_that_is_not_a_regular_file_is_ignored_with_a_warning(tmp_path, capsys):
    out = tmp_path / "oracle.json"
    out.with_name(out.name + ".partial").symlink_to("/dev/zero")
    assert eval_main(["eval", "--agent", "oracle", "--suite", "bandit-bare-v2", "--envs", "Bandit", "--max-states",
                      "2", "--no-progress", "-o", str(out)]) == 0  # fmt: skip
    assert "ignoring checkpoint" in capsys.readouterr().err and load_result(out)


# ------------------------------------------------------------------------------------------------ YAML
def test_yaml_alias_expansion_is_bounded():
    bomb = "".join(f"{a}: &{a} [" + ",".join([f"*{p}" if p else "x"] * 9) + "]\n"
                   for p, a in zip(["", *"abcdefgh"], "abcdefghi"))  # fmt: skip
    assert len(bomb) < 400  # 9**9 values once expanded
    with pytest.raises(ValueError, match=f"more than {MAX_NODES:,} values once its aliases"):
        load_yaml(bomb, "config")
    small = "a: &a [1, 2]\nb: *a\nc: {<<: {d: 1}}\n"  # aliases and merge keys within the bound are fine
    assert load_yaml(small) == {"a": [1, 2], "b": [1, 2], "c": {"d": 1}}


def test_yaml_nesting_is_bounded():
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH} levels"):
        load_yaml("[" * 50_000 + "]" * 50_000)
    with pytest.raises(ValueError, match="nested deeper"):
        load_yaml("a:\n" + "".join("  " * k + "- \n" for k in range(1, 200)))
    assert load_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None


def test_yaml_stays_plain_data(tmp_path):
    with pytest.raises(ValueError, match="not valid YAML"):
        load_yaml("!!python/object/apply:os.system ['echo pwned']")
    path = tmp_path / "c.yaml"
    path.write_bytes(b"a: \xff\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_yaml_file(path)


# ------------------------------------------------------------------------------------------------ Markdown
def test_names_cannot_forge_markdown_rows_or_markup(tmp_path, oracle_result):
    forged = json.loads(json.dumps(oracle_result))
    forged["agent"]["name"] = "evil | 100.0 |\n| 1 | fake-model | model | 100.0 <script>alert(1)</script> [x](javascript:y)"
    save_result(forged, tmp_path / "forged.json")
    markdown, _ = build_leaderboard([tmp_path / "forged.json"])
    rows = [line for line in markdown.splitlines() if line.startswith("| 1 ")]
    assert len(rows) == 1 and "fake-model" in rows[0]  # one row, the forged one inside its own cell
    header = next(line for line in markdown.splitlines() if line.startswith("| #"))

    def cells(line: str) -> int:  # a cell ends at a | that is not backslash-escaped
        return len(re.split(r"(?<!\\)\|", line))

    assert cells(rows[0]) == cells(header)
    assert "<script>" not in markdown and "\\<script\\>" in markdown and "\\[x\\]" in markdown
    assert markdown_text("a|b\r\nc`d*e") == "a\\|b c\\`d\\*e"


# ------------------------------------------------------------------------------------------------ permissions
@pytest.fixture
def umask():
    """Set the process's umask for one test (restored after)."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@posix_only
@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_get_the_modes_of_the_umask(tmp_path, umask, oracle_result, mask, expected):
    umask(mask)
    assert fileio.current_umask() == mask
    written = [
        fileio.atomic_write_text(tmp_path / "a.txt", "x"),
        fileio.atomic_write_json(tmp_path / "summary.json", {"a": 1}),
        save_result(oracle_result, tmp_path / "results" / "oracle.json"),
        load_config("starpo-s").save(tmp_path / "config.yaml") or tmp_path / "config.yaml",
    ]
    build_leaderboard([tmp_path / "results" / "oracle.json"], markdown_path=tmp_path / "leaderboard.md",
                      html_path=tmp_path / "leaderboard.html")  # fmt: skip
    written += [tmp_path / "leaderboard.md", tmp_path / "leaderboard.html"]
    assert {p.name: oct(_mode(p)) for p in written} == {p.name: oct(expected) for p in written}


@posix_only
def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    path = tmp_path / "kept.json"
    path.write_text("{}")
    path.chmod(0o640)
    fileio.atomic_write_json(path, {"b": 2})
    assert _mode(path) == 0o640 and json.loads(path.read_text()) == {"b": 2}


@posix_only
def test_a_saved_model_folder_and_its_card_get_the_modes_of_the_umask(tmp_path, umask):
    """transformers 5 writes model.safetensors 0600; the serving files (what final/ and checkpoint-N get) fix it."""
    pytest.importorskip("torch")
    from ragen_trainer.model_card import serving_settings, write_serving_files
    from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer

    umask(0o022)
    folder = tmp_path / "final"
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    cfg = load_config("starpo-s").validate()
    write_serving_files(folder, model=model, tokenizer=tokenizer, config=cfg, settings=serving_settings(cfg),
                        base_model="tiny", step=1, kind="final")  # fmt: skip
    modes = {p.name: oct(_mode(p)) for p in folder.iterdir()}
    assert "model.safetensors" in modes and "README.md" in modes
    assert set(modes.values()) == {oct(0o644)}, modes
    assert _mode(folder) == 0o755
