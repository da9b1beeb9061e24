"""``transformers serve`` as a local OpenAI-compatible server, started and stopped from Python.

Used to check a checkpoint the way a user serves it (``benchmarks/serving_agreement.py``) and by the tests of the
``openai`` engine: the server runs as a subprocess bound to 127.0.0.1 on a free port, logs to ``<work>/serve.log``,
and is stopped when the ``with`` block ends (also on an error inside it).

    with transformers_serve(work_dir) as server:          # no model forced: each request loads the folder it names
        engine = OpenAIEngine(base_url=server.url, model="runs/bandit/final")
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

#: Seconds the server may take to answer ``/health``: about 5 s on 2 CPU cores; the bound only keeps a broken server
#: from hanging the caller.
STARTUP_TIMEOUT_S = 180.0


def serve_missing() -> str | None:
    """Why ``transformers serve`` cannot run here, or ``None`` when it can."""
    import transformers
    from transformers.utils.import_utils import is_serve_available

    if int(transformers.__version__.split(".")[0]) < 5:
        return f"transformers {transformers.__version__} has no `transformers serve` of the 5.x kind"
    if not is_serve_available():
        return "`transformers serve` needs fastapi, uvicorn and openai (pip install 'transformers[serving]')"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of the server's log, for error messages."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


@contextlib.contextmanager
def transformers_serve(
    work: str | os.PathLike[str],
    folder: str | os.PathLike[str] | None = None,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    threads: int | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> Iterator[SimpleNamespace]:
    """Run ``transformers serve`` on 127.0.0.1 until the block ends; yields ``url`` (the API root, ``.../v1``) and
    ``log`` (the log file's path).

    ``folder``: the model it serves; ``None``: each request loads the model (folder) it names. Offline
    (``HF_HUB_OFFLINE``): a local folder needs nothing from the Hub. ``threads``: the server's torch threads
    (``OMP_NUM_THREADS``; tiny test models run fastest on one). Raises ``RuntimeError`` with the log's end when
    the server exits or does not answer ``/health`` within ``startup_timeout`` seconds.
    """
    work_dir = Path(work)
    port = free_port()
    log_path = work_dir / "serve.log"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **({"OMP_NUM_THREADS": str(threads)} if threads else {}),
    }
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", *([str(folder)] if folder else [])]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", device, "--log-level", "warning"]
    if dtype:
        command += ["--dtype", dtype]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=work_dir, env=env)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {proc.returncode} while starting:\n"
                                   f"{log_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve not up after {startup_timeout:.0f} s:\n{log_tail(log_path)}")
            time.sleep(0.2)
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}/v1", log=log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


__all__ = ["STARTUP_TIMEOUT_S", "free_port", "log_tail", "serve_missing", "transformers_serve"]
