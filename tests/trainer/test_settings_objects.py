"""One home for each concern: the rollout and loss settings are made from the config in one place and taken whole by
the library functions, none of which has a default of its own for a setting that differs between ragen's two
references; the turn protocol is resolved by one function on every path (config, TRL datasets, ``gymnasium.make``).
"""

from __future__ import annotations

import importlib.util
import inspect

import gymnasium as gym
import pytest

import ragen_envs
from ragen_envs.protocol import find_protocol
from ragen_envs.settings import ProtocolSettings, resolve_protocol
from ragen_trainer.config import REFERENCE_BASE, StarPOConfig, field_names, load_config
from ragen_trainer.settings import DEFAULT_MAX_CONTEXT_TOKENS, LossSettings, RolloutSettings

#: Each reference's values of the settings that differ between the two (the config's ByReference values), written
#: out so that a change of the config's values shows here too.
EXPECTED = {
    "paper": {"loss_mask": "after_system", "clip_ratio_c": 0.0, "loss_agg_mode": "micro-token-mean",
              "loss_agg_micro_size": 4},
    "latest": {"loss_mask": "replies", "clip_ratio_c": 3.0, "loss_agg_mode": "seq-mean-token-mean",
               "loss_agg_micro_size": 1},
}  # fmt: skip

#: Parameter names that carry a setting whose value depends on the reference (or that a function used to default to
#: the other reference's value): none of them may have a default in a library function.
REFERENCE_DEPENDENT = {
    *REFERENCE_BASE, "reply_tokens", "kl_estimator", "max_context_tokens", "settings",
    # the same settings under the loss functions' own names
    "agg_mode", "mode", "micro_size", "estimator",
}  # fmt: skip
#: The one exception: agg_loss's micro_size is needed only by micro-token-mean without normalizers; ``None`` there is
#: "not given", and that case raises (tests/trainer/test_losses.py).
NONE_MEANS_NOT_GIVEN = {("agg_loss", "micro_size")}


def _settings_of(reference: str) -> tuple[RolloutSettings, LossSettings]:
    cfg = load_config("starpo-s").replace(reference=reference)
    return cfg.rollout_settings(), cfg.loss_settings()


# ------------------------------------------------------------------------------------------ made once, from the config
@pytest.mark.parametrize("reference", ["paper", "latest"])
def test_the_settings_carry_the_references_values(reference):
    rollout, losses = _settings_of(reference)
    for name, value in EXPECTED[reference].items():
        assert getattr(rollout if name == "loss_mask" else losses, name) == value == REFERENCE_BASE[name].at(reference)
    # what both references share: the config's defaults (3600 declared once)
    assert (rollout.reply_tokens, rollout.max_context_tokens, rollout.group_randomness) == (
        "cleaned", DEFAULT_MAX_CONTEXT_TOKENS, "shared")
    assert (losses.clip_low, losses.clip_high, losses.kl_estimator, losses.value_clip) == (0.2, 0.28, "k1", 0.5)
    assert StarPOConfig().max_context_tokens == DEFAULT_MAX_CONTEXT_TOKENS == 3600


def test_every_settings_field_is_the_config_field_of_its_name():
    changed = {"loss_mask": "replies", "reply_tokens": "sampled", "max_context_tokens": 2048,
               "group_randomness": "independent", "clip_low": 0.1, "clip_high": 0.3, "clip_ratio_c": 2.5,
               "loss_agg_mode": "token-mean", "loss_agg_micro_size": 2, "kl_estimator": "k3", "value_clip": 0.4}
    cfg = load_config("starpo-s").replace(**changed).validate()
    made = {**vars(cfg.rollout_settings()), **vars(cfg.loss_settings())}
    assert made == changed and set(made) <= set(field_names())
    # frozen: a run's settings are passed on as they were made
    with pytest.raises(AttributeError):
        cfg.rollout_settings().loss_mask = "after_system"  # type: ignore[misc]


def test_rollout_settings_are_checked_when_made():
    good = vars(load_config().rollout_settings())
    for name, bad in (("loss_mask", "all"), ("reply_tokens", "raw"), ("max_context_tokens", 1),
                      ("group_randomness", "own")):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            RolloutSettings(**{**good, name: bad})


# ------------------------------------------------------------------------------------------ no reference by default
def _public_callables(module):
    for name in getattr(module, "__all__", dir(module)):
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) != module.__name__:
            continue  # re-exported: checked in its own module
        if inspect.isclass(obj):
            yield name, obj.__init__
            for method_name, method in vars(obj).items():
                if inspect.isfunction(method) and not method_name.startswith("_"):
                    yield f"{name}.{method_name}", method
        elif inspect.isfunction(obj):
            yield name, obj


def test_no_library_function_defaults_a_reference_dependent_setting():
    pytest.importorskip("torch")
    from ragen_trainer import losses, rollout, selfplay, settings, update

    modules = [losses, rollout, selfplay, settings, update]
    if importlib.util.find_spec("trl") is not None:  # the TRL adapter needs the train extra
        from ragen_trainer import trl_integration

        modules.append(trl_integration)
    checked, bad = 0, []
    for module in modules:
        for name, function in _public_callables(module):
            for param in inspect.signature(function).parameters.values():
                if param.name not in REFERENCE_DEPENDENT:
                    continue
                checked += 1
                allowed = (param.default is None and (name, param.name) in NONE_MEANS_NOT_GIVEN)
                if param.default is not inspect.Parameter.empty and not allowed:
                    bad.append(f"{module.__name__}.{name}({param.name}={param.default!r})")
    assert not bad, f"library functions with a default for a reference-dependent setting: {bad}"
    assert checked >= 12  # policy_loss, value_loss, kl_penalty, agg_loss, TokenAgent, collect_rollouts, ... are seen


def test_the_evaluation_agent_plays_with_the_one_context_default():
    pytest.importorskip("torch")
    from ragen_trainer.evaluation.agents import ModelAgent

    default = inspect.signature(ModelAgent.__init__).parameters["max_context_tokens"].default
    assert default == DEFAULT_MAX_CONTEXT_TOKENS == StarPOConfig().max_context_tokens


# ------------------------------------------------------------------------------------------ driven from the config
@pytest.mark.parametrize("reference", ["paper", "latest"])
def test_the_losses_driven_from_the_config_compute_what_it_says(reference):
    torch = pytest.importorskip("torch")
    from ragen_trainer.losses import kl_penalty, policy_loss

    _, settings = _settings_of(reference)
    # 5 rows of one token each, every advantage -1 and ratio 10: the clipped surrogate is 10 per token, which the
    # later reference's dual clip bounds at 3; each row its own sequence, so every aggregation gives the token mean
    logp = torch.log(torch.full((5, 1), 10.0))
    loss, stats = policy_loss(logp, torch.zeros(5, 1), -torch.ones(5, 1), torch.ones(5, 1), settings)
    assert float(loss) == pytest.approx(10.0 if reference == "paper" else 3.0)
    assert float(stats["clipfrac_dual"]) == (0.0 if reference == "paper" else 1.0)
    # rows of different lengths: micro-token-mean over micro-batches of 4 (paper) is not the mean of row means (latest)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    advantages = -torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 0.0, 0.0], [6.0, 0.0, 0.0], [7.0, 8.0, 0.0]])
    loss, _ = policy_loss(torch.zeros(5, 3), torch.zeros(5, 3), advantages, mask, settings)
    per_row = [[1, 2, 3], [4], [5], [6], [7, 8]]  # -A * ratio 1, unclipped
    if reference == "paper":  # micro-batches {0..3} and {4}: the mean of their token means
        want = ((1 + 2 + 3 + 4 + 5 + 6) / 6 + (7 + 8) / 2) / 2
    else:
        want = sum(sum(r) / len(r) for r in per_row) / len(per_row)
    assert float(loss) == pytest.approx(want)
    ref = torch.tensor([-2.0])
    assert float(kl_penalty(torch.tensor([-1.0]), ref, settings.kl_estimator)) == pytest.approx(1.0)  # k1: log-ratio


@pytest.mark.parametrize("reference", ["paper", "latest"])
def test_rollouts_driven_from_the_config_train_what_it_says(reference, tiny_tokenizer, scripted_engine):
    from ragen_trainer.engines import SamplingParams
    from ragen_trainer.rollout import ChatTokens, after_system_mask, collect_rollouts

    settings, _ = _settings_of(reference)
    engine = scripted_engine(tiny_tokenizer, ["<think>hm</think><answer>Dragon</answer>"])
    batch = collect_rollouts(engine, tiny_tokenizer, "ragen/Bandit-v0", [0, 1], 2, settings=settings,
                             sampling=SamplingParams(max_new_tokens=32), env_kwargs={"reply_prefix": ""})  # fmt: skip
    chat = ChatTokens(tiny_tokenizer)
    for traj in batch.trajectories:
        replies = [0] * len(traj.input_ids)
        for start, end in traj.turn_spans:
            replies[start:end] = [1] * (end - start)
        if reference == "paper":  # every token after the system prompt
            system = chat.system_turn_ids(traj.messages[0]["content"])
            assert traj.loss_mask == after_system_mask(traj.input_ids, system) != replies
        else:  # the replies only
            assert traj.loss_mask == replies
        assert traj.old_logprobs is None  # cleaned replies (both references): re-tokenised, no sampling log-probs


# ------------------------------------------------------------------------------------------ one protocol resolver
CASES = [  # (env id, protocol field / argument, protocol keywords)
    ("ragen/FrozenLake-v0", {}, {}),
    ("ragen/FrozenLake-v0", {"max_turns": 3}, {"action_sep": ";"}),
    ("ragen/Sokoban-v0", {"max_turns": 3}, {"max_turns": 3}),
    ("ragen/Bandit-v0", {"format_penalty": -1}, {"enable_think": False}),
    ("ragen/TicTacToe-v0", {}, {"reply_prefix": ""}),
]


@pytest.mark.parametrize(("env_id", "protocol", "keywords"), CASES)
def test_the_three_paths_resolve_the_protocol_alike(env_id, protocol, keywords):
    pytest.importorskip("trl")
    from ragen_trainer.trl_integration import resolve_env_settings

    want = resolve_protocol(ragen_envs.reference_settings(env_id), protocol=protocol, keywords=keywords)
    config = StarPOConfig(env_id=env_id, protocol=protocol, env_kwargs=dict(keywords)).protocol_settings()
    own, dataset = resolve_env_settings(env_id, {**keywords, "protocol": protocol})
    env = gym.make(env_id, protocol=protocol, **keywords)
    try:
        assert config == dataset == find_protocol(env).settings == want and own == {}
    finally:
        env.close()


def test_a_conflict_is_refused_on_every_path_naming_its_places():
    pytest.importorskip("trl")
    from ragen_trainer.trl_integration import resolve_env_settings

    env_id, protocol, keywords = "ragen/FrozenLake-v0", {"max_turns": 3}, {"max_turns": 4}
    given_twice = "'max_turns' is given twice with different values: 3 in {} and 4 in {}"
    with pytest.raises(ValueError, match=given_twice.format("config field protocol", "config field env_kwargs")):
        StarPOConfig(env_id=env_id, protocol=protocol, env_kwargs=keywords).protocol_settings()
    nested = r"env_kwargs\['protocol'\]"
    with pytest.raises(ValueError, match=given_twice.format(nested, "env_kwargs protocol keywords")):
        resolve_env_settings(env_id, {**keywords, "protocol": protocol})
    with pytest.raises(ValueError, match=given_twice.format("the protocol argument", "gymnasium.make keywords")):
        gym.make(env_id, protocol=protocol, **keywords)


def test_a_whole_resolved_protocol_is_played_as_it_is():
    whole = ProtocolSettings(max_turns=2)
    base = ragen_envs.reference_settings("ragen/Sokoban-v0")
    assert resolve_protocol(base, protocol=whole) is whole
    assert resolve_protocol(base, protocol=whole, keywords={"max_turns": 2}) == whole  # agreeing: merged, equal
    with pytest.raises(ValueError, match="given twice"):  # every field of a whole object counts as given
        resolve_protocol(base, protocol=whole, keywords={"max_turns": 3})
    # the caller's layer on top comes last: its place is named second
    with pytest.raises(ValueError, match="3 in the protocol argument and 4 in the protocol on top"):
        resolve_protocol(base, protocol={"max_turns": 3}, on_top={"max_turns": 4})
