"""What a training run prints on the console: no warning of a backend it does not use (DeepSpeed's accelerator
note), none of transformers' load or save bars inside the step table, a line announcing a long update, a line per
checkpoint saved, and one line saying where a resume starts from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_trainer.models import load_model_and_tokenizer, quiet_progress_bars

ROOT = Path(__file__).resolve().parents[2]
#: The bars transformers draws while loading, converting and saving models.
TRANSFORMERS_BARS = ("Loading weights", "Writing model shards", "Converting and de-quantizing")


def _train(model_dir: Path, output_dir: Path, steps: int) -> str:
    """A tiny CLI run in a fresh process (DeepSpeed's warning comes once per process, at its first import)."""
    command = [sys.executable, "-m", "ragen_trainer.cli", "train", "--config", "starpo-s", "--env",
               "ragen/Bandit-v0", "--model", str(model_dir), "--enable_think", "false", "--max_new_tokens", "8",
               "--env_groups", "2", "--group_size", "4", "--micro_batch_size", "8", "--total_steps", str(steps),
               "--val_every", "0", "--save_steps", "1", "--report_to", "console", "jsonl",
               "--output_dir", str(output_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def test_train_help_names_no_backend_warning():
    done = subprocess.run([sys.executable, "-m", "ragen_trainer.cli", "train", "--help"], check=False, cwd=ROOT,
                          text=True, capture_output=True, timeout=120)
    assert done.returncode == 0
    assert "real_accelerator" not in done.stdout + done.stderr


def test_a_run_prints_its_update_saves_and_resume_and_no_deepspeed_warning_or_bars(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    first = _train(tiny_model_dir, out, 1)
    assert "real_accelerator" not in first and "Setting accelerator to CPU" not in first
    assert not [bar for bar in TRANSFORMERS_BARS if bar in first], first
    assert "step 1/1: updating the policy on 4 trajectories (1 optimizer step) ..." in first
    assert f"saved {out / 'checkpoint-1'} (" in first
    assert "resuming" not in first

    second = _train(tiny_model_dir, out, 2)  # the same folder, two steps: continues from checkpoint-1
    assert f"resuming {out} from checkpoint-1 (step 1 of 2)" in second
    assert "real_accelerator" not in second
    assert not [bar for bar in TRANSFORMERS_BARS if bar in second], second
    assert "step 2/2: updating the policy" in second  # the first update of this process is announced too


def test_quiet_progress_bars_turns_transformers_bars_off_and_back_on():
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    original = gguf_utils.tqdm
    assert hf_logging.is_progress_bar_enabled()
    with quiet_progress_bars():
        assert not hf_logging.is_progress_bar_enabled()
        assert gguf_utils.tqdm([1, 2], desc="Converting").disable  # the GGUF conversion's own tqdm, silenced
    assert hf_logging.is_progress_bar_enabled() and gguf_utils.tqdm is original
    hf_logging.disable_progress_bar()  # a user who turned them off keeps them off
    try:
        with quiet_progress_bars():
            pass
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()


def test_loading_a_local_model_draws_no_bar(tiny_model_dir, capfd):
    pytest.importorskip("torch")
    load_model_and_tokenizer(str(tiny_model_dir), dtype="float32", device="cpu")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
