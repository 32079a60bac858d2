"""Comparing runs: TrainJobs picked in the list, or found by a label selector, overlaid on one time axis aligned
by their start (progress, and each metric they all report), with a table of runtime, nodes, duration, final
state and final metrics; a link that reopens the comparison; its CSV and JSON; each TrainJob authorized as its
own page is, so a user of another namespace, or a comparison that names one TrainJob the caller may not read,
is refused whole."""

from __future__ import annotations

import csv
import io
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .find_support import SWEEP, indexed_sweep, record_sweep
from .progress_support import Story
from .support import browser, get, log_in, screenshot

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

FIVE = ["lr-1e-2", "lr-3e-3", "lr-1e-3", "lr-3e-4", "lr-1e-4"]


@pytest.fixture(scope="module")
def sweep(story: Story) -> Iterator[Story]:
    record_sweep(story)
    indexed_sweep(story)
    yield story


def _compare(story: Story, who: str = "viewer", **query: str | list[str]) -> tuple[int, bytes]:
    path = "/api/v1/compare?" + urllib.parse.urlencode(query, doseq=True)
    status, body, _ = get(story.server.url + path, story.tokens[who])
    return status, body


def test_the_api_compares_named_runs_or_a_label_selectors_aligned_by_start(sweep: Story) -> None:
    status, body = _compare(sweep, trainjob=[f"{sweep.namespace}/{n}" for n in FIVE])
    assert status == 200, body
    answer = json.loads(body)
    assert answer["metrics"] == ["loss"]
    runs = {r["name"]: r for r in answer["trainjobs"]}
    assert list(runs) == FIVE
    assert runs["lr-1e-3"]["finalMetrics"] == {"loss": "0.21"} and runs["lr-1e-3"]["state"] == "Complete"
    assert runs["lr-3e-4"]["runtime"] == "deepspeed" and runs["lr-3e-4"]["nodes"] == 4
    assert runs["lr-3e-4"]["state"] == "Running" and not runs["lr-3e-4"]["finished"]
    assert runs["lr-1e-4"]["state"] == "Failed" and runs["lr-1e-4"]["reason"] == "BackoffLimitExceeded"
    for run in runs.values():  # aligned by start: every series begins within seconds of 0
        assert 0 <= run["series"][0]["t"] < 10, run["series"][0]
        assert [p["metrics"]["loss"] for p in run["series"]] == [float(v) for v in SWEEP[run["name"]][4]]

    status, body = _compare(sweep, namespace=sweep.namespace, labelSelector="sweep=lr,!canary")
    assert status == 200 and sorted(r["name"] for r in json.loads(body)["trainjobs"]) == sorted(FIVE[:4])

    status, body = _compare(sweep, trainjob=[f"{sweep.namespace}/{n}" for n in FIVE[:2]], output="csv")
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert status == 200 and rows[0].keys() == {"trainjob", "seconds_since_start", "progress_percentage", "loss"}
    assert [r["loss"] for r in rows if r["trainjob"].endswith("lr-3e-3")] == ["2.0", "0.6", "0.28"]

    for bad in ({"trainjob": [f"{sweep.namespace}/lr-1e-2"]}, {"trainjob": ["not a key"]}, {"labelSelector": "x"}):
        status, body = _compare(sweep, **bad)
        assert status == 400, (bad, body)


def test_a_user_of_another_namespace_is_refused_and_one_unreadable_job_refuses_all(sweep: Story) -> None:
    status, body = _compare(sweep, "outsider", trainjob=[f"{sweep.namespace}/{n}" for n in FIVE[:3]])
    assert status == 403 and b"loss" not in body
    status, body = _compare(sweep, "outsider", namespace=sweep.namespace, labelSelector="sweep=lr")
    assert status == 403 and b"lr-" not in body
    status, body = _compare(sweep, trainjob=[f"{sweep.namespace}/lr-1e-2", f"{sweep.other}/hidden"])
    assert status == 403 and b"loss" not in body and b"lr-1e-2" not in body


def test_five_runs_picked_in_the_list_on_one_chart_with_a_link_and_downloads(sweep: Story, tmp_path: Path) -> None:
    driver = browser(tmp_path, width=1280, height=1100)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    try:
        driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        log_in(driver, sweep.server.url, sweep.tokens["viewer"])
        wait = WebDriverWait(driver, 20)
        driver.get(f"{sweep.server.url}/#/?labelSelector=sweep%3Dlr")
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#trainjobs tbody tr")) == 5)
        for name in FIVE:
            driver.find_element(By.CSS_SELECTOR, f'#trainjobs tr[data-name="{name}"] input.pick').click()
        wait.until(ec.element_to_be_clickable((By.ID, "compare-picked"))).click()
        wait.until(ec.visibility_of_element_located((By.ID, "compare-svg")))
        lines = driver.find_elements(By.CSS_SELECTOR, '#compare-svg polyline[data-metric="loss"]')
        assert sorted(line.get_attribute("data-pod").split("/")[1] for line in lines) == sorted(FIVE)
        assert len(driver.find_elements(By.CSS_SELECTOR, "#compare-svg .progress-line")) == 5
        table = driver.find_element(By.ID, "compare-table").text
        assert "deepspeed" in table and "Failed — BackoffLimitExceeded" in table and "0.21" in table
        screenshot(driver, "history-compare", tmp_path)

        # The link reopens the same comparison, in a new page.
        link = driver.find_element(By.ID, "compare-link").get_attribute("href")
        driver.get("about:blank")
        driver.get(link)
        wait.until(ec.visibility_of_element_located((By.ID, "compare-svg")))
        assert len(driver.find_elements(By.CSS_SELECTOR, '#compare-svg polyline[data-metric="loss"]')) == 5

        driver.find_element(By.ID, "compare-csv").click()
        driver.find_element(By.ID, "compare-json").click()
        saved_csv, saved_json = downloads / "trainjobs_compared.csv", downloads / "trainjobs_compared.json"
        wait.until(lambda _: saved_csv.exists() and saved_json.exists() and saved_json.stat().st_size > 0)
        assert len(json.loads(saved_json.read_text())["trainjobs"]) == 5
        assert "lr-1e-3" in saved_csv.read_text()

        # Another namespace's token opening the same link sees a refusal and nothing of the runs.
        driver.find_element(By.ID, "logout").click()
        log_in(driver, sweep.server.url, sweep.tokens["outsider"])
        driver.get(link)
        wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "may not"))
        assert not driver.find_elements(By.CSS_SELECTOR, "#compare-svg")
        assert "lr-1e-3" not in driver.find_element(By.TAG_NAME, "main").text
    finally:
        driver.quit()
