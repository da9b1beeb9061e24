"""Read the reference's settings from its git history and write ``docs/reference-settings.json``.

For every setting a preset holds, at both references -- ``paper`` (the runs behind the paper's figures: RAGEN
``3059df8`` on verl ``797f999``, with ``train_all.sh``) and ``latest`` (RAGEN ``5eb79b8`` on verl ``1e47e41``) -- the
record gives the file, the line, the line's text and the value it means for ragen's config field. The numbers are
read here, from the mirrors, not typed: ``tests/trainer/test_presets_reference.py`` compares the presets with the
record, and (where the mirrors exist) runs this extraction again and compares it with the record.

    python scripts/extract_reference_settings.py                 # rewrite the record (and the tables in the docs)
    python scripts/extract_reference_settings.py --check         # exit 1 if the record or the docs are stale

Mirrors: ``--ragen`` and ``--verl``, git directories (bare or a checkout) of https://github.com/RAGEN-AI/RAGEN and
https://github.com/volcengine/verl that hold the commits above; by default ``../.mirror/RAGEN-AI+RAGEN/repo`` and
``../.mirror/volcengine+verl/repo``, relative to this repository's root. Files are read with ``git show COMMIT:PATH``;
a mirror that is not there stops the script with a message naming it and the flag to pass.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "reference-settings.json"
DOC = ROOT / "docs" / "presets.md"
BEGIN, END = "<!-- reference-settings: begin (scripts/extract_reference_settings.py) -->", \
    "<!-- reference-settings: end -->"

COMMITS: dict[str, dict[str, str]] = {
    "paper": {"RAGEN": "3059df8", "verl": "797f9994b73f6335aa2349cdb2e9bb2a42f13f5c"},
    "latest": {"RAGEN": "5eb79b8", "verl": "1e47e412a441bae8cd1152888f6822871f95dec5"},
}
#: The default mirrors: beside this repository's folder, in ``../.mirror/`` (``--ragen`` / ``--verl`` point elsewhere).
MIRRORS = {"RAGEN": ROOT.parent / ".mirror" / "RAGEN-AI+RAGEN" / "repo",
           "verl": ROOT.parent / ".mirror" / "volcengine+verl" / "repo"}
URLS = {"RAGEN": "https://github.com/RAGEN-AI/RAGEN", "verl": "https://github.com/volcengine/verl"}
BASE, VERL, TRAIN_ALL = "config/base.yaml", "verl/trainer/config/ppo_trainer.yaml", "train_all.sh"


@dataclass(frozen=True)
class Locator:
    """Where a value is: a YAML key (dotted) or the first line matching a regex, in a repo's file; ``convert`` turns
    the YAML value (or the regex's first group) into the config field's value."""

    repo: str
    path: str
    key: str = ""
    regex: str = ""
    convert: Callable[[Any], Any] = lambda v: v


def Y(path: str, key: str, convert: Callable[[Any], Any] = lambda v: v, repo: str = "RAGEN") -> Locator:
    return Locator(repo, path, key=key, convert=convert)


def G(path: str, regex: str, convert: Callable[[Any], Any], repo: str = "RAGEN") -> Locator:
    return Locator(repo, path, regex=regex, convert=convert)


def _flt(v: Any) -> float:
    return float(v)


def _off_means_zero(v: Any) -> float:
    """``use_kl_loss: False`` / ``use_kl_in_reward: False``: the coefficient does not act."""
    if v is not False:
        raise ValueError(f"expected False, found {v!r}")
    return 0.0


def _bool_text(v: Any) -> bool:
    return {"True": True, "False": False}[v] if isinstance(v, str) else bool(v)


_MASK = {False: "after_system", True: "replies"}
_AGG = {4: "micro-token-mean", 1: "seq-mean-token-mean"}
_KL_TYPE = {"kl": "k1", "low_var_kl": "k3"}

#: (field, presets it applies to ("*" = every preset unless a preset has its own entry), what, paper, latest).
#: ``None`` for an era: the code of that commit has no such setting.
SPECS: list[tuple[str, str | tuple[str, ...], str, Locator | None, Locator | None]] = [
    ("env_groups", "*", "initial states per step", Y(BASE, "es_manager.train.env_groups"),
     Y(BASE, "es_manager.train.env_groups")),
    ("group_size", "*", "rollouts per state", Y(BASE, "es_manager.train.group_size"),
     Y(BASE, "es_manager.train.group_size")),
    ("filter_ratio", "*", "groups kept by the filter", Y(BASE, "actor_rollout_ref.rollout.rollout_filter_ratio", _flt),
     Y(BASE, "actor_rollout_ref.rollout.rollout_filter_ratio", _flt)),
    ("filter_mode", "*", "ranking of groups", Y(BASE, "actor_rollout_ref.rollout.rollout_filter_type"),
     Y(BASE, "actor_rollout_ref.rollout.rollout_filter_type")),
    ("adv_estimator", "*", "advantage", Y(BASE, "algorithm.adv_estimator"), Y(BASE, "algorithm.adv_estimator")),
    ("gamma", "*", "token discount", Y(BASE, "algorithm.gamma", _flt), Y(BASE, "algorithm.gamma", _flt)),
    ("lam", "*", "GAE lambda", Y(BASE, "algorithm.lam", _flt), Y(BASE, "algorithm.lam", _flt)),
    ("clip_low", "*", "clip below 1", Y(BASE, "actor_rollout_ref.actor.clip_ratio_low", _flt),
     Y(BASE, "actor_rollout_ref.actor.clip_ratio_low", _flt)),
    ("clip_high", "*", "clip above 1", Y(BASE, "actor_rollout_ref.actor.clip_ratio_high", _flt),
     Y(BASE, "actor_rollout_ref.actor.clip_ratio_high", _flt)),
    ("clip_ratio_c", "*", "dual clip (0 = none)",
     G("ragen/workers/actor/dp_actor.py", r"^\s*pg_loss = verl_F\.masked_mean\(torch\.max\((pg_losses, pg_losses2)\), "
       r"eos_mask\)", lambda v: 0.0),
     Y(VERL, "actor_rollout_ref.actor.clip_ratio_c", _flt, repo="verl")),
    ("kl_coef", "*", "KL loss weight", Y(BASE, "actor_rollout_ref.actor.use_kl_loss", _off_means_zero),
     Y(BASE, "actor_rollout_ref.actor.use_kl_loss", _off_means_zero)),
    ("kl_reward_coef", "*", "in-reward KL weight (paper: applied whenever the KL loss is off)",
     Y(BASE, "algorithm.kl_ctrl.kl_coef", _flt),
     Y(VERL, "algorithm.use_kl_in_reward", _off_means_zero, repo="verl")),
    ("kl_estimator", "*", "KL estimator", Y(BASE, "actor_rollout_ref.actor.kl_loss_type", _KL_TYPE.get),
     Y(BASE, "actor_rollout_ref.actor.kl_loss_type", _KL_TYPE.get)),
    ("entropy_coef", "*", "entropy bonus", Y(BASE, "actor_rollout_ref.actor.entropy_coeff", _flt),
     Y(BASE, "actor_rollout_ref.actor.entropy_coeff", _flt)),
    ("loss_mask", "*", "trained tokens", Y(BASE, "enable_response_mask", _MASK.get),
     Y(BASE, "enable_response_mask", _MASK.get)),
    ("loss_agg_mode", "*", "loss averaging (token mean per micro-batch of this many sequences)",
     Y(BASE, "micro_batch_size_per_gpu", _AGG.get), Y(BASE, "micro_batch_size_per_gpu", _AGG.get)),
    ("loss_agg_micro_size", "*", "sequences per loss micro-batch", Y(BASE, "micro_batch_size_per_gpu"),
     Y(BASE, "micro_batch_size_per_gpu")),
    ("ppo_mini_batch_size", "*", "trajectories per optimizer step", Y(BASE, "ppo_mini_batch_size"),
     Y(BASE, "ppo_mini_batch_size")),
    ("ppo_epochs", "*", "passes per step", Y(VERL, "actor_rollout_ref.actor.ppo_epochs", repo="verl"),
     Y(VERL, "actor_rollout_ref.actor.ppo_epochs", repo="verl")),
    ("value_clip", "*", "value clip", Y(VERL, "critic.cliprange_value", _flt, repo="verl"),
     Y(VERL, "critic.cliprange_value", _flt, repo="verl")),
    ("max_grad_norm", "*", "policy gradient clip", Y(VERL, "actor_rollout_ref.actor.grad_clip", _flt, repo="verl"),
     Y(VERL, "actor_rollout_ref.actor.grad_clip", _flt, repo="verl")),
    ("critic_max_grad_norm", "*", "critic gradient clip", Y(VERL, "critic.grad_clip", _flt, repo="verl"),
     Y(VERL, "critic.grad_clip", _flt, repo="verl")),
    ("actor_lr", "*", "policy learning rate", Y(VERL, "actor_rollout_ref.actor.optim.lr", _flt, repo="verl"),
     Y(VERL, "actor_rollout_ref.actor.optim.lr", _flt, repo="verl")),
    ("critic_lr", "*", "critic learning rate", Y(VERL, "critic.optim.lr", _flt, repo="verl"),
     Y(VERL, "critic.optim.lr", _flt, repo="verl")),
    ("weight_decay", "*", "AdamW weight decay",
     G("ragen/workers/fsdp_workers.py", r"weight_decay=optim_config\.get\('weight_decay', ([0-9.e-]+)\)", _flt),
     Y(VERL, "actor_rollout_ref.actor.optim.weight_decay", _flt, repo="verl")),
    ("total_steps", "*", "training steps", Y(BASE, "trainer.total_training_steps"),
     Y(BASE, "trainer.total_training_steps")),
    ("val_every", "*", "validation every", Y(BASE, "trainer.test_freq"), Y(BASE, "trainer.test_freq")),
    ("val_groups", "*", "validation states", Y(BASE, "es_manager.val.env_groups"), Y(BASE, "es_manager.val.env_groups")),
    ("val_temperature", "*", "validation temperature", Y(BASE, "actor_rollout_ref.rollout.val_kwargs.temperature", _flt),
     Y(BASE, "actor_rollout_ref.rollout.val_kwargs.temperature", _flt)),
    ("temperature", "*", "rollout temperature", Y(BASE, "actor_rollout_ref.rollout.temperature", _flt),
     Y(BASE, "actor_rollout_ref.rollout.temperature", _flt)),
    ("top_p", "*", "nucleus sampling", Y(VERL, "actor_rollout_ref.rollout.top_p", _flt, repo="verl"),
     Y(VERL, "actor_rollout_ref.rollout.top_p", _flt, repo="verl")),
    ("max_new_tokens", "*", "tokens per reply", Y(BASE, "actor_rollout_ref.rollout.response_length"),
     Y(BASE, "actor_rollout_ref.rollout.response_length")),
    ("max_context_tokens", "*", "context", Y(BASE, "actor_rollout_ref.rollout.max_model_len"),
     Y(BASE, "actor_rollout_ref.rollout.max_model_len")),
    ("protocol.enable_think", "*", "thinking", Y(BASE, "agent_proxy.enable_think"), Y(BASE, "agent_proxy.enable_think")),
    # ---- presets: train_all.sh's bundles and runs
    ("filter_ratio", ("starpo", "ppo", "grpo"), "USE_BASE: no filter",
     G(TRAIN_ALL, r"^USE_BASE=.*rollout_filter_ratio=([0-9.]+)", _flt),
     G(TRAIN_ALL, r"^USE_BASE=.*rollout_filter_ratio=([0-9.]+)", _flt)),
    ("clip_high", ("starpo", "ppo", "grpo", "starpo-s-no-clip-higher"), "USE_BASE: symmetric clip",
     G(TRAIN_ALL, r"^USE_BASE=.*clip_ratio_high=([0-9.]+)", _flt),
     G(TRAIN_ALL, r"^USE_BASE=.*clip_ratio_high=([0-9.]+)", _flt)),
    ("kl_reward_coef", ("starpo", "ppo", "starpo-s-kl"), "USE_BASE's kl_ctrl.kl_coef (paper: in the reward when the "
     "KL loss is off, agent_trainer.py; latest: only with use_kl_in_reward, off)",
     G(TRAIN_ALL, r"^USE_BASE=.*kl_ctrl\.kl_coef=([0-9.]+)", _flt),
     Y(VERL, "algorithm.use_kl_in_reward", _off_means_zero, repo="verl")),
    ("kl_coef", ("grpo",), "USE_GRPO use_kl_loss=True with USE_BASE's kl_loss_coef",
     G(TRAIN_ALL, r"^USE_BASE=.*actor\.kl_loss_coef=([0-9.]+)", _flt),
     G(TRAIN_ALL, r"^USE_BASE=.*actor\.kl_loss_coef=([0-9.]+)", _flt)),
    ("kl_coef", ("starpo-s-kl",), "the KL as a loss (latest: the only way vanilla PPO's 0.001 can act)",
     Y(BASE, "actor_rollout_ref.actor.use_kl_loss", _off_means_zero),
     G(TRAIN_ALL, r"^USE_BASE=.*actor\.kl_loss_coef=([0-9.]+)", _flt)),
    ("adv_estimator", ("grpo",), "USE_GRPO", G(TRAIN_ALL, r"^USE_GRPO=\"algorithm\.adv_estimator=(\w+)", str),
     G(TRAIN_ALL, r"^USE_GRPO=\"algorithm\.adv_estimator=(\w+)", str)),
    ("adv_estimator", ("starpo-s-grpo",), "sokoban-s-grpo run",
     G(TRAIN_ALL, r"experiment_name=sokoban-s-grpo algorithm\.adv_estimator=(\w+)", str),
     G(TRAIN_ALL, r"experiment_name=sokoban-s-grpo algorithm\.adv_estimator=(\w+)", str)),
    ("adv_estimator", ("starpo-s-bilevel",), "bi-level GAE (not in the paper's code)", None,
     G(TRAIN_ALL, r"algorithm\.(bi_level_gae)=True", lambda v: "bilevel_gae")),
    ("filter_mode", ("starpo-s-std-rev",), "std_rev ranking (no train_all.sh run)",
     G("ragen/trainer/agent_trainer.py", r"rollout_filter_type == \"(std_rev)\"", str),
     G("ragen/trainer/agent_trainer.py", r"rollout_filter_type == \"(std_rev)\"", str)),
    ("protocol.enable_think", ("starpo-s-no-think",), "the *-nothink runs",
     G(TRAIN_ALL, r"^\s*agent_proxy\.enable_think=(False)", _bool_text),
     G(TRAIN_ALL, r"^\s*agent_proxy\.enable_think=(False)", _bool_text)),
]


def is_git_dir(path: Path) -> bool:
    """Whether ``path`` is a bare git directory or a checkout."""
    return path.is_dir() and ((path / "HEAD").is_file() or (path / ".git").exists())


def git_show(repo: str, commit: str, path: str, mirrors: dict[str, Path]) -> str:
    return subprocess.run(["git", "-C", str(mirrors[repo]), "show", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout  # fmt: skip


def _yaml_find(text: str, key: str) -> tuple[int, Any]:
    """(1-based line, value) of a dotted ``key`` in YAML ``text``."""
    node = yaml.compose(text)
    for part in key.split("."):
        found = None
        for k, v in node.value:
            if k.value == part:
                found = (k, v)
        if found is None:
            raise KeyError(key)
        key_node, node = found
    return key_node.start_mark.line + 1, yaml.safe_load(yaml.serialize(node))


def locate(loc: Locator, era: str, mirrors: dict[str, Path]) -> dict[str, Any]:
    commit = COMMITS[era][loc.repo]
    text = git_show(loc.repo, commit, loc.path, mirrors)
    lines = text.splitlines()
    if loc.key:
        line, raw = _yaml_find(text, loc.key)
    else:
        pattern = re.compile(loc.regex)
        for line, content in enumerate(lines, 1):
            match = pattern.search(content)
            if match and match.group(1) is not None:
                raw = match.group(1)
                break
        else:
            raise LookupError(f"{loc.path}@{commit}: no line matches {loc.regex!r}")
    value = loc.convert(raw)
    if value is None:
        raise ValueError(f"{loc.path}@{commit}: cannot read {raw!r}")
    return {"repo": loc.repo, "commit": commit[:7], "file": loc.path, "line": line,
            "text": lines[line - 1].strip()[:200], "value": value}  # fmt: skip


def extract(mirrors: dict[str, Path] = MIRRORS) -> dict[str, Any]:
    settings = []
    for field, presets, what, paper, latest in SPECS:
        entry: dict[str, Any] = {"field": field, "presets": presets if presets == "*" else list(presets), "what": what}
        for era, loc in (("paper", paper), ("latest", latest)):
            entry[era] = locate(loc, era, mirrors) if loc is not None else None
        settings.append(entry)
    return {"commits": COMMITS, "settings": settings}


# ------------------------------------------------------------------------------------------------ the doc's tables
def _cell(era: dict[str, Any] | None) -> tuple[str, str]:
    if era is None:
        return "-", "not in the code at this commit"
    return f"`{era['value']}`", f"{era['repo']} `{era['commit']}` `{era['file']}`:{era['line']} `{era['text']}`".replace(
        "|", "\\|")


def render_tables(record: dict[str, Any]) -> str:
    """Markdown: StarPO-S's values at both references, then each preset's own entries."""
    out = [BEGIN, "", "| field | paper (3059df8) | source | latest (5eb79b8) | source |", "|---|---|---|---|---|"]
    rows = [e for e in record["settings"] if e["presets"] == "*"]
    for e in rows:
        (pv, ps), (lv, ls) = _cell(e["paper"]), _cell(e["latest"])
        out.append(f"| `{e['field']}` | {pv} | {ps} | {lv} | {ls} |")
    out += ["", "Preset entries (where a preset differs from StarPO-S):", "",
            "| preset(s) | field | paper (3059df8) | source | latest (5eb79b8) | source |", "|---|---|---|---|---|---|"]
    for e in record["settings"]:
        if e["presets"] == "*":
            continue
        (pv, ps), (lv, ls) = _cell(e["paper"]), _cell(e["latest"])
        names = ", ".join(f"`{p}`" for p in e["presets"])
        out.append(f"| {names} | `{e['field']}` | {pv} | {ps} | {lv} | {ls} |")
    out += ["", END]
    return "\n".join(out)


def write_doc_tables(record: dict[str, Any], doc: Path = DOC) -> bool:
    """Put the tables between the markers of ``doc``; whether the file changed."""
    text = doc.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + render_tables(record) + text[end:]
    if new != text:
        doc.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ragen", type=Path, default=MIRRORS["RAGEN"])
    parser.add_argument("--verl", type=Path, default=MIRRORS["verl"])
    parser.add_argument("--check", action="store_true", help="compare with the record and docs; write nothing")
    args = parser.parse_args(argv)
    for repo, path, flag in (("RAGEN", args.ragen, "--ragen"), ("verl", args.verl, "--verl")):
        if not is_git_dir(path):
            parser.error(f"the {repo} reference mirror is not at {path} (no git directory there): clone "
                         f"{URLS[repo]} (it must hold commit {COMMITS['paper'][repo][:7]} and "
                         f"{COMMITS['latest'][repo][:7]}) and pass {flag} PATH")
    record = extract({"RAGEN": args.ragen, "verl": args.verl})
    text = json.dumps(record, indent=1) + "\n"
    if args.check:
        stale = RECORD.read_text(encoding="utf-8") != text or render_tables(record) not in DOC.read_text("utf-8")
        print("stale: run scripts/extract_reference_settings.py" if stale else "up to date")
        return 1 if stale else 0
    RECORD.write_text(text, encoding="utf-8")
    write_doc_tables(record)
    print(f"wrote {RECORD} ({len(record['settings'])} settings) and the tables in {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
