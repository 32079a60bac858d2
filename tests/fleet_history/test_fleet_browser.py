"""The fleet's UI in a real Chromium: log in with a token of cluster A, chosen as A's at the login, and see
A's TrainJobs with their cluster named on every row and on the opened timeline, and nothing of B."""

from __future__ import annotations

from pathlib import Path

import pytest
from history.support import browser, screenshot
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from .conftest import LOSS, NAMESPACE, World

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(180)]


def test_the_list_and_a_timeline_name_the_cluster_and_show_nothing_of_b(world: World, tmp_path: Path) -> None:
    driver = browser(tmp_path)
    try:
        wait = WebDriverWait(driver, 20)
        driver.get(world.server.url + "/")
        wait.until(ec.visibility_of_element_located((By.ID, "login-cluster")))
        Select(driver.find_element(By.ID, "login-cluster")).select_by_value("a")
        driver.find_element(By.ID, "token").send_keys(world.clusters["a"].viewer)
        driver.find_element(By.ID, "login").click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#trainjobs tbody tr")))
        rows = driver.find_elements(By.CSS_SELECTOR, "#trainjobs tbody tr")
        assert sorted((r.get_attribute("data-cluster"), r.get_attribute("data-name")) for r in rows) == [
            ("a", "alpha"),
            ("a", "shared"),
        ]
        assert sorted(c.text for c in driver.find_elements(By.CSS_SELECTOR, "#trainjobs tbody td.cluster")) == [
            "a",
            "a",
        ]
        assert driver.find_element(By.ID, "col-cluster").is_displayed()
        assert driver.find_element(By.ID, "who").text.endswith(" on a")
        assert not driver.find_element(By.ID, "nav-health").is_displayed()
        assert LOSS["b"] not in driver.page_source and "beta" not in driver.page_source
        screenshot(driver, "fleet-history-list", tmp_path)

        driver.find_element(By.CSS_SELECTOR, '#trainjobs tr[data-name="shared"] a').click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#timeline-svg .mark")))
        assert driver.find_element(By.ID, "timeline-title").text == f"a: {NAMESPACE}/shared"
        assert "cluster a" in driver.find_element(By.ID, "timeline-facts").text
        assert f"loss {LOSS['a']}" in driver.find_element(By.ID, "progress-latest").text

        # B's TrainJob of the same name, asked for by its address: refused, and nothing of A's page stays.
        driver.get(f"{world.server.url}/#/c/b/ns/{NAMESPACE}/shared")
        wait.until(ec.visibility_of_element_located((By.ID, "login-view")))
        assert LOSS["b"] not in driver.page_source
        assert not driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .mark")
    finally:
        driver.quit()
