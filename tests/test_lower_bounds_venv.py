"""``scripts/check_lower_bounds.sh`` builds its throwaway venv over the environment that has the project.

The README's test command once failed at this lane inside a venv: ``python -m venv --system-site-packages`` sits on
the *base* interpreter, so pip saw no torch, pulled a CUDA torch (5.7 GB of nvidia wheels) and the tests stopped at
"No module named 'gymnasium'". Fast tests: the script's refusals (an interpreter without torch, a folder that is not
a venv). The slow one (``-m slow``; pip fetches the pinned transformers and TRL) builds the venv over a *project venv*
made without system site-packages and checks that torch and gymnasium import there from the project venv, that the
pins win, and that no CUDA torch came in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from importlib.metadata import distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_lower_bounds.sh"


def _run(python: Path | str, venv: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": str(python), "LOWER_BOUNDS_VENV": str(venv)}
    return subprocess.run(["bash", str(SCRIPT), *args], check=False, cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=timeout)


def test_an_interpreter_without_torch_is_refused_with_a_message(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    done = _run(bare / "bin" / "python", tmp_path / "lb")
    assert done.returncode == 2
    assert f"(environment {bare}) has no torch: run bash scripts/setup.sh first" in done.stderr
    assert not (tmp_path / "lb").exists()  # nothing built, nothing installed


def test_a_folder_that_is_not_a_venv_is_never_removed(tmp_path):
    pytest.importorskip("torch")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious", encoding="utf-8")
    done = _run(sys.executable, folder)
    assert done.returncode == 2
    assert "exists and is not a virtual environment (no pyvenv.cfg)" in done.stderr
    assert (folder / "keep.txt").read_text(encoding="utf-8") == "precious"


@pytest.mark.slow
def test_the_venv_sits_on_a_project_venv_and_keeps_its_cpu_torch(tmp_path):
    torch = pytest.importorskip("torch")
    # The project venv: no system site-packages; its packages come through a .pth file of its own, as an editable
    # install's do (the script must process the project venv's .pth files, not only list its folder).
    project = tmp_path / "project"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project)], check=True, timeout=120)
    project_python = project / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    project_site = Path(subprocess.run([str(project_python), "-c", purelib], text=True, capture_output=True,
                                       check=True).stdout.strip())
    (project_site / "_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    # and one module only the project venv has (the base interpreter's packages are not the project's)
    (project_site / "ragen_project_probe.py").write_text("WHERE = 'the project venv'\n", encoding="utf-8")

    venv = tmp_path / "lower-bounds"
    done = _run(project_python, venv, "--setup-only", timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"over {project.resolve()}" in done.stdout and f"torch {torch.__version__}" in done.stdout
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", (
        "import json, torch, gymnasium, transformers, trl, ragen_project_probe; "
        "from importlib.metadata import distributions; "
        "print(json.dumps({'probe': ragen_project_probe.WHERE, "
        "'torch': torch.__version__, 'torch_file': torch.__file__, 'cuda': torch.version.cuda, "
        "'gymnasium': gymnasium.__file__, 'transformers': transformers.__file__, "
        "'nvidia': sorted({d.metadata['Name'] for d in distributions() if d.metadata['Name'].startswith('nvidia')})}))"
    )], check=False, text=True, capture_output=True, timeout=300)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["probe"] == "the project venv"
    assert found["torch"] == torch.__version__ and found["torch_file"] == torch.__file__  # the project's torch
    own = sorted({d.metadata["Name"] for d in distributions() if d.metadata["Name"].startswith("nvidia")})
    assert found["cuda"] == torch.version.cuda and found["nvidia"] == own  # no other build came in (none on a CPU)
    assert str(venv) in found["transformers"]  # the pinned transformers wins over the project's
    assert found["gymnasium"].startswith(sysconfig.get_paths()["purelib"])
