"""ragen_trainer: StarPO and StarPO-S (arXiv 2504.20073) for multi-turn LLM agents, built on TRL."""

__version__ = "0.1.0"
