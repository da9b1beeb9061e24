"""The processes a training run is spread over: ``accelerate`` for the launch and the collectives, DDP or DeepSpeed
ZeRO for the model, and what each engine needs from ragen's loop.

* **One process, DDP** (``accelerate launch --multi_gpu``; on CPUs ``ACCELERATE_USE_CPU=1`` too, gloo): the model is
  replicated, gradients are all-reduced on a mini-batch's last micro-batch, checkpoints hold whole optimizer states
  (they resume at any world size).
* **DeepSpeed ZeRO-2 / ZeRO-3** (``--deepspeed ds.json``, or an accelerate config with ``distributed_type:
  DEEPSPEED``): :func:`deepspeed_config` completes the user's JSON with what ragen's loop owns -- one optimizer step
  per mini-batch whatever its number of micro-batches (``gradient_accumulation_steps`` 1, the boundary set per
  micro-batch), clipping per parameter group inside the optimizer (``gradient_clipping`` 0), ragen's AdamW as a client
  optimizer, and the run's precision (bf16 with float32 master weights, gradient accumulation and reduction). The
  master weights are saved through ``safe_get_full_fp32_param``; DeepSpeed's own checkpoint holds the partitioned
  optimizer state, and a ZeRO-2 checkpoint resumes at another world size through DeepSpeed's universal checkpoint.
* **FSDP** is not driven by ragen's loop (see ``docs/training.md``): accelerate 1.15 turns FSDP on only for GPU and
  other accelerator device types, so it cannot be exercised on a CPU, and ragen refuses it rather than run it untested.

On a CPU, ``accelerate`` picks no process group for DeepSpeed by itself: :func:`make_accelerator` names gloo.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, DistributedType, InitProcessGroupKwargs

from ragen_trainer.precision import compute_dtype

logger = logging.getLogger(__name__)

#: The subfolder of a checkpoint that holds DeepSpeed's own state (module and partitioned optimizer).
DEEPSPEED_TAG = "deepspeed"
#: Keys of a DeepSpeed config that ragen's loop sets itself (a user's value is replaced, with a warning if it
#: differed).
DEEPSPEED_OWNED = ("gradient_accumulation_steps", "gradient_clipping", "train_batch_size",
                   "train_micro_batch_size_per_gpu", "zero_force_ds_cpu_optimizer", "zero_allow_untested_optimizer",
                   "bf16", "fp16", "data_types", "communication_data_type", "optimizer", "scheduler")


def make_accelerator(config: Any) -> Accelerator:
    """The run's ``Accelerator`` for a :class:`~ragen_trainer.config.StarPOConfig`: DeepSpeed when ``deepspeed`` names
    a config (or accelerate's launcher asked for it), DDP when launched as several processes, one process otherwise.
    On CPUs: gloo, and ``cpu=True`` for DDP (accelerate's MULTI_CPU); DeepSpeed needs ``cpu=False`` (accelerate's CPU
    mode would ignore it) with gloo named."""
    cpu = not torch.cuda.is_available()
    launched = "LOCAL_RANK" in os.environ
    ds_file = config.deepspeed or (os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "")
                                   if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" else "")
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        raise ValueError("FSDP is not supported by ragen's training loop: accelerate turns FSDP on for GPUs only, so "
                         "ragen cannot test it on a CPU and refuses it rather than run it untested; use DDP or "
                         "DeepSpeed ZeRO-2/3 (see docs/training.md)")
    kwargs: dict[str, Any] = {}
    if ds_file:
        if not launched:  # one process without a launcher: DeepSpeed still wants a process group of one
            _single_process_env()
            launched = True
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=deepspeed_config(
            ds_file, compute_dtype(config.dtype, "cuda" if not cpu else "cpu"), config.micro_batch_size))
        if cpu and launched:
            kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
    else:
        # ragen autocasts its own passes (ragen_trainer.precision, --dtype): accelerate must not wrap the model in a
        # second autocast, nor inherit one from an Accelerator made earlier in this process (e.g. TRL's bf16=True)
        kwargs["mixed_precision"] = "no"
        if cpu:
            kwargs["cpu"] = True  # one process, or DDP over gloo (MULTI_CPU) under a launcher
    try:
        return Accelerator(**kwargs)
    except ValueError as exc:
        if "already been initialized" not in str(exc):
            raise
        raise ValueError(
            "this process already made an accelerate Accelerator with other settings (for example a TRL trainer "
            "with bf16=True), and accelerate keeps one state per process: ragen's run needs mixed_precision 'no' "
            "(it autocasts by itself, see --dtype); start the run in a fresh process") from exc


def _single_process_env() -> None:
    """The environment a launcher gives a process group of one (DeepSpeed looks for MPI without it)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(key, value)


def deepspeed_config(path: str, compute: torch.dtype, micro_batch_size: int) -> dict[str, Any]:
    """The user's DeepSpeed JSON with the keys ragen's loop owns set (:data:`DEEPSPEED_OWNED`).

    ``compute`` is the run's compute dtype: bfloat16 turns on DeepSpeed's bf16 mode (bf16 module weights, float32
    master weights in the optimizer) with float32 gradient accumulation and reduction, so several processes add up
    as one; float16 its fp16 mode (with loss scaling); float32 neither."""
    try:
        user = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"invalid config field deepspeed={path!r}: not a readable JSON file ({exc})") from None
    if not isinstance(user, dict):
        raise ValueError(f"invalid config field deepspeed={path!r}: expected a JSON object (a DeepSpeed config)")
    stage = int((user.get("zero_optimization") or {}).get("stage", 0))
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"invalid config field deepspeed={path!r}: zero_optimization.stage={stage}; expected 0-3")
    owned: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,  # the loop sets the boundary itself, per mini-batch
        "gradient_clipping": 0.0,  # the optimizer clips the policy and the critic each by its own norm
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": compute == torch.bfloat16},
        "fp16": {"enabled": compute == torch.float16},
    }
    if compute in (torch.bfloat16, torch.float16):
        owned["data_types"] = {"grad_accum_dtype": "fp32"}
        owned["communication_data_type"] = "fp32"
    for key in ("optimizer", "scheduler"):
        if key in user:
            logger.warning("warning: the DeepSpeed config's %r is ignored: ragen's AdamW (actor_lr, critic_lr) and "
                           "learning-rate schedule are used", key)
    config = {k: v for k, v in user.items() if k not in DEEPSPEED_OWNED}
    config.update(owned)
    zero = dict(config.get("zero_optimization") or {})
    if stage == 3:
        # one ZeRO-3 sub-group per parameter group, so the optimizer's clipping sees each group whole
        zero["sub_group_size"] = max(float(zero.get("sub_group_size", 1e9)), 1e9)
        zero.setdefault("stage3_gather_16bit_weights_on_model_save", True)
    if zero:
        config["zero_optimization"] = zero
    config.setdefault("steps_per_print", 10**9)
    return config


def is_deepspeed(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def zero_stage(accelerator: Accelerator) -> int:
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.zero_stage) if plugin is not None else 0


def full_state_dict(accelerator: Accelerator, model: Any) -> dict[str, torch.Tensor]:
    """The model's whole state dict with the **master** weights (float32 unless pure low precision), on every process
    (a collective under ZeRO-3: every process must call it)."""
    if not is_deepspeed(accelerator):
        return accelerator.get_state_dict(model)
    from deepspeed.utils import safe_get_full_fp32_param

    module = accelerator.unwrap_model(model)
    gathered: dict[int, torch.Tensor] = {}  # by parameter: tied weights (an LM head sharing the embedding) stay one tensor
    state = {}
    for name, tensor in module.state_dict(keep_vars=True).items():  # persistent buffers included, as state_dict()
        if isinstance(tensor, torch.nn.Parameter):
            if id(tensor) not in gathered:
                full = safe_get_full_fp32_param(tensor)
                gathered[id(tensor)] = (full if full is not None else tensor).detach().cpu()
            state[name] = gathered[id(tensor)]
        else:
            state[name] = tensor.detach().cpu()
    return state


def save_engine_state(model: Any, folder: str) -> None:
    """DeepSpeed's own checkpoint (module and partitioned optimizer state) into ``folder/deepspeed`` (every process
    writes its partition)."""
    model.save_checkpoint(folder, tag=DEEPSPEED_TAG)


def load_engine_state(accelerator: Accelerator, model: Any, folder: str, saved_world: int) -> None:
    """Load a checkpoint's DeepSpeed state. Saved at another world size, a ZeRO-2 state is converted once to
    DeepSpeed's universal checkpoint (``ds_to_universal``) and loaded from it; ZeRO-3 refuses (see below)."""
    world = accelerator.num_processes
    if saved_world in (0, world):
        model.load_checkpoint(folder, tag=DEEPSPEED_TAG, load_module_strict=False)
        return
    if zero_stage(accelerator) == 3:
        raise ValueError(
            f"the checkpoint {folder} was saved by {saved_world} processes under DeepSpeed ZeRO-3 and this run has "
            f"{world}: DeepSpeed 0.19's universal checkpoint loads ZeRO-3 optimizer states with the first parameter "
            "group's hyper-parameters for every group and loses the critic's Adam state (measured), so ragen does not "
            f"resume it at another world size; resume with {saved_world} processes, or train with ZeRO-2")
    universal = Path(folder).parent / f".universal-{Path(folder).name}"
    if accelerator.is_main_process and not (universal / DEEPSPEED_TAG).is_dir():
        shutil.rmtree(universal, ignore_errors=True)
        universal.mkdir(parents=True)
        command = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                   "--input_folder", str(Path(folder) / DEEPSPEED_TAG), "--output_folder",
                   str(universal / DEEPSPEED_TAG), "--num_extract_workers", "1", "--num_merge_workers", "1",
                   "--inject_missing_state"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            shutil.rmtree(universal, ignore_errors=True)
            raise ValueError(f"converting {folder} to DeepSpeed's universal checkpoint failed: "
                             f"{done.stderr.strip()[-500:]}")
        (universal / "latest_universal").write_text(DEEPSPEED_TAG)
    accelerator.wait_for_everyone()
    model._config.load_universal_checkpoint = True  # DeepSpeed reads this switch when loading
    try:
        model.load_checkpoint(str(universal), tag=DEEPSPEED_TAG, load_module_strict=False)
    finally:
        model._config.load_universal_checkpoint = False
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:  # loaded: the conversion is not part of the run
        shutil.rmtree(universal, ignore_errors=True)
    logger.info("resumed %s (saved by %d processes) at %d processes through DeepSpeed's universal checkpoint",
                folder, saved_world, world)


__all__ = [
    "DEEPSPEED_OWNED",
    "DEEPSPEED_TAG",
    "deepspeed_config",
    "full_state_dict",
    "is_deepspeed",
    "load_engine_state",
    "make_accelerator",
    "save_engine_state",
    "zero_stage",
]
