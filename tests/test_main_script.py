"""``scripts/main.sh``: the main job's steps in order, and its leaderboard printed once.

The commands it runs (``ragen-demo``, ``ragen-trainer``) are stand-ins on ``PATH`` that record their arguments and,
for ``leaderboard``, print a table and write it where ``--markdown`` says, as the real command does: what is tested
is the script's own printing, in a second rather than the job's 15 minutes."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = "| 1 | oracle | reference | 100.0 |"

FAKE_TRAINER = f"""#!/usr/bin/env bash
echo "ragen-trainer $*" >> "$RAGEN_FAKE_LOG"
if [[ $1 == leaderboard ]]; then
  while [[ $# -gt 0 ]]; do
    if [[ $1 == --markdown ]]; then echo '{TABLE}' > "$2"; fi
    shift
  done
  echo '{TABLE}'  # the real command prints the Markdown it wrote
fi
"""


def _command(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_main(tmp_path: Path, **env_vars: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``scripts/main.sh`` with the stand-ins on ``PATH``: its result and the commands it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _command(bin_dir, "ragen-trainer", FAKE_TRAINER)
    _command(bin_dir, "ragen-demo", '#!/usr/bin/env bash\necho "ragen-demo $*" >> "$RAGEN_FAKE_LOG"\n')
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RAGEN_OUT": str(tmp_path / "out"),
           "RAGEN_FAKE_LOG": str(log), **env_vars}
    done = subprocess.run(["bash", "scripts/main.sh"], cwd=ROOT, env=env, text=True, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, log.read_text(encoding="utf-8").splitlines()


def test_main_job_prints_its_leaderboard_once(tmp_path):
    done, lines = _run_main(tmp_path)
    assert done.stdout.count(TABLE) == 1, done.stdout
    assert (tmp_path / "out" / "leaderboard.md").read_text(encoding="utf-8").strip() == TABLE
    calls = [line.split()[:2] for line in lines]
    assert calls == [["ragen-demo", "--quiet"], ["ragen-trainer", "train"], ["ragen-trainer", "plot"]] \
        + [["ragen-trainer", "eval"]] * 4 + [["ragen-trainer", "leaderboard"]]


def test_main_job_seed_comes_from_ragen_seed(tmp_path):
    _, lines = _run_main(tmp_path, RAGEN_SEED="7")
    train = next(line for line in lines if line.startswith("ragen-trainer train"))
    assert "--seed 7" in train and "--actor_lr 5e-6" in train and "--val_envs [ragen/BanditTest-v0]" in train
    assert "--total_steps 40" in train
