// The history server's UI: plain DOM, no framework, no build step, nothing fetched but this server's API.
// Every piece of record data is written with textContent or as an SVG attribute, never as markup.
"use strict";

const TOKEN_KEY = "tjpipe-history-token";
const CLUSTERS_KEY = "tjpipe-history-clusters";
const SVG = "http://www.w3.org/2000/svg";
const LANES = ["event", "plan", "result", "dead-letter"];
const LANE_NAMES = { "event": "events", "plan": "plans", "result": "results", "dead-letter": "dead letters" };
const $ = (id) => document.getElementById(id);

let me = null;
let listCache = { key: "", items: [] };
// At a fleet's hub: every cluster's name (null on a single cluster's server). The token goes to the clusters
// chosen at log-in only (none chosen: every cluster), and a TrainJob's cluster is in every path asked for it.
let fleet = null;

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

function chosenClusters() { return (sessionStorage.getItem(CLUSTERS_KEY) || "").split(",").filter(Boolean); }

function clusterQuery(names) { return names.map((c) => "cluster=" + encodeURIComponent(c)).join("&"); }

function jobPath(cluster, namespace, name) {
  const ns = `/namespaces/${encodeURIComponent(namespace)}/trainjobs/${encodeURIComponent(name)}`;
  return cluster ? `/api/v1/clusters/${encodeURIComponent(cluster)}${ns}` : `/api/v1${ns}`;
}

function jobLink(j) {
  const tail = `${encodeURIComponent(j.namespace)}/${encodeURIComponent(j.name)}`;
  return j.cluster ? `#/c/${encodeURIComponent(j.cluster)}/ns/${tail}` : `#/ns/${tail}`;
}

async function findFleet() {
  const response = await fetch("/api/v1/clusters", { cache: "no-store" });
  fleet = response.ok ? (await response.json()).items : null;
  const select = $("login-cluster");
  // A token goes to the one cluster chosen here, never to every member.
  select.replaceChildren(...(fleet || []).map((c) => el("option", { value: c, text: c })));
  $("login-cluster-row").hidden = !fleet;
  $("nav-health").hidden = !!fleet;
  $("col-cluster").hidden = !fleet;
  $("col-pick").hidden = !!fleet;
  $("filter-cluster-row").hidden = !fleet;
}

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, { text = false } = {}) {
  const response = await fetch(path, { headers: { "Authorization": "Bearer " + token() }, cache: "no-store" });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    me = null;
    showLogin("Your token was not accepted (expired or revoked?): log in again.");
    throw new HttpError(401, "not logged in");
  }
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error || message; } catch (e) { /* not JSON */ }
    throw new HttpError(response.status, message);
  }
  return text ? response.text() : response.json();
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function show(view) {
  for (const id of ["login-view", "list-view", "timeline-view", "health-view", "compare-view"]) $(id).hidden = id !== view;
  $("error").hidden = true;
}

function fail(error) {
  if (error instanceof HttpError && error.status === 401) return;
  $("error").textContent = error.message || String(error);
  $("error").hidden = false;
}

function showLogin(message = "") {
  $("nav").hidden = true;
  $("login-error").textContent = message;
  show("login-view");
  $("token").focus();
}

function age(seconds) {
  if (!isFinite(seconds) || seconds < 0) return "";
  const units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  for (const [unit, size] of units) if (seconds >= size) return Math.floor(seconds / size) + unit;
  return "0s";
}

function utc(ts) { return new Date(ts * 1000).toISOString().replace("T", " ").replace("Z", ""); }

function hashParams() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  return { path: path || "/", params: new URLSearchParams(query || "") };
}

// ------------------------------------------------------------------------------------------- the list

// The list's query: what the server filters, sorts and pages by (history_server.find), kept in the
// address so a link reopens the same list. `id` is the form field that shows it.
const FIND_FIELDS = [["state", "filter-state"], ["name", "filter-name"], ["labelSelector", "filter-labels"],
  ["runtime", "filter-runtime"], ["from", "filter-from"], ["to", "filter-to"], ["metric", "filter-metric"],
  ["sort", "filter-sort"]];
const PAGE = 50;

function findQuery(params) {
  const query = new URLSearchParams();
  for (const [key] of FIND_FIELDS) if (params.get(key)) query.set(key, params.get(key));
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  if (offset) query.set("offset", String(offset));
  query.set("limit", String(PAGE));
  return query;
}

// The sort list offers the metric of the condition typed (both ways), as well as the fixed columns.
function metricSorts(metric, chosen) {
  const select = $("filter-sort");
  for (const option of [...select.querySelectorAll("option.metric-sort")]) option.remove();
  const name = (metric.match(/^\s*([A-Za-z_][-A-Za-z0-9_./:]*)/) || [])[1];
  const wanted = (chosen || "").replace(/^-/, "").startsWith("metric:") ? chosen.replace(/^-?metric:/, "") : "";
  for (const m of [...new Set([name, wanted].filter(Boolean))]) {
    select.append(el("option", { class: "metric-sort", value: `metric:${m}`, text: `${m}, lowest first` }),
      el("option", { class: "metric-sort", value: `-metric:${m}`, text: `${m}, highest first` }));
  }
}

function showFindFields(params) {
  metricSorts(params.get("metric") || "", params.get("sort") || "");
  for (const [key, id] of FIND_FIELDS) $(id).value = params.get(key) || (key === "sort" ? "-lastSeen" : "");
  if (!$("filter-sort").value) $("filter-sort").value = "-lastSeen";
}

// `again` is the list's own refresh (below): the rows stay on screen until the new ones replace them, and
// whatever is being typed into the form is kept.
async function renderList(params, again = false, ticket = routeTicket) {
  if (!again) { clearList(); showFindFields(params); }
  show("list-view");
  if (fleet) return renderFleetList(params, again, ticket);
  const namespaces = await api("/api/v1/namespaces");
  if (!current(ticket)) return;
  const select = $("filter-namespace");
  const chosen = params.get("namespace") ?? (namespaces.clusterWide ? "" : (namespaces.items[0] || ""));
  select.replaceChildren();
  if (namespaces.clusterWide) select.append(el("option", { value: "", text: "all namespaces" }));
  for (const ns of namespaces.items) select.append(el("option", { value: ns, text: ns }));
  select.value = chosen;
  const body = $("trainjobs").querySelector("tbody");
  if (!namespaces.items.length) {
    body.replaceChildren();
    $("list-note").textContent = "No namespace in the history is readable with this token.";
    return;
  }
  const query = findQuery(params).toString();
  const path = (chosen ? `/api/v1/namespaces/${encodeURIComponent(chosen)}/trainjobs` : "/api/v1/trainjobs") + "?" + query;
  await drawListing(path, ticket);
}

// A query the server cannot read is said under the form, which stays as typed, so it can be put right.
async function drawListing(path, ticket) {
  let listing;
  try {
    listing = await api(path);
  } catch (error) {
    if (!current(ticket)) return null;
    if (!(error instanceof HttpError && error.status === 400)) throw error;
    clearList();
    $("list-error").textContent = error.message;
    $("list-error").hidden = false;
    return null;
  }
  if (!current(ticket) || $("list-view").hidden) return null;  // the address moved on meanwhile: draw nothing
  $("list-error").hidden = true;
  listCache = { key: path, items: listing.items };
  drawRows(listing);
  return listing;
}

// The fleet's list: every cluster the token was given to (or the one chosen), each row naming its cluster.
async function renderFleetList(params, again = false, ticket = routeTicket) {
  const accepted = me.clusters.filter((c) => c.accepted).map((c) => c.cluster);
  const cluster = params.get("cluster") || "";
  const select = $("filter-cluster");
  select.replaceChildren(el("option", { value: "", text: "all clusters" }), ...accepted.map((c) => el("option", { value: c, text: c })));
  select.value = accepted.includes(cluster) ? cluster : "";
  const asked = select.value ? [select.value] : accepted;
  const namespace = params.get("namespace") || "";
  const path = "/api/v1/trainjobs?" + clusterQuery(asked) + "&" + findQuery(params).toString() +
    (namespace ? "&namespace=" + encodeURIComponent(namespace) : "");
  const listing = await drawListing(path, ticket);
  if (!listing) return;
  const namespaces = [...new Set(listing.clusters.flatMap((c) => c.namespaces || []))].sort();
  const nsSelect = $("filter-namespace");
  nsSelect.replaceChildren(el("option", { value: "", text: "all namespaces" }), ...namespaces.map((ns) => el("option", { value: ns, text: ns })));
  nsSelect.value = namespaces.includes(namespace) ? namespace : "";
  if (!namespaces.length) $("list-note").textContent = "No namespace of these clusters is readable with this token.";
}

function drawRows(listing) {
  const body = $("trainjobs").querySelector("tbody");
  const now = Date.now() / 1000;
  const runtimes = new Set([...$("runtimes").querySelectorAll("option")].map((o) => o.value));
  for (const j of listing.items) if (j.runtime && !runtimes.has(j.runtime)) { runtimes.add(j.runtime); $("runtimes").append(el("option", { value: j.runtime })); }
  body.replaceChildren(...listing.items.map((j) => {
    const created = j.creationTimestamp ? Date.parse(j.creationTimestamp) / 1000 : j.firstSeen;
    const link = el("a", { href: jobLink(j), text: j.name });
    const stateCell = el("td", {}, el("span", { class: "state " + j.state, text: j.state }));
    if (j.stalled) {
      stateCell.append(" ", el("span", { class: "stalled", text: "stalled " + duration(j.stalledSeconds),
        title: `Running, and no progress reported for ${duration(j.stalledSeconds)}` }));
    }
    const labels = Object.entries(j.labels || {}).map(([k, v]) => v ? `${k}=${v}` : k);
    const nameCell = el("td", {}, link);
    if (labels.length) nameCell.append(el("div", { class: "labels", text: labels.join(" "), title: labels.join("\n") }));
    const key = `${j.namespace}/${j.name}`;
    const pick = el("input", { type: "checkbox", class: "pick", "aria-label": `compare ${key}` });
    pick.checked = picked.has(key);
    pick.addEventListener("change", () => { if (pick.checked) picked.add(key); else picked.delete(key); pickedChanged(); });
    const pickCell = el("td", { class: "pick-cell" }, pick);
    pickCell.hidden = !!fleet;
    const row = el("tr", { "data-name": j.name, "data-namespace": j.namespace, "data-cluster": j.cluster || "" }, pickCell,
      ...(fleet ? [el("td", { class: "cluster", text: j.cluster })] : []),
      nameCell, el("td", { text: j.namespace }), stateCell, progressCell(j.progress),
      el("td", { text: j.runtime }), el("td", { text: age(now - created) }), el("td", { text: age(now - j.lastSeen) + " ago" }),
      el("td", { class: "num", text: String(j.events) }), el("td", { class: "num", text: String(j.deadLetters) }));
    row.addEventListener("click", (e) => { if (e.target.tagName !== "A" && e.target !== pick && e.target !== pickCell) location.hash = link.getAttribute("href"); });
    return row;
  }));
  const first = listing.offset || 0;
  const shown = listing.items.length;
  $("list-note").textContent = shown
    ? `${first + 1}–${first + shown} of ${listing.total} TrainJob(s)` : `no TrainJob found (${listing.total})`;
  $("page-where").textContent = shown ? `${first + 1}–${first + shown} of ${listing.total}` : "";
  const selector = hashParams().params.get("labelSelector");
  $("compare-found").hidden = !!fleet || !selector || !$("filter-namespace").value || listing.total < 2;
  $("compare-found").textContent = `Compare those labelled ${selector} (the newest ${COMPARE_MOST})`;
  pickedChanged();
  $("page-previous").disabled = first === 0;
  $("page-next").disabled = first + shown >= listing.total;
}

// The newest progress a TrainJob reported, in a few words: "62% · loss 0.31 · accuracy 0.82".
function progressWords(p, most = 2) {
  if (!p) return "";
  const parts = [];
  if (p.percentage != null) parts.push(p.percentage + "%");
  const names = Object.keys(p.metrics || {}).sort();
  for (const name of names.slice(0, most)) parts.push(`${name} ${p.metrics[name]}`);
  if (names.length > most) parts.push(`+${names.length - most} more`);
  return parts.join(" · ");
}

function progressCell(p) {
  const cell = el("td", { class: "progress" });
  if (!p) return cell;
  if (p.percentage != null) {
    const bar = el("div", { class: "bar small" }, el("span"));
    bar.firstChild.style.width = `${Math.max(0, Math.min(100, p.percentage))}%`;
    cell.append(bar);
  }
  cell.append(el("span", { class: "progress-text", text: progressWords(p) }));
  const all = Object.entries(p.metrics || {}).map(([k, v]) => `${k} ${v}`);
  cell.title = [p.percentage != null ? `${p.percentage}% done` : "", p.estimatedRemainingSeconds != null
    ? `about ${duration(p.estimatedRemainingSeconds)} left` : "", ...all, `reported ${utc(p.receivedAt)} UTC`].filter(Boolean).join("\n");
  return cell;
}

// The form's values into the address (a new search starts at the first page), which draws the list again.
function listFiltersChanged(offset = 0) {
  const params = new URLSearchParams();
  if (fleet && $("filter-cluster").value) params.set("cluster", $("filter-cluster").value);
  if ($("filter-namespace").value) params.set("namespace", $("filter-namespace").value);
  for (const [key, id] of FIND_FIELDS) {
    const value = $(id).value.trim();
    if (value && !(key === "sort" && value === "-lastSeen")) params.set(key, value);
  }
  if (offset > 0) params.set("offset", String(offset));
  const hash = "#/?" + params.toString();
  if (location.hash !== hash) location.hash = hash; else route();
}

function turnPage(step) {
  const offset = Math.max(0, (parseInt(hashParams().params.get("offset") || "0", 10) || 0) + step * PAGE);
  listFiltersChanged(offset);
}

// --------------------------------------------------------------------------------------- the timeline

let timeline = null;

const STATE_WORDS = { Created: "waiting for pods", Running: "running", Suspended: "suspended", Complete: "complete", Failed: "failed", Deleted: "deleted" };
const TERMINAL = new Set(["Complete", "Failed", "Deleted"]);
const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

function day(ts) {
  const d = new Date(ts * 1000);
  return `${d.getUTCDate()} ${MONTHS[d.getUTCMonth()]} ${d.getUTCFullYear()}`;
}

function clock(ts, fine = false) { return new Date(ts * 1000).toISOString().slice(11, fine ? 23 : 19); }

function duration(seconds) {
  if (!isFinite(seconds) || seconds < 0) return "";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${Math.round(seconds)}s`;
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]]) {
    if (seconds >= size && parts.length < 2) { parts.push(Math.floor(seconds / size) + unit); seconds %= size; }
    else if (parts.length) break;
  }
  return parts.join(" ");
}

function stateText(phase) {
  let text = phase.state;
  if (phase.reason && phase.reason !== phase.state) text += " — " + phase.reason;
  return text;
}

// Everything one TrainJob's page shows, emptied before a page is drawn and when a request is refused, so no
// fact of the page shown before stays on screen next to another TrainJob's (or namespace's) name.
function clearTimeline() {
  timeline = null;
  $("timeline-title").textContent = "";
  $("timeline-facts").textContent = "";
  $("states").replaceChildren();
  $("progress-now").replaceChildren();
  $("picture").replaceChildren();
  $("entries").querySelector("tbody").replaceChildren();
  $("detail").hidden = true;
  $("timeline-view").append($("detail"));
  clearKeepAndRunAgain();
}

function clearList() {
  $("list-note").textContent = "";
  $("list-error").hidden = true;
  $("page-where").textContent = "";
  $("trainjobs").querySelector("tbody").replaceChildren();
  listCache = { key: "", items: [] };
}

async function renderTimeline(namespace, name, cluster = "", ticket = routeTicket) {
  clearTimeline();
  show("timeline-view");
  $("timeline-title").textContent = cluster ? `${cluster}: ${namespace}/${name}` : `${namespace}/${name}`;
  const base = jobPath(cluster, namespace, name);
  const [data, progress] = await Promise.all([api(base + "/history"), api(base + "/progress")]);
  if (!current(ticket)) return;
  timeline = { base, data, progress, selected: -1, cluster };
  const job = data.trainjob;
  const states = data.states || [];
  const now = Date.now() / 1000;
  const facts = [];
  if (cluster) facts.push("cluster " + cluster);
  const last = states[states.length - 1];
  if (last) facts.push(stateText(last) + (last.state !== "Deleted" && job.state === "Deleted" ? " (deleted)" : ""));
  else if (job.state) facts.push(job.state);
  const ran = states.filter((p) => p.state === "Running").reduce((sum, p) => sum + ((p.to ?? now) - p.from), 0);
  if (ran > 0) facts.push("ran " + duration(ran));
  if (job.runtime) facts.push("runtime " + job.runtime);
  if (job.creationTimestamp) facts.push("created " + day(Date.parse(job.creationTimestamp) / 1000) + " " + clock(Date.parse(job.creationTimestamp) / 1000) + " UTC");
  const counts = data.counts || {};
  const others = (counts.plan || 0) + (counts.result || 0);
  facts.push(`${counts.event || 0} event(s), ${others} step(s) of the pipeline` + (data.truncated ? ` (the newest ${data.entries.length} of ${data.total} records shown)` : ""));
  if (counts["dead-letter"]) facts.push(`${counts["dead-letter"]} given up (dead letters)`);
  $("timeline-facts").textContent = facts.join(" · ");
  drawProgressNow(progress, job);
  drawStates(states, now);
  drawPicture(data.entries, states, now, progress);
  drawEntries(data.entries);
  if (!cluster) drawKeepAndRunAgain(base, job, ticket).catch(fail);
  if (typeof drawLogs === "function") drawLogs(base, job).catch(fail);  // logs.js
}

function drawProgressNow(progress, job) {
  const box = $("progress-now");
  box.replaceChildren();
  const points = progress.points || [];
  if (!points.length) return;
  const latest = points[points.length - 1];
  const parts = [];
  if (latest.progressPercentage != null) parts.push(`${latest.progressPercentage}% done`);
  if (latest.estimatedRemainingSeconds != null && !TERMINAL.has(job.state)) parts.push(`about ${duration(latest.estimatedRemainingSeconds)} left`);
  for (const [name, value] of Object.entries(latest.metrics || {}).sort()) parts.push(`${name} ${value}`);
  parts.push(`last reported ${day(latest.time)} ${clock(latest.time)} UTC`);
  box.append(el("span", { id: "progress-latest", text: parts.join(" · ") }));
  if (job.stalled) box.append(" ", el("span", { class: "stalled", text: `stalled: no update for ${duration(job.stalledSeconds)}` }));
  const csv = el("button", { type: "button", id: "download-csv", text: `Download CSV (${progress.total} updates)` });
  csv.addEventListener("click", () => downloadCsv().catch(fail));
  box.append(" ", csv);
}

// A download the browser can save: fetched with the token (a plain link could not send it), handed over as a blob.
async function downloadCsv() {
  const text = await api(`${timeline.base}/progress?output=csv`, { text: true });
  const [, namespace, name] = timeline.base.match(/namespaces\/([^/]+)\/trainjobs\/([^/]+)$/);
  const link = el("a", { href: URL.createObjectURL(new Blob([text], { type: "text/csv" })),
    download: `${timeline.cluster ? timeline.cluster + "_" : ""}${decodeURIComponent(namespace)}_${decodeURIComponent(name)}_progress.csv` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

const MAX_METRIC_CHARTS = 6;
const SERIES_COLOURS = ["#1f4e79", "#c0392b", "#2e8b57", "#8e44ad", "#d35400", "#16a085"];

// One series per pod (a TrainJob's pods may each report); a value that is not a number is left out of the chart.
function seriesOf(points, value) {
  const byPod = new Map();
  for (const p of points) {
    const v = value(p);
    if (v == null || v === "" || !isFinite(Number(v))) continue;
    if (!byPod.has(p.pod)) byPod.set(p.pod, []);
    byPod.get(p.pod).push([p.time, Number(v)]);
  }
  return byPod;
}

function drawSeriesPanel(root, { y, height, left, right, width, x, name, byPod, fixed, cls, metric, colours = SERIES_COLOURS, seriesWord = "pod " }) {
  root.append(svg("rect", { class: "lane chart-lane", x: left, y, width: width - left - right, height }));
  const values = [...byPod.values()].flat().map(([, v]) => v);
  if (!values.length) return;
  let lo = fixed ? fixed[0] : Math.min(...values), hi = fixed ? fixed[1] : Math.max(...values);
  if (hi === lo) { hi += Math.abs(hi) * 0.05 || 1; lo -= Math.abs(lo) * 0.05 || 1; }
  const pad = 6;
  const yOf = (v) => y + pad + (hi - v) / (hi - lo) * (height - 2 * pad);
  const fmt = (v) => Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(2) : String(+v.toPrecision(4));
  const label = svg("text", { class: "lane-label chart-name", x: 8, y: y + 14 });
  label.textContent = name;
  root.append(label);
  for (const [v, dy] of [[hi, 0], [lo, 0]]) {
    const t = svg("text", { class: "tick chart-scale", x: left - 4, y: yOf(v) + 4 + dy, "text-anchor": "end" });
    t.textContent = fixed ? `${v}%` : fmt(v);
    root.append(t);
  }
  let colour = 0;
  for (const [pod, series] of byPod) {
    const stroke = colours[colour++ % colours.length];
    if (!series.length) continue;
    const line = svg("polyline", { class: cls, fill: "none", stroke, "stroke-width": 2, "data-pod": pod, ...(metric ? { "data-metric": metric } : {}),
      points: series.map(([t, v]) => `${x(t).toFixed(1)},${yOf(v).toFixed(1)}`).join(" ") });
    const title = svg("title");
    const first = series[0][1], last = series[series.length - 1][1];
    title.textContent = `${name}${byPod.size > 1 ? ` (${seriesWord}${pod})` : ""}: ${fmt(first)} → ${fmt(last)} over ${series.length} update(s)`;
    line.append(title);
    root.append(line);
    const [tl, vl] = series[series.length - 1];
    root.append(svg("circle", { class: "chart-dot", cx: x(tl), cy: yOf(vl), r: 3, fill: stroke }));
  }
}

function drawStates(states, now) {
  $("states").replaceChildren(...states.map((p, i) => {
    const ongoing = p.to == null && !TERMINAL.has(p.state);
    const lasted = p.to != null ? duration(p.to - p.from) : ongoing ? duration(now - p.from) + " so far" : "";
    const item = el("li", { class: "phase-item", "data-state": p.state },
      el("span", { class: "state " + p.state, text: p.state }));
    if (p.reason && p.reason !== p.state) item.append(el("span", { class: "reason", text: p.reason }));
    item.append(el("span", { class: "when", text: `at ${clock(p.from)}` + (lasted ? `, for ${lasted}` : "") }));
    if (p.message) item.title = p.message;
    return item;
  }));
}

function drawPicture(entries, states, now, progress = { points: [], metrics: [] }) {
  const width = 1000, left = 100, right = 20, lane = 34, stateLane = 30, axis = 40;
  const points = progress.points || [];
  const progressSeries = seriesOf(points, (p) => p.progressPercentage);
  const metricNames = (progress.metrics || []).filter((m) => points.some((p) => isFinite(Number((p.metrics || {})[m])) && (p.metrics || {})[m] !== ""));
  const charted = metricNames.slice(0, MAX_METRIC_CHARTS);
  const chartHeight = 70, metricHeight = 56, gap = 6;
  const charts = (progressSeries.size ? chartHeight + gap : 0) + charted.length * (metricHeight + gap);
  const top = 10 + charts;
  const pipelineTop = top + stateLane + 8;
  const height = pipelineTop + lane * LANES.length + axis;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "timeline", id: "timeline-svg" });
  const label = (text, y, cls = "lane-label") => {
    const node = svg("text", { class: cls, x: 8, y });
    node.textContent = text;
    root.append(node);
  };
  root.append(svg("rect", { class: "lane", x: left, y: top, width: width - left - right, height: stateLane }));
  label("state", top + stateLane / 2 + 4);
  LANES.forEach((kind, i) => {
    root.append(svg("rect", { class: "lane", x: left, y: pipelineTop + i * lane + 2, width: width - left - right, height: lane - 4 }));
    label(LANE_NAMES[kind], pipelineTop + i * lane + lane / 2 + 4);
  });
  const times = entries.map((e) => e.time).concat(states.map((p) => p.from), points.map((p) => p.time));
  if (!times.length) { $("picture").replaceChildren(root); return; }
  const last = states[states.length - 1];
  const t0 = Math.min(...times);
  let t1 = Math.max(...times);
  if (last && last.to == null && !TERMINAL.has(last.state)) t1 = Math.max(t1, now);
  t1 = Math.max(t1, t0 + 1);
  if (last && last.to == null && TERMINAL.has(last.state)) t1 += (t1 - t0) * 0.1;  // room to name how it ended
  const x = (t) => left + 6 + (t - t0) / (t1 - t0) * (width - left - right - 12);
  // The training's own figures first: progress in percent, then each metric on its own scale.
  let y = 10;
  const panel = { left, right, width, x };
  if (progressSeries.size) {
    drawSeriesPanel(root, { ...panel, y, height: chartHeight, name: "progress", byPod: progressSeries, fixed: [0, 100], cls: "progress-line" });
    y += chartHeight + gap;
  }
  for (const metric of charted) {
    drawSeriesPanel(root, { ...panel, y, height: metricHeight, name: metric, byPod: seriesOf(points, (p) => (p.metrics || {})[metric]), cls: "metric-line", metric });
    y += metricHeight + gap;
  }
  if (metricNames.length > charted.length) {
    const more = svg("text", { class: "tick", x: 8, y: y - 2 });
    more.textContent = `${metricNames.length - charted.length} more metric(s) in the CSV`;
    root.append(more);
  }
  // The job's own states: one bar per state, as long as the job was in it.
  states.forEach((p) => {
    const end = p.to ?? (TERMINAL.has(p.state) ? Math.max(t1, p.from) : t1);
    const x0 = x(p.from), w = Math.max(TERMINAL.has(p.state) && p.to == null ? 8 : 3, x(end) - x0);
    const bar = svg("rect", { class: "phase " + p.state, x: x0, y: top + 4, width: w, height: stateLane - 8, rx: 3, "data-state": p.state });
    const title = svg("title");
    const lasted = p.to != null ? ` for ${duration(p.to - p.from)}` : "";
    title.textContent = `${stateText(p)} from ${day(p.from)} ${clock(p.from)} UTC${lasted}` + (p.message ? `\n${p.message}` : "");
    bar.append(title);
    root.append(bar);
    const lasted2 = p.to != null ? " " + duration(p.to - p.from) : "";
    const words = [stateText(p) + lasted2, p.state + lasted2, p.state].find((t) => w > t.length * 6.5 + 8);
    if (words) {
      const text = svg("text", { class: "phase-label", x: x0 + 5, y: top + stateLane / 2 + 4 });
      text.textContent = words;
      root.append(text);
    }
  });
  // The axis, with the day it starts on (and the day on a tick where it changes).
  const base = pipelineTop + lane * LANES.length;
  root.append(svg("line", { class: "axis", x1: left, x2: width - right, y1: base + 2, y2: base + 2 }));
  let shownDay = day(t0);
  label(shownDay, base + 18, "tick date");
  label("UTC", base + 32, "tick");
  for (let i = 0; i <= 4; i++) {
    const t = t0 + (t1 - t0) * i / 4;
    const tick = svg("text", { class: "tick", x: x(t), y: base + 18, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" });
    const today = day(t);
    tick.textContent = (today !== shownDay ? today.replace(/ \d{4}$/, "") + " " : "") + clock(t, t1 - t0 < 10);
    shownDay = today;
    root.append(tick);
  }
  entries.forEach((entry, index) => {
    const row = LANES.indexOf(entry.kind);
    const cy = pipelineTop + Math.max(row, 0) * lane + lane / 2;
    const cls = `mark ${entry.kind} ${entry.tone || ""}`;
    const mark = entry.kind === "plan"
      ? svg("rect", { class: cls, x: x(entry.time) - 5, y: cy - 5, width: 10, height: 10, "data-index": index })
      : svg("circle", { class: cls, cx: x(entry.time), cy, r: entry.kind === "dead-letter" ? 8 : 6, "data-index": index });
    const title = svg("title");
    title.textContent = `${utc(entry.time)} ${entry.text || entry.summary}`;
    mark.append(title);
    mark.addEventListener("click", () => select(index, $("picture")));
    root.append(mark);
  });
  $("picture").replaceChildren(root);
}

function chip(entry) {
  if (entry.kind === "result" && entry.detail && entry.detail.action) return entry.detail.action;
  return { "event": "event", "plan": "plan", "dead-letter": "gave up" }[entry.kind] || entry.kind;
}

function drawEntries(entries) {
  const body = $("entries").querySelector("tbody");
  body.replaceChildren(...entries.map((entry, index) => {
    const row = el("tr", { class: `${entry.kind} ${entry.tone || ""}`, "data-index": index },
      el("td", { class: "time", text: utc(entry.time) }), el("td", { text: entry.text || entry.summary }),
      el("td", {}, el("span", { class: `kind ${entry.kind} ${entry.tone || ""}`, text: chip(entry) })));
    row.addEventListener("click", () => select(index, row));
    return row;
  }));
}

// The detail opens where it was asked for: under the clicked row of the table, or under the picture.
function place(anchor) {
  const detail = $("detail");
  if (anchor && anchor.tagName === "TR") {
    const holder = el("tr", { class: "detail-row" }, el("td", { colspan: "3" }));
    holder.firstChild.append(detail);
    anchor.after(holder);
  } else {
    $("picture").after(detail);
  }
  for (const row of document.querySelectorAll("tr.detail-row")) if (!row.contains(detail)) row.remove();
  detail.hidden = false;
  detail.scrollIntoView({ block: "nearest" });
}

function select(index, anchor) {
  const entry = timeline.data.entries[index];
  timeline.selected = index;
  for (const node of document.querySelectorAll(".selected")) node.classList.remove("selected");
  for (const node of document.querySelectorAll(`[data-index="${index}"]`)) node.classList.add("selected");
  $("detail-title").textContent = entry.text || entry.summary;
  $("detail-when").textContent = `${day(entry.time)}, ${clock(entry.time, true)} UTC`;
  $("detail-summary").textContent = `${entry.stream} #${entry.seq}: ${entry.summary}`;
  $("detail-body").textContent = JSON.stringify(entry.detail, null, 2);
  const actions = $("detail-actions");
  actions.replaceChildren();
  place(anchor);
  const eventSeq = entry.kind === "plan" ? entry.detail.source_seq : entry.kind === "event" ? entry.seq : null;
  if (eventSeq == null) return;
  const planned = timeline.data.entries.filter((e) => e.kind === "plan").map((e) => e.detail.source_seq);
  const seqs = [...new Set(planned)].sort((a, b) => a - b);
  if (!seqs.includes(eventSeq)) return;
  const button = (text, id, action) => {
    const b = el("button", { type: "button", id, text });
    b.addEventListener("click", () => action().catch(fail));
    actions.append(b);
  };
  button(`Plan of event ${eventSeq} (YAML)`, "show-plan", async () => {
    $("detail-body").textContent = await api(`${timeline.base}/plans/${eventSeq}`, { text: true });
  });
  const earlier = seqs.filter((s) => s < eventSeq);
  if (earlier.length) {
    const previous = earlier[earlier.length - 1];
    button(`Diff with the plan of event ${previous}`, "show-diff", async () => {
      const diff = await api(`${timeline.base}/plans/diff?from=${previous}&to=${eventSeq}`);
      const lines = [];
      for (const [component, changes] of Object.entries(diff.components)) {
        for (const c of changes) lines.push(`${component}: ${c.field}\n  - ${JSON.stringify(c.from)}\n  + ${JSON.stringify(c.to)}`);
      }
      $("detail-body").textContent = lines.length ? lines.join("\n") : `the plans of events ${previous} and ${eventSeq} are the same`;
    });
  }
}

// ------------------------------------------------------------------------------------------ comparing

// TrainJobs picked in the list for a comparison, by "namespace/name" (kept across pages and searches).
const picked = new Set();
const COMPARE_MOST = 10;
const RUN_COLOURS = ["#1f4e79", "#c0392b", "#2e8b57", "#8e44ad", "#d35400", "#16a085", "#7f8c8d", "#b7950b", "#2c3e50", "#e84393"];

// A colour key, set through the style object: the Content Security Policy refuses style attributes.
function swatch(colour) {
  const node = el("span", { class: "swatch" });
  node.style.background = colour;
  return node;
}

function pickedChanged() {
  const button = $("compare-picked");
  button.textContent = `Compare ${picked.size} picked`;
  button.disabled = picked.size < 2 || picked.size > COMPARE_MOST;
  button.title = picked.size > COMPARE_MOST ? `at most ${COMPARE_MOST}` : picked.size < 2 ? "pick at least 2" : "";
}

function compareQuery(params) {
  const query = new URLSearchParams();
  for (const key of ["trainjob", "namespace", "labelSelector"]) for (const v of params.getAll(key)) query.append(key, v);
  return query;
}

async function renderCompare(params, ticket = routeTicket) {
  clearCompare();
  show("compare-view");
  const query = compareQuery(params);
  const data = await api("/api/v1/compare?" + query.toString());
  if (!current(ticket)) return;
  compared = { data, query };
  const runs = data.trainjobs;
  $("compare-facts").textContent = `${runs.length} TrainJobs, aligned by the moment each started running` +
    (data.metrics.length ? ` · metrics they all report: ${data.metrics.join(", ")}` : " · no metric that they all report");
  $("compare-link").href = location.href;
  drawComparison(data);
  drawCompareTable(data);
}

let compared = null;

function clearCompare() {
  compared = null;
  $("compare-facts").textContent = "";
  $("compare-picture").replaceChildren();
  $("compare-legend").replaceChildren();
  $("compare-table").querySelector("thead").replaceChildren();
  $("compare-table").querySelector("tbody").replaceChildren();
}

function drawComparison(data) {
  const runs = data.trainjobs;
  const width = 1000, left = 100, right = 20, chartHeight = 90, metricHeight = 80, gap = 8, axis = 36;
  const hasProgress = runs.some((r) => r.series.some((p) => p.progress != null));
  const panels = (hasProgress ? chartHeight + gap : 0) + data.metrics.length * (metricHeight + gap);
  const height = 10 + panels + axis;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "comparison", id: "compare-svg" });
  const tMax = Math.max(1, ...runs.flatMap((r) => r.series.map((p) => p.t)));
  const x = (t) => left + 6 + Math.max(0, t) / tMax * (width - left - right - 12);
  const series = (value) => {
    const byRun = new Map();
    for (const r of runs) {
      const points = r.series.map((p) => [p.t, value(p)]).filter(([, v]) => v != null && isFinite(v));
      byRun.set(`${r.namespace}/${r.name}`, points);
    }
    return byRun;
  };
  const panel = { left, right, width, x, colours: RUN_COLOURS, seriesWord: "" };
  let y = 10;
  if (hasProgress) {
    drawSeriesPanel(root, { ...panel, y, height: chartHeight, name: "progress", byPod: series((p) => p.progress), fixed: [0, 100], cls: "progress-line" });
    y += chartHeight + gap;
  }
  for (const metric of data.metrics) {
    drawSeriesPanel(root, { ...panel, y, height: metricHeight, name: metric, byPod: series((p) => p.metrics[metric]), cls: "metric-line", metric });
    y += metricHeight + gap;
  }
  root.append(svg("line", { class: "axis", x1: left, x2: width - right, y1: y, y2: y }));
  for (let i = 0; i <= 4; i++) {
    const t = tMax * i / 4;
    const tick = svg("text", { class: "tick", x: x(t), y: y + 16, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" });
    tick.textContent = i === 0 ? "start" : "+" + duration(t);
    root.append(tick);
  }
  const label = svg("text", { class: "tick", x: 8, y: y + 16 });
  label.textContent = "since start";
  root.append(label);
  $("compare-picture").replaceChildren(root);
  $("compare-legend").replaceChildren(...runs.map((r, i) => el("span", { class: "run-key" },
    swatch(RUN_COLOURS[i % RUN_COLOURS.length]), `${r.namespace}/${r.name}`)));
}

function drawCompareTable(data) {
  const runs = data.trainjobs;
  const metricNames = [...new Set(runs.flatMap((r) => Object.keys(r.finalMetrics)))].sort();
  $("compare-table").querySelector("thead").replaceChildren(el("tr", {},
    ...["TrainJob", "Runtime", "Nodes", "Duration", "Final state", "Progress", ...metricNames].map((t) => el("th", { text: t }))));
  $("compare-table").querySelector("tbody").replaceChildren(...runs.map((r, i) => {
    const name = el("td", {}, swatch(RUN_COLOURS[i % RUN_COLOURS.length]),
      el("a", { href: jobLink(r), text: `${r.namespace}/${r.name}` }));
    return el("tr", { "data-name": r.name, "data-namespace": r.namespace }, name,
      el("td", { text: r.runtime }), el("td", { class: "num", text: r.nodes != null ? String(r.nodes) : "" }),
      el("td", { text: r.seconds != null ? duration(r.seconds) + (r.finished ? "" : " so far") : "" }),
      el("td", {}, el("span", { class: "state " + r.state, text: r.state + (r.reason && r.reason !== r.state ? " — " + r.reason : "") })),
      el("td", { class: "num", text: r.finalProgress != null ? r.finalProgress + "%" : "" }),
      ...metricNames.map((m) => el("td", { class: "num", text: r.finalMetrics[m] ?? "" })));
  }));
}

async function downloadComparison(output) {
  const text = await api("/api/v1/compare?" + compared.query.toString() + "&output=" + output, { text: true });
  const link = el("a", { href: URL.createObjectURL(new Blob([text], { type: output === "csv" ? "text/csv" : "application/json" })),
    download: `trainjobs_compared.${output}` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

// ------------------------------------------------------------------------------------------- health

function card(label, value, bad = false) {
  return el("div", { class: "card" + (bad ? " bad" : "") }, el("div", { class: "value", text: value }), el("div", { class: "label", text: label }));
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

async function renderHealth(ticket = routeTicket) {
  show("health-view");
  const h = await api("/api/v1/health");
  if (!current(ticket)) return;
  const refused = h.refusedPublishes;
  const refusedTotal = Object.values(refused.byStream).reduce((a, b) => a + b, 0);
  $("health-cards").replaceChildren(
    card("dead letters", String(h.deadLetters ?? "?"), (h.deadLetters || 0) > 0),
    card("planner lag (messages)", String(h.lagByStage.planner ?? "?"), (h.lagByStage.planner || 0) > 0),
    card("applier lag (messages)", String(h.lagByStage.applier ?? "?"), (h.lagByStage.applier || 0) > 0),
    card("refused publishes", refused.known ? String(refusedTotal) : "not known", refusedTotal > 0),
    card("TrainJobs in the history", String(h.index.trainjobs)),
  );
  $("streams").querySelector("tbody").replaceChildren(...h.streams.map((s) => {
    const bar = el("div", { class: "bar" + (s.usage > 0.8 ? " high" : "") }, el("span"));
    bar.firstChild.style.width = `${Math.min(100, (s.usage || 0) * 100).toFixed(1)}%`;
    return el("tr", {}, el("td", { text: s.stream }), el("td", { class: "num", text: String(s.messages ?? s.error) }),
      el("td", { class: "num", text: s.bytes != null ? bytes(s.bytes) : "" }),
      el("td", { class: "num", text: s.maxBytes > 0 ? bytes(s.maxBytes) : "no limit" }),
      el("td", {}, s.usage != null ? bar : el("span", { text: "—" })));
  }));
  const partitions = new Map();
  for (const c of h.consumers) {
    if (!partitions.has(c.partition)) partitions.set(c.partition, {});
    partitions.get(c.partition)[c.stage] = c;
  }
  const cells = (c) => c ? [String(c.pending ?? c.error), String(c.unacknowledged ?? "")] : ["", ""];
  $("lag").querySelector("tbody").replaceChildren(...[...partitions.entries()].map(([p, stages]) => el("tr", {},
    el("td", { class: "num", text: String(p) }),
    ...[...cells(stages.planner), ...cells(stages.applier)].map((text) => el("td", { class: "num", text })))));
}

// ------------------------------------------------------------------------------------------- routing

// Each drawing of a page takes a ticket; one whose ticket is no longer the newest (the address moved on while
// it waited for an answer) draws and shows nothing, so a late answer never puts a page the address left back
// on screen over the one it names.
let routeTicket = 0;
const current = (ticket) => ticket === routeTicket;

async function route() {
  const ticket = ++routeTicket;
  if (!token()) { showLogin(); return; }
  window.scrollTo(0, 0);
  try {
    if (!me) {
      me = await api("/api/v1/whoami" + (fleet ? "?" + clusterQuery(chosenClusters()) : ""));
      if (!current(ticket)) return;
      const on = fleet ? me.clusters.filter((c) => c.accepted).map((c) => c.cluster) : [];
      $("who").textContent = me.username + (on.length ? " on " + on.join(", ") : "");
      $("version").textContent = me.version ? "trainjob-pipeline " + me.version : "";
      $("nav").hidden = false;
    }
    const { path, params } = hashParams();
    const match = path.match(/^\/ns\/([^/]+)\/([^/]+)$/);
    const inCluster = path.match(/^\/c\/([^/]+)\/ns\/([^/]+)\/([^/]+)$/);
    if (inCluster && fleet) await renderTimeline(decodeURIComponent(inCluster[2]), decodeURIComponent(inCluster[3]), decodeURIComponent(inCluster[1]), ticket);
    else if (match && !fleet) await renderTimeline(decodeURIComponent(match[1]), decodeURIComponent(match[2]), "", ticket);
    else if (path === "/health") await renderHealth(ticket);
    else if (path === "/compare" && !fleet) await renderCompare(params, ticket);
    else await renderList(params, false, ticket);
  } catch (error) {
    if (!current(ticket)) return;
    // A refused or failed page shows the refusal and nothing else: no facts or counts of the page before.
    clearTimeline();
    clearList();
    clearCompare();
    if (!(error instanceof HttpError && error.status === 401)) show("");
    fail(error);
  }
}

// The list on screen is read again every few seconds, so a TrainJob that reaches the history after the page
// opened (a demo's first one often does, a moment after log-in) appears without a reload. A refused or failed
// refresh goes the way of any other request: route()'s handling, which leaves nothing of the page before.
const LIST_REFRESH_MS = 5000;
let listRefreshing = false;

async function refreshList() {
  if (listRefreshing || !me || fleet || $("list-view").hidden || document.hidden) return;
  listRefreshing = true;
  try {
    await renderList(hashParams().params, true, routeTicket);
  } catch (error) {
    if ($("list-view").hidden) return;
    clearList();
    show("");
    fail(error);
  } finally {
    listRefreshing = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  setInterval(refreshList, LIST_REFRESH_MS);
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    sessionStorage.setItem(CLUSTERS_KEY, fleet ? $("login-cluster").value : "");
    $("token").value = "";
    me = null;
    route();
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); me = null; $("version").textContent = ""; showLogin(); });
  fetch("/api/v1/docs", { cache: "no-store" }).then((r) => r.ok ? r.json() : null).then((d) => {
    if (!d || !/^\/static\/[\w-]+\.html$/.test(d.dataScientists)) return;
    $("docs-link").href = d.dataScientists;
    $("docs-link").hidden = false;
  }).catch(() => {});
  for (const id of ["filter-namespace", "filter-cluster", "filter-state", "filter-sort"]) $(id).addEventListener("change", () => listFiltersChanged());
  $("find-form").addEventListener("submit", (e) => { e.preventDefault(); listFiltersChanged(); });
  $("find-clear").addEventListener("click", () => {
    for (const [, id] of FIND_FIELDS) $(id).value = "";
    listFiltersChanged();
  });
  $("filter-metric").addEventListener("change", () => metricSorts($("filter-metric").value, $("filter-sort").value));
  $("page-previous").addEventListener("click", () => turnPage(-1));
  $("compare-picked").addEventListener("click", () => {
    const query = new URLSearchParams();
    for (const key of picked) query.append("trainjob", key);
    location.hash = "#/compare?" + query.toString();
  });
  $("compare-found").addEventListener("click", () => {
    const query = new URLSearchParams({ namespace: $("filter-namespace").value, labelSelector: hashParams().params.get("labelSelector") });
    location.hash = "#/compare?" + query.toString();
  });
  $("compare-csv").addEventListener("click", () => downloadComparison("csv").catch(fail));
  $("compare-json").addEventListener("click", () => downloadComparison("json").catch(fail));
  $("page-next").addEventListener("click", () => turnPage(1));
  window.addEventListener("hashchange", route);
  findFleet().catch(fail).finally(route);
});

// ------------------------------------------------------------------------------ how long it is kept; run again

function clearKeepAndRunAgain() {
  $("timeline-kept").textContent = "";
  $("run-again").hidden = true;
  $("run-again-said").replaceChildren();
  $("run-again-said").className = "";
}

function keptText(kept, job) {
  if (!kept.policy) {
    return kept.streamsKeepSeconds ? `Kept as long as the pipeline's streams keep records: ${duration(kept.streamsKeepSeconds)} after each.` : "";
  }
  const most = kept.maxTrainJobs ? ` At most ${kept.maxTrainJobs} ended TrainJobs of this namespace are kept, the last to end.` : "";
  if (kept.keptUntil != null) {
    const when = `${day(kept.keptUntil)} ${clock(kept.keptUntil)} UTC`;
    return (job.state === "Deleted" ? "Deleted from the cluster; its history is kept until " : "Kept until ") + when + ` (${duration(kept.keepForSeconds)} after it ended).` + most;
  }
  if (kept.keepForSeconds) return `Kept while it lives, and ${duration(kept.keepForSeconds)} after it ends.` + most;
  return ("Kept as long as the pipeline's streams keep records." + most).trim();
}

async function drawKeepAndRunAgain(base, job, ticket) {
  const [kept, offer] = await Promise.all([api(base + "/retention"), api(base + "/run-again")]);
  if (!current(ticket)) return;
  $("timeline-kept").textContent = keptText(kept, job);
  // Offered only to whom the cluster lets create TrainJobs here, and only for one that finished.
  if (!offer.allowed || !offer.finished) return;
  $("run-again-name").value = offer.name;
  $("run-again").hidden = false;
  $("run-again").onsubmit = (e) => { e.preventDefault(); runAgain(base, ticket).catch(fail); };
}

async function runAgain(base, ticket) {
  const said = $("run-again-said");
  $("run-again-go").disabled = true;
  try {
    // The token in the header, the body as JSON: what the server requires of a write.
    const response = await fetch(base + "/run-again", {
      method: "POST",
      headers: { "Authorization": "Bearer " + token(), "Content-Type": "application/json" },
      body: JSON.stringify({ name: $("run-again-name").value.trim() }),
      cache: "no-store",
    });
    if (response.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      me = null;
      showLogin("Your token was not accepted (expired or revoked?): log in again.");
      return;
    }
    const answer = await response.json().catch(() => ({}));
    if (!current(ticket)) return;
    if (!response.ok) {
      said.className = "error";
      said.textContent = answer.error || response.statusText;
      return;
    }
    said.className = "note";
    said.replaceChildren("Created ", el("a", { id: "run-again-link", href: jobLink(answer), text: `${answer.namespace}/${answer.name}` }),
      ": its history appears here once the pipeline sees it.");
  } finally {
    $("run-again-go").disabled = false;
  }
}
