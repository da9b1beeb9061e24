"""Where a training run's memory goes: peak RSS per phase of ``ragen-trainer train``, and the tensors that stay.

Takes the same arguments as ``ragen-trainer train`` and runs that training in this process, as the command does
(the same model loading, trainer and steps), while a thread samples the resident set size (RSS) every few
milliseconds and files each sample under the phase running then:

* ``load``: the model and tokenizer loading; ``init``: the trainer's construction (the critic's copy, the optimizer);
* ``validate``, ``rollout`` (the engine's KV cache, decode activations, logits of the rows decoding), ``score`` (the
  no-grad log-prob / value pass), ``fwd+bwd`` (activations and gradients of the update's micro-batches),
  ``optimizer`` (gradient clipping and AdamW), ``save`` (checkpoints and the final model), ``other`` (the rest: the
  filter, advantages, metrics).

Then it adds up the tensors that live through the run, from the tensors themselves: weights, gradients (at their
largest: just before an optimizer step) and AdamW's state, for the policy and for the critic (a separate value model
is a second copy of the backbone), and prints the arithmetic: ``bytes = parameters x 4`` per float32 copy, AdamW's
two moments = 2 copies. What the process holds beyond them (the Python runtime and libraries, torch's allocator
caches, the tokenizer, the envs) is the RSS before the model was loaded plus what is unaccounted for.

    python benchmarks/bench_memory.py --config starpo-s --env ragen/FrozenLake-v0 --model smollm2 \\
        --env_groups 4 --group_size 8 --max_new_tokens 64 --total_steps 1 --val_every 0 --save_steps 0 \\
        --output_dir runs/memory --overwrite
    python benchmarks/bench_memory.py ... --json memory.json     # also the numbers as JSON

RSS is what the operating system charges the process: freed memory that glibc's allocator keeps for reuse still
counts, so a phase's peak can include what an earlier phase freed but the process did not give back.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen_trainer.host_memory import peak_rss_bytes  # noqa: E402  (light: no torch, so the first phase stays bare)

PHASES = ("load", "init", "validate", "rollout", "score", "fwd+bwd", "optimizer", "save", "other")
GB = 1e9


class PhaseSampler:
    """A thread that samples this process's RSS every ``interval`` seconds into the current phase's peak."""

    def __init__(self, interval: float = 0.005) -> None:
        import psutil

        self._process = psutil.Process()
        self.interval = interval
        self.phase = "other"  # whatever runs outside a named phase
        self.baseline = 0  # RSS when sampling started
        self.peaks: dict[str, int] = defaultdict(int)
        self.entered: dict[str, int] = {}  # RSS when a phase was first entered
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _sample(self) -> int:
        rss = int(self._process.memory_info().rss)
        self.peaks[self.phase] = max(self.peaks[self.phase], rss)
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> PhaseSampler:
        self.baseline = int(self._process.memory_info().rss)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        """Samples go to ``phase`` while the block runs (then back to the phase it interrupted)."""
        self._sample()
        previous, self.phase = self.phase, phase
        self.entered.setdefault(phase, self._sample())
        try:
            yield
        finally:
            self._sample()
            self.phase = previous


def _wrap(sampler: PhaseSampler, phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)  # keeps what others marked on it (torch's LR scheduler marks the optimizer's step)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with sampler.in_phase(phase):
            return method(*args, **kwargs)

    return wrapped


def _tensor_bytes(tensors: Any) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors if t is not None))


def _split(model: Any, critic_attr: str) -> dict[str, list[Any]]:
    parts: dict[str, list[Any]] = {"policy": [], "critic": []}
    for name, p in model.named_parameters():
        parts["critic" if critic_attr in name else "policy"].append(p)
    return parts


class StateLedger:
    """The tensors that live through the run: weights, gradients at their largest, AdamW's state (see the module
    docstring), per part of the model (``policy``, ``critic``)."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        from ragen_trainer.critic import CRITIC_ATTR

        self.parts = _split(model, CRITIC_ATTR)
        self.optimizer = optimizer
        self.grads: dict[str, int] = defaultdict(int)
        optimizer.register_step_pre_hook(self._before_step)

    def _before_step(self, *args: Any) -> None:
        for part, params in self.parts.items():
            self.grads[part] = max(self.grads[part], _tensor_bytes(p.grad for p in params))

    def rows(self) -> list[dict[str, Any]]:
        import torch

        out = []
        for part, params in self.parts.items():
            if not params:
                continue
            count = sum(p.numel() for p in params)
            trainable = sum(p.numel() for p in params if p.requires_grad)
            ids = {id(p) for p in params}
            state = [t for p, s in self.optimizer.state.items() if id(p) in ids
                     for t in s.values() if isinstance(t, torch.Tensor)]  # fmt: skip
            out.append({"part": part, "parameters": count, "trainable": trainable,
                        "weights_bytes": _tensor_bytes(params), "grads_bytes": self.grads.get(part, 0),
                        "optimizer_bytes": _tensor_bytes(state)})  # fmt: skip
        return out


def run(argv: list[str]) -> dict[str, Any]:
    """Train as ``ragen-trainer train argv`` does, sampling RSS per phase; returns the report (also printed)."""
    from ragen_trainer.cli import add_train_arguments, resolve_config

    parser = add_train_arguments(argparse.ArgumentParser(prog="bench_memory.py", description=__doc__.split("\n\n")[0]))
    parser.add_argument("--json", default="", help="also write the report to this JSON file")
    args = parser.parse_args(argv)
    cfg = resolve_config(args)
    import torch

    from ragen_trainer.distributed import make_accelerator
    from ragen_trainer.models import load_model_and_tokenizer
    from ragen_trainer.precision import compute_dtype
    from ragen_trainer.trainer import StarPOTrainer

    sampler = PhaseSampler().start()  # after the imports: the baseline is the runtime (Python, torch, transformers)
    started = time.perf_counter()
    state = make_accelerator(cfg)
    with sampler.in_phase("load"):
        model, tokenizer = load_model_and_tokenizer(cfg.model, dtype=cfg.master_dtype, device=state.device,
                                                    lora=cfg.lora_settings())  # fmt: skip
        ref_model = None
        if cfg.kl_coef > 0 or cfg.kl_reward_coef > 0:
            ref_model, _ = load_model_and_tokenizer(cfg.model, dtype=compute_dtype(cfg.dtype, state.device),
                                                    device=state.device)  # fmt: skip
    with sampler.in_phase("init"):
        trainer = StarPOTrainer(cfg, model, tokenizer, ref_model=ref_model, accelerator=state)
    ledger = StateLedger(trainer.policy, trainer.adamw)
    # the instance's step, not step hooks: ragen's optimizer subclasses AdamW and calls its step, so once any plain
    # AdamW has been built in this process (torch hooks each class's step on its first instance) the hooks run twice
    trainer.adamw.step = _wrap(sampler, "optimizer", trainer.adamw.step)
    for name, phase in (("validate", "validate"), ("rollout", "rollout"), ("score", "score"), ("update", "fwd+bwd"),
                        ("save_checkpoint", "save"), ("save_final", "save")):  # fmt: skip
        setattr(trainer, name, _wrap(sampler, phase, getattr(trainer, name)))
    trainer.train(overwrite=bool(getattr(args, "overwrite", False)))
    sampler.stop()
    report = {
        "command": "ragen-trainer train " + " ".join(argv),
        "seconds": time.perf_counter() - started,
        "rss_before_load_bytes": sampler.baseline,
        "peak_rss_bytes": peak_rss_bytes(),
        "phases": {
            p: {"peak_bytes": sampler.peaks[p], "entered_bytes": sampler.entered.get(p)}
            for p in PHASES
            if p in sampler.peaks
        },
        "state": ledger.rows(),
        "threads": torch.get_num_threads(),
    }
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")
        print(f"report written to {args.json}")
    return report


def format_report(report: dict[str, Any]) -> str:
    """The per-phase peaks and the state's arithmetic, as text."""
    runtime = report["rss_before_load_bytes"] / GB
    lines = [
        f"== memory of: {report['command']}",
        (f"peak RSS {report['peak_rss_bytes'] / GB:.2f} GB (ru_maxrss); the runtime before loading the model "
        f"(Python, torch, transformers) {runtime:.2f} GB; {report['seconds']:.0f} s"),
        "",
        f"{'phase':<10} {'RSS at entry GB':>16} {'peak RSS GB':>12}",
    ]
    for phase, row in report["phases"].items():
        entered = row["entered_bytes"]
        lines.append(f"{phase:<10} {entered / GB if entered is not None else float('nan'):>16.2f} "
                     f"{row['peak_bytes'] / GB:>12.2f}")  # fmt: skip
    lines += ["", f"{'part':<8} {'parameters':>12} {'weights GB':>11} {'grads GB':>9} {'AdamW GB':>9} {'sum GB':>7}"]
    total = 0
    for row in report["state"]:
        part_sum = row["weights_bytes"] + row["grads_bytes"] + row["optimizer_bytes"]
        total += part_sum
        lines.append(f"{row['part']:<8} {row['parameters']:>12,} {row['weights_bytes'] / GB:>11.3f} "
                     f"{row['grads_bytes'] / GB:>9.3f} {row['optimizer_bytes'] / GB:>9.3f} {part_sum / GB:>7.3f}")  # fmt: skip
    lines.append(f"{'state':<8} {'':>12} {'':>11} {'':>9} {'':>9} {total / GB:>7.3f}  (weights + gradients + AdamW: "
                 "float32 parameters x 4 bytes x (1 + 1 + 2))")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    run(list(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
