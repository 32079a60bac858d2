"""The UI in a real Chromium: log in with a token, read the list, open a timeline, and see nothing of a
namespace the token may not read. The ``tjpipe up --demo`` test opens the demo TrainJob's timeline on
the stack ``up`` printed the URL and login token of."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .conftest import World
from .support import browser, listed_trainjobs, log_in, screenshot

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def test_a_reader_of_a_sees_a_in_the_ui_and_nothing_of_b(world: World, tmp_path: Path) -> None:
    a, b = world.a, world.b
    driver = browser(tmp_path)
    try:
        log_in(driver, world.server.url, world.token("viewer-a"))
        wait = WebDriverWait(driver, 20)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#trainjobs tbody tr")))
        assert listed_trainjobs(driver) == [(a.namespace, "alpha")]
        options = [o.get_attribute("value") for o in driver.find_elements(By.CSS_SELECTOR, "#filter-namespace option")]
        assert options == [a.namespace]
        assert b.namespace not in driver.page_source and "beta" not in driver.page_source

        driver.get(f"{world.server.url}/#/ns/{b.namespace}/beta")
        wait.until(ec.visibility_of_element_located((By.ID, "error")))
        assert "may not get" in driver.find_element(By.ID, "error").text
        assert not driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .mark")
        assert not driver.find_elements(By.CSS_SELECTOR, "#entries tbody tr")
        screenshot(driver, "history-forbidden", tmp_path)
    finally:
        driver.quit()


def test_a_timeline_draws_every_entry_and_dead_letters_in_red_with_plans_a_click_away(
    world: World, tmp_path: Path
) -> None:
    a = world.a
    driver = browser(tmp_path, width=390, height=844, phone=True)
    try:
        log_in(driver, world.server.url, world.token("viewer-a"))
        driver.get(f"{world.server.url}/#/ns/{a.namespace}/alpha")
        wait = WebDriverWait(driver, 20)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#timeline-svg .mark")))
        marks = driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .mark")
        entries = driver.find_elements(By.CSS_SELECTOR, "#entries tbody tr")
        assert len(marks) == len(entries) >= 9
        red = driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .mark.dead-letter")
        assert len(red) == 1
        assert red[0].value_of_css_property("fill") in ("rgb(214, 40, 40)", "#d62828")

        plans = driver.find_elements(By.CSS_SELECTOR, "#entries tbody tr.plan")
        plans[-1].click()
        wait.until(ec.element_to_be_clickable((By.ID, "show-diff"))).click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "detail-body"), "parallelism"))
        driver.find_element(By.ID, "show-plan").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "detail-body"), "kind: JobSet"))
        width = driver.execute_script("return document.documentElement.scrollWidth")
        assert width <= 400, f"the page is {width}px wide on a 390px screen"
        driver.execute_script("window.scrollTo(0, 0)")
        screenshot(driver, "history-phone-timeline", tmp_path)
    finally:
        driver.quit()


def test_up_demo_prints_the_history_url_and_token_and_its_timeline_shows_the_demo(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NATS_URL", "NATS_CREDS")}
    run = [sys.executable, "-m", "tjpipe"]
    up = subprocess.run(
        [*run, "up", "--demo", "--detach", "--control-plane-only"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        url = re.search(r"history UI:\s+(http://127\.0\.0\.1:\d+)", up.stderr)
        token = re.search(r"log in with the stack's admin token: (\S+)", up.stderr)
        assert url and token, up.stderr
        driver = browser(tmp_path)
        try:
            log_in(driver, url.group(1), token.group(1))
            wait = WebDriverWait(driver, 60)
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#trainjobs tr[data-name="mnist"]')))
            assert not driver.find_element(By.ID, "filter-cluster-row").is_displayed()  # one cluster: no picker
            screenshot(driver, "history-list", tmp_path)
            driver.find_element(By.LINK_TEXT, "mnist").click()
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#timeline-svg .mark.result")))
            assert driver.find_element(By.ID, "timeline-title").text == "tjpipe-demo/mnist"
            assert "runtime torch-distributed" in driver.find_element(By.ID, "timeline-facts").text
            assert driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .mark.event")
            assert driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .mark.plan")
            texts = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#entries tbody tr")]
            assert any("Created JobSet mnist" in t for t in texts), texts
            screenshot(driver, "history-timeline", tmp_path)
            driver.find_element(By.ID, "nav-health").click()
            wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#lag tbody tr")))
            assert "refused publishes" in driver.find_element(By.ID, "health-cards").text
            screenshot(driver, "history-health", tmp_path)
        finally:
            driver.quit()
    finally:
        subprocess.run([*run, "down"], cwd=tmp_path, env=env, capture_output=True, timeout=120, check=False)
