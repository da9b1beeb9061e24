"""The distributed engines with two CPU processes over gloo (the ``distributed`` lane: ``pytest -m distributed``).

For DDP, DeepSpeed ZeRO-2 and ZeRO-3, two processes train the same weights as one process on the same batch
(:mod:`tests.distributed.tiny_run`: scripted rollouts, two steps of two updates each, the policy and a separate critic
clipped each by its own norm), and a checkpoint saved by two processes resumes in one (ZeRO-3 refuses, saying why).

Tolerances (measured): float32 runs agree to ~1e-7 (max abs over all weights, which move by ~4e-3); the tests allow
1e-5. bfloat16 compute (DDP autocast, DeepSpeed bf16 with float32 accumulation and reduction) agrees with its own
one-process run to ~1e-7; the tests allow 1e-4.

Launchers: DDP on CPUs needs ``accelerate launch --multi_gpu`` (``--cpu`` starts a single process) or ``torchrun``;
DeepSpeed runs under ``torchrun`` (or a single process without a launcher).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from safetensors.torch import load_file

from ragen_trainer.engines.local_server import free_port

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "distributed" / "tiny_run.py"
ZERO2 = str(REPO / "configs" / "distributed" / "ds_zero2.json")
ZERO3 = str(REPO / "configs" / "distributed" / "ds_zero3.json")
FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-4


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))


def run(out, *args, processes=1, launcher="torchrun", expect_ok=True):
    """``tiny_run.py out args`` in ``processes`` processes; returns the completed process."""
    if processes == 1 and launcher != "accelerate":
        cmd = [sys.executable, str(SCRIPT), str(out), *args]
    elif launcher == "accelerate":
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(free_port()), str(SCRIPT), str(out), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
               str(free_port()), str(SCRIPT), str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), check=False)
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert proc.stdout.count("RESULT") == processes, proc.stdout
    return proc


def weights(out):
    return load_file(str(Path(out) / "final" / "model.safetensors"))


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Two float32 steps in one plain process: the reference every engine is held to."""
    out = tmp_path_factory.mktemp("w1") / "run"
    run(out, "--steps", "2")
    return weights(out)


def _world(out, checkpoint="checkpoint-1"):
    return json.loads((Path(out) / checkpoint / "trainer_state.json").read_text())["world_size"]


@pytest.mark.parametrize("engine", ["ddp", "zero2", "zero3"])
def test_two_processes_train_the_same_weights_as_one(tmp_path, one_process, engine):
    out = tmp_path / "run"
    if engine == "ddp":
        run(out, "--steps", "2", "--save_steps", "1", processes=2, launcher="accelerate")
    else:
        run(out, "--steps", "2", "--save_steps", "1", "--deepspeed", ZERO2 if engine == "zero2" else ZERO3,
            processes=2)
    assert _world(out) == 2 and (out / "checkpoint-1" / "rng_state_1.json").is_file()  # really two processes
    got = weights(out)
    assert {v.dtype for v in got.values()} == {torch.float32}  # the master weights
    moved = max_diff(got, load_file(str(out / "checkpoint-1" / "model.safetensors")))
    assert moved > 1e-4  # the second step trained
    assert max_diff(got, one_process) < FP32_TOLERANCE
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["optim/updates"] for r in rows] == [2, 2] and all(r["critic/grad_norm"] > 0 for r in rows)


@pytest.mark.parametrize("engine", ["ddp", "zero2"])
def test_a_checkpoint_of_two_processes_resumes_in_one(tmp_path, one_process, engine):
    out = tmp_path / "run"
    extra = [] if engine == "ddp" else ["--deepspeed", ZERO2]
    run(out, "--steps", "1", "--save_steps", "1", *extra, processes=2,
        launcher="accelerate" if engine == "ddp" else "torchrun")
    assert _world(out) == 2
    run(out, "--steps", "2", "--save_steps", "1", *extra)  # the same folder, one process: resumes checkpoint-1
    assert _world(out, "checkpoint-2") == 1
    assert max_diff(weights(out), one_process) < FP32_TOLERANCE
    assert not list(out.glob(".universal-*"))  # DeepSpeed's conversion is not left behind


def test_zero3_refuses_another_world_size_and_says_why(tmp_path):
    out = tmp_path / "run"
    run(out, "--steps", "1", "--save_steps", "1", "--deepspeed", ZERO3, processes=2)
    proc = run(out, "--steps", "2", "--save_steps", "1", "--deepspeed", ZERO3, expect_ok=False)
    assert proc.returncode != 0
    assert "ZeRO-3" in proc.stderr and "resume with 2 processes" in proc.stderr, proc.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 1  # the run is as it was


@pytest.mark.parametrize("engine", ["ddp", "zero2"])
def test_bf16_compute_with_two_processes_matches_one(tmp_path, engine):
    extra = ["--dtype", "bfloat16"] + ([] if engine == "ddp" else ["--deepspeed", ZERO2])
    run(tmp_path / "w1", "--steps", "2", *extra)
    run(tmp_path / "w2", "--steps", "2", *extra, processes=2, launcher="accelerate" if engine == "ddp" else "torchrun")
    one, two = weights(tmp_path / "w1"), weights(tmp_path / "w2")
    assert {v.dtype for v in two.values()} == {torch.float32}  # the master weights, not the bf16 compute copies
    assert max_diff(one, two) < BF16_TOLERANCE


def test_the_train_command_runs_as_two_processes(tmp_path, tiny_model_dir):
    """``ragen-trainer train`` itself under ``accelerate launch --multi_gpu`` on CPUs: both processes roll out their
    share of the groups, gather, filter alike, train, and only the main process writes the output folder."""
    if shutil.which("accelerate") is None:
        pytest.skip("the accelerate launcher is not on PATH")
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
        "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m",
        "ragen_trainer.cli", "train", "--config", "starpo-s", "--model", str(tiny_model_dir), "--output_dir",
        str(out), "--total_steps", "1", "--env_groups", "3", "--group_size", "2", "--max_new_tokens", "4",
        "--max_context_tokens", "1024", "--max_turns", "1", "--val_every", "1", "--val_groups", "3", "--save_steps",
        "1", "--micro_batch_size", "1", "--filter_ratio", "0.5", "--report_to", "jsonl",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1  # written once, by the main process
    assert rows[0]["batch/trajectories"] == 6 and rows[0]["batch/groups"] == 3  # both processes' groups
    assert rows[0]["filter/kept_trajectories"] == 2  # int(0.5 x 3) = 1 group of 2
    assert _world(out) == 2 and (out / "checkpoint-1" / "rng_state_1.json").is_file()
    assert json.loads((out / "summary.json").read_text())["steps"] == 1


def test_the_train_command_under_zero3_copies_the_whole_policy_into_a_separate_critic(tmp_path, tiny_model_dir):
    """Under ZeRO-3 ``from_pretrained`` loads the weights partitioned; the separate critic (``value_model``) is a copy
    of the policy's backbone and must be copied whole, not as the empty tensors a process shows (it was: the first
    critic forward failed on a zero-size parameter). Two processes run ``ragen-trainer train`` for one step; the saved
    critic's backbone has the policy's shapes and starts from its weights."""
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        "-m", "ragen_trainer.cli", "train", "--config", "starpo-s", "--critic", "value_model", "--model",
        str(tiny_model_dir), "--output_dir", str(out), "--deepspeed", ZERO3, "--total_steps", "1", "--env_groups",
        "2", "--group_size", "2", "--max_new_tokens", "4", "--max_context_tokens", "1024", "--max_turns", "1",
        "--val_every", "0", "--save_steps", "1", "--micro_batch_size", "2", "--filter_ratio", "1.0",
        "--critic_lr", "1e-6", "--report_to", "jsonl",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    initial = load_file(str(next(Path(tiny_model_dir).glob("*.safetensors"))))
    critic = load_file(str(out / "checkpoint-1" / "critic.safetensors"))
    backbone = {k.removeprefix("backbone."): v for k, v in critic.items() if k.startswith("backbone.")}
    assert backbone, sorted(critic)
    for name, value in backbone.items():
        source = initial[f"model.{name}"]
        assert value.shape == source.shape, name
        assert float((value.float() - source.float()).abs().max()) < 1e-3, name  # one step at lr 1e-6


def test_copies_of_a_zero3_partitioned_policy_hold_its_whole_weights():
    """The frozen reference and self-play snapshots (``policy_copy``) and the separate critic's backbone, copied from
    a policy that ``from_pretrained`` loaded partitioned: every weight whole and equal to the gathered original."""
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "distributed" / "zero3_copies.py")],
                          capture_output=True, text=True, timeout=300, env=_env(), check=False)  # fmt: skip
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
