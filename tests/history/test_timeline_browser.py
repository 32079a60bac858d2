"""A TrainJob's page in a real Chromium as its owner reads it: the progress and each metric charted, the job's
own states in a lane with Trainer's reasons, plain words (the pipeline's record one click away, opening
where it was clicked), a dated time axis, a skipped write not drawn as a success, the same event count in
the list and on the page, the CSV download, and nothing of the page before left on screen after a refusal.
"""

from __future__ import annotations

import asyncio
import csv
import time
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from plumbing import bus

from .progress_support import _COMPLETE as COMPLETE
from .progress_support import LOSS, Story, _publish_event
from .support import browser, log_in, run_async, screenshot

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

GREEN = "rgb(46, 139, 87)"
PIPELINE_WORDS = ("rv ", "policy ", "TJ_EVENTS", "TJ_RESULTS", "wire_version", "observed_at", "source_seq")


def _open_gamma(driver: Any, story: Story) -> WebDriverWait:  # type: ignore[type-arg]
    driver.get(f"{story.server.url}/#/ns/{story.namespace}/gamma")
    wait = WebDriverWait(driver, 20)
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#timeline-svg .progress-line")))
    return wait


def _in_view(driver: Any, element: Any) -> bool:
    return bool(
        driver.execute_script(
            "const r = arguments[0].getBoundingClientRect();"
            "return r.height > 0 && r.top >= 0 && r.top < window.innerHeight;",
            element,
        )
    )


def test_the_page_charts_progress_and_metrics_above_the_states_and_speaks_plainly(story: Story, tmp_path: Path) -> None:
    driver = browser(tmp_path, width=1280, height=1000)
    try:
        log_in(driver, story.server.url, story.tokens["viewer"])
        wait = WebDriverWait(driver, 20)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#trainjobs tr[data-name="gamma"]')))
        row = driver.find_element(By.CSS_SELECTOR, '#trainjobs tr[data-name="gamma"]')
        assert "96% · accuracy 0.84 · loss 0.31" in row.text
        listed_events = int(row.find_elements(By.CSS_SELECTOR, "td")[-2].text)
        screenshot(driver, "history-progress-list", tmp_path)

        _open_gamma(driver, story)
        # The chart: progress, and a line per numeric metric ("phase" is not a number), above the state lane.
        progress = driver.find_element(By.CSS_SELECTOR, "#timeline-svg .progress-line")
        assert len(progress.get_attribute("points").split()) == len(LOSS)
        metrics = {m.get_attribute("data-metric") for m in driver.find_elements(By.CSS_SELECTOR, ".metric-line")}
        assert metrics == {"accuracy", "loss"}
        phases = driver.find_elements(By.CSS_SELECTOR, "#timeline-svg rect.phase")
        assert [p.get_attribute("data-state") for p in phases] == ["Created", "Running", "Complete"]
        assert progress.rect["y"] + progress.rect["height"] <= phases[0].rect["y"]
        first_plan = driver.find_element(By.CSS_SELECTOR, "#timeline-svg .mark.plan")
        assert phases[0].rect["y"] < first_plan.rect["y"]

        # The owner's words: state, reason and durations; no pipeline vocabulary outside the record panel.
        facts = driver.find_element(By.ID, "timeline-facts").text
        assert facts.startswith("Complete — AllJobsCompleted · ran "), facts
        assert f"{listed_events} event(s)" in facts
        states = driver.find_element(By.ID, "states").text
        assert "Created" in states and "Running" in states and "AllJobsCompleted" in states
        latest = driver.find_element(By.ID, "progress-latest").text
        assert latest.startswith("96% done · accuracy 0.84 · loss 0.31")
        shown = driver.find_element(By.ID, "timeline-view").text
        assert not [w for w in PIPELINE_WORDS if w in shown], shown
        assert "Complete — AllJobsCompleted: jobset completed successfully" in shown
        axis = " ".join(t.text for t in driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .tick.date"))
        assert any(str(year) in axis for year in range(2025, 2100)), axis

        # A write left as it was is not drawn like a success.
        skipped = driver.find_element(By.CSS_SELECTOR, "#timeline-svg .mark.result.skipped")
        assert skipped.value_of_css_property("fill") != GREEN
        done = driver.find_elements(By.CSS_SELECTOR, "#timeline-svg .mark.result.ok")
        assert done and all(m.value_of_css_property("fill") == GREEN for m in done)
        chip = driver.find_element(By.CSS_SELECTOR, "#entries tr.skipped .kind")
        assert chip.text == "skipped" and chip.value_of_css_property("color") != GREEN

        driver.execute_script("window.scrollTo(0, 0)")
        screenshot(driver, "history-progress", tmp_path)

        # The pipeline's record is one click away and opens where it was asked for, in view.
        rows = driver.find_elements(By.CSS_SELECTOR, "#entries tbody tr.result")
        driver.execute_script("arguments[0].scrollIntoView({block: 'end'})", rows[-1])
        rows[-1].click()
        detail = wait.until(ec.visibility_of_element_located((By.ID, "detail")))
        assert _in_view(driver, detail)
        assert "TJ_RESULTS #" in driver.find_element(By.ID, "detail-summary").text
        screenshot(driver, "history-progress-detail", tmp_path)
        driver.execute_script("window.scrollTo(0, 0)")
        driver.find_element(By.CSS_SELECTOR, "#timeline-svg .mark.event").click()
        assert _in_view(driver, wait.until(ec.visibility_of_element_located((By.ID, "detail"))))
    finally:
        driver.quit()


def test_the_csv_download_saves_the_series(story: Story, tmp_path: Path) -> None:
    driver = browser(tmp_path)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    try:
        driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        log_in(driver, story.server.url, story.tokens["viewer"])
        wait = _open_gamma(driver, story)
        wait.until(ec.element_to_be_clickable((By.ID, "download-csv"))).click()
        saved = downloads / f"{story.namespace}_gamma_progress.csv"
        wait.until(lambda _: saved.exists() and saved.stat().st_size > 0)
        with saved.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert [float(r["loss"]) for r in rows] == list(LOSS)
    finally:
        driver.quit()


def test_a_refused_page_keeps_no_facts_or_counts_of_the_page_before(story: Story, tmp_path: Path) -> None:
    driver = browser(tmp_path)
    try:
        log_in(driver, story.server.url, story.tokens["viewer"])
        wait = WebDriverWait(driver, 20)
        note = wait.until(ec.visibility_of_element_located((By.ID, "list-note")))
        wait.until(lambda _: "TrainJob(s)" in note.text)

        # A namespace the token may not read, opened by URL after the readable list.
        driver.get(f"{story.server.url}/#/?namespace={story.other}")
        error = wait.until(ec.visibility_of_element_located((By.ID, "error")))
        assert "may not list" in error.text
        assert not driver.find_element(By.ID, "list-note").is_displayed() or not note.text
        assert not driver.find_elements(By.CSS_SELECTOR, "#trainjobs tbody tr")

        # A TrainJob of that namespace, opened by URL after a readable TrainJob's page.
        _open_gamma(driver, story)
        assert "AllJobsCompleted" in driver.find_element(By.ID, "timeline-facts").text
        driver.get(f"{story.server.url}/#/ns/{story.other}/hidden")
        wait.until(ec.text_to_be_present_in_element((By.ID, "error"), "may not get"))
        for gone in ("timeline-facts", "states", "progress-now", "timeline-title"):
            element = driver.find_element(By.ID, gone)
            assert not element.is_displayed() or not element.text, gone
        assert not driver.find_elements(By.CSS_SELECTOR, "#timeline-svg")
        assert not driver.find_elements(By.CSS_SELECTOR, "#entries tbody tr")
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "gamma" not in body and "AllJobsCompleted" not in body and "event(s)" not in body
        screenshot(driver, "history-refused", tmp_path)

        # Back to a readable page: it is drawn again in full.
        _open_gamma(driver, story)
        assert driver.find_element(By.ID, "timeline-facts").text.startswith("Complete")
    finally:
        driver.quit()


def test_the_list_with_progress_and_the_page_with_its_chart_fit_a_phone(story: Story, tmp_path: Path) -> None:
    driver = browser(tmp_path, width=390, height=844, phone=True)
    try:
        log_in(driver, story.server.url, story.tokens["viewer"])
        wait = WebDriverWait(driver, 20)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, '#trainjobs tr[data-name="gamma"] td.progress')))
        for page in ("list", "timeline"):
            if page == "timeline":
                _open_gamma(driver, story)
            width = driver.execute_script("return document.documentElement.scrollWidth")
            assert width <= 400, f"the {page} is {width}px wide on a 390px screen"
    finally:
        driver.quit()


def test_a_finished_job_never_reads_as_waiting_again_between_its_last_pod_and_complete(
    story: Story, tmp_path: Path
) -> None:
    """The moment between a job's last pod ending (no pod active, some succeeded) and Trainer's Complete
    condition is the end of its run, not a return to waiting for pods."""
    finishing = {"jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 2}]}

    async def publish() -> None:
        nc = await bus.connect(story.nats_url, name="test-history-finishing", creds=story.admin_creds)
        try:
            js = nc.jetstream()
            for rv, status in enumerate((None, {"jobsStatus": [{"name": "node", "active": 2}]}, finishing, COMPLETE)):
                await _publish_event(js, story.namespace, "epsilon", status, str(rv + 1))
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    run_async(publish)
    driver = browser(tmp_path)
    try:
        log_in(driver, story.server.url, story.tokens["viewer"])
        driver.get(f"{story.server.url}/#/ns/{story.namespace}/epsilon")
        wait = WebDriverWait(driver, 20)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#timeline-svg rect.phase")))
        lane = [
            p.get_attribute("data-state") for p in driver.find_elements(By.CSS_SELECTOR, "#timeline-svg rect.phase")
        ]
        assert lane == ["Created", "Running", "Complete"], lane
        listed = [i.get_attribute("data-state") for i in driver.find_elements(By.CSS_SELECTOR, "#states li")]
        assert listed == ["Created", "Running", "Complete"], listed
        assert "Waiting for its pods" not in driver.find_element(By.ID, "entries").text
    finally:
        driver.quit()


SLOW_FIRST_WHOAMI = """
(() => {
  const fetched = window.fetch.bind(window);
  let first = true;
  window.fetch = (url, options) => {
    if (first && String(url).includes("/whoami")) {
      first = false;
      return new Promise((resolve) => setTimeout(resolve, 2500)).then(() => fetched(url, options));
    }
    return fetched(url, options);
  };
})();
"""


def test_on_a_phone_a_viewer_going_from_the_list_to_a_page_by_its_address_sees_the_page(
    story: Story, tmp_path: Path
) -> None:
    """At 390x844, a namespace viewer on the list (``#/``) who opens a TrainJob's address sees that page and
    nothing of the list, also when an answer the list was waiting for (a phone's network: the page's first
    who-am-I) arrives after the page was drawn, and after the list's own refresh would have come round."""
    driver = browser(tmp_path, width=390, height=844, phone=True)
    try:
        log_in(driver, story.server.url, story.tokens["viewer"])
        wait = WebDriverWait(driver, 20)
        wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, '#trainjobs tr[data-name="gamma"]')))
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": SLOW_FIRST_WHOAMI})
        for navigate in ("reloaded", "same page"):
            if navigate == "reloaded":
                driver.refresh()  # the list (#/) loads again, its who-am-I slow; the address changes meanwhile
                time.sleep(0.5)
            else:
                driver.get(f"{story.server.url}/#/")
                wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, '#trainjobs tr[data-name="gamma"]')))
            driver.execute_script(f"location.hash = '#/ns/{story.namespace}/gamma'")
            wait.until(ec.visibility_of_element_located((By.ID, "timeline-svg")))
            for _ in range(14):  # past the slow answer and through one of the list's refreshes
                assert driver.execute_script("return location.hash").endswith("/gamma")
                assert not driver.find_element(By.ID, "list-view").is_displayed(), navigate
                assert driver.find_element(By.ID, "timeline-view").is_displayed(), navigate
                time.sleep(0.5)
    finally:
        driver.quit()
