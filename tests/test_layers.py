"""The project's layers, checked on the source: every module's imports of the
project's own modules point down (or sideways, within a layer), stand at the top of the module, and
``import ragen_trainer.config`` stays light.

The order is declared once, in :data:`LAYERS`; a module belongs to the layer of the longest entry that names it or
one of its parent packages.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("webshop_server", "ragen_envs", "ragen_trainer", "benchmarks", "scripts", "examples")

#: Lowest first. A module may import its own layer and the layers before it, never a later one.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the bundled WebShop server: below the envs (the WebShop env starts it), knows nothing of ragen
    ("webshop_server",),
    # the text envs, the turn protocol and the episode driver: gymnasium and numpy only
    ("ragen_envs",),
    # the trainer's plain-data foundation (no torch at import): files, YAML, trajectories, filtering, model files
    ("ragen_trainer", "ragen_trainer.fileio", "ragen_trainer.safe_yaml", "ragen_trainer.trajectory",
     "ragen_trainer.filtering", "ragen_trainer.models", "ragen_trainer.host_memory",
     # a checkpoint's names, its verification and its RNG file, which the model loader uses: no torch either
     "ragen_trainer.checkpoints.layout", "ragen_trainer.checkpoints.rng", "ragen_trainer.checkpoints.verify"),
    # named settings: the run config with its presets, the settings objects it makes for the rollout and loss
    # functions, the evaluation suites (data, like the presets)
    ("ragen_trainer.config", "ragen_trainer.settings", "ragen_trainer.evaluation", "ragen_trainer.evaluation.suites"),
    # the compute pieces: precision, losses, advantages, critic, packing, optimizer, processes, engines, saved
    # folders
    ("ragen_trainer.precision", "ragen_trainer.losses", "ragen_trainer.advantages", "ragen_trainer.critic",
     "ragen_trainer.packing", "ragen_trainer.optimizer", "ragen_trainer.distributed", "ragen_trainer.engines",
     "ragen_trainer.model_card", "ragen_trainer.checkpoints"),
    # playing and scoring episodes, one PPO update, the training monitor, the evaluation runner and agents
    ("ragen_trainer.rollout", "ragen_trainer.selfplay", "ragen_trainer.update", "ragen_trainer.monitor",
     "ragen_trainer.evaluation.metrics", "ragen_trainer.evaluation.schema", "ragen_trainer.evaluation.runner",
     "ragen_trainer.evaluation.agents", "ragen_trainer.evaluation.rescore", "ragen_trainer.evaluation.leaderboard",
     "ragen_trainer.plotting"),
    # the training runs: ragen's trainer, the TRL adapter, SFT warm-up
    ("ragen_trainer.trainer", "ragen_trainer.trl_integration", "ragen_trainer.warmup"),
    # the commands
    ("ragen_trainer.cli", "ragen_trainer.evaluation.cli"),
    # benchmarks, scripts and examples use everything
    ("benchmarks", "scripts", "examples"),
)

#: Function-local imports of the project's own modules that must stay local, each with its reason:
#: (importing module, imported module) -> why.
LOCAL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {
    ("ragen_envs.webshop", "webshop_server.app"): "the embedded server needs the webshop extra (bm25s, rapidfuzz); "
    "the env itself needs only gymnasium and talks HTTP",
    ("ragen_envs.games", "ragen_envs.games.pettingzoo_env"): "needs the games extra (pettingzoo); the single-agent "
    "views work without it, and a missing extra is an ImportError that names it (pettingzoo_module)",
    **{("ragen_trainer.engines", f"ragen_trainer.engines.{name}"): "the package re-exports each engine on first "
       "use (PEP 562): importing ragen_trainer.engines.base (rollouts, the evaluation's reference agents) loads "
       "neither torch nor vllm nor an HTTP client" for name in ("hf", "hf_generate", "vllm", "openai")},
    **{("ragen_trainer.cli", f"ragen_trainer.{name}"): "the train command loads the training stack (torch, "
       "transformers, accelerate: seconds) when a run starts, so --help, presets and a bad config answer at once"
       for name in ("distributed", "precision", "trainer")},
    **{("benchmarks.bench_step", f"ragen_trainer.{name}"): "each side of the benchmark runs in a worker process "
       "that loads its own stack when it starts (TRL_EXPERIMENTAL_SILENCE is set before TRL loads); the parent "
       "process only schedules the workers and prints the tables"
       for name in ("config", "trainer", "models", "trl_integration")},
    **{("benchmarks.bench_memory", f"ragen_trainer.{name}"): "the benchmark measures the memory of each phase, "
       "the first one being the Python runtime before the trainer's modules load"
       for name in ("critic", "cli", "distributed", "models", "precision", "trainer")},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def source_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


KNOWN_MODULES = {module_name(p) for p in source_files()}


def imported_modules(module: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> list[str]:
    """The project modules an import statement names (``from a import b`` names ``a.b`` when that is a module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join(parts + ([base] if base else []))
        names = []
        for alias in node.names:
            full = f"{base}.{alias.name}"
            names.append(full if full in KNOWN_MODULES else base)
    return [n for n in dict.fromkeys(names) if n.split(".")[0] in PACKAGES]


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and len(entry) > best_len:
                best, best_len = index, len(entry)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def top_level_nodes(tree: ast.Module) -> set[int]:
    """ids of the statements at module level, including inside module-level ``if`` / ``try`` blocks."""
    found: set[int] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            found.add(id(node))
            if isinstance(node, (ast.If, ast.Try)):
                walk(node.body)
                walk(node.orelse)
                walk(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)

    walk(tree.body)
    return found


def project_imports() -> list[tuple[str, str, str, bool]]:
    """``(importing module, where, imported module, at top level)`` for every import of a project module."""
    out = []
    for path in source_files():
        module = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = top_level_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported_modules(module, node, path.name == "__init__.py"):
                    out.append((module, f"{path.relative_to(ROOT)}:{node.lineno}", target, id(node) in top))
    return out


def test_every_module_is_in_a_layer():
    for module in sorted(KNOWN_MODULES):
        layer_of(module)


def test_no_module_imports_a_higher_layer():
    upward = [f"{where}: {module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
              for module, where, target, _ in project_imports() if layer_of(target) > layer_of(module)]  # fmt: skip
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_imports_of_the_project_stand_at_the_top_of_modules():
    """Everywhere but ``examples/``: an example reads top to bottom as a user's script, and sets TRL's environment
    variables before TRL loads."""
    local = [f"{where}: {module} imports {target} inside a function"
             for module, where, target, top in project_imports()
             if not top and (module, target) not in LOCAL_IMPORTS_ALLOWED
             and module.split(".")[0] != "examples"]  # fmt: skip
    assert not local, "function-local imports of the project's own modules:\n" + "\n".join(local)


def test_allowed_local_imports_are_still_there():
    """An allow-list entry that no longer matches anything is dropped, so the list stays the truth."""
    seen = {(module, target) for module, _, target, top in project_imports() if not top}
    assert set(LOCAL_IMPORTS_ALLOWED) <= seen, set(LOCAL_IMPORTS_ALLOWED) - seen


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The checker itself: a made-up module of the env layer that imports the trainer is found."""
    tree = ast.parse("from ragen_trainer.trainer import StarPOTrainer\n")
    (node,) = tree.body
    assert imported_modules("ragen_envs.core", node, False) == ["ragen_trainer.trainer"]
    assert layer_of("ragen_trainer.trainer") > layer_of("ragen_envs.core")
    assert layer_of("ragen_trainer.engines.hf.runner") == layer_of("ragen_trainer.engines")
    assert layer_of("ragen_trainer.evaluation.cli") > layer_of("ragen_trainer.evaluation.suites")


@pytest.mark.parametrize(
    "statement, heavy",
    [
        ("import ragen_trainer.config", ("torch", "transformers", "trl", "accelerate", "ragen_trainer.trainer",
                                         "ragen_trainer.engines", "ragen_trainer.selfplay", "ragen_trainer.rollout")),
        ("import ragen_trainer.config as c; c.load_config('starpo-s').validate()",
         ("torch", "transformers", "trl", "ragen_trainer.engines", "ragen_trainer.selfplay", "ragen_trainer.rollout")),
        ("import ragen_envs", ("torch", "ragen_trainer", "webshop_server")),
        # checking a model folder or a checkpoint reads file headers and JSON, never a tensor
        ("import ragen_trainer.models, ragen_trainer.checkpoints.verify", ("torch", "transformers", "ragen_trainer.config",
                                                                            "ragen_trainer.checkpoints.state")),
        # saving a checkpoint reads the suites' definitions (the model card's eval command), not the leaderboard
        ("import ragen_trainer.model_card", ("ragen_trainer.evaluation.leaderboard", "ragen_trainer.evaluation.runner",
                                             "ragen_trainer.evaluation.agents", "ragen_trainer.trainer",
                                             "ragen_trainer.engines")),
    ],
)
def test_light_imports_stay_light(statement, heavy):
    code = (f"import sys; {statement}; "
            f"bad = [m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in {heavy!r})]; "
            "assert not bad, bad")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_cli_always_has_eval_and_leaderboard():
    """``eval`` and ``leaderboard`` are imported, not looked for: an import error there is an error, never a command
    that silently disappears."""
    from ragen_trainer.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert {"train", "presets", "eval", "leaderboard"} <= set(sub.choices)


@pytest.mark.parametrize(
    "missing, code, expected",
    [
        ("vllm", "from ragen_trainer.engines.vllm import require_vllm; require_vllm()", "pip install 'ragen[vllm]'"),
        ("trl", "import ragen_trainer.trl_integration", "pip install 'ragen[train]'"),
        ("pettingzoo", "from ragen_trainer.config import load_config; "
                       "load_config('starpo-s').replace(env_id='ragen/TicTacToe-v0', opponent_pool=['self'])"
                       ".validate()", "pip install 'ragen[games]'"),
        ("pettingzoo", "from ragen_envs.games import aec_env; aec_env('tictactoe')", "pip install 'ragen[games]'"),
    ],
)
def test_a_missing_extra_is_named_with_its_pip_command(missing, code, expected):
    script = f"import sys; sys.modules[{missing!r}] = None\n{code}\n"  # importing it now fails, as if not installed
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert out.returncode != 0
    assert expected in out.stderr, out.stderr[-2000:]
