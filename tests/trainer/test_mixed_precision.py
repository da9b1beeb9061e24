"""Mixed precision as the reference trains: float32 master weights and AdamW state, bfloat16 compute.

At the paper's actor learning rate (1e-6) an AdamW step is far below the spacing of bfloat16 numbers, so weights
stored in bfloat16 barely move; float32 master weights with bfloat16 autocast move every dense weight. On a CPU with
AVX-512 BF16 the bfloat16 products run in hardware; elsewhere torch emulates them (slower, the same rounding), so these
tests hold on either, and the trainer warns where bfloat16 is emulated.

Tolerance (measured on the tiny model below, one step of four updates at lr 1e-4): the weight update of the bfloat16
compute run differs from the float32 run's by about 3 % of its norm; the tests allow 10 %.
"""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")

from accelerate import Accelerator
from accelerate.state import AcceleratorState
from safetensors import safe_open

from ragen_trainer import cli
from ragen_trainer.config import load_config
from ragen_trainer.distributed import make_accelerator
from ragen_trainer.precision import cpu_flags, emulated_bf16_advice
from ragen_trainer.trainer import StarPOTrainer
from tests.trainer.conftest import ScriptedEngine, build_tiny_model

#: Replies that differ inside each group, so every update has non-zero advantages.
_REPLIES = ["<answer>Dragon</answer>", "<answer>Phoenix</answer>", "not an arm", "<answer>Dragon</answer>"]
#: Largest relative difference allowed between the weight updates of a bfloat16-compute and a float32 run.
UPDATE_TOLERANCE = 0.10


def _run(tmp_path, tokenizer, name, *, dtype, master, lr, steps):
    """``steps`` steps of StarPO-S on a scripted Bandit batch (4 mini-batches each); returns (before, after,
    trainer) with the policy's weights as float32 copies."""
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer, hidden_size=64)
    if master == "bfloat16":
        model.to(torch.bfloat16)  # what load_model_and_tokenizer(dtype=master_dtype) gives
    before = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    cfg = load_config("starpo-s").replace(
        env_id="ragen/Bandit-v0", env_groups=2, group_size=4, max_new_tokens=8, max_context_tokens=1024,
        enable_think=False, reply_prefix="", total_steps=steps, save_steps=steps, val_every=0, micro_batch_size=2,
        ppo_mini_batch_size=2, actor_lr=lr, critic_lr=lr, filter_ratio=1.0, report_to=["jsonl"],
        output_dir=str(tmp_path / name), dtype=dtype, master_dtype=master,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pure bf16 warns (tested on its own below)
        trainer = StarPOTrainer(cfg.validate(), model, tokenizer,
                                engine=ScriptedEngine(tokenizer, lambda p, c, r: _REPLIES[r % 4]))
    trainer.train()
    after = {k: v.detach().float().cpu().clone()  # on the CPU, as `before`, wherever the run trained
             for k, v in trainer.policy.state_dict().items() if "ragen_critic" not in k}
    return before, after, trainer


def _dense(after):
    """The dense (matrix) weights of the policy: attention and MLP projections (the embedding's rows of tokens that
    never occur get no gradient)."""
    return [k for k, v in after.items() if v.dim() == 2 and "embed" not in k]


def test_bf16_compute_with_fp32_master_weights_moves_every_dense_weight_at_the_papers_lr(tmp_path, tiny_tokenizer):
    before, after, trainer = _run(tmp_path, tiny_tokenizer, "mixed", dtype="bfloat16", master="float32", lr=1e-6,
                                  steps=3)
    assert trainer.precision.mixed and trainer.precision.compute == torch.bfloat16
    assert trainer.optimizer_steps == 12  # 3 steps x 4 mini-batches
    assert all(p.dtype == torch.float32 for p in trainer.policy.parameters())  # the master weights
    for key in _dense(after):
        moved = float((after[key] != before[key]).float().mean())
        assert moved > 0.999, f"{key}: only {moved:.1%} of its entries moved"
    # The checkpoint holds the master weights, in float32.
    with safe_open(str(tmp_path / "mixed" / "checkpoint-3" / "model.safetensors"), "pt") as fh:
        assert {fh.get_slice(k).get_dtype() for k in fh.keys()} == {"F32"}


def test_pure_bf16_loses_small_updates_and_warns(tmp_path, tiny_tokenizer):
    cfg = load_config("starpo-s").replace(dtype="bfloat16", master_dtype="bfloat16", actor_lr=1e-6)
    with pytest.warns(UserWarning, match="rounded away"):
        cfg.validate()
    with pytest.raises(ValueError, match="master_dtype"):  # weights in bf16 with float32 compute makes no sense
        load_config("starpo-s").replace(dtype="float32", master_dtype="bfloat16").validate()
    before, after, trainer = _run(tmp_path, tiny_tokenizer, "pure", dtype="bfloat16", master="bfloat16", lr=1e-6,
                                  steps=3)
    assert trainer.optimizer_steps == 12
    moved = sum(float((after[k] != before[k]).float().sum()) for k in _dense(after))
    total = sum(after[k].numel() for k in _dense(after))
    assert moved / total < 0.2  # measured: about 2 % (the figure on this model: 2.0 %)


def test_bf16_compute_tracks_the_fp32_run_on_the_same_batch(tmp_path, tiny_tokenizer):
    b32, a32, t32 = _run(tmp_path, tiny_tokenizer, "fp32", dtype="float32", master="float32", lr=1e-4, steps=1)
    b16, a16, t16 = _run(tmp_path, tiny_tokenizer, "bf16", dtype="bfloat16", master="float32", lr=1e-4, steps=1)
    assert not t32.precision.mixed and t16.precision.mixed
    diff = sum(float(((a16[k] - b16[k]) - (a32[k] - b32[k])).norm() ** 2) for k in a32) ** 0.5
    norm = sum(float((a32[k] - b32[k]).norm() ** 2) for k in a32) ** 0.5
    assert norm > 0
    assert 0 < diff / norm < UPDATE_TOLERANCE  # close, and not identical: the compute really ran in bfloat16
    row32, row16 = t32.history[-1], t16.history[-1]
    assert row16["loss/policy"] == pytest.approx(row32["loss/policy"], abs=0.05)
    assert row16["policy/entropy"] == pytest.approx(row32["policy/entropy"], rel=0.02)
    # The first update sees ratio 1 in either precision: scoring runs in the compute dtype, as the update.
    assert row16["policy/ratio_min"] <= 1.0 <= row16["policy/ratio_max"]


def test_train_command_with_bf16_compute_saves_float32_weights_that_all_moved(tmp_path, tiny_model_dir):
    out = tmp_path / "run"
    rc = cli.main([
        "train", "--config", "starpo-s", "--env", "ragen/Bandit-v0", "--model", str(tiny_model_dir),
        "--output_dir", str(out), "--total_steps", "2", "--env_groups", "2", "--group_size", "4",
        "--max_new_tokens", "6", "--max_context_tokens", "1024", "--max_turns", "1", "--val_every", "0",
        "--save_steps", "0", "--report_to", "jsonl", "--filter_ratio", "1.0", "--ppo_mini_batch_size", "2",
        "--dtype", "bfloat16", "--actor_lr", "1e-6", "--temperature", "1.0",
    ])
    assert rc == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"note"' not in x]
    assert [r["optim/updates"] for r in rows] == [4, 4]
    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as fh:
        initial = {k: fh.get_tensor(k) for k in fh.keys()}
    with safe_open(str(out / "final" / "model.safetensors"), "pt") as fh:
        final = {k: fh.get_tensor(k) for k in fh.keys()}
    assert {v.dtype for v in final.values()} == {torch.float32}
    for key, value in final.items():
        if value.dim() == 2 and "embed" not in key:
            assert float((value != initial[key]).float().mean()) > 0.99, key


def test_an_earlier_bf16_accelerator_in_the_process_is_refused_not_inherited():
    """accelerate keeps one state per process: an Accelerator made earlier with bf16 (e.g. by TRL) would wrap ragen's
    model in a second autocast. make_accelerator asks for mixed_precision 'no' and says what to do when it cannot."""
    cfg = load_config("starpo-s")
    try:
        assert make_accelerator(cfg).mixed_precision == "no"
        AcceleratorState._reset_state(reset_partial_state=True)
        Accelerator(cpu=True, mixed_precision="bf16")
        with pytest.raises(ValueError, match="fresh process"):
            make_accelerator(cfg)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


_X86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\nbugs\t\t: sysret_ss_attrs\n"
_ARM = "processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\nCPU implementer\t: 0x41\n"


def test_cpu_flags_reads_the_first_flags_line_of_x86_and_arm_and_nothing_elsewhere(tmp_path):
    (tmp_path / "x86").write_text(_X86 + "processor\t: 1\nflags\t\t: other\n")
    (tmp_path / "arm").write_text(_ARM)
    (tmp_path / "none").write_text("processor\t: 0\n")
    assert cpu_flags(tmp_path / "x86") == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert "bf16" in cpu_flags(tmp_path / "arm")
    assert cpu_flags(tmp_path / "none") is None and cpu_flags(tmp_path / "missing") is None


def test_bf16_compute_on_a_cpu_without_bf16_instructions_is_warned_about_and_nothing_else_is():
    avx2 = frozenset({"avx", "avx2", "fma"})
    advice = emulated_bf16_advice(torch.bfloat16, "cpu", avx2)
    assert advice is not None and "emulates" in advice and "dtype='float32'" in advice
    for flag in ("avx512_bf16", "amx_bf16", "bf16"):  # x86 AVX-512 BF16, AMX, Arm BF16: bfloat16 in hardware
        assert emulated_bf16_advice(torch.bfloat16, "cpu", avx2 | {flag}) is None
    assert emulated_bf16_advice(torch.float32, "cpu", avx2) is None
    assert emulated_bf16_advice(torch.bfloat16, "cuda", avx2) is None
    assert emulated_bf16_advice(torch.bfloat16, torch.device("cpu"), frozenset()) is not None


def test_the_trainer_warns_once_when_its_bf16_compute_would_be_emulated(tmp_path, tiny_tokenizer, monkeypatch, caplog):
    monkeypatch.setattr("ragen_trainer.precision.cpu_flags", lambda: frozenset({"avx2"}))
    cfg = load_config("starpo-s").replace(env_id="ragen/Bandit-v0", env_groups=2, group_size=4, report_to=["jsonl"],
                                          output_dir=str(tmp_path / "run"), dtype="bfloat16")
    engine = ScriptedEngine(tiny_tokenizer, lambda p, c, r: _REPLIES[r % 4])
    with caplog.at_level("WARNING", logger="ragen_trainer.trainer"):
        StarPOTrainer(cfg.validate(), build_tiny_model(tiny_tokenizer, hidden_size=64), tiny_tokenizer, engine=engine)
    assert [r.message for r in caplog.records].count(emulated_bf16_advice(torch.bfloat16, "cpu", frozenset())) == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="ragen_trainer.trainer"):
        StarPOTrainer(cfg.replace(dtype="float32", output_dir=str(tmp_path / "fp32")).validate(),
                      build_tiny_model(tiny_tokenizer, hidden_size=64), tiny_tokenizer, engine=engine)
    assert not any("emulates" in r.getMessage() for r in caplog.records)
