"""A rank that stops answering (SIGSTOP) no longer holds the others for gloo's 30-minute default: after
``dist_timeout_minutes`` the waiting rank stops with a message naming the silent rank and where it waited (issue 35).

Two CPU processes over gloo (``tests/distributed/stalled_run.py``): one stops itself when training begins, the other
reaches the first rollout's gather. With ``dist_timeout_minutes`` 0.1 (six seconds) the message comes within about
ten seconds of the stop (the timeout, then a grace of a few seconds in which the ranks that reached a collective
say so through the process group's store); the launcher then ends the stopped process (it sends SIGTERM, which a
stopped process only receives when continued, then SIGKILL after 30 s).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from ragen_trainer.engines.local_server import free_port

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "distributed" / "stalled_run.py"
ZERO2 = str(REPO / "configs" / "distributed" / "ds_zero2.json")


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))


def _launch(out: Path, stop_rank: int, engine: str) -> tuple[int | None, list[tuple[float, str]], float]:
    """Run the two processes; returns (exit status or None if the launcher had to be killed, every output line with
    the time it arrived, when the rank stopped)."""
    if engine == "ddp":
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
               str(free_port()), str(SCRIPT), str(out), str(stop_rank), "0.1"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(SCRIPT), str(out), str(stop_rank), "0.1", ZERO2]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                            start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    pids: dict[int, int] = {}
    try:
        rc = proc.wait(timeout=400)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        for _, line in lines:
            found = re.search(r"PID (\d+) (\d+)", line)  # stdout and stderr share the pipe: a line may hold more
            if found:
                pids[int(found.group(1))] = int(found.group(2))
        for pid in pids.values():  # the test's own processes: never leave a stopped one behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
    stopped = next((t for t, line in lines if f"STOPPING {stop_rank}" in line), float("nan"))
    return rc, lines, stopped


@pytest.mark.parametrize("engine,stop_rank", [("ddp", 1), ("ddp", 0), ("zero2", 1)])
def test_a_stopped_rank_ends_the_run_with_a_message_naming_it(tmp_path, engine, stop_rank):
    rc, lines, stopped = _launch(tmp_path / "run", stop_rank, engine)
    text = "\n".join(line for _, line in lines)
    survivor = 1 - stop_rank
    message = next(((t, line) for t, line in lines if "ragen: error: rank" in line), None)
    assert message is not None, text[-4000:]
    at, line = message
    assert f"rank {survivor} waited 0.1 minutes for the other processes at " in line, line
    assert f"rank {stop_rank} did not answer: a process stopped answering (SIGSTOP, hang, or crash)" in line, line
    assert "StarPOTrainer." in line  # where it waited (the first rollout's gather)
    assert at - stopped < 60, f"the message came {at - stopped:.0f} s after the stop"  # 6 s timeout + grace
    assert rc is not None and rc != 0, text[-4000:]  # the launcher ended by itself
    assert "FINISHED" not in text
