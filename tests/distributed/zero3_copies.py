"""Copies of a ZeRO-3-partitioned policy (the separate critic's backbone, the frozen reference, self-play snapshots)
hold its whole weights. Run as one process: ``python tests/distributed/zero3_copies.py``; prints ``OK`` and the
number of weights checked."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import deepspeed
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations import HfDeepSpeedConfig

from ragen_trainer.critic import attach_critic, policy_copy
from tests.trainer.conftest import build_tiny_model, build_tiny_tokenizer


def main() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    deepspeed.init_distributed(dist_backend="gloo")
    folder = tempfile.mkdtemp()
    build_tiny_model(build_tiny_tokenizer(), seed=0).save_pretrained(folder)
    ds = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_batch_size": 1})  # noqa: F841  (kept alive:
    # while it lives, from_pretrained loads the weights partitioned, as `ragen-trainer train --deepspeed` does)
    model = AutoModelForCausalLM.from_pretrained(folder)
    params = dict(model.named_parameters())
    assert all(hasattr(p, "ds_id") and p.numel() == 0 for p in params.values()), "the weights are not partitioned"
    with deepspeed.zero.GatheredParameters(list(params.values())):
        whole = {name: p.detach().clone() for name, p in params.items()}
    critic = attach_critic(model, "value_model")
    reference = policy_copy(model)
    for name, value in reference.named_parameters():
        assert torch.equal(value, whole[name]), f"reference: {name}"
    for name, value in critic.backbone.named_parameters():
        assert torch.equal(value, whole[f"model.{name}"]), f"critic: {name}"
    print("OK", len(whole))
    return 0


if __name__ == "__main__":
    sys.exit(main())
