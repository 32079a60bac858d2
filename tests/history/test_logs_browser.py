"""A TrainJob page's logs panel and export in a real Chromium, as the TrainJob's owner reads them: the newest lines
of a kept log and its download, the whole record saved as one JSON-lines file, what could not be kept said in
words, and a simulated cluster's TrainJob said to have no logs because the cluster runs no containers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from .logs_support import DONE_LOG, Kept
from .support import browser, log_in

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def _open(driver: Any, world: Kept, name: str) -> WebDriverWait:  # type: ignore[type-arg]
    driver.get(f"{world.server.url}/#/ns/{world.namespace}/{name}")
    wait = WebDriverWait(driver, 20)
    wait.until(lambda d: d.find_element(By.ID, "logs-note").text.strip())
    return wait


def test_the_logs_panel_shows_a_tail_downloads_the_log_and_exports_the_record(kept_logs: Kept, tmp_path: Path) -> None:
    driver = browser(tmp_path)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    try:
        driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
        log_in(driver, kept_logs.server.url, kept_logs.tokens["viewer"])
        wait = _open(driver, kept_logs, "done")
        wait.until(lambda d: "done: loss 0.083" in d.find_element(By.ID, "logs-tail").text)
        assert driver.find_element(By.ID, "logs-tail").text.splitlines() == DONE_LOG.splitlines()
        assert "when it finished" in driver.find_element(By.ID, "logs-note").text
        options = driver.find_elements(By.CSS_SELECTOR, "#logs-container option")
        assert [o.text.split(" (")[0] for o in options] == ["done-node-0-0 / node"]
        assert not driver.find_element(By.ID, "logs-capture").is_displayed()  # finished: kept already

        wait.until(ec.element_to_be_clickable((By.ID, "logs-download"))).click()
        saved = downloads / f"{kept_logs.namespace}_done_done-node-0-0_node.log"
        wait.until(lambda _: saved.exists() and saved.stat().st_size > 0)
        assert saved.read_text() == DONE_LOG

        wait.until(ec.element_to_be_clickable((By.ID, "export-record"))).click()
        record = downloads / f"{kept_logs.namespace}_done.jsonl"
        wait.until(lambda _: record.exists() and record.stat().st_size > 0)
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        assert lines[0]["record"] == "trainjob" and lines[-1] == {
            "record": "log",
            "pod": "done-node-0-0",
            "container": "node",
            "kept": True,
            "complete": True,
            "text": DONE_LOG,
        }
    finally:
        driver.quit()


def test_the_panel_says_what_is_missing_and_that_a_simulated_cluster_runs_no_containers(
    kept_logs: Kept, tmp_path: Path
) -> None:
    driver = browser(tmp_path)
    try:
        log_in(driver, kept_logs.server.url, kept_logs.tokens["viewer"])
        _open(driver, kept_logs, "lost")
        missing = driver.find_element(By.ID, "logs-missing").text
        assert "lost-node-0-0 / node: not kept: the node's kubelet could not be reached" in missing
        assert not driver.find_element(By.ID, "logs-controls").is_displayed()
        _open(driver, kept_logs, "gone")
        WebDriverWait(driver, 20).until(
            lambda d: "the TrainJob's JobSet is gone" in d.find_element(By.ID, "logs-missing").text
        )
        _open(driver, kept_logs, "sim")
        WebDriverWait(driver, 20).until(lambda d: "runs no containers" in d.find_element(By.ID, "logs-note").text)
        assert driver.find_element(By.ID, "logs-missing").text == ""
    finally:
        driver.quit()
