"""Multi-turn learning on a CPU: StarPO-S on FrozenLake and Sokoban (the paper's environment settings) from the
``reply-format`` warm-up, several seeds, validated during training on every split with 95 % intervals.

Every run: the warm-up (:mod:`ragen_trainer.warmup`: SFT on the random agent's valid replies, so that SmolLM2-135M
answers in the format; its own seed), then ``ragen-trainer train`` from the warmed-up model with StarPO-S at the
settings below, validation every :data:`VAL_EVERY` steps (per env) on :data:`VAL_GROUPS` states of the training env and
of each generalisation split (the paper's: Sokoban runs validate SokobanLarge, SokobanNewVocab and FrozenLake). Runs resume:
``run`` again after an interruption continues each unfinished run from its checkpoint.

    python benchmarks/learn_multiturn.py run --envs frozenlake --seeds 0 1 2 --jobs 2
    python benchmarks/learn_multiturn.py run --envs frozenlake --variant keep1   # or mixed, mixed-state, perceive-state, perceive-state-keep1, ppo, grpo, grpo-replies, keep1-replies (VARIANTS)
    python benchmarks/learn_multiturn.py report          # docs/learning/multiturn.md: start / end with 95 % CIs
    ragen-trainer plot docs/learning/runs/frozenlake -o docs/learning/frozenlake.png

``run`` and ``report`` copy each run's curves, summary and settings into ``docs/learning/runs/`` (``--records``): the
run folders under ``runs/`` belong to one machine, the records to the repository, so the table and the figures can be
made again where the runs are gone (a fresh machine); a run listed in the table before records were kept keeps its rows.

The learning rate is the Bandit sweep's (docs/sweeps/bandit.md: 5e-5 collapses the policy onto one reply, 1e-5 learns
on every seed there); the rest is fixed here before any run, not tuned toward the paper.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import sys
from functools import partial
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's root, for benchmarks.*
from benchmarks.run_queue import Job, parse_queue_args, queue_parser, run_finished, run_jobs
from ragen_trainer.monitor import read_metrics

#: Env name -> (env id, the generalisation splits validated during training).
HERE = Path(__file__).resolve().parent
ENVS: dict[str, tuple[str, tuple[str, ...]]] = {
    "frozenlake": ("ragen/FrozenLake-v0", ()),
    "sokoban": ("ragen/Sokoban-v0", ("ragen/SokobanLarge-v0", "ragen/SokobanNewVocab-v0", "ragen/FrozenLake-v0")),
}
STEPS = 40
#: Steps between validations, per env: a Sokoban validation plays four splits of 128 states (about half an hour on one
#: thread of this 2-core machine), so its curve has three points (steps 0, 20, 40) where FrozenLake's has five.
VAL_EVERY: dict[str, int] = {"frozenlake": 10, "sokoban": 20}
VAL_GROUPS = 128
SEEDS = (0, 1, 2)
#: A run's record, copied into the repository (``--records``) by :func:`keep_records`.
RECORD_FILES = ("metrics.jsonl", "summary.json", "config.yaml")
#: StarPO-S over its paper defaults: CPU-sized batches and replies, the sweep's learning rate.
TRAIN_FIELDS: dict[str, str] = {
    "env_groups": "4", "group_size": "8", "max_new_tokens": "48", "actor_lr": "1e-5", "critic_lr": "1e-4",
    "micro_batch_size": "8", "total_steps": str(STEPS), "val_groups": str(VAL_GROUPS),
    "save_steps": "5", "save_total_limit": "1",
}
#: Variants of the search (``--variant``), each a change to :data:`TRAIN_FIELDS` and to :data:`WARMUP_FIELDS`, trained
#: into ``<out>/<env>-<variant>/seed<N>``: ``base`` is the configuration above; ``keep1`` keeps every group (no variance
#: filter: one update on all 32 trajectories a step instead of on the 8 kept), the largest change in how much signal a
#: step carries at the same learning rate; ``mixed`` starts from a warm-up on the ``mixed`` agent's replies (the
#: oracle's actions at half of the turns, random ones at the others, one thinking sentence for both) instead of the
#: random agent's: the base warm-up's policy plays one direction in every state (docs/learning.md), and RL cannot sharpen
#: a state dependence that is not there; ``mixed-state`` is ``mixed`` with the teacher's thinking naming the state
#: (``--think state``: the player's and the goal's cells, where the goal lies, which moves fall into a hole), so that
#: the move can follow from text the model wrote itself (the fixed sentence's warm-up did not read the board:
#: docs/learning.md), on twice the episodes and with room in the reply for the longer thinking (96 new tokens: its
#: longest reply is 65 tokens). ``ppo`` and ``grpo`` are the multi-turn half of the Echo Trap contrast (one
#: cause at a time, as ``benchmarks/sweep_bandit.py``'s ``algo``): the vanilla presets at the same learning rate, from the
#: same warm-up, each making one update a step on all 32 trajectories (``keep1`` is StarPO-S's side of it: only the
#: filter differs between ``keep1`` and ``base``). ``config`` names the preset (``starpo-s`` when absent).
#: ``grpo-replies`` is ``grpo`` with the replies alone trained (``loss_mask: replies``, today's reference) instead of
#: every token after the system prompt (the paper's runs): the one change that tests whether vanilla GRPO's fall on
#: FrozenLake comes from its trajectory-level advantage on the environment's text (docs/learning.md, "Why vanilla
#: GRPO fell off"). ``keep1-replies`` is ``keep1`` with the replies alone trained: under the paper's mask 88 % of a
#: FrozenLake batch's trained tokens are the environment's text, whose gradient says nothing about which move to make.
#: ``perceive-state`` is ``mixed-state`` after a *perception stage* (:data:`PERCEPTION_VARIANTS`) and on the grid
#: written one token per cell (FrozenLake's ``cell_separator=" "``, not the paper's rendering): the ``mixed-state``
#: warm-ups wrote one and the same (false) state in every state, while SFT on the state alone, with short answers,
#: teaches SmolLM2 to read the board (``benchmarks/grid_perception.py``, docs/learning/grid-perception.md).
#: ``perceive-state-keep1`` is ``perceive-state`` without the variance filter (as ``keep1`` is ``base``), from the same
#: warm-up (:data:`SHARED_WARMUPS`): four times the trajectories an update, on a policy that reads the board.
#: ``still-ice`` is a diagnostic, not the paper's setting: ``base`` on FrozenLake without slipping (``is_slippery:
#: false``), from the base warm-up, validated on still ice. There a policy blind to the board still scores at most
#: 0.242 on other states but one that reads it reaches 1.0 (benchmarks/headroom.py), and a reply's move decides its
#: reward, so it asks whether StarPO-S at this scale learns anything where the board pays and the ice adds no noise.
SPACED = '{cell_separator: " "}'
PERCEIVE_STATE = {"max_new_tokens": "96", "env_kwargs": SPACED}
VARIANTS: dict[str, dict[str, str]] = {
    "base": {}, "keep1": {"filter_ratio": "1.0"}, "mixed": {}, "mixed-state": {"max_new_tokens": "96"},
    "ppo": {"config": "ppo"}, "grpo": {"config": "grpo"}, "grpo-replies": {"config": "grpo", "loss_mask": "replies"},
    "keep1-replies": {"filter_ratio": "1.0", "loss_mask": "replies"},
    "perceive-state": PERCEIVE_STATE, "perceive-state-keep1": {**PERCEIVE_STATE, "filter_ratio": "1.0"},
    "still-ice": {"env_kwargs": "{is_slippery: false}"},
}
#: Variants whose settings are FrozenLake's (a perception stage that reads its grids, its env arguments).
FROZENLAKE_ONLY = frozenset({"perceive-state", "perceive-state-keep1", "still-ice"})
#: Variants that train from another variant's warm-up (its perception stage, warm-up and check, in its folders):
#: only the RL differs between the two.
SHARED_WARMUPS: dict[str, str] = {"perceive-state-keep1": "perceive-state", "still-ice": "base"}
#: The warm-up (docs/reproduction.md's CPU scale).
WARMUP_FIELDS: dict[str, str] = {"episodes": "16", "epochs": "3", "lr": "1e-4"}
#: Variants' changes to the warm-up; a variant listed here warms up into its own folder.
WARMUP_VARIANTS: dict[str, dict[str, str]] = {
    "mixed": {"agent": "mixed", "oracle-share": "0.5", "episodes": "64"},
    "mixed-state": {"agent": "mixed", "oracle-share": "0.5", "think": "state", "episodes": "128"},
    "perceive-state": {"agent": "mixed", "oracle-share": "0.5", "think": "state", "episodes": "128",
                       "env-kwargs": SPACED},
}
#: Variants whose warm-up starts from a perception stage: ``benchmarks/grid_perception.py``'s arguments (FrozenLake
#: only); the stage saves its model beside the warm-up (``<warm-up folder>-perception``) and the warm-up starts there.
PERCEPTION_VARIANTS: dict[str, dict[str, str]] = {
    "perceive-state": {"task": "state", "renderings": "spaced", "train": "1024", "test": "128", "epochs": "2",
                       "threads": "1"},
}


def applies(env: str, variant: str) -> bool:
    """Whether ``variant`` trains on ``env`` (:data:`FROZENLAKE_ONLY` on FrozenLake only)."""
    return variant not in FROZENLAKE_ONLY or env == "frozenlake"


def warmup_of(variant: str) -> str:
    """The variant whose perception stage, warm-up and check ``variant`` trains from (itself unless shared)."""
    return SHARED_WARMUPS.get(variant, variant)


def run_folder(root: Path, env: str, seed: int, variant: str = "base") -> Path:
    """Where a run trains: ``<root>/<env>/seed<N>`` for the base configuration, ``<root>/<env>-<variant>/...``."""
    return root / (env if variant == "base" else f"{env}-{variant}") / f"seed{seed}"


def jobs(root: Path, envs: list[str], seeds: list[int], variant: str = "base") -> list[Job]:
    out = []
    fields = {**TRAIN_FIELDS, **VARIANTS[variant]}
    preset = fields.pop("config", "starpo-s")
    for env in envs:
        if not applies(env, variant):
            raise ValueError(f"--variant {variant} trains on FrozenLake only (its settings are FrozenLake's); got "
                             f"--envs {env}")
        env_id, splits = ENVS[env]
        start = warmup_of(variant)
        for seed in seeds:
            folder = run_folder(root, env, seed, variant)
            warm = root / "warmup" / (f"{env}-{start}-seed{seed}" if start in WARMUP_VARIANTS else f"{env}-seed{seed}")
            warmup_fields = {**WARMUP_FIELDS, **WARMUP_VARIANTS.get(start, {})}
            warmup = [sys.executable, "-m", "ragen_trainer.warmup", "--env", env_id, "--seed", str(seed),
                      "--out", str(warm)] + [a for k, v in warmup_fields.items() for a in (f"--{k}", v)]
            stages = [warmup]
            if start in PERCEPTION_VARIANTS:
                seen = warm.with_name(warm.name + "-perception")
                stages = [[sys.executable, str(HERE / "grid_perception.py"), "--seed", str(seed), "--save", str(seen),
                           "--resume", "--json", f"{seen}.json", "--md", f"{seen}.md"]
                          + [a for k, v in PERCEPTION_VARIANTS[start].items() for a in (f"--{k}", v)],
                          warmup + ["--model", str(seen)]]  # fmt: skip
            if warmup_fields.get("think") == "state":  # check the warm-up before RL: does it write true thoughts?
                check = [sys.executable, str(HERE / "oracle_logprob.py"), str(warm), "--env", env_id,
                         "--think", "state", "--own-thinking", "96", "--states", "64", "--no-progress", "--resume",
                         "--json", f"{warm}-check.json", "--md", f"{warm}-check.md"]  # fmt: skip
                if "env-kwargs" in warmup_fields:
                    check += ["--env-kwargs", warmup_fields["env-kwargs"]]
                stages.append(check)
            train = ["ragen-trainer", "train", "--config", preset, "--env", env_id, "--model", str(warm),
                     "--seed", str(seed), "--output_dir", str(folder), "--report_to", "[console, jsonl]",
                     "--val_envs", "[" + ", ".join(splits) + "]"]
            train += [a for k, v in {**fields, "val_every": str(VAL_EVERY[env])}.items() for a in (f"--{k}", v)]
            out.append(Job(f"{folder.parent.name}/seed{seed}", folder, [*stages, train],
                           done=partial(run_finished, folder, STEPS)))
    return out


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a success rate (``successes`` of ``n``)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def gain_interval(start: float, end: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """A 95 % interval of ``end - start`` for two independent success rates on ``n`` states each (normal)."""
    se = math.sqrt(start * (1 - start) / n + end * (1 - end) / n)
    return (end - start - z * se, end - start + z * se)


def run_minutes(folder: Path) -> str:
    """A run's wall-clock minutes as its summary records them: every segment's together where the summary lists them
    all from the first ("96 in 3 segments"), else the last segment's, and it says so ("44 since checkpoint-26": a
    summary written before segments were kept, or after a segment that ended without one); "unfinished" without a
    summary (still training, or killed before it could write one)."""
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        minutes = f"{summary['wall_seconds'] / 60:.0f}"
    except (OSError, ValueError, KeyError, TypeError):
        return "unfinished"
    segments, total = summary.get("segments"), summary.get("total_wall_seconds")
    if (isinstance(segments, list) and segments and isinstance(segments[0], dict)
            and segments[0].get("resumed_from") is None and isinstance(total, (int, float))):
        return f"{total / 60:.0f}" + (f" in {len(segments)} segments" if len(segments) > 1 else "")
    resumed = summary.get("resumed_from")
    return f"{minutes} since {Path(str(resumed)).name}" if resumed else minutes


def validations(folder: Path) -> dict[int, dict[str, float]]:
    """``step -> {val key: value}`` of a run, its validation at step ``s`` being the policy after ``s`` steps."""
    out: dict[int, dict[str, float]] = {}
    for row in read_metrics(folder / "metrics.jsonl"):
        val = {k: v for k, v in row.items() if k.startswith("val/") and k.endswith("success")}
        if val and isinstance(row.get("step"), (int, float)):
            out[int(row["step"]) - 1] = val
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        # An interrupted run's summary has no final validation (an empty mapping): its last is the last logged one.
        if isinstance(summary, dict) and isinstance(summary.get("final_validation"), dict) and summary["final_validation"]:
            out[int(summary["steps"])] = {k: v for k, v in summary["final_validation"].items() if k.endswith("success")}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return out


def keep_records(root: Path, records: Path, envs: list[str], seeds: list[int], variants: tuple[str, ...]) -> list[Path]:
    """Copy each run's record (:data:`RECORD_FILES`: its curves, summary and settings, not its weights) from ``root``
    to ``records``, a folder of the repository: ``runs/`` lives and dies with one machine, the records let the report
    and the docs' figures (``ragen-trainer plot docs/learning/runs/...``) be made again anywhere. Returns the copies."""
    copied = []
    for env, variant, seed in itertools.product(envs, variants, seeds):
        if not applies(env, variant) or not validations(source := run_folder(root, env, seed, variant)):
            continue
        target = run_folder(records, env, seed, variant)
        target.mkdir(parents=True, exist_ok=True)
        for name in RECORD_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, target / name)
        copied.append(target)
    return copied


def earlier_rows(out_md: Path) -> dict[tuple[str, str, str], list[tuple[str, list[str]]]]:
    """The rows of the report already in ``out_md``, per (env, variant, seed), of runs it lists as trained: each row
    as written and split into its cells."""
    try:
        text = out_md.read_text(encoding="utf-8")
    except OSError:
        return {}
    rows: dict[tuple[str, str, str], list[tuple[str, list[str]]]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[2].isdigit() and cells[6] != "not run":
            rows.setdefault((cells[0], cells[1], cells[2]), []).append((line, cells))
    return rows


def report(root: Path, envs: list[str], seeds: list[int], out_md: Path, variants: tuple[str, ...] = ("base",),
           records: Path | None = None) -> str:
    """Every run's validation success at step 0 and at its last validation, per split, with Wilson intervals and the
    gain's interval; then, per env, variant and split whose seeds all finished :data:`STEPS` steps, the seeds pooled
    (``3 x 128`` states at each end).

    A run whose folder is not under ``root`` is read from its record under ``records`` (:func:`keep_records`); one
    with neither but which ``out_md`` already lists (trained on a machine before records were kept) keeps its rows,
    and the table says so below: a report never drops a run it once listed."""
    earlier = earlier_rows(out_md)
    carried: list[str] = []
    lines = [("| env | variant | seed | split | steps | minutes | success at step 0 (95 % CI) | success at the end "
              "(95 % CI) | gain (95 % CI) |"), "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    pooled: dict[tuple[str, str, str], list[tuple[int, float, float]]] = {}
    for env, variant, seed in itertools.product(envs, variants, seeds):
        if not applies(env, variant):
            continue
        folder = run_folder(root, env, seed, variant)
        vals = validations(folder)
        if not vals and records is not None:
            folder = run_folder(records, env, seed, variant)
            vals = validations(folder)
        if not vals and (env, variant, str(seed)) in earlier:
            carried.append(f"{env}-{variant}/seed{seed}")
            for line, cells in earlier[env, variant, str(seed)]:
                if cells[4] == str(STEPS):
                    pooled.setdefault((env, variant, cells[3]), []).append(
                        (seed, float(cells[6].split()[0]), float(cells[7].split()[0])))
                lines.append(line)
            continue
        if not vals:
            lines.append(f"| {env} | {variant} | {seed} | - | 0 | - | not run | - | - |")
            continue
        first, last = min(vals), max(vals)
        minutes = run_minutes(folder)
        for key in sorted(vals[first]):
            if key not in vals[last]:
                continue
            a, b = vals[first][key], vals[last][key]
            lo_a, hi_a = wilson(a * VAL_GROUPS, VAL_GROUPS)
            lo_b, hi_b = wilson(b * VAL_GROUPS, VAL_GROUPS)
            g_lo, g_hi = gain_interval(a, b, VAL_GROUPS)
            split = key[len("val/"):-len("success")].strip("/") or env
            if last == STEPS:
                pooled.setdefault((env, variant, split), []).append((seed, a, b))
            lines.append(f"| {env} | {variant} | {seed} | {split} | {last} | {minutes} | {a:.3f} ({lo_a:.2f}-{hi_a:.2f}) "
                         f"| {b:.3f} ({lo_b:.2f}-{hi_b:.2f}) | {b - a:+.3f} ({g_lo:+.2f} to {g_hi:+.2f}) |")
    for (env, variant, split), runs in pooled.items():
        if len(runs) < 2 or len(runs) < len(seeds):
            continue
        n = VAL_GROUPS * len(runs)
        a = sum(r[1] for r in runs) / len(runs)
        b = sum(r[2] for r in runs) / len(runs)
        lo_a, hi_a = wilson(a * n, n)
        lo_b, hi_b = wilson(b * n, n)
        g_lo, g_hi = gain_interval(a, b, n)
        lines.append(f"| {env} | {variant} | pooled ({len(runs)} seeds) | {split} | {STEPS} | - | {a:.3f} "
                     f"({lo_a:.2f}-{hi_a:.2f}) | {b:.3f} ({lo_b:.2f}-{hi_b:.2f}) | {b - a:+.3f} ({g_lo:+.2f} to {g_hi:+.2f}) |")
    text = "\n".join(lines) + "\n"
    if carried:
        text += (f"\nCarried from the previous report (their folders are not under {root} on the machine that wrote "
                 f"this one): {', '.join(carried)}.\n")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(text, encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = queue_parser(__doc__.split("\n\n")[0], out="runs/multiturn", seeds=SEEDS, md="docs/learning/multiturn.md")
    parser.add_argument("--envs", nargs="+", choices=list(ENVS), default=list(ENVS))
    parser.add_argument("--variant", choices=list(VARIANTS), default="base",
                        help="the configuration trained (run and list); report lists every variant")
    parser.add_argument("--records", default="docs/learning/runs",
                        help="where each run's curves, summary and settings are kept in the repository (report reads "
                             "a run from there when its folder is not under --out)")
    args = parse_queue_args(parser, argv)
    console = Console()
    root = Path(args.out)
    try:
        queue = jobs(root, args.envs, args.seeds, args.variant)
    except ValueError as error:
        parser.error(str(error))
    if args.action == "list":
        for job in queue:
            for command in job.commands:
                console.print(" ".join(command), soft_wrap=True, markup=False)
        return 0
    failed = run_jobs(queue, args.jobs, console) if args.action == "run" else 0
    records = Path(args.records)
    # The table lists every run of the search, not only this queue's: a queue for one env and seed rewrites the
    # whole page (runs of other envs, seeds and variants from their folders or their kept records).
    envs, seeds = list(ENVS), sorted(set(SEEDS) | set(args.seeds))
    kept = keep_records(root, records, envs, seeds, tuple(VARIANTS))
    console.print(report(root, envs, seeds, Path(args.md), tuple(VARIANTS), records), markup=False)
    console.print(f"{len(kept)} runs' records copied to {records}; table in {args.md}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

