"""Retention and Run again in a real Chromium: the page says until when a TrainJob is kept, a deleted one is
in the list until then and leaves it after, and Run again is a button for whoever may create TrainJobs in the
namespace and for nobody else."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client as kube_client
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .keep_support import SHORT, Kept, publish
from .support import browser, listed_trainjobs, log_in, run_async, screenshot

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def _rows(driver: object) -> list[str]:
    return [name for _, name in listed_trainjobs(driver)]


def test_a_runner_runs_a_finished_trainjob_again_from_its_page(kept: Kept, tmp_path: Path) -> None:
    driver = browser(tmp_path)
    try:
        log_in(driver, kept.server.url, kept.tokens["runner"])
        driver.get(f"{kept.server.url}/#/ns/{kept.mine}/finished")
        wait = WebDriverWait(driver, 20)
        wait.until(ec.text_to_be_present_in_element((By.ID, "timeline-kept"), "Kept until"))
        assert "(1h after it ended)" in driver.find_element(By.ID, "timeline-kept").text
        wait.until(ec.visibility_of_element_located((By.ID, "run-again")))
        name = driver.find_element(By.ID, "run-again-name")
        name.clear()
        name.send_keys("finished-from-the-page")
        driver.find_element(By.ID, "run-again-go").click()
        link = wait.until(ec.visibility_of_element_located((By.ID, "run-again-link")))
        assert link.text == f"{kept.mine}/finished-from-the-page"
        assert link.get_attribute("href").endswith(f"#/ns/{kept.mine}/finished-from-the-page")
        screenshot(driver, "history-run-again", tmp_path)
        custom = kube_client.CustomObjectsApi(kept.api)
        made = custom.get_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", kept.mine, "trainjobs", "finished-from-the-page"
        )
        assert made["spec"]["runtimeRef"]["name"] == "torch-distributed"

        # The name taken: the API server's refusal, said next to the button.
        driver.find_element(By.ID, "run-again-go").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "run-again-said"), "already exists"))

        # No button for a TrainJob that still runs.
        driver.get(f"{kept.server.url}/#/ns/{kept.mine}/running")
        wait.until(ec.text_to_be_present_in_element((By.ID, "timeline-kept"), "Kept while it lives"))
        assert not driver.find_element(By.ID, "run-again").is_displayed()
    finally:
        driver.quit()


def test_a_viewer_reads_how_long_it_is_kept_and_is_not_offered_run_again(kept: Kept, tmp_path: Path) -> None:
    driver = browser(tmp_path, width=390, height=844, phone=True)
    try:
        log_in(driver, kept.server.url, kept.tokens["viewer"])
        driver.get(f"{kept.server.url}/#/ns/{kept.mine}/deleted")
        wait = WebDriverWait(driver, 20)
        wait.until(ec.text_to_be_present_in_element((By.ID, "timeline-kept"), "its history is kept until"))
        assert driver.find_element(By.ID, "timeline-kept").text.startswith("Deleted from the cluster")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#entries tbody tr")))
        time.sleep(1)  # the offer's answer is in by now: still no button
        assert not driver.find_element(By.ID, "run-again").is_displayed()
        width = driver.execute_script("return document.documentElement.scrollWidth")
        assert width <= 400, f"the page is {width}px wide on a 390px screen"
        screenshot(driver, "history-kept-until", tmp_path)
    finally:
        driver.quit()


def test_a_user_of_another_namespace_is_refused_the_page_and_offered_no_run_again(kept: Kept, tmp_path: Path) -> None:
    driver = browser(tmp_path)
    try:
        # The outsider may create TrainJobs, in another namespace: nothing of this one's page, no button.
        log_in(driver, kept.server.url, kept.tokens["outsider"])
        driver.get(f"{kept.server.url}/#/ns/{kept.mine}/finished")
        WebDriverWait(driver, 20).until(ec.text_to_be_present_in_element((By.ID, "error"), "may not get"))
        time.sleep(1)  # the offer's answer is in by now: still no button
        assert not driver.find_element(By.ID, "run-again").is_displayed()
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "Kept until" not in body and "AllJobsCompleted" not in body
    finally:
        driver.quit()


def test_a_deleted_trainjob_stays_in_the_list_until_it_expires_then_leaves_it(kept: Kept, tmp_path: Path) -> None:
    driver = browser(tmp_path)
    try:
        log_in(driver, kept.server.url, kept.tokens["runner"])
        run_async(lambda: publish(kept.nats_url, kept.admin_creds, kept.short, "fleeting", delete=True))
        driver.get(f"{kept.server.url}/#/?namespace={kept.short}")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: "fleeting" in _rows(d))
        driver.get(f"{kept.server.url}/#/ns/{kept.short}/fleeting")
        wait.until(ec.text_to_be_present_in_element((By.ID, "timeline-kept"), f"({SHORT:.0f}s after it ended)"))
        driver.get(f"{kept.server.url}/#/?namespace={kept.short}")
        WebDriverWait(driver, SHORT + 60).until(lambda d: _rows(d) == ["lives"])  # the list reads itself again
        driver.get(f"{kept.server.url}/#/ns/{kept.short}/fleeting")
        wait.until(ec.visibility_of_element_located((By.ID, "error")))
        assert "no history" in driver.find_element(By.ID, "error").text
    finally:
        driver.quit()
