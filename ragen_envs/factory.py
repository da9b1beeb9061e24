"""The entry point of every ``ragen/<Name>-v0`` id: build an env class inside the turn protocol and reward wrappers.

Kept apart from :mod:`ragen_envs.protocol` so that the protocol and the reward wrappers (which wrap a protocol) do not
import each other.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

from ragen_envs.core import BaseTextEnv, check_arg
from ragen_envs.protocol import TurnProtocol
from ragen_envs.rewards import wrap_rewards
from ragen_envs.settings import ProtocolSettings, resolve_protocol, split_protocol_kwargs

#: ``gymnasium.make`` keywords that only an id's registration sets: which class to build (imported by name) and its
#: reference protocol. Data a user hands over (a config's or a suite's ``env_kwargs``) may not set them: a class path
#: in a YAML file would make ``gymnasium.make`` import and call whatever it names.
REGISTRATION_KWARGS: tuple[str, ...] = ("env_cls", "reference_protocol")


def check_user_env_kwargs(env_kwargs: Any, where: str) -> None:
    """Raise ``ValueError`` when ``env_kwargs`` (from a config file, a suite, a command line) sets a keyword that
    only an env id's registration may set (:data:`REGISTRATION_KWARGS`); ``where`` names the source."""
    if not isinstance(env_kwargs, dict):
        return
    bad = [k for k in REGISTRATION_KWARGS if k in env_kwargs]
    if bad:
        raise ValueError(f"invalid {where}: {', '.join(repr(k) for k in bad)} cannot be set here (an env id's "
                         "registration sets the class it builds and its reference protocol; use another env id, or "
                         "register your env in code with ragen_envs.register_text_env); accepted: the env class's "
                         "own arguments, protocol settings and reward_wrappers")


def load_object(path: str) -> Any:
    """Import ``"package.module:Name"`` and return ``Name``."""
    module_name, _, attr = path.partition(":")
    check_arg(bool(module_name and attr), "env_cls", path, "'package.module:ClassName'")
    return getattr(importlib.import_module(module_name), attr)


def make_text_env(
    env_cls: str | type[BaseTextEnv],
    *,
    reference_protocol: ProtocolSettings | dict[str, Any] | None = None,
    protocol: ProtocolSettings | dict[str, Any] | None = None,
    reward_wrappers: list[str | dict[str, Any]] | tuple[str | dict[str, Any], ...] = (),
    **kwargs: Any,
) -> gym.Env:
    """Build the LLM-facing env: ``env_cls(**env_kwargs)`` inside :class:`TurnProtocol`, then any reward wrappers.

    This is the entry point of every ``ragen/<Name>-v0`` id: ``gymnasium.make`` passes the id's registered
    ``reference_protocol`` and the caller's kwargs here. The caller sets protocol fields either as keywords
    (``actions_per_turn=2``) or in ``protocol`` (a dict of fields, or a whole :class:`ProtocolSettings` that replaces
    the reference's); a field given both ways with different values is an error naming both
    (:func:`~ragen_envs.settings.resolve_protocol`, the one resolution of every path). ``reward_wrappers``
    names wrappers of :mod:`ragen_envs.rewards` (a name, or ``{"name": ..., **kwargs}``); everything else goes to the
    env class.
    """
    cls = load_object(env_cls) if isinstance(env_cls, str) else env_cls
    check_arg(isinstance(cls, type) and issubclass(cls, BaseTextEnv), "env_cls", env_cls,
              "a ragen_envs.core.BaseTextEnv subclass ('package.module:ClassName')")
    if isinstance(reference_protocol, dict):
        reference_protocol = ProtocolSettings.from_dict(reference_protocol, where="reference_protocol")
    check_arg(protocol is None or isinstance(protocol, (dict, ProtocolSettings)), "protocol", protocol,
              "a dict or a ProtocolSettings")
    settings = resolve_protocol(reference_protocol or ProtocolSettings(), protocol=protocol,
                                keywords=split_protocol_kwargs(kwargs))
    env: gym.Env = TurnProtocol(cls(**kwargs), settings)
    if reward_wrappers:
        env = wrap_rewards(env, reward_wrappers)
    return env
