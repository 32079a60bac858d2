// A TrainJob page's logs panel and its export, loaded after app.js (whose helpers it uses): what the history
// server kept of the pods' logs (the newest lines of each container's, the whole of it as a download, what
// could not be kept and why), a button to keep them now while the TrainJob runs, and the whole record as one
// file. Every log line is written with textContent, never as markup.
"use strict";

let logsView = null;

async function drawLogs(base, job) {
  logsView = { base, job, kept: null };
  $("logs-note").textContent = "";
  $("logs-missing").replaceChildren();
  $("logs-tail").textContent = "";
  $("logs-container").replaceChildren();
  $("logs-controls").hidden = true;
  $("logs-capture").hidden = true;
  $("logs-panel").hidden = false;
  let data;
  try {
    data = await api(base + "/logs");
  } catch (error) {
    if (error instanceof HttpError && error.status === 404) {
      // At a fleet's hub there is no logs bucket: each cluster keeps its pods' logs on its own bus.
      $("logs-note").textContent = job.cluster ? "Logs are kept on each cluster's own history server, not in the fleet's." : error.message + ".";
      return;
    }
    throw error;
  }
  if (!logsView || logsView.base !== base) return;
  showKept(data);
}

function showKept(data) {
  const kept = data.kept;
  logsView.kept = kept;
  $("logs-capture").hidden = !(data.captures && !data.finished);
  if (!kept) {
    $("logs-note").textContent = !data.captures ? "This history server keeps no logs."
      : data.finished ? "No log of this TrainJob was kept." : "Its pods' logs are kept when it finishes; keep them now with the button.";
    return;
  }
  const when = `${day(kept.capturedAt)} ${clock(kept.capturedAt)} UTC`;
  const notes = [`Kept ${when}, ${kept.reason === "finished" ? "when it finished" : "on request while it ran"}`];
  if (kept.noContainers) notes.push("this cluster runs no containers (a simulated cluster), so its pods wrote no logs");
  $("logs-note").textContent = notes.join("; ") + ".";
  $("logs-missing").replaceChildren(...kept.missing.filter((m) => m.why !== "no-containers").map((m) => {
    const where = m.pod ? `${m.pod}${m.container ? " / " + m.container : ""}: ` : "";
    return el("li", { text: `${where}not kept: ${m.reason}${m.detail ? " (" + m.detail + ")" : ""}` });
  }));
  $("logs-container").replaceChildren(...kept.pieces.map((p, i) =>
    el("option", { value: String(i), text: `${p.pod} / ${p.container} (${bytes(p.bytes)})` })));
  $("logs-controls").hidden = !kept.pieces.length;
  if (kept.pieces.length) showTail().catch(fail);
}

function logPath(piece) {
  return `${logsView.base}/logs/${encodeURIComponent(piece.pod)}/${encodeURIComponent(piece.container)}`;
}

function chosenPiece() { return logsView.kept.pieces[Number($("logs-container").value || 0)]; }

async function showTail() {
  const piece = chosenPiece();
  const data = await api(logPath(piece) + "?tail=200");
  const notes = [];
  if (data.totalLines > data.lines.length) notes.push(`the last ${data.lines.length} of ${data.totalLines} lines`);
  if (data.truncated) notes.push("the log was longer than a capture keeps: its start and its newest lines were kept");
  if (data.redacted) notes.push(`${data.redacted} secret(s) blanked out`);
  if (!data.complete) notes.push("part of it is no longer kept (the logs bucket's limits)");
  $("logs-tail-note").textContent = notes.join("; ");
  $("logs-tail").textContent = data.lines.join("\n");
}

// Fetched with the token (a plain link could not send it) and handed to the browser as a file.
async function downloadFile(path, filename, type) {
  const text = await api(path, { text: true });
  const link = el("a", { href: URL.createObjectURL(new Blob([text], { type })), download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function fileStem() {
  const j = logsView.job;
  return `${j.cluster ? j.cluster + "_" : ""}${j.namespace}_${j.name}`;
}

async function captureNow() {
  const base = logsView.base;
  $("logs-capture").disabled = true;
  try {
    const response = await fetch(base + "/logs/capture", { method: "POST", headers: { "Authorization": "Bearer " + token() }, cache: "no-store" });
    if (!response.ok) {
      let message = response.statusText;
      try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
      throw new HttpError(response.status, message);
    }
    await drawLogs(base, logsView.job);
  } finally {
    $("logs-capture").disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("logs-container").addEventListener("change", () => showTail().catch(fail));
  $("logs-download").addEventListener("click", () => {
    const piece = chosenPiece();
    downloadFile(logPath(piece) + "?output=download", `${fileStem()}_${piece.pod}_${piece.container}.log`, "text/plain").catch(fail);
  });
  $("logs-capture").addEventListener("click", () => captureNow().catch(fail));
  $("export-record").addEventListener("click", () =>
    downloadFile(logsView.base + "/export", `${fileStem()}.jsonl`, "application/x-ndjson").catch(fail));
});
