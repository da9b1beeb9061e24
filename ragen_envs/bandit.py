"""Two-armed bandit with semantically named arms (the paper's Bandit, BanditTest and BanditRev).

The model sees two arm names, one suggesting safety (``Phoenix``), one risk (``Dragon``), and must pick the arm with the
higher expected payout from the names' meaning alone: a single-turn test of whether reasoning uses prior knowledge.

Action space: ``UnicodeText``; valid actions are the two arm names (case-insensitive), or ``1`` / ``2`` for the first
or second arm as listed.

Observation: the text ``Arms: <name1>, <name2>. Choose one.`` (ragen layout) or the reference's game rules naming
both arms (reference layout, :meth:`BanditEnv.reference_state_text`); the order of the arms is shuffled per seed.

Rewards (reference code): the low-risk arm pays ``low_risk_payout`` (0.1) every time; the high-risk arm pays
``high_risk_payout`` (1.0) with probability ``high_risk_prob`` (0.25) and 0 otherwise, so its expectation (0.25) is
higher. Success means choosing the high-risk arm, whatever it paid.

Episode end: terminated after one pull. ``ragen/Bandit*-v0`` allow one turn (the reference's ``max_turn: 1``), so a
reply without a valid arm ends the episode truncated, with the format penalty.

Arguments:
    low_risk_name / high_risk_name: the arms' names (Phoenix / Dragon; the test vocabulary is Trader / Librarian).
    reverse: swap which *name* carries the risk (BanditRev): the safe-sounding name becomes the high-risk arm.
    low_risk_payout, high_risk_payout, high_risk_prob: the payout distributions.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ragen_envs.core import BaseTextEnv, StepOutcome, check_arg

#: The reference env's first rendering (RAGEN ``ragen/env/bandit/env.py`` ``INIT_PROMPT``), trailing spaces included.
REFERENCE_PROMPT = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to pull. \n"
    "Game Rules: \n"
    "1. There are 2 arms, named {a} and {b}\n"
    "2. Each arm has its own reward distribution, related to their names. \n"
    "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution might behave.\n"
    "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher rewards "
    "on average? Choose between {a} and {b}, and output like <answer> {a} </answer> or <answer> {b} </answer>.\n"
)

# Words that, next to an arm's name in the thinking, claim that arm is the risky or the safe one.
_RISKY_WORDS = ("high-risk", "high risk", "risky", "riskier", "volatile", "gamble", "dangerous", "uncertain")
_SAFE_WORDS = ("low-risk", "low risk", "safe", "safer", "steady", "stable", "reliable", "consistent", "guaranteed")


class BanditEnv(BaseTextEnv):
    """A two-armed bandit whose arm names hint at their payout distributions. See the module docstring."""

    max_action_chars = 512
    # The reference's Bandit has an empty env_instruction: its rules are the state text (REFERENCE_PROMPT).
    reference_instruction = ""

    def __init__(
        self,
        low_risk_name: str = "Phoenix",
        high_risk_name: str = "Dragon",
        *,
        reverse: bool = False,
        low_risk_payout: float = 0.1,
        high_risk_payout: float = 1.0,
        high_risk_prob: float = 0.25,
        render_mode: str | None = None,
    ) -> None:
        for name, value in (("low_risk_name", low_risk_name), ("high_risk_name", high_risk_name)):
            check_arg(
                isinstance(value, str) and value.strip() != "" and value.strip() not in ("1", "2"),
                name,
                value,
                "a non-empty arm name other than '1' or '2'",
            )
        check_arg(
            low_risk_name.strip().lower() != high_risk_name.strip().lower(),
            "high_risk_name",
            high_risk_name,
            "a name != low_risk_name (ignoring case and surrounding spaces)",
        )
        check_arg(
            isinstance(high_risk_prob, (int, float))
            and not isinstance(high_risk_prob, bool)
            and 0.0 <= high_risk_prob <= 1.0,
            "high_risk_prob",
            high_risk_prob,
            "a probability in [0, 1]",
        )
        for name, value in (("low_risk_payout", low_risk_payout), ("high_risk_payout", high_risk_payout)):
            check_arg(
                isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                name,
                value,
                "a finite number",
            )
        if reverse:  # BanditRev: the safe-sounding name now carries the risk.
            low_risk_name, high_risk_name = high_risk_name, low_risk_name
        self.low_risk_name = low_risk_name.strip()
        self.high_risk_name = high_risk_name.strip()
        self.low_risk_payout = float(low_risk_payout)
        self.high_risk_payout = float(high_risk_payout)
        self.high_risk_prob = float(high_risk_prob)
        self.action_names = (self.low_risk_name, self.high_risk_name)  # instance-level: names are arguments
        super().__init__(render_mode=render_mode)
        self._arms: list[str] = [self.low_risk_name, self.high_risk_name]
        self._pulled: str | None = None
        self._payout = 0.0

    @property
    def instructions(self) -> str:
        a, b = self._arms
        return (
            "You are playing a bandit game. Goal: maximize your total reward by choosing which arm to pull.\n"
            f"Game rules:\n1. There are 2 arms, named {a} and {b}.\n"
            "2. Each arm has its own reward distribution, related to its name.\n"
            "3. Analyze the symbolic meaning of each arm's name to guess how its reward distribution might behave.\n"
            "4. Based on the symbolic meaning of their names, which arm do you think is more likely to give higher "
            f"rewards on average? Choose between {a} and {b}, and output like <answer>{a}</answer> or "
            f"<answer>{b}</answer>."
        )

    def _reset_state(self, options: dict[str, Any] | None) -> None:
        order = self.np_random.permutation(2)
        self._arms = [[self.low_risk_name, self.high_risk_name][i] for i in order]
        self._pulled = None
        self._payout = 0.0

    def parse_action(self, text: str) -> str | None:
        key = text.strip().strip("\"'`.[](){}*").strip()
        if key in ("1", "2"):
            return self._arms[int(key) - 1]
        return super().parse_action(key)

    def _apply_action(self, action: str) -> StepOutcome:
        self._pulled = action
        if action == self.high_risk_name:
            won = self.np_random.random() < self.high_risk_prob
            reward = self.high_risk_payout if won else 0.0
        else:
            reward = self.low_risk_payout
        self._payout = reward
        return StepOutcome(reward=reward, terminated=True, effective=True, success=self.is_success())

    def is_success(self) -> bool:
        return self._pulled == self.high_risk_name

    def state_text(self) -> str:
        a, b = self._arms
        if self._pulled is None:
            return f"Arms: {a}, {b}. Choose one."
        return f"Arms: {a}, {b}. You pulled {self._pulled}."

    def reference_state_text(self) -> str:
        """The reference's rendering: the game's rules before the pull, ``"<arm>: <payout> points"`` after it."""
        if self._pulled is None:
            a, b = self._arms
            return REFERENCE_PROMPT.format(a=a, b=b)
        return f"{self._pulled}: {self._payout} points"

    def state_view(self) -> dict[str, Any]:
        return {
            "arms": list(self._arms),
            "low_risk_arm": self.low_risk_name,
            "high_risk_arm": self.high_risk_name,
            "pulled": self._pulled,
        }

    def check_reasoning(self, think: str, view_before: dict[str, Any], actions: list[str]) -> dict[str, int]:
        """Count sentences that call an arm risky or safe, against which arm really is which."""
        supported = contradicted = 0
        for sentence in re.split(r"[.!?\n;]+", think.lower()):
            for arm, truth in ((view_before["high_risk_arm"], "risky"), (view_before["low_risk_arm"], "safe")):
                if arm.lower() not in sentence:
                    continue
                other = view_before["low_risk_arm"] if truth == "risky" else view_before["high_risk_arm"]
                if other.lower() in sentence:
                    continue  # a sentence naming both arms is ambiguous; skip it
                says_risky = any(w in sentence for w in _RISKY_WORDS)
                says_safe = any(w in sentence for w in _SAFE_WORDS)
                if says_risky == says_safe:
                    continue
                claim = "risky" if says_risky else "safe"
                if claim == truth:
                    supported += 1
                else:
                    contradicted += 1
        return {"supported": supported, "contradicted": contradicted}
