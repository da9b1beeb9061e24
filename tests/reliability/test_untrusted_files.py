"""Files from a run folder, a checkpoint or a model folder are data, never code (issue 35), and damaged ones get a
message, not a traceback. The tiny random model of tests/trainer/conftest.py; never the real SmolLM2.

* A crafted ``rng_state.pth`` (a pickle whose ``__reduce__`` would create a marker file) in a checkpoint: the resume
  never unpickles it (the marker never appears), says why the RNG state was not restored, and loads the rest. The RNG
  state is JSON now (``rng_state.json``), and a round trip restores exactly the same random streams.
* A crafted ``optimizer.pt`` / ``scheduler.pt``: refused with a message naming the file and saying that it holds
  something other than tensors and plain data (exit 2 from ``ragen-trainer train``).
* DeepSpeed's files, which DeepSpeed reads with ``weights_only=False``: scanned first; ``os.system`` in one is
  refused, a clean one accepted (the real ZeRO checkpoints: ``tests/distributed/test_untrusted_checkpoints.py``).
* A model folder whose ``model.safetensors`` is cut in half, or whose header names a dtype that does not exist:
  ``ragen-trainer eval --model`` and ``train --model`` exit 2 naming the file.
* Duplicate keys in YAML (a config file, ``--set``, a flag's value): an error naming the key and both lines.
* ``dist_timeout_minutes``: validated, handed to the process group whatever its value, and the sentence a process
  prints when another one stops answering (the two-process test: ``tests/distributed/test_bounded_waits.py``).
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import random
import shlex
import shutil
import zipfile
from collections import OrderedDict
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
np = pytest.importorskip("numpy")

# after the skips: these need the training stack
from ragen_trainer import cli
from ragen_trainer.checkpoints.rng import capture_rng_state, read_rng_state, set_rng_state
from ragen_trainer.checkpoints.state import load_plain_torch_file
from ragen_trainer.checkpoints.verify import checkpoint_problems, pickled_globals
from ragen_trainer.config import load_config
from ragen_trainer.distributed import (
    DEEPSPEED_PICKLE_GLOBALS,
    DEEPSPEED_TAG,
    check_deepspeed_files,
    collective_timeout_message,
    is_collective_timeout,
    load_engine_state,
    process_group_kwargs,
)
from ragen_trainer.fileio import atomic_write_json
from ragen_trainer.models import DamagedModelError, ModelLoadError, load_model_and_tokenizer
from ragen_trainer.safe_yaml import load_yaml


class RunsCode:
    """Pickles as ``os.system("touch MARKER")``: what a hostile file in a run folder would hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def plant(path: Path, marker: Path, **extra) -> None:
    """A ``torch.save`` file at ``path`` that runs ``touch marker`` when unpickled without restrictions."""
    path.unlink(missing_ok=True)
    torch.save({"state": {}, "param_groups": [], "payload": RunsCode(marker), **extra}, path)


def run_cli(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own exits
        return int(exc.code or 0)


def train_args(model_dir: Path, out: Path, steps: int) -> list[str]:
    return [
        "train", "--config", "starpo-s-grpo", "--env", "ragen/Bandit-v0", "--model", str(model_dir),
        "--output_dir", str(out), "--total_steps", str(steps), "--env_groups", "2", "--group_size", "2",
        "--max_new_tokens", "4", "--max_context_tokens", "1024", "--max_turns", "1", "--val_every", "0",
        "--save_steps", "1", "--report_to", "jsonl",
    ]


# ---------------------------------------------------------------------------------------------- the RNG state
def draws() -> list[float]:
    """Numbers from every generator a run uses, the cached Gaussians included."""
    return [random.random(), random.gauss(0, 1), random.gauss(0, 1), *np.random.rand(3).tolist(),
            *np.random.randn(3).tolist(), *torch.rand(3).tolist(), *torch.randn(3).tolist()]


def test_the_json_rng_state_restores_exactly_the_same_streams(tmp_path):
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    random.gauss(0, 1)  # leaves a cached Gaussian in Python's generator
    np.random.randn(1)  # and in numpy's
    path = tmp_path / "rng_state.json"
    atomic_write_json(path, capture_rng_state(), indent=None)
    expected = draws()
    draws()  # the generators move on
    set_rng_state(read_rng_state(path), str(path))
    assert draws() == expected
    data = json.loads(path.read_text())
    assert data["python"]["gauss"] is not None and data["numpy"]["has_gauss"] == 1
    assert "pth" not in path.read_text() and path.stat().st_size < 32_000


@pytest.mark.parametrize("change,needle", [
    (lambda d: d.update(format="something else"), "format"),
    (lambda d: d["python"].update(state=d["python"]["state"][:10]), "python.state"),
    (lambda d: d["numpy"].update(key=["a"] * 624), "numpy.key"),
    (lambda d: d["numpy"].update(pos=9999), "pos"),
    (lambda d: d.update(torch_cpu="%%% not base64"), "torch_cpu"),
    (lambda d: d.update(torch_cpu="AAAA"), "generators refuse"),  # decodes, but no torch state of 3 bytes
    (lambda d: d.update(cuda="x"), "cuda"),
    (lambda d: d.clear(), "format"),
], ids=["format", "python-state", "numpy-key", "numpy-pos", "torch-not-base64", "torch-wrong-size", "cuda", "empty"])
def test_a_damaged_rng_state_is_a_message_naming_the_file(tmp_path, change, needle):
    path = tmp_path / "rng_state.json"
    data = capture_rng_state()
    change(data)
    path.write_text(json.dumps(data))
    before = (random.getstate(), torch.random.get_rng_state())
    with pytest.raises(ValueError, match=needle) as info:
        set_rng_state(read_rng_state(path), str(path))
    assert str(path) in str(info.value)
    assert random.getstate() == before[0] and torch.equal(torch.random.get_rng_state(), before[1])  # untouched


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null", '{"format": "ragen-rng-state-1"}'])
def test_a_torn_or_foreign_rng_state_file_is_a_message(tmp_path, text):
    path = tmp_path / "rng_state.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="rng_state.json"):
        read_rng_state(path)


# ---------------------------------------------------------------------------------- a real run's checkpoints
@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, tiny_model_dir):
    """A finished one-step run of ``ragen-trainer train`` (checkpoint-1 and final/); tests work on copies."""
    out = tmp_path_factory.mktemp("untrusted") / "run"
    assert run_cli(train_args(tiny_model_dir, out, 1)) == 0
    checkpoint = out / "checkpoint-1"
    assert (checkpoint / "rng_state.json").is_file() and not list(checkpoint.glob("*.pth"))
    assert checkpoint_problems(checkpoint) == []
    return out


@pytest.fixture
def run_copy(cli_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(cli_run, out)
    return out


def test_the_crafted_file_runs_code_when_unpickled(tmp_path):
    """The planted files of these tests are real threats: unpickled without restrictions, one runs its command."""
    marker = tmp_path / "ran"
    plant(tmp_path / "evil.pt", marker)
    assert ("posix", "system") in {(m, n) for _, m, n in pickled_globals(tmp_path / "evil.pt")}
    with zipfile.ZipFile(tmp_path / "evil.pt") as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    pickle.loads(data)
    assert marker.exists()


def test_a_crafted_rng_state_pth_is_never_unpickled_and_the_resume_says_so(run_copy, tiny_model_dir, tmp_path,
                                                                          capsys, caplog):
    out, marker = run_copy, tmp_path / "pwned"
    checkpoint = out / "checkpoint-1"
    (checkpoint / "rng_state.json").unlink()  # an older checkpoint's layout: rng_state.pth only
    plant(checkpoint / "rng_state.pth", marker)
    assert checkpoint_problems(checkpoint) == []  # still whole: it is an old checkpoint, not a broken one

    with caplog.at_level(logging.WARNING):
        assert run_cli(train_args(tiny_model_dir, out, 2)) == 0

    assert not marker.exists()
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert "rng_state.pth" in warning and "RNG state was not restored" in warning, warning
    assert "can run code" in warning and "weights, optimizer and schedule are loaded" in warning
    assert json.loads((out / "summary.json").read_text())["steps"] == 2  # resumed from step 1 and trained step 2
    assert (out / "checkpoint-2" / "rng_state.json").is_file() and not list((out / "checkpoint-2").glob("*.pth"))
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt"])
def test_a_crafted_optimizer_or_scheduler_file_is_refused_with_a_message(run_copy, tiny_model_dir, tmp_path,
                                                                         capsys, name):
    out, marker = run_copy, tmp_path / "pwned"
    plant(out / "checkpoint-1" / name, marker)

    rc = run_cli(train_args(tiny_model_dir, out, 2))

    err = capsys.readouterr().err
    assert rc == 2, err[-3000:]
    assert not marker.exists()
    assert f"checkpoint-1/{name}" in err and "something other than tensors and plain data" in err, err
    assert "posix.system" in err and "Traceback" not in err
    assert json.loads((out / "summary.json").read_text())["steps"] == 1  # nothing trained, nothing rewritten


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
def test_plain_torch_files_refuse_what_the_scan_cannot_follow(tmp_path):
    """A protocol-4 pickle (which torch's own scan does not parse) is still refused by the restricted loader; a
    torn file is a message too."""
    marker = tmp_path / "pwned"
    path = tmp_path / "scheduler.pt"
    torch.save({"x": RunsCode(marker)}, path, pickle_protocol=4)
    with pytest.raises(ValueError, match="something other than tensors and plain data"):
        load_plain_torch_file(str(path))
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ValueError, match="scheduler.pt"):
        load_plain_torch_file(str(path))
    assert not marker.exists()
    good = tmp_path / "good.pt"
    torch.save({"base_lrs": [1e-3], "last_epoch": 3, "t": torch.ones(2)}, good)
    assert load_plain_torch_file(str(good))["last_epoch"] == 3


def test_checkpoint_checks_accept_json_and_old_pth_rng_states(cli_run, tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(cli_run / "checkpoint-1", checkpoint)
    (checkpoint / "rng_state.json").rename(checkpoint / "rng_state_0.json")  # a process's own file
    assert checkpoint_problems(checkpoint) == []
    (checkpoint / "rng_state_0.json").unlink()
    assert checkpoint_problems(checkpoint) == ["rng_state.json is missing"]
    torch.save({"python": None}, checkpoint / "rng_state.pth")  # an older checkpoint: checked whole, never read
    assert checkpoint_problems(checkpoint) == []
    (checkpoint / "rng_state.json").write_text('{"format": "ragen-rng-state-1", "python": 3}')
    assert any("rng_state.json is not a ragen RNG state" in p for p in checkpoint_problems(checkpoint))


# ------------------------------------------------------------------------------------------- DeepSpeed's files
def torch_zip(path: Path, pickle_bytes: bytes) -> None:
    """A zip laid out like torch.save's, holding ``pickle_bytes`` as its data.pkl."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/version", "3\n")


def test_the_deepspeed_scan_refuses_os_system_and_accepts_a_clean_file(tmp_path):
    tag = tmp_path / "checkpoint-1" / DEEPSPEED_TAG
    tag.mkdir(parents=True)
    clean = {"module": OrderedDict(w=torch.ones(2, 3)), "param_shapes": [OrderedDict(w=torch.Size([2, 3]))],
             "global_steps": 1, "ds_config": {"zero_optimization": {"stage": 2}}, "ds_version": "0.19.8"}
    torch.save(clean, tag / "mp_rank_00_model_states.pt")
    torch.save({"fp32": torch.zeros(4, dtype=torch.bfloat16)}, tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert check_deepspeed_files(tag) == 2

    marker = tmp_path / "pwned"
    plant(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt", marker)
    with pytest.raises(ValueError, match="names the Python object posix.system") as info:
        check_deepspeed_files(tag)
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in str(info.value)
    # load_engine_state scans before DeepSpeed (the model) is touched
    with pytest.raises(ValueError, match="posix.system"):
        load_engine_state(SimpleNamespace(num_processes=1), object(), str(tag.parent), 1)
    assert not marker.exists()


def test_the_allowlist_is_what_deepspeed_writes():
    assert "posix.system" not in DEEPSPEED_PICKLE_GLOBALS and "builtins.eval" not in DEEPSPEED_PICKLE_GLOBALS
    assert all(not g.startswith(("builtins.", "os.", "posix.", "subprocess.", "sys.")) for g in DEEPSPEED_PICKLE_GLOBALS)


@pytest.mark.parametrize("pickle_bytes,needle", [
    # STACK_GLOBAL whose operands are not the two strings pushed right before it (here: a POP in between)
    (b"\x80\x04\x8c\x05posix\x8c\x06system\x8c\x01x0\x93.", "computed"),
    (b"\x80\x02\x82\x01.", "extension registry"),  # EXT1: an import by code number
    (b"\x80\x02cposix\nsystem\n.", "posix.system"),
    (b"\x80\x02(ctorch\nSize\n.", "torch.Size"),  # allowed global, but a garbled pickle (MARK never closed)
], ids=["computed-stack-global", "ext1", "global", "garbled"])
def test_the_pickle_scan_refuses_what_it_cannot_resolve(tmp_path, pickle_bytes, needle):
    tag = tmp_path / DEEPSPEED_TAG
    tag.mkdir()
    torch_zip(tag / "mp_rank_00_model_states.pt", pickle_bytes)
    if needle == "torch.Size":  # every name allowed: accepted (unpickling fails later, harmlessly)
        assert check_deepspeed_files(tag) == 1
        return
    with pytest.raises(ValueError, match=needle):
        check_deepspeed_files(tag)


def test_the_pickle_scan_refuses_other_archives(tmp_path):
    tag = tmp_path / DEEPSPEED_TAG
    tag.mkdir()
    legacy = tag / "legacy.pt"
    torch.save({"w": torch.ones(1)}, legacy, _use_new_zipfile_serialization=False)  # several pickles in a row
    with pytest.raises(ValueError, match="not a zip-format torch file"):
        check_deepspeed_files(tag)
    legacy.unlink()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(1, protocol=2))
        with pytest.warns(UserWarning, match="Duplicate name"):
            archive.writestr("archive/data.pkl", pickle.dumps(2, protocol=2))
    (tag / "twice.pt").write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match="two zip entries of one name"):
        check_deepspeed_files(tag)


# ------------------------------------------------------------------------------------------ damaged model folders
def cut_in_half(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def bad_dtype(folder: Path) -> None:
    """The header names a dtype that does not exist; sizes and offsets stay consistent."""
    path = folder / "model.safetensors"
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = data[8:8 + length].replace(b'"F32"', b'"Q32"', 1)
    path.write_bytes(data[:8] + header + data[8 + length:])


@pytest.fixture(params=["cut-in-half", "bad-dtype"])
def damaged_model(request, tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    (cut_in_half if request.param == "cut-in-half" else bad_dtype)(folder)
    needle = "model.safetensors is truncated" if request.param == "cut-in-half" else \
        "model.safetensors is not a readable safetensors file"  # fmt: skip
    return folder, needle


def test_a_damaged_model_folder_is_a_message_from_eval(damaged_model, tmp_path, capsys):
    folder, needle = damaged_model
    rc = run_cli(["eval", "--model", str(folder), "--envs", "Bandit", "--max-states", "1", "--no-progress",
                  "-o", str(tmp_path / "result.json")])
    err = capsys.readouterr().err
    assert rc == 2, err[-3000:]
    assert needle in err and str(folder) in err and "Traceback" not in err, err


def test_a_damaged_model_folder_is_a_message_from_train(damaged_model, tmp_path, capsys):
    folder, needle = damaged_model
    rc = run_cli(train_args(folder, tmp_path / "run", 1))
    err = capsys.readouterr().err
    assert rc == 2, err[-3000:]
    assert needle in err and str(folder) in err and "Traceback" not in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_loading_a_damaged_model_folder_raises_a_value_error(damaged_model):
    folder, needle = damaged_model
    with pytest.raises(DamagedModelError, match=needle) as info:
        load_model_and_tokenizer(str(folder), device="cpu")
    assert isinstance(info.value, ValueError) and isinstance(info.value, ModelLoadError)


# --------------------------------------------------------------------------------------------- duplicate keys
def test_duplicate_yaml_keys_are_an_error_naming_the_key_and_lines():
    with pytest.raises(ValueError, match=r"duplicate key 'actor_lr' at line 3 \(first at line 1\)"):
        load_yaml("actor_lr: 1.0e-6\nseed: 1\nactor_lr: 2.0e-6\n", "config")
    with pytest.raises(ValueError, match=r"duplicate key 'a' at line 1, column 8 \(first at line 1, column 2\)"):
        load_yaml("{a: 1, a: 2}")
    with pytest.raises(ValueError, match="duplicate key 'k' at line 3"):
        load_yaml("env_kwargs:\n  k: 1\n  k: 2\n")
    # a merge (<<) may be overridden, as YAML intends; equal keys of other types are different keys
    assert load_yaml("base: &b {x: 1, y: 2}\nrun:\n  <<: *b\n  x: 5\n")["run"] == {"x": 5, "y": 2}
    assert load_yaml("{1: a, '1': b}") == {1: "a", "1": "b"}


@pytest.mark.parametrize("argv,needle", [
    (["--config", "{tmp}/dup.yaml"], "duplicate key 'actor_lr' at line 3 (first at line 1)"),
    (["--set", "env_kwargs={size: 4, size: 5}"], "duplicate key 'size'"),
    (["--env_kwargs", "{size: 4, size: 5}"], "duplicate key 'size'"),
    (["--set", "env_kwargs=size: 4\nsize: 5"], "duplicate key 'size' at line 2 (first at line 1)"),
], ids=["config-file", "set", "flag", "set-block"])
def test_duplicate_yaml_keys_exit_2_from_train(tmp_path, capsys, argv, needle):
    (tmp_path / "dup.yaml").write_text("actor_lr: 1.0e-6\nseed: 1\nactor_lr: 2.0e-6\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc = run_cli(["train", *argv, "--output_dir", str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert needle in err and "Traceback" not in err, err


# ----------------------------------------------------------------------------------------- bounded waits
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "soon", True])
def test_dist_timeout_minutes_is_validated(value):
    with pytest.raises(ValueError, match="dist_timeout_minutes"):
        load_config("starpo-s").replace(dist_timeout_minutes=value).validate()


def test_dist_timeout_minutes_bad_flag_exits_2(tmp_path, capsys):
    rc = run_cli(["train", "--dist_timeout_minutes", "0", "--output_dir", str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "dist_timeout_minutes" in err and "> 0" in err, err


@pytest.mark.parametrize("minutes", [0.1, 10.0, 45.0])
def test_the_timeout_reaches_the_process_group_whatever_its_value(minutes):
    """accelerate passes on only the fields that differ from its defaults (10 minutes): every value must arrive."""
    assert process_group_kwargs(minutes).to_kwargs() == {"timeout": timedelta(minutes=minutes)}
    assert process_group_kwargs(minutes, "gloo").to_kwargs() == {"timeout": timedelta(minutes=minutes),
                                                                 "backend": "gloo"}


def test_the_timeout_message_names_the_silent_rank():
    def waiting_at_a_collective():
        raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 6000ms for recv operation")

    try:
        waiting_at_a_collective()
    except RuntimeError as exc:
        error, tb = exc, exc.__traceback__
    assert is_collective_timeout(error) and not is_collective_timeout(RuntimeError("CUDA out of memory"))
    assert not is_collective_timeout(RuntimeError("the vLLM server timed out after 120 s"))  # not a collective's
    text = collective_timeout_message(error, tb, rank=0, world=2, minutes=0.1, silent=[1])
    assert text.startswith("rank 0 waited 0.1 minutes for the other processes at ")
    assert "rank 1 did not answer: a process stopped answering (SIGSTOP, hang, or crash)" in text
    text = collective_timeout_message(error, tb, rank=2, world=4, minutes=5, silent=[1, 3])
    assert "ranks 1, 3 did not answer (ranks 0, 2 reached a collective)" in text
    text = collective_timeout_message(error, tb, rank=0, world=3, minutes=5, silent=None)  # the store was gone
    assert "one of ranks 1, 2 did not answer" in text
