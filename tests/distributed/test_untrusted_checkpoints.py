"""DeepSpeed's checkpoint files, which DeepSpeed reads with ``torch.load(weights_only=False)``, are scanned before it
reads them (issue 35): the real ZeRO-2 and ZeRO-3 checkpoints of ``ragen-trainer train`` name only the objects of
:data:`ragen_trainer.distributed.DEEPSPEED_PICKLE_GLOBALS`, and a file planted with ``os.system`` in it is refused
with a message (exit 2) before anything of it runs.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from ragen_trainer.checkpoints.verify import pickled_globals
from ragen_trainer.distributed import DEEPSPEED_PICKLE_GLOBALS, DEEPSPEED_TAG, check_deepspeed_files

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs" / "distributed"


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def train(model_dir: Path, out: Path, steps: int, zero: int, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ragen_trainer.cli", "train", "--config", "starpo-s", "--model", str(model_dir),
           "--output_dir", str(out), "--deepspeed", str(CONFIGS / f"ds_zero{zero}.json"), "--total_steps",
           str(steps), "--env_groups", "2", "--group_size", "2", "--max_new_tokens", "4", "--max_context_tokens",
           "1024", "--max_turns", "1", "--val_every", "0", "--save_steps", "1", "--micro_batch_size", "2",
           "--report_to", "jsonl", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)


def test_a_planted_file_in_a_zero2_checkpoint_is_refused_before_deepspeed_reads_it(tmp_path, tiny_model_dir):
    out, marker = tmp_path / "run", tmp_path / "pwned"
    proc = train(tiny_model_dir, out, 1, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tag = out / "checkpoint-1" / DEEPSPEED_TAG
    assert check_deepspeed_files(tag) == 2  # the real files pass
    target = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    state = torch.load(target, weights_only=False)  # noqa: S614  (the file this test's own run just wrote)
    state["hidden"] = RunsCode(marker)
    torch.save(state, target)

    proc = train(tiny_model_dir, out, 2, 2)

    assert proc.returncode == 2, proc.stderr[-3000:]
    assert not marker.exists()
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in proc.stderr and "posix.system" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_zero3_bf16_checkpoint_names_only_allowed_objects(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    proc = train(tiny_model_dir, out, 1, 3, "--dtype", "bfloat16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tag = out / "checkpoint-1" / DEEPSPEED_TAG
    names = {f"{m}.{n}" for f in tag.rglob("*.pt") for _, m, n in pickled_globals(f)}
    assert names and names <= DEEPSPEED_PICKLE_GLOBALS, sorted(names - DEEPSPEED_PICKLE_GLOBALS)
    assert check_deepspeed_files(tag) == 2
