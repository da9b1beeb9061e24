"""A two-process tiny run in which one rank stops answering (SIGSTOP) once training begins, for
``test_bounded_waits.py``.

    python -m accelerate.commands.launch --multi_gpu --num_processes 2 ... tests/distributed/stalled_run.py OUT RANK \
        [MINUTES] [DEEPSPEED_JSON]

``RANK`` stops itself right after the run's start (both processes met at its barriers); the other goes on to the
first rollout's gather and must give up after ``dist_timeout_minutes`` (0.1: six seconds) with a message naming the
silent rank. Each process prints ``PID <rank> <pid>`` first, so the test can end the stopped one.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ragen_trainer.config import load_config
from ragen_trainer.trainer import StarPOTrainer, TrainerCallback
from tests.trainer.conftest import ScriptedEngine, build_tiny_model, build_tiny_tokenizer


class StopAtStart(TrainerCallback):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def on_train_begin(self, trainer: StarPOTrainer, step: int) -> None:
        if trainer.accelerator.process_index == self.rank:
            print(f"STOPPING {self.rank}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)


def main() -> int:
    out, stop_rank = sys.argv[1], int(sys.argv[2])
    minutes = float(sys.argv[3]) if len(sys.argv) > 3 else 0.1
    deepspeed = sys.argv[4] if len(sys.argv) > 4 else ""
    tokenizer = build_tiny_tokenizer()
    cfg = load_config("starpo-s").replace(
        env_id="ragen/Bandit-v0", env_groups=2, group_size=2, max_turns=1, max_new_tokens=8, max_context_tokens=1024,
        enable_think=False, reply_prefix="", total_steps=2, save_steps=0, val_every=0, micro_batch_size=1,
        report_to=["jsonl"], output_dir=out, dist_timeout_minutes=minutes, deepspeed=deepspeed,
    ).validate()  # fmt: skip
    engine = ScriptedEngine(tokenizer, lambda prompt, call, row: "<answer>Dragon</answer>")
    trainer = StarPOTrainer(cfg, build_tiny_model(tokenizer), tokenizer, engine=engine,
                            callbacks=[StopAtStart(stop_rank)])
    print(f"PID {trainer.accelerator.process_index} {os.getpid()}", flush=True)
    trainer.train()
    print("FINISHED", flush=True)  # never reached by the waiting rank: the timeout ends it
    return 0


if __name__ == "__main__":
    sys.exit(main())
