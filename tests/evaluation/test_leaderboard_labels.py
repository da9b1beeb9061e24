"""The leaderboard's bar charts: every agent's label readable under its bar, never running into its neighbour's (the
main job's two models, "SmolLM2-135M-Instruct" and "SmolLM2 + StarPO-S (10 steps)", once did)."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest

from ragen_trainer.evaluation.agents import OracleAgent, RandomAgent
from ragen_trainer.evaluation.leaderboard import (
    CHART_SLOT_PX,
    LABEL_LINE_CHARS,
    LABEL_LINES,
    build_leaderboard,
    chart_label_lines,
)
from ragen_trainer.evaluation.runner import run_suite, save_result

from .helpers import small_suite
from .test_leaderboard import _chromium

#: The main job's labels (scripts/main.sh), a long one and one without a place to break.
NAMES = ("random", "oracle", "SmolLM2-135M-Instruct", "SmolLM2 + StarPO-S (20 steps, seed 0)",
         "Qwen2.5-0.5B-Instruct + StarPO-S (200 steps, seed 3)", "W" * 40)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("labels")
    suite = small_suite(("Bandit", "ragen/Bandit-v0", 2), ("BanditTest", "ragen/BanditTest-v0", 2))
    paths = []
    for i, name in enumerate(NAMES):
        agent = (OracleAgent if i % 2 else RandomAgent)()
        agent.name = name
        paths.append(save_result(run_suite(suite, agent, progress=False), folder / f"{i}.json"))
    _, html = build_leaderboard(paths, html_path=folder / "board.html")
    return folder / "board.html", html


@pytest.mark.parametrize("label, lines", [
    ("oracle", ["oracle"]),
    ("SmolLM2-135M-Instruct", ["SmolLM2-135M-", "Instruct"]),
    ("SmolLM2 + StarPO-S (10 steps)", ["SmolLM2 +", "StarPO-S (10", "steps)"]),
    ("SmolLM2 + StarPO-S (20 steps, seed 0)", ["SmolLM2 +", "StarPO-S (20", "steps, seed 0)"]),
    ("Qwen2.5-0.5B-Instruct + StarPO-S (200 steps, seed 3)", ["Qwen2.5-0.5B-", "Instruct +", "StarPO-S (200…"]),
])
def test_labels_wrap_at_spaces_and_hyphens_and_end_in_an_ellipsis_when_cut(label, lines):
    assert chart_label_lines(label) == lines


def test_every_label_line_fits_its_slot_and_the_whole_label_is_the_tooltip(page):
    _, html = page
    labels = re.findall(r'<text x="(\d+)" y="[\d.]+" class="label" text-anchor="middle"><title>(.*?)</title>(.*?)</text>',
                        html)
    assert len(labels) == 2 * len(NAMES)  # one per agent in each env's chart
    for x, title, body in labels:
        lines = re.findall(r"<tspan x=\"(\d+)\" dy=\"\d+\">(.*?)</tspan>", body)
        assert 1 <= len(lines) <= LABEL_LINES and all(tx == x for tx, _ in lines)
        assert all(len(text.replace("&amp;", "&")) <= LABEL_LINE_CHARS for _, text in lines)
        assert title in [n.replace("&", "&amp;") for n in NAMES]
    centres = sorted({int(x) for x, _, _ in labels})
    assert all(b - a == CHART_SLOT_PX for a, b in pairwise(centres))


@pytest.mark.browser
def test_labels_do_not_overlap_in_headless_chromium(page, tmp_path):
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By

    path, _ = page
    driver = _chromium()
    try:
        driver.get(path.as_uri())
        boxes = driver.execute_script(
            "return Array.from(document.querySelectorAll('svg.bars')).map(function(svg){"
            "  return Array.from(svg.querySelectorAll('text.label')).map(function(t){"
            "    var b = t.getBBox(); return [b.x, b.x + b.width, svg.width.baseVal.value]; }); });")
        assert len(boxes) == 2
        for chart in boxes:
            assert len(chart) == len(NAMES)
            for (_, right, _), (left, _, _) in pairwise(chart):
                assert right < left, chart  # a gap between every two neighbouring labels
            assert chart[0][0] >= 0 and chart[-1][1] <= chart[-1][2]  # and all of them inside the chart
        figure = driver.find_elements(By.CSS_SELECTOR, "figure.chart")[0]
        figure.screenshot(str(tmp_path / "chart.png"))  # kept with the test's files, to look at
    finally:
        driver.quit()
