"""Where a trained policy moved from its start: its log-probability of the same conversations, token by token, apart
for the model's own replies and for the text it did not write (the environment's observations and the template).

What is measured. ``--reference`` (the model RL started from, usually its warm-up) plays ``--groups`` x
``--group-size`` episodes of the run's env with the run's settings (``--config``: the run's ``config.yaml`` or a preset;
its env, protocol, rollout settings, temperature and reply length), sampled with ``--seed``. Each model then scores
those conversations by teacher forcing (one forward pass each, float32), and per episode the mean of
``log pi(x_t) - log pi_ref(x_t)`` is taken over

* **reply** tokens: the model's replies as trained (``Trajectory.turn_spans``);
* **context** tokens: everything after the system turn that is not a reply -- the environment's observations and
  rewards, the chat template's role headers -- what the paper's loss mask (``loss_mask: after_system``) trains too;

reported as the mean over episodes with its standard error. Over the reply tokens the number estimates ``KL(pi_ref ||
pi)`` with a minus sign (the replies are the reference's samples); over the context tokens it says how much more (> 0) or
less (< 0) likely the model finds the environment's text than its start did.

Also reported, from the same episodes: the share of context among the tokens after the system turn, and the mean
advantage GRPO (``A_i = (R_i - mean_G R) / std_G R``, broadcast over every trained token) would put on the context
tokens of this batch (``grpo_context_advantage``): the policy gradient ``A * grad log pi`` has zero mean over text the
policy sampled, not over text it did not write, so below zero this is a push down on the observations' likelihood.

Why: vanilla GRPO on FrozenLake lost its reply format between steps 27 and 33 in both seeds run, where PPO and
StarPO-S did not (docs/learning.md, "Why vanilla GRPO fell off"); this tool found the model had unlearned its
observations (context log-ratio -4 to -6 nats a token) while its replies had moved by a tenth of that.

Run (one thread, a few minutes)::

    OMP_NUM_THREADS=1 python benchmarks/token_drift.py runs/multiturn/warmup/frozenlake-seed0 \\
        runs/multiturn/frozenlake-grpo/seed0/final --config runs/multiturn/frozenlake-grpo/seed0/config.yaml \\
        --json drift.json --md drift.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np

import ragen_envs  # noqa: F401  (registers the ragen/* ids)
from ragen_trainer.advantages import grpo_advantages
from ragen_trainer.config import StarPOConfig, load_config
from ragen_trainer.engines.base import SamplingParams
from ragen_trainer.engines.hf import HFEngine
from ragen_trainer.models import is_default_model, load_model_and_tokenizer
from ragen_trainer.rollout import ChatTokens, after_system_mask, collect_rollouts
from ragen_trainer.trajectory import Trajectory

#: Token kinds of :func:`token_kinds`, per predicted position.
UNSCORED, CONTEXT, REPLY = 0, 1, 2


# ------------------------------------------------------------------------------------------------ the episodes
def play(reference: Any, tokenizer: Any, cfg: StarPOConfig, groups: int, group_size: int, seed: int,
         progress: bool = True) -> list[Trajectory]:  # fmt: skip
    """``groups`` x ``group_size`` episodes of ``cfg``'s env played by ``reference`` with the run's settings: initial
    states ``seed * 1000 + g`` (away from the seeds training and validation draw), sampling seeded by ``seed``."""
    engine = HFEngine(reference, tokenizer, batch_size=max(1, groups * group_size))
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                              seed=seed)  # fmt: skip
    batch = collect_rollouts(engine, tokenizer, cfg.env_id, [seed * 1000 + g for g in range(groups)], group_size,
                             settings=cfg.rollout_settings(), sampling=sampling,
                             env_kwargs=cfg.env_make_kwargs(cfg.protocol_settings()), progress=progress)  # fmt: skip
    return batch.trajectories


def token_kinds(traj: Trajectory, chat: ChatTokens) -> np.ndarray:
    """The kind of each predicted position ``1 .. len(input_ids) - 1``: :data:`REPLY` inside a reply, :data:`CONTEXT`
    after the system turn outside the replies (the paper's ``after_system`` mask minus the replies, whatever mask
    the run trained with), :data:`UNSCORED` in the system turn."""
    system = traj.messages[0]["content"] if traj.messages and traj.messages[0]["role"] == "system" else ""
    after = np.array(after_system_mask(traj.input_ids, chat.system_turn_ids(system) if system else []), dtype=np.int64)
    kinds = np.where(after > 0, CONTEXT, UNSCORED)
    for start, end in traj.turn_spans:
        kinds[start:end] = REPLY
    return kinds[1:]


def grpo_context_advantage(trajs: list[Trajectory], kinds: list[np.ndarray]) -> float:
    """The mean GRPO advantage (group-normalised return, std-normalised) over these episodes' context tokens: what
    one GRPO update under ``loss_mask: after_system`` puts on the text the policy did not write."""
    import torch

    adv = grpo_advantages(torch.tensor([t.reward for t in trajs], dtype=torch.float32), [t.group_id for t in trajs])
    n_context = np.array([(k == CONTEXT).sum() for k in kinds], dtype=np.float64)
    return float((adv.numpy().astype(np.float64) * n_context).sum() / max(n_context.sum(), 1.0))


# ------------------------------------------------------------------------------------------------ scoring
def sequence_logprobs(model: Any, input_ids: list[int]) -> np.ndarray:
    """``log p(x_t | x_<t)`` for ``t = 1 .. n-1`` under ``model`` (one forward pass, float32)."""
    import torch

    ids = torch.tensor([input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0].numpy().astype(np.float64)


def mean_sem(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for one value)."""
    arr = np.asarray(values, dtype=np.float64)
    sem = float(arr.std(ddof=1) / math.sqrt(len(arr))) if len(arr) > 1 else 0.0
    return float(arr.mean()), sem


def drift(logp: list[np.ndarray], base: list[np.ndarray], kinds: list[np.ndarray]) -> dict[str, Any]:
    """Per kind, the mean over episodes of each episode's mean ``logp - base`` over its tokens of that kind."""
    out: dict[str, Any] = {}
    for name, code in (("reply", REPLY), ("context", CONTEXT)):
        per_episode = [float((lp - b)[k == code].mean()) for lp, b, k in zip(logp, base, kinds) if (k == code).any()]
        if per_episode:
            mean, sem = mean_sem(per_episode)
            out[name] = {"mean": mean, "sem": sem, "episodes": len(per_episode)}
    return out


# ------------------------------------------------------------------------------------------------ the report
def format_markdown(result: dict[str, Any]) -> str:
    s, e = result["settings"], result["episodes"]
    lines = [
        (f"Log-probability of the reference's episodes against the reference ({s['env']}, {e['count']} episodes of "
        f"{e['mean_turns']:.2f} turns, success {e['success']:.3f}; context is {e['context_share']:.2f} of the tokens "
        f"after the system turn; GRPO's mean advantage on them {e['grpo_context_advantage']:+.3f}), nats a token, "
         "mean over episodes +- standard error:"),
        "",
        "| model | replies | context (observations, template) |",
        "|---|---:|---:|",
    ]
    for m in result["models"]:
        cells = [f"{m['drift'][k]['mean']:+.3f} +- {m['drift'][k]['sem']:.3f}" if k in m["drift"] else "-"
                 for k in ("reply", "context")]  # fmt: skip
        lines.append(f"| {m['label']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def default_label(name: str) -> str:
    if is_default_model(name):
        return "smollm2"
    path = Path(name)
    return f"{path.parent.name}/{path.name}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("reference", help="the model RL started from (a folder, or 'smollm2' for the bundled model)")
    p.add_argument("models", nargs="+", help="trained models to compare with it (ragen checkpoints, HF folders)")
    p.add_argument("--labels", nargs="+", default=None, help="one label per model (default: parent/folder)")
    p.add_argument("--config", default="starpo-s",
                   help="the run's config.yaml or a preset: env, protocol, rollout settings (default starpo-s)")
    p.add_argument("--groups", type=int, default=8, help="initial states (default 8)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per initial state (default 4)")
    p.add_argument("--seed", type=int, default=7, help="initial states seed*1000+g and the sampling seed (default 7)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", default=None, help="write the full result (per-episode numbers included) here")
    p.add_argument("--md", default=None, help="write the table as Markdown here")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.labels is not None and len(args.labels) != len(args.models):
        parser.error(f"--labels: {len(args.labels)} labels for {len(args.models)} models")
    if args.groups < 1 or args.group_size < 1:
        parser.error("--groups and --group-size must be >= 1")
    try:
        cfg = load_config(args.config).validate()
    except (ValueError, TypeError) as error:
        parser.error(f"--config {args.config!r}: {error}")
    import torch
    from tqdm import tqdm

    torch.set_num_threads(max(1, args.threads))
    started = time.perf_counter()

    def load(name: str) -> tuple[Any, Any]:
        model, tokenizer = load_model_and_tokenizer(None if is_default_model(name) else name, dtype="float32",
                                                    device="cpu")  # fmt: skip
        return model.eval(), tokenizer

    reference, tokenizer = load(args.reference)
    trajs = play(reference, tokenizer, cfg, args.groups, args.group_size, args.seed, progress=not args.no_progress)
    chat = ChatTokens(tokenizer)
    kinds = [token_kinds(t, chat) for t in trajs]
    scored = sum(int((k != UNSCORED).sum()) for k in kinds)
    context = sum(int((k == CONTEXT).sum()) for k in kinds)
    episodes = {"count": len(trajs), "mean_turns": float(np.mean([len(t.turn_spans) for t in trajs])),
                "success": float(np.mean([t.success for t in trajs])), "context_share": context / max(scored, 1),
                "grpo_context_advantage": grpo_context_advantage(trajs, kinds)}  # fmt: skip

    def score(model: Any, label: str) -> list[np.ndarray]:
        return [sequence_logprobs(model, t.input_ids)
                for t in tqdm(trajs, desc=label, unit="episode", file=sys.stderr, disable=args.no_progress)]

    base = score(reference, "reference")
    del reference
    labels = args.labels or [default_label(m) for m in args.models]
    models = []
    for label, name in zip(labels, args.models):
        model, _ = load(name)
        entry = {"label": label, "model": name, "drift": drift(score(model, label), base, kinds)}
        models.append(entry)
        d = entry["drift"]
        print(f"{label}: replies {d['reply']['mean']:+.3f} +- {d['reply']['sem']:.3f}, context "
              f"{d['context']['mean']:+.3f} +- {d['context']['sem']:.3f} nats a token", file=sys.stderr, flush=True)
        del model
    result = {
        "settings": {"reference": args.reference, "config": args.config, "env": cfg.env_id, "loss_mask": cfg.loss_mask,
                     "groups": args.groups, "group_size": args.group_size, "seed": args.seed, "threads": args.threads,
                     "dtype": "float32", "device": "cpu"},
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "episodes": episodes,
        "models": models,
        "seconds": round(time.perf_counter() - started, 2),
    }
    text = format_markdown(result)
    print("\n" + text + f"\n({result['seconds']:.0f} s)", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.md).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
