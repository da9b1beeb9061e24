"""A config's, a suite's or a validation split's ``env_kwargs`` is data: it can never name a class for
``gymnasium.make`` to import and call (``env_cls: "os:system"`` once ran a shell command from a YAML file)."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import pytest

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_trainer.config import load_config
from ragen_trainer.evaluation.suites import load_suite


def test_a_config_file_naming_a_class_is_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    config = tmp_path / "evil.yaml"
    config.write_text(f'env_kwargs:\n  env_cls: "os:system"\n  command: "touch {marker}"\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "ragen_trainer.cli", "train", "--config", str(config), "--dry-run"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2, done.stderr
    assert "'env_cls' cannot be set here" in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()


@pytest.mark.parametrize("key", ["env_cls", "reference_protocol"])
def test_config_and_validation_splits_refuse_registration_keywords(key):
    with pytest.raises(ValueError, match=f"'{key}' cannot be set here"):
        load_config("starpo-s").replace(env_kwargs={key: "os:system"}).validate()
    split = {"env_id": "ragen/Bandit-v0", "env_kwargs": {key: "os:system"}}
    with pytest.raises(ValueError, match=f"val_envs.*'{key}' cannot be set here"):
        load_config("starpo-s").replace(val_envs=[split]).validate()


def test_a_suite_naming_a_class_is_refused(tmp_path):
    suite = {"name": "evil", "version": 1, "description": "x", "decoding": {"temperature": 0.0, "max_new_tokens": 8},
             "envs": [{"name": "Bandit", "env_id": "ragen/Bandit-v0", "env_kwargs": {"env_cls": "os:system"},
                       "seeds": {"start": 0, "count": 1}}]}
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(suite), encoding="utf-8")
    with pytest.raises(ValueError, match="'env_cls' cannot be set here"):
        load_suite(path)


def test_gymnasium_make_builds_only_text_env_classes(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(ValueError, match="BaseTextEnv subclass"):
        gym.make("ragen/Bandit-v0", env_cls="os:system", command=f"touch {marker}")
    assert not marker.exists()
