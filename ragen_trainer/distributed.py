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
import re
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, DistributedType, InitProcessGroupKwargs

from ragen_trainer.checkpoints.verify import pickled_globals
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
    minutes = float(getattr(config, "dist_timeout_minutes", DEFAULT_TIMEOUT_MINUTES))
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
        kwargs["kwargs_handlers"] = [process_group_kwargs(minutes, "gloo" if cpu and launched else None)]
    else:
        quiet_deepspeed_accelerator_warning()
        # ragen autocasts its own passes (ragen_trainer.precision, --dtype): accelerate must not wrap the model in a
        # second autocast, nor inherit one from an Accelerator made earlier in this process (e.g. TRL's bf16=True)
        kwargs["mixed_precision"] = "no"
        if cpu:
            kwargs["cpu"] = True  # one process, or DDP over gloo (MULTI_CPU) under a launcher
        kwargs["kwargs_handlers"] = [process_group_kwargs(minutes)]
    try:
        accelerator = Accelerator(**kwargs)
    except ValueError as exc:
        if "already been initialized" not in str(exc):
            raise
        raise ValueError(
            "this process already made an accelerate Accelerator with other settings (for example a TRL trainer "
            "with bf16=True), and accelerate keeps one state per process: ragen's run needs mixed_precision 'no' "
            "(it autocasts by itself, see --dtype); start the run in a fresh process") from exc
    if accelerator.num_processes > 1:
        report_collective_timeouts(accelerator.process_index, accelerator.num_processes, minutes)
    return accelerator


def process_group_kwargs(minutes: float, backend: str | None = None) -> InitProcessGroupKwargs:
    """accelerate's handler that gives the process group a timeout of ``minutes`` (``dist_timeout_minutes``): how
    long a process waits at a collective (a gather, a barrier, an all-reduce) for the others, for DDP and DeepSpeed
    alike; ``backend`` names one (gloo for DeepSpeed on CPUs), ``None`` leaves accelerate's choice."""
    timeout = timedelta(minutes=minutes)
    handler = InitProcessGroupKwargs(backend=backend or "nccl", timeout=timeout)
    passed: dict[str, Any] = {"timeout": timeout, **({"backend": backend} if backend else {})}
    # accelerate hands init_process_group only the fields that differ from InitProcessGroupKwargs' defaults (10
    # minutes, the nccl backend): a timeout of exactly 10 minutes would be dropped and gloo would wait its own 30
    handler.to_kwargs = lambda: dict(passed)  # type: ignore[method-assign]
    return handler


#: The start of the warning DeepSpeed logs when it picks the CPU (deepspeed/accelerator/real_accelerator.py).
_DEEPSPEED_CPU_WARNING = "Setting accelerator to CPU."


class _DropDeepSpeedCpuWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_DEEPSPEED_CPU_WARNING)


def quiet_deepspeed_accelerator_warning() -> None:
    """Drop DeepSpeed's "Setting accelerator to CPU..." warning in a run that does not use DeepSpeed. accelerate
    imports DeepSpeed whenever it is installed (``Accelerator.unwrap_model`` checks for a DeepSpeed engine), and the
    import logs which accelerator DeepSpeed would use: noise opening every CPU run. Only that message is dropped (a
    filter on DeepSpeed's logger, which DeepSpeed's own setup keeps); runs with ``--deepspeed`` still show it."""
    ds_logger = logging.getLogger("DeepSpeed")  # the name deepspeed.utils.logging gives its logger
    if not any(isinstance(f, _DropDeepSpeedCpuWarning) for f in ds_logger.filters):
        ds_logger.addFilter(_DropDeepSpeedCpuWarning())


# ------------------------------------------------------------------------------------------ bounded waits
#: ``dist_timeout_minutes`` when a config does not say (the config's own default is the same).
DEFAULT_TIMEOUT_MINUTES = 10.0
#: The exit status of a process that stopped because another one did not answer at a collective.
EXIT_COLLECTIVE_TIMEOUT = 1
_TIMEOUT_REPORT: dict[str, Any] = {}
_STORE_PREFIX = "ragen/collective-timeout/"


def report_collective_timeouts(rank: int, world: int, minutes: float) -> None:
    """Make a collective that times out end the process with :func:`collective_timeout_message` instead of a
    traceback of gloo internals (``sys.excepthook``: whatever the entry point, the command line or a script, the
    error reaches it uncaught). Other exceptions go to the previous hook unchanged."""
    first = not _TIMEOUT_REPORT
    _TIMEOUT_REPORT.update(rank=rank, world=world, minutes=minutes)
    if first:
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            if _TIMEOUT_REPORT and is_collective_timeout(exc):
                message = collective_timeout_message(exc, tb, **_TIMEOUT_REPORT, silent=_silent_ranks())
                print(f"\nragen: error: {message}", file=sys.stderr, flush=True)  # after a progress bar's line
                logging.shutdown()
                # not a normal exit: its clean-up (destroying the process group) would wait for the silent process
                os._exit(EXIT_COLLECTIVE_TIMEOUT)
            previous(kind, exc, tb)

        sys.excepthook = hook


def is_collective_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a process group's timeout at a collective (gloo: "Timed out
    waiting 600000ms for recv operation to complete"; torch's ``DistBackendError`` / ``DistError``)."""
    dist_error = getattr(torch.distributed, "DistError", ())
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        # a timeout of the process group's own (not, say, an HTTP engine's RuntimeError that mentions a timeout)
        if isinstance(current, RuntimeError) and re.search(r"timed out|timeout", text, re.IGNORECASE) and (
                isinstance(current, dist_error) or re.search(r"gloo|nccl|c10d|process ?group|collective", text,
                                                             re.IGNORECASE)):  # fmt: skip
            return True
        current = current.__cause__ or current.__context__
    return False


def collective_phase(tb: TracebackType | None) -> str:
    """Where the process waited, from the traceback: the innermost function of ragen's own code and what it called
    (``StarPOTrainer.rollout -> gather_object (ragen_trainer/trainer.py:467)``)."""
    package = str(Path(__file__).resolve().parent)
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    own = [i for i, f in enumerate(frames) if os.path.abspath(f.tb_frame.f_code.co_filename).startswith(package)
           and not f.tb_frame.f_code.co_filename.endswith(("distributed.py",))]
    if not own:
        return "a collective (outside ragen's code)"
    index = own[-1]
    code = frames[index].tb_frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    called = frames[index + 1].tb_frame.f_code.co_name if index + 1 < len(frames) else "a collective"
    where = os.path.relpath(code.co_filename, Path(package).parent)
    return f"{name} -> {called} ({where}:{frames[index].tb_lineno})"


def collective_timeout_message(exc: BaseException, tb: TracebackType | None, *, rank: int, world: int,
                               minutes: float, silent: list[int] | None = None) -> str:
    """The sentence a process prints when it waited ``minutes`` at a collective: its rank, where it waited, and which
    ranks did not answer (``silent``: found through the process group's store; ``None`` when that could not be
    asked, then every other rank is named as possibly silent)."""
    others = [r for r in range(world) if r != rank]
    if silent:
        reached = [r for r in range(world) if r not in silent]
        who = (f"{_ranks(silent)} did not answer" + (f" ({_ranks(reached)} reached a collective)"
                                                      if len(reached) > 1 else ""))  # fmt: skip
    elif silent is None or not others:
        who = f"{_ranks(others)} did not answer" if len(others) == 1 else \
            f"one of {_ranks(others)} did not answer"  # fmt: skip
    else:  # every process reported a timeout: they waited at different collectives
        who = f"every process timed out ({_ranks(list(range(world)))}): they waited at different collectives"
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return (f"rank {rank} waited {minutes:g} minutes for the other processes at {collective_phase(tb)}; {who}: a "
            f"process stopped answering (SIGSTOP, hang, or crash). The run stops (dist_timeout_minutes="
            f"{minutes:g}; {detail})")


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _silent_ranks() -> list[int] | None:
    """The ranks that did not report a timeout through the process group's store within a grace period (the ranks
    that reached a collective time out at about the same moment and say so there); ``None`` when the store cannot be
    used (then nothing is known beyond this process)."""
    rank, world, minutes = _TIMEOUT_REPORT["rank"], _TIMEOUT_REPORT["world"], _TIMEOUT_REPORT["minutes"]
    try:
        store = torch.distributed.distributed_c10d._get_default_store()
        store.set(f"{_STORE_PREFIX}{rank}", "1")
        grace = min(30.0, max(3.0, 6.0 * minutes))  # the others' timeouts start within their clocks' skew
        deadline = time.monotonic() + grace
        while True:
            reported = [r for r in range(world) if store.check([f"{_STORE_PREFIX}{r}"])]
            if len(reported) == world or time.monotonic() > deadline:
                return [r for r in range(world) if r not in reported]
            time.sleep(0.2)
    except Exception:  # noqa: BLE001  (any failure of the store: the message then names every other rank)
        return None


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


#: Every Python object a DeepSpeed 0.19 checkpoint of ragen's runs names in its pickles (``module.name``), found by
#: scanning the ZeRO-2 / ZeRO-3 checkpoints of one and two processes, float32 and bfloat16, and their universal
#: conversion (``tests/reliability/test_untrusted_files.py`` keeps this true), plus the siblings DeepSpeed's save code
#: writes on GPUs (fp16's ``DynamicLossScaler``, the storages of the other dtypes). DeepSpeed reads its files with
#: ``torch.load(weights_only=False)``, which imports and calls whatever a pickle names: :func:`check_deepspeed_files`
#: refuses a file that names anything else before DeepSpeed opens it. Each of these only builds data (tensors, sizes,
#: an enum, plain records); none runs code of the file's choosing.
DEEPSPEED_PICKLE_GLOBALS = frozenset({
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor_v2",
    "torch._tensor._rebuild_from_type_v2",
    "torch.Tensor",
    "torch.Size",
    *(f"torch.{kind}Storage" for kind in ("Float", "BFloat16", "Half", "Double", "Long", "Int", "Short", "Char",
                                          "Byte", "Bool")),
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
})


def check_deepspeed_files(folder: str | os.PathLike[str]) -> int:
    """Refuse a DeepSpeed checkpoint folder (a tag folder, or a universal checkpoint's) that DeepSpeed must not read:
    every ``*.pt`` file under it (what DeepSpeed's loaders open) is scanned without unpickling it
    (:func:`ragen_trainer.checkpoints.verify.pickled_globals`), and a file that names a Python object outside
    :data:`DEEPSPEED_PICKLE_GLOBALS`, or that cannot be scanned, is a ``ValueError`` naming the file and the object.
    Returns how many files were checked."""
    root = Path(folder)
    files = sorted(p for p in root.rglob("*.pt") if p.is_file())
    for path in files:
        try:
            found = pickled_globals(path)
        except ValueError as exc:
            raise ValueError(f"the DeepSpeed checkpoint file {exc}; DeepSpeed reads it with a loader that can run "
                             "code, so it is not read. Delete this checkpoint if you did not make it, or resume from "
                             "another one") from None
        for entry, module, name in found:
            if f"{module}.{name}" not in DEEPSPEED_PICKLE_GLOBALS:
                raise ValueError(
                    f"the DeepSpeed checkpoint file {path} names the Python object {module}.{name} (in {entry}), "
                    "which DeepSpeed never writes there; DeepSpeed reads the file with a loader that runs what it "
                    "names, so it is not read. Delete this checkpoint if you did not make it, or resume from "
                    "another one")
    return len(files)


def save_engine_state(model: Any, folder: str) -> None:
    """DeepSpeed's own checkpoint (module and partitioned optimizer state) into ``folder/deepspeed`` (every process
    writes its partition)."""
    model.save_checkpoint(folder, tag=DEEPSPEED_TAG)


def load_engine_state(accelerator: Accelerator, model: Any, folder: str, saved_world: int) -> None:
    """Load a checkpoint's DeepSpeed state. Saved at another world size, a ZeRO-2 state is converted once to
    DeepSpeed's universal checkpoint (``ds_to_universal``) and loaded from it; ZeRO-3 refuses (see below)."""
    world = accelerator.num_processes
    check_deepspeed_files(Path(folder) / DEEPSPEED_TAG)  # before DeepSpeed (or its converter) reads a file
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
    if accelerator.is_main_process:  # made anew: a conversion left in the run folder is not trusted
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
    check_deepspeed_files(universal / DEEPSPEED_TAG)
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
    "DEEPSPEED_PICKLE_GLOBALS",
    "DEEPSPEED_TAG",
    "EXIT_COLLECTIVE_TIMEOUT",
    "check_deepspeed_files",
    "collective_timeout_message",
    "deepspeed_config",
    "full_state_dict",
    "is_collective_timeout",
    "is_deepspeed",
    "load_engine_state",
    "make_accelerator",
    "process_group_kwargs",
    "report_collective_timeouts",
    "save_engine_state",
    "zero_stage",
]
