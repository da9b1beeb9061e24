"""A real browser buys the goal's product: selenium drives headless Chromium (Debian's chromium + chromedriver)."""

from __future__ import annotations

import shutil
import urllib.parse

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage"):  # fmt: skip
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()


def test_browser_purchase_gives_reward_one(browser, server, shop):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    base = server.url
    k = next(k for k in range(20) if shop.goal(f"test_{k}").goal_options)  # a goal with options to choose
    goal = shop.goal(f"test_{k}")
    wait = WebDriverWait(browser, 10)

    browser.get(f"{base}/test_{k}")
    assert goal.instruction_text in browser.find_element(By.ID, "instruction-text").text
    box = browser.find_element(By.ID, "search_input")
    box.send_keys(goal.name)
    browser.find_element(By.CSS_SELECTOR, "#form-search button").click()
    link = wait.until(ec.element_to_be_clickable((By.LINK_TEXT, goal.asin)))
    link.click()
    wait.until(ec.presence_of_element_located((By.ID, "product-title")))
    assert browser.find_element(By.ID, "product-title").text == goal.name

    for name, value in goal.goal_options.items():
        # clicking an option's label checks its radio; the page's script reloads with the option in the URL
        label = next(
            lb for lb in browser.find_elements(By.CSS_SELECTOR, ".radio-toolbar label")
            if lb.text == value and browser.find_element(By.ID, lb.get_attribute("for")).get_attribute("name") == f"o.{name}"
        )  # fmt: skip
        label.click()
        key = f"o.{urllib.parse.quote_plus(name)}="
        wait.until(lambda d, key=key: key in d.current_url)
        radio = browser.find_element(
            By.ID, browser.find_element(By.XPATH, f"//label[text()='{value}']").get_attribute("for")
        )
        assert radio.is_selected()

    browser.find_element(By.ID, "buy-now").click()
    reward = wait.until(ec.presence_of_element_located((By.ID, "reward")))
    assert float(reward.text) == 1.0
    assert browser.find_element(By.ID, "part-r_type").text == "1.0"
    assert "Thank you for shopping with us!" in browser.page_source


def test_browser_shows_escaped_query_and_error_pages(browser, server):
    browser.get(f"{server.url}/test_0/search?q=" + urllib.parse.quote("<img src=x onerror=alert(1)>"))
    from selenium.webdriver.common.by import By

    assert browser.find_element(By.ID, "current-query").text == "<img src=x onerror=alert(1)>"
    assert not browser.find_elements(By.CSS_SELECTOR, "#current-query img")
    browser.get(f"{server.url}/not_a_session")
    assert "unknown session" in browser.find_element(By.ID, "error").text
