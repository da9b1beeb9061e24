"""Offline, seed-pinned leaderboard evaluation (``ragen-trainer eval`` / ``ragen-trainer leaderboard``).

* :mod:`.suites` -- named, versioned suites of (env, kwargs, pinned seeds, rollouts, decoding);
* :mod:`.agents` -- the agent interface, the random and oracle reference agents, the model agent;
* :mod:`.runner` -- plays a suite, writes one JSON result file;
* :mod:`.metrics` -- success rate with standard errors, partial credit, pass@k, invalid-action rate, overall score;
* :mod:`.rescore` -- recomputes a result's summary from its saved episodes, without a model;
* :mod:`.leaderboard` -- merges result files into a Markdown table and one self-contained HTML page;
* :mod:`.cli` -- the ``eval`` and ``leaderboard`` subcommands.

Nothing heavy is imported here: torch and the engines load only when a model agent is built.
"""

from ragen_trainer.evaluation.suites import Suite, SuiteEnv, load_suite

__all__ = ["Suite", "SuiteEnv", "load_suite"]
