"""Host memory: glibc's mmap threshold fixed for a training run (``release_freed_memory``)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ragen_trainer import host_memory, trainer as trainer_module
from ragen_trainer.config import load_config
from ragen_trainer.trainer import StarPOTrainer
from tests.trainer.conftest import ScriptedEngine, build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_the_threshold_is_set_on_glibc():
    assert host_memory.return_freed_memory() is True


PROBE = """
import sys, torch
from ragen_trainer import host_memory
if sys.argv[1] == "fixed":
    assert host_memory.return_freed_memory()
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
warm = torch.ones(6 << 20); del warm  # a 24 MiB block freed: glibc raises its mmap threshold to 24 MiB
before = rss()
blocks, pins = [], []
for _ in range(8):
    blocks.append(torch.ones(4 << 20))  # 16 MiB each, now under glibc's threshold: from the heap
    pins.append(torch.ones(64))          # small blocks between them keep the heap from shrinking at its top
del blocks
print((rss() - before) >> 20)
"""


@pytest.mark.skipif(not GLIBC, reason="RSS and mallopt as glibc on Linux")
def test_freed_activation_sized_tensors_leave_the_resident_set():
    """The case the setting is for (in a fresh process each): after glibc has raised its threshold, eight freed
    16 MiB tensors partly stay resident (32 or 80 MiB measured); with the threshold fixed they are given back."""
    kept = {}
    for mode in ("default", "fixed"):
        out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120,
                             cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
        kept[mode] = int(out.stdout.split()[-1])
    assert kept["default"] >= 16 and kept["fixed"] <= 8, kept  # default: 32 or 80 MiB measured, fixed: 0


@pytest.mark.parametrize("release", [True, False])
def test_the_trainer_sets_it_when_the_config_says(tmp_path, tiny_tokenizer, monkeypatch, release):
    calls = []
    monkeypatch.setattr(trainer_module, "return_freed_memory", lambda: calls.append(1) or True)
    cfg = load_config("starpo-s").replace(env_id="ragen/Bandit-v0", total_steps=1, output_dir=str(tmp_path / "run"),
                                          release_freed_memory=release).validate()
    StarPOTrainer(cfg, build_tiny_model(tiny_tokenizer), tiny_tokenizer,
                  engine=ScriptedEngine(tiny_tokenizer, lambda prompt, call, row: "<answer>Dragon</answer>"))
    assert calls == ([1] if release else [])
