// The history server's UI: plain DOM, no framework, no build step, nothing fetched but this server's API.
// Every piece of record data is written with textContent or as an SVG attribute, never as markup.
"use strict";

const TOKEN_KEY = "tjpipe-history-token";
const SVG = "http://www.w3.org/2000/svg";
const LANES = ["event", "plan", "result", "dead-letter"];
const LANE_NAMES = { "event": "events", "plan": "plans", "result": "results", "dead-letter": "dead letters" };
const $ = (id) => document.getElementById(id);

let me = null;
let listCache = { key: "", items: [] };

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

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
  for (const id of ["login-view", "list-view", "timeline-view", "health-view"]) $(id).hidden = id !== view;
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

async function renderList(params) {
  show("list-view");
  const namespaces = await api("/api/v1/namespaces");
  const select = $("filter-namespace");
  const chosen = params.get("namespace") ?? (namespaces.clusterWide ? "" : (namespaces.items[0] || ""));
  select.replaceChildren();
  if (namespaces.clusterWide) select.append(el("option", { value: "", text: "all namespaces" }));
  for (const ns of namespaces.items) select.append(el("option", { value: ns, text: ns }));
  select.value = chosen;
  $("filter-state").value = params.get("state") || "";
  $("filter-name").value = params.get("name") || "";
  const body = $("trainjobs").querySelector("tbody");
  body.replaceChildren();
  if (!namespaces.items.length) {
    $("list-note").textContent = "No namespace in the history is readable with this token.";
    return;
  }
  const state = $("filter-state").value;
  const query = state ? "?state=" + encodeURIComponent(state) : "";
  const path = chosen ? `/api/v1/namespaces/${encodeURIComponent(chosen)}/trainjobs${query}` : `/api/v1/trainjobs${query}`;
  const listing = await api(path);
  listCache = { key: path, items: listing.items };
  drawRows(listing);
}

function drawRows(listing) {
  const body = $("trainjobs").querySelector("tbody");
  const needle = $("filter-name").value.trim();
  const now = Date.now() / 1000;
  const rows = listing.items.filter((j) => !needle || j.name.includes(needle));
  body.replaceChildren(...rows.map((j) => {
    const created = j.creationTimestamp ? Date.parse(j.creationTimestamp) / 1000 : j.firstSeen;
    const link = el("a", { href: `#/ns/${encodeURIComponent(j.namespace)}/${encodeURIComponent(j.name)}`, text: j.name });
    const row = el("tr", { "data-name": j.name, "data-namespace": j.namespace },
      el("td", {}, link), el("td", { text: j.namespace }), el("td", {}, el("span", { class: "state " + j.state, text: j.state })),
      el("td", { text: j.runtime }), el("td", { text: age(now - created) }), el("td", { text: age(now - j.lastSeen) + " ago" }),
      el("td", { class: "num", text: String(j.events) }), el("td", { class: "num", text: String(j.deadLetters) }));
    row.addEventListener("click", (e) => { if (e.target.tagName !== "A") location.hash = link.getAttribute("href"); });
    return row;
  }));
  const shown = rows.length === listing.items.length ? `${rows.length}` : `${rows.length} of ${listing.items.length}`;
  $("list-note").textContent = `${shown} TrainJob(s)` + (listing.truncated ? ` (the newest ${listing.items.length} of ${listing.total})` : "");
}

function listFiltersChanged() {
  const params = new URLSearchParams();
  for (const [key, id] of [["namespace", "filter-namespace"], ["state", "filter-state"], ["name", "filter-name"]]) {
    params.set(key, $(id).value);
  }
  history.replaceState(null, "", "#/?" + params.toString());
  route();
}

// --------------------------------------------------------------------------------------- the timeline

let timeline = null;

async function renderTimeline(namespace, name) {
  show("timeline-view");
  $("timeline-title").textContent = `${namespace}/${name}`;
  $("detail").hidden = true;
  $("picture").replaceChildren();
  $("entries").querySelector("tbody").replaceChildren();
  const base = `/api/v1/namespaces/${encodeURIComponent(namespace)}/trainjobs/${encodeURIComponent(name)}`;
  const data = await api(base + "/history");
  timeline = { base, data, selected: -1 };
  const job = data.trainjob;
  const facts = [];
  if (job.state) facts.push("state " + job.state);
  if (job.runtime) facts.push("runtime " + job.runtime);
  facts.push(`${data.total} entries` + (data.truncated ? ` (the newest ${data.entries.length} shown)` : ""));
  if (job.deadLetters) facts.push(`${job.deadLetters} dead letter(s)`);
  $("timeline-facts").textContent = facts.join(" · ");
  drawPicture(data.entries);
  drawEntries(data.entries);
}

function drawPicture(entries) {
  const width = 1000, left = 100, right = 20, top = 10, lane = 34, axis = 26;
  const height = top + lane * LANES.length + axis;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "timeline", id: "timeline-svg" });
  LANES.forEach((kind, i) => {
    root.append(svg("rect", { class: "lane", x: left, y: top + i * lane + 2, width: width - left - right, height: lane - 4 }));
    const label = svg("text", { class: "lane-label", x: 8, y: top + i * lane + lane / 2 + 4 });
    label.textContent = LANE_NAMES[kind];
    root.append(label);
  });
  if (entries.length) {
    const t0 = entries[0].time, t1 = Math.max(entries[entries.length - 1].time, t0 + 1);
    const x = (t) => left + 6 + (t - t0) / (t1 - t0) * (width - left - right - 12);
    const base = top + lane * LANES.length;
    root.append(svg("line", { class: "axis", x1: left, x2: width - right, y1: base + 2, y2: base + 2 }));
    for (let i = 0; i <= 4; i++) {
      const t = t0 + (t1 - t0) * i / 4;
      const tick = svg("text", { class: "tick", x: x(t), y: base + 18, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" });
      tick.textContent = new Date(t * 1000).toISOString().slice(11, t1 - t0 < 10 ? 23 : 19);
      root.append(tick);
    }
    entries.forEach((entry, index) => {
      const row = LANES.indexOf(entry.kind);
      const cy = top + Math.max(row, 0) * lane + lane / 2;
      const failed = entry.kind === "result" && entry.detail && entry.detail.action === "failed";
      const cls = `mark ${entry.kind}${failed ? " failed" : ""}`;
      const mark = entry.kind === "plan"
        ? svg("rect", { class: cls, x: x(entry.time) - 5, y: cy - 5, width: 10, height: 10, "data-index": index })
        : svg("circle", { class: cls, cx: x(entry.time), cy, r: entry.kind === "dead-letter" ? 8 : 6, "data-index": index });
      const title = svg("title");
      title.textContent = `${utc(entry.time)} ${entry.kind}: ${entry.summary}`;
      mark.append(title);
      mark.addEventListener("click", () => select(index));
      root.append(mark);
    });
  }
  $("picture").replaceChildren(root);
}

function drawEntries(entries) {
  const body = $("entries").querySelector("tbody");
  body.replaceChildren(...entries.map((entry, index) => {
    const what = entry.summary + (entry.detail && entry.detail.changed && entry.detail.changed.length
      ? "\nchanged: " + entry.detail.changed.slice(0, 8).join(", ") : "");
    const row = el("tr", { class: entry.kind, "data-index": index },
      el("td", { text: utc(entry.time) }), el("td", {}, el("span", { class: "kind " + entry.kind, text: entry.kind })),
      el("td", { text: what }));
    row.addEventListener("click", () => select(index));
    return row;
  }));
}

function select(index) {
  const entry = timeline.data.entries[index];
  timeline.selected = index;
  for (const node of document.querySelectorAll(".selected")) node.classList.remove("selected");
  for (const node of document.querySelectorAll(`[data-index="${index}"]`)) node.classList.add("selected");
  $("detail").hidden = false;
  $("detail-title").textContent = `${entry.kind} · ${entry.stream} #${entry.seq} · ${utc(entry.time)}`;
  $("detail-summary").textContent = entry.summary;
  $("detail-body").textContent = JSON.stringify(entry.detail, null, 2);
  const actions = $("detail-actions");
  actions.replaceChildren();
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

async function renderHealth() {
  show("health-view");
  const h = await api("/api/v1/health");
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

async function route() {
  if (!token()) { showLogin(); return; }
  try {
    if (!me) {
      me = await api("/api/v1/whoami");
      $("who").textContent = me.username;
      $("nav").hidden = false;
    }
    const { path, params } = hashParams();
    const match = path.match(/^\/ns\/([^/]+)\/([^/]+)$/);
    if (match) await renderTimeline(decodeURIComponent(match[1]), decodeURIComponent(match[2]));
    else if (path === "/health") await renderHealth();
    else await renderList(params);
  } catch (error) { fail(error); }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    me = null;
    route();
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); me = null; showLogin(); });
  $("filter-namespace").addEventListener("change", listFiltersChanged);
  $("filter-state").addEventListener("change", listFiltersChanged);
  $("filter-name").addEventListener("input", () => drawRows({ items: listCache.items, total: listCache.items.length, truncated: false }));
  window.addEventListener("hashchange", route);
  route();
});
