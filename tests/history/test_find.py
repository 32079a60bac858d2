"""Finding runs: the list filters by label selector, runtime, state, creation time and the newest value of a
metric, sorts by any of them and pages, over the JSON API and in a real Chromium, under the same per-namespace
authorization as the rest of the server; a user of another namespace is refused whatever the query says."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .find_support import SWEEP, indexed_sweep, record_sweep
from .progress_support import Story
from .support import browser, get, log_in, screenshot

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


@pytest.fixture(scope="module")
def sweep(story: Story) -> Iterator[Story]:
    record_sweep(story)
    indexed_sweep(story)
    yield story


def _find(story: Story, who: str = "viewer", **query: str) -> tuple[int, dict[str, Any]]:
    path = f"/api/v1/namespaces/{story.namespace}/trainjobs?" + urllib.parse.urlencode(query)
    status, body, _ = get(story.server.url + path, story.tokens[who])
    return status, json.loads(body)


def _names(story: Story, **query: str) -> list[str]:
    status, answer = _find(story, **query)
    assert status == 200, answer
    return [j["name"] for j in answer["items"]]


def test_the_api_finds_by_label_runtime_state_time_and_newest_metric(sweep: Story) -> None:
    assert sorted(_names(sweep, labelSelector="sweep=lr")) == sorted(n for n in SWEEP if n.startswith("lr-"))
    assert _names(sweep, labelSelector="sweep=lr,!canary", metric="loss < 0.3", sort="metric:loss") == [
        "lr-1e-3",
        "lr-3e-3",
    ]
    assert _names(sweep, labelSelector="team in (nlp)", runtime="deepspeed") == ["lr-3e-4"]
    assert _names(sweep, labelSelector="team", state="Failed") == ["lr-1e-4"]
    window = {"from": "2026-11-03", "to": "2026-11-04T12:00:00Z"}
    assert _names(sweep, labelSelector="team", **window, sort="created") == ["lr-1e-3", "lr-3e-4"]
    status, page = _find(sweep, labelSelector="team", sort="name", limit="2", offset="2")
    assert status == 200 and page["total"] == 6 and page["offset"] == 2 and page["truncated"]
    assert [j["name"] for j in page["items"]] == ["lr-1e-4", "lr-3e-3"]
    assert page["items"][0]["labels"] == {"sweep": "lr", "team": "nlp", "canary": ""}
    status, answer = _find(sweep, labelSelector="sweep in lr")
    assert status == 400 and "selector" in answer["error"]
    status, answer = _find(sweep, metric="loss <")
    assert status == 400 and "metric condition" in answer["error"]


def test_a_user_of_another_namespace_is_refused_whatever_the_query(sweep: Story) -> None:
    for query in ({"labelSelector": "sweep=lr"}, {"metric": "loss < 0.3"}, {"sort": "-metric:loss", "limit": "1"}):
        status, answer = _find(sweep, "outsider", **query)
        assert status == 403, answer
        assert not any(name in json.dumps(answer) for name in SWEEP)
    # Every namespace at once is for whoever may list them all: the namespace's viewer may not.
    status, body, _ = get(f"{sweep.server.url}/api/v1/trainjobs?labelSelector=sweep%3Dlr", sweep.tokens["viewer"])
    assert status == 403 and b"lr-" not in body


def test_the_list_finds_sorts_and_keeps_the_query_in_its_address(sweep: Story, tmp_path: Path) -> None:
    driver = browser(tmp_path, width=1280, height=1000)
    try:
        log_in(driver, sweep.server.url, sweep.tokens["viewer"])
        wait = WebDriverWait(driver, 20)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#trainjobs tr[data-name="lr-1e-3"]')))
        driver.find_element(By.ID, "filter-labels").send_keys("sweep=lr")
        driver.find_element(By.ID, "filter-metric").send_keys("loss < 0.4")
        driver.find_element(By.ID, "find").click()
        wait.until(lambda d: "labelSelector=" in d.current_url)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#trainjobs tbody tr")) == 3)
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element(By.ID, "filter-sort")).select_by_value("metric:loss")
        wait.until(lambda d: "sort=metric" in d.current_url)

        def shown(d: Any) -> list[str]:
            return [r.get_attribute("data-name") for r in d.find_elements(By.CSS_SELECTOR, "#trainjobs tbody tr")]

        wait.until(lambda d: shown(d) == ["lr-1e-3", "lr-3e-3", "lr-3e-4"])
        assert "1\u20133 of 3" in driver.find_element(By.ID, "list-note").text
        assert "sweep=lr" in driver.find_element(By.CSS_SELECTOR, '#trainjobs tr[data-name="lr-1e-3"] .labels').text
        screenshot(driver, "history-find", tmp_path)

        # The address reopens the same list, in a new page.
        address = driver.current_url
        driver.get("about:blank")
        driver.get(address)
        wait.until(lambda d: shown(d) == ["lr-1e-3", "lr-3e-3", "lr-3e-4"])
        assert driver.find_element(By.ID, "filter-labels").get_attribute("value") == "sweep=lr"

        # A query the server cannot read is said under the form, which keeps what was typed.
        labels = driver.find_element(By.ID, "filter-labels")
        labels.clear()
        labels.send_keys("sweep in lr")
        driver.find_element(By.ID, "find").click()
        error = wait.until(ec.visibility_of_element_located((By.ID, "list-error")))
        assert "selector" in error.text
        assert driver.find_element(By.ID, "filter-labels").get_attribute("value") == "sweep in lr"
        assert not driver.find_elements(By.CSS_SELECTOR, "#trainjobs tbody tr")

        # A user who may read none of it, opening the same search in the sweep's namespace, sees nothing of it.
        driver.find_element(By.ID, "logout").click()
        log_in(driver, sweep.server.url, sweep.tokens["outsider"])
        driver.get(f"{sweep.server.url}/#/?namespace={sweep.namespace}&labelSelector=sweep%3Dlr&sort=metric%3Aloss")
        wait.until(ec.text_to_be_present_in_element((By.ID, "list-note"), "No namespace in the history is readable"))
        assert not driver.find_elements(By.CSS_SELECTOR, "#trainjobs tbody tr")
        assert "lr-" not in driver.find_element(By.TAG_NAME, "main").text
    finally:
        driver.quit()


def test_the_page_shows_the_version_and_links_the_data_scientists_guide(sweep: Story, tmp_path: Path) -> None:
    from importlib.metadata import version

    from tjpipe import about

    status, body, _ = get(f"{sweep.server.url}/api/v1/docs")
    assert status == 200 and json.loads(body) == {"dataScientists": about.DATA_SCIENTISTS_GUIDE}
    status, guide, _ = get(f"{sweep.server.url}{about.DATA_SCIENTISTS_GUIDE}")
    assert status == 200 and b"<h1>For data scientists</h1>" in guide and b"kubectl -n my-team create token" in guide
    driver = browser(tmp_path)
    try:
        driver.get(sweep.server.url + "/")
        link = WebDriverWait(driver, 20).until(ec.visibility_of_element_located((By.ID, "docs-link")))
        assert link.get_attribute("href") == sweep.server.url + about.DATA_SCIENTISTS_GUIDE
        assert not driver.find_element(By.ID, "version").text  # told only to whoever logged in
        log_in(driver, sweep.server.url, sweep.tokens["viewer"])
        shown = WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "version").text)
        assert shown == f"trainjob-pipeline {version('trainjob-pipeline')}"
    finally:
        driver.quit()
