"""``scripts/gpu_check.sh``: it parses; without a GPU it skips the device parts, dry-runs the structure and exits 0;
with one (a stand-in Python that says there is a GPU and plays pytest, the trainer and the benchmark) it runs every
part, counts the tests from their JUnit XML, reports the training run and fails on a failing test group.

The real device run needs a GPU and about 7 minutes (docs/performance.md, "The GPU check"); what is tested here is
the script's own flow and report, in seconds."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

# A Python that reports a GPU and plays the commands the script runs; the script's own helper snippets (read from
# stdin) run in the real Python.
FAKE_PYTHON = """#!{python}
import json, os, sys
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["GPU_CHECK_FAKE_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
if args[:1] == ["-"]:
    source = sys.stdin.read()
    if "GPU yes" in source:  # the device block
        print("torch 9.9 (stand-in)")
        print("cuda devices 1; device 0: Stand-in H100, capability 9.0, 79.2 GiB, bf16 supported True")
        print("GPU yes")
        sys.exit(0)
    sys.argv = ["-"] + args[1:]
    exec(compile(source, "<stdin>", "exec"), {{"__name__": "__main__"}})
    sys.exit(0)
if args[:2] == ["-m", "pytest"]:
    xml = next(a.split("=", 1)[1] for a in args if a.startswith("--junitxml="))
    name = Path(xml).stem
    tests, failures, skipped, rc = 3, 0, 0, 0
    if name == "packing":
        failures, rc = 1, 1
        print("FAILED tests/trainer/test_packing.py::test_x - RuntimeError: Expected all tensors to be on the same "
              "device, but found at least two devices, cuda:0 and cpu!")
    if name == "vllm":
        tests, skipped, rc = 1, 1, 5
    Path(xml).write_text(f'<testsuites><testsuite tests="{{tests}}" failures="{{failures}}" errors="0" '
                         f'skipped="{{skipped}}"/></testsuites>')
    sys.exit(rc)
if args[:2] == ["-m", "ragen_trainer.cli"]:
    out = Path(args[args.index("--output_dir") + 1])
    steps = int(args[args.index("--total_steps") + 1])
    out.mkdir(parents=True)
    rows = [{{"step": s, "reward/mean": 0.5, "success_rate": 0.5, "loss/policy": 0.1, "time/total": 2.0}}
            for s in range(1, steps + 1)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    (out / "config.yaml").write_text("dtype: bfloat16\\n")
    (out / "summary.json").write_text(json.dumps({{"steps": steps, "interrupted": False, "wall_seconds": 24.0,
                                                  "peak_rss_gb": 3.1, "validation": [], "last_metrics": rows[-1]}}))
    print("trained", steps, "steps")
    sys.exit(0)
if args and args[0].endswith("bench_engines.py"):
    if "--help" in args:
        print("usage: bench_engines.py [--device DEVICE] [--skip-vllm] [--rounds ROUNDS] [--json JSON] [--md MD]")
    else:
        print("| hf | bfloat16 | 32 | 1234 tok/s |")
    sys.exit(0)
sys.exit(f"stand-in python: unexpected arguments {{args}}")
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1", **extra}
    for name in ("GPU_CHECK_BENCH_ARGS", "GPU_CHECK_BENCH_VLLM", "GPU_CHECK_BUDGET_S"):
        env.pop(name, None)
    return env


def test_the_script_parses():
    done = subprocess.run(["bash", "-n", str(SCRIPT)], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_without_a_gpu_the_device_parts_are_skipped_and_the_dry_run_passes(tmp_path):
    env = _env(tmp_path, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(SCRIPT)], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "no GPU: device parts skipped" in report
    assert "| training command (--dry-run) | PASS |" in report
    assert "| test files collect | PASS |" in report
    assert "| pytest mixed_precision | SKIP (no GPU) |" in report
    assert "| train 12 steps bf16 | SKIP (no GPU) |" in report
    assert (tmp_path / "out" / "logs" / "train_dry_run.log").is_file()


def test_with_a_gpu_every_part_runs_and_a_failing_group_fails_the_check(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable), encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.log"
    bench = tmp_path / "bench_engines.py"  # the stand-in Python plays it: it need only exist
    bench.write_text("", encoding="utf-8")
    env = _env(tmp_path, PYTHON=str(fake), GPU_CHECK_FAKE_LOG=str(log), GPU_CHECK_BENCH=str(bench))
    done = subprocess.run(
        ["bash", str(SCRIPT)], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stdout + done.stderr  # the packing group failed
    out = tmp_path / "out"
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "**FAIL**" in report and "Stand-in H100" in report
    assert "| pytest mixed_precision | PASS | 3 | 0 | 0 | 0 |" in report
    assert "| pytest packing | FAIL (rc 1) | 2 | 1 | 0 | 0 |" in report
    assert "Expected all tensors to be on the same device" in report  # the failure line, and the note on it
    assert "| pytest vllm | SKIP (nothing ran) | 0 | 0 | 0 | 1 |" in report
    assert "| train 12 steps bf16 | PASS |" in report and "- steps: 12 of 12" in report
    assert "| bench_engines | PASS |" in report
    assert (out / "train" / "summary.json").is_file() and (out / "logs" / "train.log").is_file()
    calls = log.read_text(encoding="utf-8").splitlines()
    train = next(c for c in calls if c.startswith("-m ragen_trainer.cli train"))
    for option in (
        "--dtype bfloat16",
        "--total_steps 12",
        "--config starpo-s",
        "--env ragen/Bandit-v0",
        "--model smollm2",
    ):
        assert option in train, option
    bench = next(c for c in calls if "bench_engines.py" in c and "--help" not in c)
    assert "--device cuda" in bench and "--skip-vllm" in bench and f"--json {out}/bench_engines.json" in bench
