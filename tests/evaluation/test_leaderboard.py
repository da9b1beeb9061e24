"""The leaderboard: Markdown table, the self-contained HTML page, and the page in headless Chromium."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ragen_trainer.evaluation.agents import Agent, OracleAgent, RandomAgent
from ragen_trainer.evaluation.leaderboard import GRID_LEGENDS, build_board, build_leaderboard, markdown_table
from ragen_trainer.evaluation.runner import run_suite, save_result

from .helpers import small_suite

ENTRIES = [("Bandit", "ragen/Bandit-v0", 4), ("FrozenLake", "ragen/FrozenLake-v0", 4),
           ("Sokoban", "ragen/Sokoban-v0", 4), ("SokobanNewVocab", "ragen/SokobanNewVocab-v0", 2)]  # fmt: skip
NASTY = "</script><script>window.__pwned = 1</script><b>x</b>"


class _Nasty(Agent):
    """Replies with markup that must stay text in the page."""

    name = "nasty</td>"

    def reply(self, ctx):
        return f"<think>{NASTY}</think><answer>{NASTY}</answer>"


@pytest.fixture(scope="module")
def result_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("results")
    suite = small_suite(*ENTRIES)
    paths = []
    for agent in (OracleAgent(), RandomAgent(), _Nasty()):
        paths.append(save_result(run_suite(suite, agent, progress=False), folder / f"{len(paths)}.json"))
    other = small_suite(("Bandit", "ragen/Bandit-v0", 3))
    paths.append(save_result(run_suite(other, RandomAgent(), progress=False), folder / "other-suite.json"))
    return paths


def test_markdown_ranks_agents_per_suite_with_standard_errors(result_files):
    markdown, _ = build_leaderboard(result_files)
    tables = markdown.split("### Suite")[1:]
    assert len(tables) == 2  # two different suite hashes are never mixed in one table
    rows = [line for line in tables[0].splitlines() if re.match(r"\| \d", line)]
    assert [r.split("|")[2].strip() for r in rows][0] == "oracle"
    assert "| 100.0 ± 0.0 |" in rows[0]  # oracle on Bandit
    header = next(line for line in tables[0].splitlines() if line.startswith("| #"))
    assert "Sokoban" in header and "score" in header and "partial" in header


def test_board_ranks_by_overall_score(result_files):
    from ragen_trainer.evaluation.leaderboard import load_results

    board = build_board(load_results(result_files[:3]))
    scores = [row["overall"]["score"] for row in board[0]["rows"]]
    assert scores == sorted(scores, reverse=True)
    assert "nasty" in markdown_table(board)


def test_html_is_one_self_contained_file_that_keeps_replies_as_text(result_files, tmp_path):
    _, page = build_leaderboard(result_files, html_path=tmp_path / "board.html")
    assert (tmp_path / "board.html").read_text(encoding="utf-8") == page
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"(src|href)=\"https?://", page)
    assert page.count("board sortable") == 2 and page.count("<svg") == 5  # a table per suite, a chart per env
    assert page.count("all metrics per env") == 2 and "think words" in page
    assert NASTY not in page  # the reply's markup is escaped inside the JSON data block


def test_grid_legends_match_the_envs_symbols():
    from ragen_envs.frozen_lake import PLAYER, PLAYER_IN_HOLE, PLAYER_ON_GOAL
    from ragen_envs.sokoban.env import VOCABS

    words = {"wall": "wall", "empty": "floor", "target": "target", "box_on_target": "box_on_target", "box": "box",
             "player": "player", "player_on_target": "player_on_target"}  # fmt: skip
    for vocab, legend in (("default", "sokoban"), ("new", "sokoban_new")):
        assert {sym: words[key] for key, sym in VOCABS[vocab].items()} == GRID_LEGENDS[legend]
    lake = GRID_LEGENDS["frozenlake"]
    assert (lake[PLAYER], lake[PLAYER_IN_HOLE], lake[PLAYER_ON_GOAL]) == ("player", "player_in_hole", "player_on_goal")


def _chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (Path(binary).exists() and Path(driver).exists()):
        pytest.skip("headless Chromium needs /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium "
                    "chromium-driver)")  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--window-size=1280,1400"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.mark.browser
def test_page_in_headless_chromium_shows_the_table_sorts_and_replays(result_files, tmp_path):
    pytest.importorskip("selenium")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    page = tmp_path / "board.html"
    build_leaderboard(result_files, html_path=page)
    driver = _chromium()
    try:
        driver.get(page.as_uri())
        table = driver.find_element(By.ID, "board-0")
        rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
        assert [r.get_attribute("data-agent") for r in rows][0] == "oracle" and len(rows) == 3
        # sort by score: first click ascending, the oracle goes last
        score = next(th for th in table.find_elements(By.TAG_NAME, "th") if th.text.startswith("score"))
        score.click()
        rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
        assert rows[-1].get_attribute("data-agent") == "oracle"
        assert len(driver.find_elements(By.CSS_SELECTOR, "svg.bars rect.bar")) >= 10
        assert driver.execute_script("return window.__pwned === undefined")

        # replay an oracle Sokoban episode: the grid is drawn on the canvas, the turns step forward
        Select(driver.find_element(By.ID, "run-select")).select_by_index(0)
        Select(driver.find_element(By.ID, "env-select")).select_by_visible_text("Sokoban")
        assert "success" in Select(driver.find_element(By.ID, "episode-select")).first_selected_option.text
        canvas = driver.find_element(By.ID, "grid-canvas")
        assert canvas.size["width"] >= 6 * 40 - 2 and canvas.is_displayed()
        colours = driver.execute_script(
            "var c = document.getElementById('grid-canvas'); var d = c.getContext('2d')"
            ".getImageData(0, 0, c.width, c.height).data; var s = new Set();"
            "for (var i = 0; i < d.length; i += 4 * 7) s.add(d[i] + ',' + d[i+1] + ',' + d[i+2]); return s.size;"
        )
        assert colours >= 4  # walls, floor, box / target, player: a picture, not a blank canvas
        driver.find_element(By.ID, "next").click()
        detail = driver.find_element(By.ID, "turn-detail").text
        assert "actions:" in detail and "<answer>" in driver.find_element(By.CSS_SELECTOR, "pre.reply").text
        driver.find_element(By.ID, "play").click()
        WebDriverWait(driver, 10).until(
            lambda d: d.find_element(By.ID, "next").get_attribute("disabled") is not None
        )
        label = driver.find_element(By.ID, "step-label").text
        n = re.match(r"step (\d+) / (\d+)", label)
        assert n and n.group(1) == n.group(2) and int(n.group(2)) >= 1
        assert "success: yes" in driver.find_element(By.ID, "turn-detail").text

        # the nasty agent's reply is shown as text
        Select(driver.find_element(By.ID, "run-select")).select_by_index(2)
        Select(driver.find_element(By.ID, "env-select")).select_by_visible_text("Bandit")
        driver.find_element(By.ID, "next").click()
        assert "window.__pwned" in driver.find_element(By.CSS_SELECTOR, "pre.reply").text
        assert driver.execute_script("return window.__pwned === undefined")
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == []
    finally:
        driver.quit()


def test_results_of_an_older_suite_version_stay_readable_and_labelled(result_files, tmp_path):
    import json

    from ragen_trainer.evaluation.runner import load_result
    from ragen_trainer.evaluation.suites import suite_hash

    old = load_result(result_files[3])
    suite = old["suite"]  # as an older suite was written: no protocol recorded, its own name and hash
    suite["definition"]["name"] = suite["name"] = "old"
    suite["id"] = "old-v1"
    for entry in suite["definition"]["envs"]:
        entry.pop("protocol")
    suite["hash"] = suite_hash(suite["definition"])
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    markdown, _ = build_leaderboard([result_files[0], path], markdown_path=tmp_path / "lb.md",
                                    html_path=tmp_path / "lb.html")  # fmt: skip
    assert "Suite `old-v1`" in markdown and "protocol: not recorded" in markdown
    assert "Suite `test-v1`" in markdown and "Bandit 1/1/1" in markdown  # the current suite names its protocol
