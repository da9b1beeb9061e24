"""ragen_envs: gymnasium text environments for LLM agents (the RAGEN paper's Bandit, Sokoban, FrozenLake, Countdown,
WebShop), one turn protocol for model replies, and reasoning-aware reward wrappers.

    import gymnasium, ragen_envs
    env = gymnasium.make("ragen/Sokoban-v0")
    prompt, info = env.reset(seed=0)          # the first user message; info["system_prompt"] the system one
    prompt, reward, terminated, truncated, info = env.step("<think>...</think><answer>Up || Left</answer>")

Importing this package registers the ids and imports nothing heavy (no torch, no web server).
"""

from ragen_envs.core import INFO_KEYS, BaseTextEnv, StepOutcome, default_info
from ragen_envs.factory import make_text_env
from ragen_envs.parsing import ParsedReply, parse_reply
from ragen_envs.protocol import TurnProtocol, find_protocol
from ragen_envs.registration import ENV_IDS, EnvSpec, reference_settings, register_text_env
from ragen_envs.registration import register_all as _register_all
from ragen_envs.settings import ProtocolSettings
from ragen_envs.spaces import UnicodeText

__version__ = "0.1.0"

__all__ = [
    "ENV_IDS",
    "INFO_KEYS",
    "BaseTextEnv",
    "EnvSpec",
    "ParsedReply",
    "ProtocolSettings",
    "StepOutcome",
    "TurnProtocol",
    "UnicodeText",
    "default_info",
    "find_protocol",
    "make_text_env",
    "parse_reply",
    "reference_settings",
    "register_text_env",
]

_register_all()
