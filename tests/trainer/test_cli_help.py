"""``ragen-trainer train --help``: one group per part of the config (:data:`ragen_trainer.config.CONFIG_GROUPS`), in
the config's order, every field in exactly one, each with its help and its default."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import fields

import pytest

from ragen_trainer import cli
from ragen_trainer.config import CONFIG_GROUPS, RESUME_SAFE_FIELDS, StarPOConfig, field_names

#: The group of the protocol settings' flags, after the config's groups.
PROTOCOL_GROUP = "turn-protocol settings"


def train_help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``train --help``'s groups: title -> the text under it, in the order printed."""
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal: the same text on every machine
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--help"])
    assert exit_info.value.code == 0
    sections: dict[str, str] = {}
    title = None
    for line in capsys.readouterr().out.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):  # argparse's group titles: unindented, ending ':'
            title = line[:-1]
            sections[title] = ""
        elif title is not None:
            sections[title] += line + "\n"
    return sections


def flags_of(text: str) -> list[str]:
    """The options a help section lists (first spelling of each), in order."""
    return re.findall(r"^  (--\w+)", text, flags=re.MULTILINE)


def squeezed(text: str) -> str:
    """``text`` without whitespace: argparse re-wraps help text (and may break it after a hyphen)."""
    return re.sub(r"\s+", "", text)


def test_config_groups_hold_every_field_once_in_the_declared_order() -> None:
    listed = [name for names in CONFIG_GROUPS.values() for name in names]
    twice = sorted(name for name, count in Counter(listed).items() if count > 1)
    assert not twice, f"fields in more than one group of CONFIG_GROUPS: {twice}"
    missing, unknown = set(field_names()) - set(listed), set(listed) - set(field_names())
    assert not missing and not unknown, f"in no group: {sorted(missing)}; not config fields: {sorted(unknown)}"
    assert listed == field_names(), "StarPOConfig declares its fields group by group, in CONFIG_GROUPS' order"
    assert all(names for names in CONFIG_GROUPS.values()), "an empty group"


def test_the_groups_of_run_time_knobs_may_change_on_resume() -> None:
    # CONFIG_GROUPS' comments say so: these fields change how the work is done, not what is trained
    for banner in ("generation engine", "memory, speed, processes"):
        assert set(CONFIG_GROUPS[banner]) <= RESUME_SAFE_FIELDS, banner


def test_train_help_prints_one_group_per_part_of_the_config_in_order(capsys, monkeypatch) -> None:
    sections = train_help(capsys, monkeypatch)
    titles = list(sections)
    assert titles[0] == "options"
    assert titles[1:-1] == list(CONFIG_GROUPS)
    assert titles[-1].startswith(PROTOCOL_GROUP), titles[-1]
    for banner, names in CONFIG_GROUPS.items():
        assert flags_of(sections[banner]) == [f"--{name}" for name in names], banner
    everywhere = [flag for text in sections.values() for flag in flags_of(text)]
    assert not [name for name in field_names() if everywhere.count(f"--{name}") != 1]
    assert {"--reference", "--max_turns", "--enable_think"} <= set(everywhere)


def test_every_field_keeps_its_help_and_default(capsys, monkeypatch) -> None:
    sections = train_help(capsys, monkeypatch)
    by_name = {f.name: f for f in fields(StarPOConfig)}
    for banner, names in CONFIG_GROUPS.items():
        text = squeezed(sections[banner])
        for name in names:
            f = by_name[name]
            if name == "resume":  # its flag explains the bare --resume instead
                assert squeezed("--resume alone: continue the run in output_dir") in text
                continue
            shown = f"{f.metadata['help']} (default: {cli._default_text(f)}"
            assert squeezed(shown) in text, name
    assert squeezed("(default: 0)") in squeezed(sections["experiment"])  # seed
    assert squeezed("(default: 'after_system'; one of ['after_system', 'replies'])") in squeezed(sections["losses"])
