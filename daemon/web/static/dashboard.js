// evald dashboard: plain SVG charts over the read-only JSON API, no library and no build step.
//
// One chart per (task, stage, metric) in sections (pinned, quality, length and behaviour, system); every
// selected run is a line on it with its standard-error band, the raw curve faint behind the smoothed one
// (smoothing is computed by the server, daemon/analysis/smoothing.py, the same function as `evald compare`), alert
// markers at their onset (red: firing, grey: resolved) and the best checkpoint ringed. Runs can be grouped
// (by name without its seed suffix, a name pattern or a config key) into a mean line with a ± 1 std band
// across the group's runs. The x axis is the step, the wall time or the time since a run's first result;
// the y axis linear or log, optionally scaled without outliers. Drag to zoom, double-click to reset; hover
// lists every run at that x; a click opens that checkpoint's metrics, its jobs with their attempts
// (retries, Slurm ids, nodes, queue wait, errors: attempts.js) and its samples. The page polls
// /api/v1/changes every 2 s and reloads its data when the database moved. The view is kept in the URL,
// with the step detail or the comparison open (links.js): a link opens it, opening one is a new history
// entry (Back closes it). The alert list (alertlist.js) links each alert to its onset's detail; the
// paired comparison of two runs (compare.js) is `evald compare`'s answer, from /api/v1/compare.
"use strict";

import { showAlerts } from "./alertlist.js";
import { showJobs } from "./attempts.js";
import { fmt } from "./axis.js";
import { drawChart } from "./chart.js";
import { showComparison } from "./compare.js";
import { downloads, saveCsv, savePng, saveSvg } from "./export.js";
import { DEFAULT_FDR, viewFrom, withView } from "./links.js";

const POLL_MS = 2000;
const FIRST_WAIT_MS = 3000; // the longest the first chart holds back the rest of the first load
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#d62728", "#7f7f7f"];
const DEFAULTS = { smooth: "none", x: "step", y: "linear", group: "none" };
const SECTIONS = [
  ["pinned", "Pinned"],
  ["quality", "Quality"],
  ["behaviour", "Length and behaviour"],
  ["system", "System"],
];
const X_TITLES = { step: "step", wall: "wall time (when the result was stored, local)", relative: "time since the run's first result" };
// A seed suffix: -s1, _seed42, .rep3, -r2 ... (the name without it is the group).
const SEED_SUFFIX = /[-_.](?:seed|s|rep|r|run)[-_]?\d+$/i;
const PINS_KEY = "evald.pins";

const state = {
  runs: [],          // every run the API lists
  selected: [],      // run names shown
  series: {},        // run -> series list from /series
  alerts: {},        // run -> alert list
  alertList: [],     // every run's alerts (the alert list)
  alertState: "",    // the alert list shows: "" (all), firing, resolved
  version: null,     // /changes version last loaded
  detail: null,      // {run, step, metric, task}: the step detail open (in the URL)
  compare: null,     // {a, b, fdr}: the comparison open (in the URL)
  comparison: null,  // its /api/v1/compare answer
  compareZooms: {},  // comparison chart key -> zoom
  applied: null,     // the URL fragment the page shows (a different one was navigated to)
  smooth: DEFAULTS.smooth,
  filter: "",
  x: DEFAULTS.x,     // step | wall | relative
  y: DEFAULTS.y,     // linear | log
  outliers: false,   // ignore outliers in the y scale
  group: DEFAULTS.group, // none | seed | re:PATTERN | config:KEY
  pins: [],          // chart keys shown first
  zoom: {},          // chart key -> {x: [a, b], y: [a, b] | null}
  folded: {},        // section -> true when folded
  notices: [],       // what was wrong with the URL, shown until dismissed
  drawn: {},         // chart key -> what was drawn (domains, tick labels)
  downloads,         // charts saved: {name, type, size}
  lastOk: null,
  loadError: null,
  dataStale: false,  // the last load failed: the next poll loads again
  complete: false,   // every curve of the selected runs has been loaded once (the first chart is not needed)
};
window.evald = state; // the browser test reads what was drawn from here and from the DOM

const $ = (id) => document.getElementById(id);

class ApiFailure extends Error {
  constructor(message, parameter) { super(message); this.parameter = parameter; }
}

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" }, credentials: "same-origin" });
  if (response.status === 401) { window.location.href = "/login"; throw new Error("token required"); }
  const body = await response.json();
  if (!response.ok) throw new ApiFailure(body.error || response.statusText, body.parameter);
  return body;
}

async function pages(path) {
  const items = [];
  let next = path;
  while (next) {
    const body = await api(next);
    items.push(...body.items);
    next = body.next;
  }
  return items;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

function html(tag, attrs = {}, text = null, parent = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function swatch(color, parent) {
  const sw = html("span", { class: "sw" }, null, parent);
  sw.style.background = color; // CSSOM: allowed by the page's CSP, where a style attribute is not
  return sw;
}

// ---- state in the URL: #runs=a,b&smooth=ema:0.6&filter=acc&x=step&y=log&outliers=1&group=seed&pins=k1,k2
function smoothProblem(spec) {
  const [kind, arg, extra] = spec.split(":");
  if (spec === "none") return null;
  if (extra !== undefined) return "it has more than one ':'";
  if (kind === "ema") {
    const w = Number(arg);
    if (arg === undefined || arg.trim() === "" || !Number.isFinite(w)) return `the EMA weight “${arg ?? ""}” is not a number`;
    return w >= 0 && w < 1 ? null : `the EMA weight must be at least 0 and below 1, not ${arg}`;
  }
  if (kind === "window") {
    const n = Number(arg);
    return Number.isInteger(n) && n >= 1 && n % 2 === 1 && n <= 999 ? null : `the window width must be an odd whole number from 1 to 999, not “${arg ?? ""}”`;
  }
  return "smoothing is none, ema:W (0 ≤ W < 1) or window:N (N odd)";
}

function groupProblem(spec) {
  if (spec === "none" || spec === "seed" || /^config:.+/.test(spec)) return null;
  if (spec.startsWith("re:")) {
    try { new RegExp(spec.slice(3)); return null; } catch (e) { return `the pattern is not a regular expression (${e.message})`; }
  }
  return "grouping is none, seed, re:PATTERN or config:KEY";
}

function readHash() {
  const params = new URLSearchParams(window.location.hash.slice(1));
  const notices = [];
  const take = (name, problem, fallback, label) => {
    if (!params.has(name)) return fallback;
    const value = params.get(name);
    const why = problem(value);
    if (why === null) return value;
    notices.push(`This link's ${label} “${value}” is not valid: ${why}. Showing ${label} “${fallback}” instead.`);
    return fallback;
  };
  if (params.get("runs")) state.selected = params.get("runs").split(",").filter(Boolean);
  state.smooth = take("smooth", smoothProblem, DEFAULTS.smooth, "smoothing");
  state.x = take("x", (v) => (v in X_TITLES ? null : "the x axis is step, wall or relative"), DEFAULTS.x, "x axis");
  state.y = take("y", (v) => (v === "linear" || v === "log" ? null : "the y scale is linear or log"), DEFAULTS.y, "y scale");
  state.group = take("group", groupProblem, DEFAULTS.group, "grouping");
  state.outliers = params.get("outliers") === "1";
  state.filter = params.get("filter") || "";
  if (params.has("pins")) state.pins = params.get("pins").split(",").filter(Boolean);
  else {
    try { state.pins = JSON.parse(localStorage.getItem(PINS_KEY) || "[]").filter((k) => typeof k === "string"); } catch { state.pins = []; }
  }
  const view = viewFrom(params);
  state.detail = view.detail;
  state.compare = view.compare;
  // The detail's run is drawn, so its point is on the charts.
  if (view.detail && !state.selected.includes(view.detail.run)) state.selected = [...state.selected, view.detail.run];
  state.notices = [...notices, ...view.problems];
}

// The page's state as URL parameters, without a view (a step's detail, a comparison).
function stateParams() {
  const params = new URLSearchParams();
  params.set("runs", state.selected.join(","));
  params.set("smooth", state.smooth);
  if (state.x !== DEFAULTS.x) params.set("x", state.x);
  if (state.y !== DEFAULTS.y) params.set("y", state.y);
  if (state.outliers) params.set("outliers", "1");
  if (state.group !== DEFAULTS.group) params.set("group", state.group);
  if (state.filter) params.set("filter", state.filter);
  params.set("pins", state.pins.join(","));
  return params;
}

/** The link to a step's detail (its run drawn beside those shown), for the alert list and comparison. */
function stepLink(detail) {
  const params = stateParams();
  if (!state.selected.includes(detail.run)) params.set("runs", [...state.selected, detail.run].join(","));
  return "#" + withView(params, { detail, compare: state.compare }).toString();
}

/** The URL says what is shown. ``push``: a new history entry (a view opened or closed, which Back undoes);
 *  else the entry is replaced (a control changed). */
function writeHash(push = false) {
  const hash = "#" + withView(stateParams(), { detail: state.detail, compare: state.compare }).toString();
  if (hash !== window.location.hash) {
    if (push) history.pushState(null, "", hash); else history.replaceState(null, "", hash);
  }
  state.applied = window.location.hash;
  try { localStorage.setItem(PINS_KEY, JSON.stringify(state.pins)); } catch { /* private mode: the URL keeps them */ }
}

function showNotices() {
  const box = $("notice");
  const text = $("notice-text");
  text.replaceChildren(...state.notices.map((n) => html("p", {}, n)));
  box.hidden = !state.notices.length;
}

function syncControls() {
  const [kind, arg] = state.smooth.split(":");
  $("smooth-kind").value = kind;
  if (kind === "ema") { $("ema-weight").value = arg; $("ema-value").textContent = arg; }
  if (kind === "window") $("window-width").value = arg;
  $("ema-label").hidden = kind !== "ema";
  $("window-label").hidden = kind !== "window";
  $("x-axis").value = state.x;
  $("y-scale").value = state.y;
  $("outliers").checked = state.outliers;
  $("filter").value = state.filter;
  syncGroupControl();
}

function smoothFromControls() {
  const kind = $("smooth-kind").value;
  if (kind === "ema") return "ema:" + Number($("ema-weight").value);
  if (kind === "window") {
    let n = Math.max(1, Math.round(Number($("window-width").value) || 1));
    if (n % 2 === 0) n += 1; // a centred window has an odd width
    return "window:" + n;
  }
  return "none";
}

// ---- runs, their config and their groups
function flatConfig(config, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(config || {})) {
    if (v !== null && typeof v === "object" && !Array.isArray(v)) flatConfig(v, `${prefix}${k}.`, out);
    else out[prefix + k] = Array.isArray(v) ? v.join(", ") : v;
  }
  return out;
}

function configKeys() {
  const keys = new Set();
  for (const run of state.runs) {
    for (const [k, v] of Object.entries(flatConfig(run.config))) if (v !== null && v !== "") keys.add(k);
  }
  return [...keys];
}

function groupOf(name) {
  const g = state.group;
  if (g === "none") return null;
  if (g === "seed") return name.replace(SEED_SUFFIX, "");
  if (g.startsWith("re:")) {
    const m = new RegExp(g.slice(3)).exec(name);
    return m ? (m[1] ?? m[0]) : name;
  }
  const key = g.slice("config:".length);
  const run = state.runs.find((r) => r.name === name);
  const value = run ? flatConfig(run.config)[key] : undefined;
  return `${key}=${value === undefined || value === null || value === "" ? "unset" : value}`;
}

function groupNames() {
  const names = [];
  for (const run of state.selected) {
    const g = groupOf(run);
    if (g !== null && !names.includes(g)) names.push(g);
  }
  return names;
}

function colorOf(run) {
  const i = state.runs.findIndex((r) => r.name === run);
  return COLORS[(i < 0 ? 0 : i) % COLORS.length];
}

function groupColor(name) {
  return COLORS[Math.max(0, groupNames().indexOf(name)) % COLORS.length];
}

function syncGroupControl() {
  const select = $("group-by");
  const options = [["none", "no grouping"], ["seed", "name without seed suffix"], ["re:", "name pattern (regex)…"]];
  for (const key of configKeys()) options.push([`config:${key}`, `config: ${key}`]);
  const current = state.group.startsWith("re:") ? "re:" : state.group;
  if (state.group.startsWith("config:") && !options.some(([v]) => v === state.group)) options.push([state.group, `config: ${state.group.slice(7)}`]);
  select.replaceChildren(...options.map(([v, label]) => html("option", { value: v }, label)));
  select.value = current;
  $("group-pattern").hidden = current !== "re:";
  if (current === "re:") $("group-pattern").value = state.group.slice(3);
}

function setSelected(names) {
  state.selected = state.runs.map((r) => r.name).filter((n) => names.includes(n));
  writeHash();
  renderRunTable();
  loadData().catch(loadFailed);
}

function renderRunTable() {
  const keys = configKeys();
  const grouping = state.group !== "none";
  $("runs-count").textContent = `${state.selected.length} of ${state.runs.length} shown`;
  const head = html("tr");
  for (const h of ["", "run", ...(grouping ? ["group"] : []), "checkpoints", "latest step", "evaluated step", "firing alerts", "created", ...keys]) html("th", {}, h, head);
  const body = document.createDocumentFragment();
  for (const run of state.runs) {
    const tr = html("tr", { "data-run": run.name }, null, body);
    const pick = html("td", { class: "pick" }, null, tr);
    const input = html("input", { type: "checkbox", value: run.name, "data-run": run.name, "aria-label": `show ${run.name}` }, null, pick);
    input.checked = state.selected.includes(run.name);
    input.addEventListener("change", () => {
      const names = new Set(state.selected);
      if (input.checked) names.add(run.name); else names.delete(run.name);
      setSelected([...names]);
    });
    const name = html("td", { class: "name", title: run.root }, null, tr);
    // The colour the charts draw it in: its group's when grouped.
    swatch(grouping ? groupColor(groupOf(run.name)) : colorOf(run.name), name);
    name.append(run.name);
    // Each cell names its column (data-label): a narrow screen stacks a row's cells (dashboard.css).
    if (grouping) html("td", { "data-key": "group", "data-label": "group" }, groupOf(run.name), tr);
    html("td", { class: "num", "data-label": "checkpoints" }, String(run.checkpoints), tr);
    html("td", { class: "num", "data-label": "latest step" }, fmt(run.latest_step), tr);
    html("td", { class: "num", "data-label": "evaluated step" }, fmt(run.evaluated_step), tr);
    html("td", { class: run.firing_alerts ? "num firing" : "num", "data-label": "firing alerts" }, String(run.firing_alerts), tr);
    html("td", { class: "when", "data-label": "created" }, run.created_at ? new Date(run.created_at).toLocaleString() : "–", tr);
    const flat = flatConfig(run.config);
    for (const k of keys) {
      const v = flat[k];
      html("td", { "data-key": `config.${k}`, "data-label": k }, v === null || v === undefined || v === "" ? "–" : String(v), tr);
    }
  }
  $("run-table").replaceChildren(html("thead"), html("tbody"));
  $("run-table").tHead.appendChild(head);
  $("run-table").tBodies[0].appendChild(body);
  $("runs-note").textContent = state.runs.some((r) => r.config === null) ? "– : not in this evald's config (any more)" : "";
  fitTable($("run-table"));
}

// A table of runs or alerts wider than its box stacks each row's cells (dashboard.css: table.stacked)
// instead of scrolling sideways: on a phone, beside the detail panel, or with many config columns.
function fitTable(table) {
  table.classList.remove("stacked");
  table.classList.toggle("stacked", table.scrollWidth > table.parentElement.clientWidth + 1);
}

// Refitted when its box's width changes (the window, the detail panel opened or closed).
const tableSized = new ResizeObserver((entries) => {
  for (const entry of entries) fitTable(entry.target.querySelector("table"));
});

// ---- loading
async function loadRuns() {
  state.runs = await pages("/api/v1/runs?limit=1000");
  const names = state.runs.map((r) => r.name);
  state.selected = state.selected.filter((n) => names.includes(n));
  if (!state.selected.length && names.length) state.selected = [names[0]];
  syncGroupControl();
  syncCompareControls();
  renderRunTable();
}

async function loadData() {
  const smooth = encodeURIComponent(state.smooth);
  // Every run's alerts at once: the alert list shows them all, the charts those of the runs drawn.
  const [loaded, alerts] = await Promise.all([
    Promise.all(state.selected.map(async (run) => {
      const series = await api(`/api/v1/runs/${encodeURIComponent(run)}/series?smooth=${smooth}`);
      return [run, series.series];
    })),
    pages("/api/v1/alerts?limit=10000"),
  ]);
  state.complete = true;
  state.loadError = null;
  state.dataStale = false;
  state.series = {}; state.alerts = {};
  for (const [run, series] of loaded) { state.series[run] = series; state.alerts[run] = []; }
  for (const a of alerts) if (state.alerts[a.run]) state.alerts[a.run].push(a);
  state.alertList = alerts;
  renderAlerts();
  render();
  // A comparison on show is asked again (new results, another smoothing); one being opened asks itself.
  if (state.compare && state.comparison) loadComparison().catch(comparisonFailed);
}

function renderAlerts() {
  const [shown, total] = showAlerts($("alert-table"), state.alertList, { html, linkTo: stepLink, only: state.alertState });
  const firing = state.alertList.filter((a) => a.state === "firing").length;
  $("alerts-count").textContent = `${firing} firing · ${state.alertList.length} in all` + (shown < total ? ` · ${shown} of ${total} listed` : "");
  $("alert-table").hidden = total === 0;
  $("alerts-empty").hidden = total !== 0;
  $("alerts-empty").textContent = state.alertList.length ? `No ${state.alertState} alert.` : "No alert has fired.";
  fitTable($("alert-table"));
}

function loadFailed(e) {
  state.loadError = e.message;
  state.dataStale = true;
  if (e instanceof ApiFailure && e.parameter === "smooth" && state.smooth !== DEFAULTS.smooth) {
    // The server refused a smoothing the page let through: say so and fall back, never a blank page.
    state.notices.push(`The server refused smoothing “${state.smooth}”: ${e.message}. Showing “${DEFAULTS.smooth}”.`);
    state.smooth = DEFAULTS.smooth;
    showNotices(); syncControls(); writeHash();
    loadData().catch(loadFailed);
    return;
  }
  showError(e.message);
  setLive();
}

// First load: one curve of the first run (found from its newest results), drawn before anything else is
// asked for. A run of 1,000 checkpoints x 20 metrics is 20,000 points (1 MB of JSON); asked for beside
// it, that and the run list took the server's and the page's CPU from the first chart. Waited for at most
// FIRST_WAIT_MS: a slower answer holds nothing back, and draws nothing once every curve has come.
async function firstChart() {
  if (state.complete || !state.selected.length) return;
  const wait = new Promise((resolve) => setTimeout(resolve, FIRST_WAIT_MS));
  await Promise.race([firstCurve(state.selected[0]).catch(() => {}), wait]);
}

async function firstCurve(run) {
  const enc = encodeURIComponent(run);
  const latest = await api(`/api/v1/results/latest?run=${enc}&limit=1`);
  if (!latest.items.length || state.complete) return;
  const { task, stage, metric } = latest.items[0];
  const query = new URLSearchParams({ task, stage, metric, smooth: state.smooth });
  const body = await api(`/api/v1/runs/${enc}/series?${query}`);
  if (state.complete) return;
  state.series = { [run]: body.series };
  state.alerts = { [run]: [] };
  render();
}

// ---- chart models
function sectionOf(metric) {
  if (/^(tokens_per_s|latency_|peak_memory|wall_s|load_s)/.test(metric)) return "system";
  if (/(length|truncation|entropy|^group_|_std$)/.test(metric)) return "behaviour";
  return "quality";
}

function chartKeys() {
  const keys = new Map();
  for (const run of state.selected) {
    for (const s of state.series[run] || []) {
      const key = `${s.task}/${s.stage}/${s.metric}`;
      if (!keys.has(key)) keys.set(key, { key, task: s.task, stage: s.stage, metric: s.metric });
    }
  }
  const filter = state.filter.toLowerCase();
  return [...keys.values()].filter((m) => !filter || m.key.toLowerCase().includes(filter));
}

function linesOf(meta) {
  const lines = [];
  for (const run of state.selected) {
    const s = (state.series[run] || []).find((x) => x.task === meta.task && x.stage === meta.stage && x.metric === meta.metric);
    if (s) lines.push({ run, s });
  }
  return lines;
}

// The run's first result time: relative time counts from it. Kept per loaded series list (every chart of
// the run asks).
const starts = new WeakMap();
function startOf(run) {
  const list = state.series[run] || [];
  if (starts.has(list)) return starts.get(list);
  let t0 = Infinity;
  for (const s of list) for (const t of s.time || []) if (t !== null && t < t0) t0 = t;
  starts.set(list, t0);
  return t0;
}

const num = (v) => (v === null || v === undefined ? NaN : v);

function runTrace(run, s, kind, color) {
  const shown = s.smoothed ? s.smoothed.value : s.value;
  const se = s.smoothed ? s.smoothed.stderr : s.stderr;
  const t0 = state.x === "relative" ? startOf(run) : 0;
  const xOf = (i) => (state.x === "step" ? s.step[i] : s.time && s.time[i] !== null ? s.time[i] - t0 : NaN);
  const points = s.step.map((step, i) => {
    const y = num(shown[i]), e = num(se[i]);
    return { step, x: xOf(i), y, raw: num(s.value[i]), se: e, n: s.n[i], lo: y - e, hi: y + e };
  });
  if (state.x !== "step") points.sort((a, b) => a.x - b.x);
  const at = s.best ? s.step.indexOf(s.best.step) : -1;
  const best = s.best && at >= 0 ? { step: s.best.step, x: xOf(at), y: num(s.best.value) } : null;
  return { name: run, run, kind, color, count: s.step.length, smoothed: !!s.smoothed, points, best: kind === "run" ? best : null };
}

function groupTrace(name, members) {
  const byStep = new Map();
  for (const m of members) {
    for (const p of m.points) {
      if (!Number.isFinite(p.y)) continue;
      if (!byStep.has(p.step)) byStep.set(p.step, []);
      byStep.get(p.step).push(p);
    }
  }
  const points = [...byStep.entries()].map(([step, ps]) => {
    const n = ps.length, mean = ps.reduce((a, p) => a + p.y, 0) / n;
    // Sample standard deviation across the group's runs (n - 1); one run has none.
    const std = n > 1 ? Math.sqrt(ps.reduce((a, p) => a + (p.y - mean) ** 2, 0) / (n - 1)) : NaN;
    const x = ps.reduce((a, p) => a + p.x, 0) / n;
    return { step, x, y: mean, raw: mean, std, members: n, se: NaN, n: null, lo: mean - std, hi: mean + std };
  }).sort((a, b) => a.x - b.x || a.step - b.step);
  return { name, kind: "group", color: groupColor(name), runs: members.map((m) => m.name), count: points.length, smoothed: false, points, best: null };
}

function alertMarks(meta, lines) {
  const marks = [];
  for (const { run, s } of lines) {
    for (const a of state.alerts[run] || []) {
      if (a.metric !== meta.metric || (a.task && a.task !== meta.task)) continue;
      // The onset (first_step) is where a person rolls back to; older rows carry only step.
      const onset = a.first_step ?? a.step, last = a.last_step ?? a.step;
      if (onset === null || onset === undefined) continue;
      const xOf = (step) => {
        if (state.x === "step") return step;
        const i = s.step.indexOf(step);
        return i >= 0 && s.time && s.time[i] !== null ? s.time[i] - (state.x === "relative" ? startOf(run) : 0) : NaN;
      };
      const span = last !== null && last !== undefined && last !== onset ? ` to step ${last}` : "";
      marks.push({
        run, state: a.state, step: onset, lastStep: last, x: xOf(onset), xLast: last === null ? NaN : xOf(last),
        title: `${run} · ${a.state}: ${a.rule} (${a.severity}) from step ${onset}${span}\n${a.message}`,
      });
    }
  }
  return marks;
}

function chartModel(meta) {
  const lines = linesOf(meta);
  const traces = [];
  if (state.group === "none") {
    for (const { run, s } of lines) traces.push(runTrace(run, s, "run", colorOf(run)));
  } else {
    for (const name of groupNames()) {
      const members = lines.filter(({ run }) => groupOf(run) === name).map(({ run, s }) => ({ ...runTrace(run, s, "member", groupColor(name)), group: name }));
      if (!members.length) continue;
      traces.push(groupTrace(name, members), ...members);
    }
  }
  return {
    key: meta.key, xmode: state.x, ylog: state.y === "log", outliers: state.outliers, zoom: state.zoom[meta.key] || null,
    xTitle: X_TITLES[state.x], yTitle: meta.metric + (state.y === "log" ? " (log scale)" : ""),
    traces, alerts: alertMarks(meta, lines), lines,
  };
}

// ---- rendering
function card(meta) {
  const node = html("div", { class: "chart", "data-chart": meta.key });
  const head = html("div", { class: "chart-head" }, null, node);
  const title = html("h2", {}, meta.metric + " ", head);
  html("span", { class: "sub" }, `${meta.task} · ${meta.stage}`, title);
  const tools = html("div", { class: "tools" }, null, head);
  const button = (cls, label, tip) => html("button", { type: "button", class: cls, title: tip }, label, tools);
  const reset = button("reset", "reset zoom", "show every point (or double-click the chart)");
  reset.hidden = true;
  reset.addEventListener("click", () => setZoom(meta.key, null));
  const pin = button("pin", "☆ pin", "keep this chart at the top");
  pin.addEventListener("click", () => togglePin(meta.key));
  for (const format of ["png", "svg", "csv"]) {
    button(`dl ${format}`, format.toUpperCase(), `download this chart as ${format.toUpperCase()}${format === "csv" ? " (its data)" : ""}`)
      .addEventListener("click", () => download(meta, format));
  }
  const box = html("div", { class: "plot-box" }, null, node);
  box.appendChild(document.createElementNS("http://www.w3.org/2000/svg", "svg")).setAttribute("class", "plot");
  html("div", { class: "tooltip", role: "tooltip" }, null, box).hidden = true;
  html("div", { class: "legend" }, null, node);
  return node;
}

function legendItems(model) {
  return model.traces.filter((t) => t.kind !== "member").map((t) => {
    if (t.kind === "group") return { color: t.color, label: t.runs.length > 1 ? `${t.name}: mean of ${t.runs.length} runs ± 1 std` : `${t.name}: 1 run` };
    const last = t.points.reduce((a, p) => (a === null || p.step > a.step ? p : a), null); // the newest step
    return { color: t.color, label: `${t.name}: ${fmt(last ? last.raw : null)} @ ${last ? last.step : "–"}` + (t.best ? ` · best ${fmt(t.best.y)} @ ${t.best.step}` : "") };
  });
}

function drawCard(node, meta, width) {
  const model = { ...chartModel(meta), width };
  const drawn = drawChart(node, model, {
    onZoom: (zoom) => setZoom(meta.key, zoom),
    onPick: (run, step) => openDetail({ run, step, task: meta.task, metric: meta.metric }),
    selected: (run, step) => state.detail !== null && state.detail.run === run && state.detail.step === step,
  });
  state.drawn[meta.key] = drawn;
  node.querySelector("button.reset").hidden = !state.zoom[meta.key];
  const pinned = state.pins.includes(meta.key);
  const pin = node.querySelector("button.pin");
  pin.textContent = pinned ? "★ pinned" : "☆ pin";
  pin.setAttribute("aria-pressed", String(pinned));
  const legend = node.querySelector(".legend");
  legend.replaceChildren();
  for (const item of legendItems(model)) {
    const span = html("span", { class: "item" }, null, legend);
    swatch(item.color, span);
    span.append(item.label);
  }
  const notes = [];
  const own = model.traces.filter((t) => t.kind !== "group" && t.kind !== "member");
  const empty = own.flatMap((t) => t.points.filter((p) => p.n === 0 && !Number.isFinite(p.y)).map((p) => `step ${p.step} (${t.name})`));
  if (empty.length) notes.push(`no samples (n = 0), so no value, at ${empty.slice(0, 4).join(", ")}${empty.length > 4 ? ` and ${empty.length - 4} more` : ""} (○ on the axis)`);
  const missing = own.reduce((a, t) => a + t.points.filter((p) => !Number.isFinite(p.y) && p.n !== 0).length, 0);
  if (missing) notes.push(`${missing} point${missing > 1 ? "s" : ""} without a value (not a number) left out`);
  if (drawn && Number(drawn.skipped)) notes.push(`${drawn.skipped} value${drawn.skipped > 1 ? "s" : ""} ≤ 0 not on the log scale`);
  if (drawn && Number(drawn.clipped)) notes.push(`${drawn.clipped} outlier${drawn.clipped > 1 ? "s" : ""} outside the scale (▲▼ at the edge)`);
  if (state.group !== "none") notes.push("band: ± 1 std across the group's runs; faint lines: its runs");
  if (notes.length) html("div", { class: "note" }, notes.join(" · "), legend);
  node._model = model;
}

function render() {
  const box = $("charts");
  const keys = chartKeys();
  const wanted = new Set(keys.map((m) => m.key));
  const existing = new Map([...box.querySelectorAll(".chart")].map((c) => [c.dataset.chart, c]));
  for (const [key, node] of existing) {
    if (wanted.has(key)) continue;
    sized.unobserve(node.querySelector(".plot-box"));
    node.remove();
  }
  $("charts-empty").hidden = keys.length > 0;
  $("charts-empty").textContent = state.selected.length
    ? (state.filter ? "No chart matches the filter." : "No results yet for the selected runs.")
    : state.runs.length ? "No run shown: tick one in the run table." : "No runs in the database yet.";
  const placed = [];
  for (const [section] of SECTIONS) {
    const part = box.querySelector(`section[data-section="${section}"]`);
    const metas = keys.filter((m) => (state.pins.includes(m.key) ? "pinned" : sectionOf(m.metric)) === section);
    part.hidden = !metas.length;
    part.classList.toggle("folded", !!state.folded[section]);
    part.querySelector(".count").textContent = `${metas.length} chart${metas.length === 1 ? "" : "s"}`;
    const grid = part.querySelector(".grid");
    metas.forEach((meta, i) => {
      const node = existing.get(meta.key) || card(meta);
      node.dataset.section = section;
      // (Re)placed in key order, moved only when out of place (a move makes the page lay out again).
      if (grid.children[i] !== node) grid.insertBefore(node, grid.children[i] ?? null);
      if (!state.folded[section]) placed.push([node, meta]);
    });
  }
  // A card's width is known from its ResizeObserver; a new one is measured, all in one layout, while its
  // chart is still empty (a forced layout of twenty drawn charts cost more than drawing them).
  const fresh = placed.filter(([node]) => node._width === undefined);
  const widths = fresh.map(([node]) => node.querySelector(".plot-box").getBoundingClientRect().width);
  fresh.forEach(([node], i) => {
    node._width = widths[i];
    node._redraw = () => {
      const m = metaOf(node);
      if (m && !state.folded[node.dataset.section]) drawCard(node, m, node._width);
    };
    sized.observe(node.querySelector(".plot-box"));
  });
  for (const [node, m] of placed) drawCard(node, m, node._width);
  markFocus();
}

const metaOf = (node) => chartKeys().find((m) => m.key === node.dataset.chart);

// Charts are drawn at their card's width: a card whose width changes (window, detail panel, a phone
// turned) is redrawn at its new width (until then its svg is scaled down to fit: dashboard.css).
const sized = new ResizeObserver((entries) => {
  const changed = [];
  for (const entry of entries) {
    const node = entry.target.closest(".chart");
    const w = entry.contentRect.width;
    if (!node || Math.abs(w - (node._width ?? -1)) < 0.5) continue;
    node._width = w;
    changed.push(node);
  }
  if (!changed.length) return;
  requestAnimationFrame(() => {
    for (const node of changed) if (node.isConnected && node._redraw) node._redraw();
  });
});

function sections() {
  const box = $("charts");
  for (const [section, title] of SECTIONS) {
    const part = html("section", { class: "section", "data-section": section }, null, box);
    const head = html("h2", { class: "section-title" }, null, part);
    const fold = html("button", { type: "button", class: "fold", "aria-expanded": "true" }, title, head);
    html("span", { class: "count" }, "", head);
    fold.addEventListener("click", () => {
      state.folded[section] = !state.folded[section];
      fold.setAttribute("aria-expanded", String(!state.folded[section]));
      render();
    });
    html("div", { class: "grid" }, null, part);
    part.hidden = true;
  }
}

function setZoom(key, zoom) {
  if (zoom) state.zoom[key] = zoom; else delete state.zoom[key];
  render();
}

function togglePin(key) {
  state.pins = state.pins.includes(key) ? state.pins.filter((k) => k !== key) : [...state.pins, key];
  writeHash();
  render();
}

async function download(meta, format) {
  const node = $("charts").querySelector(`.chart[data-chart="${CSS.escape(meta.key)}"]`);
  const model = node._model;
  try {
    if (format === "csv") saveCsv(meta, model.lines);
    else if (format === "svg") saveSvg(node, meta, legendItems(model));
    else await savePng(node, meta, legendItems(model));
  } catch (e) {
    showError(`could not save the chart: ${e.message}`);
  }
}

// ---- detail: one checkpoint's metrics, alerts and samples; in the URL as run=R&step=S&metric=M&task=T
function metricsTable(info, detail) {
  // Task and stage get a column only when they differ between rows (else the caption says them).
  const varies = (k) => new Set(info.results.map((r) => r[k])).size > 1;
  const cols = ["task", "stage"].filter(varies);
  const table = html("table", { id: "metrics-table" });
  const same = ["task", "stage"].filter((k) => !cols.includes(k)).map((k) => info.results[0]?.[k]).filter(Boolean);
  if (same.length) html("caption", {}, same.join(" · "), table);
  const head = html("tr", {}, null, html("thead", {}, null, table));
  for (const h of [...cols, "metric", "value", "± stderr", "n"]) html("th", {}, h, head);
  const body = html("tbody", {}, null, table);
  for (const r of info.results) {
    // The metric the link (or the clicked chart) names is marked.
    const focus = r.metric === detail.metric && (!detail.task || r.task === detail.task);
    const tr = html("tr", { class: focus ? "focus" : null, "data-metric": r.metric, "data-task": r.task }, null, body);
    for (const k of cols) html("td", {}, r[k], tr);
    html("td", { class: "metric" }, r.metric, tr);
    html("td", { class: "num" }, r.value === null && r.n === 0 ? "no samples" : fmt(r.value), tr);
    html("td", { class: "num" }, fmt(r.stderr), tr); html("td", { class: "num" }, fmt(r.n), tr);
  }
  return table;
}

function markSelected() {
  document.querySelectorAll("circle.pt.selected").forEach((c) => c.classList.remove("selected"));
  const d = state.detail;
  if (d) document.querySelectorAll(`circle.pt[data-run="${CSS.escape(d.run)}"][data-step="${d.step}"]`).forEach((c) => c.classList.add("selected"));
}

// The charts of the detail's metric are outlined (its task's only, when the link names one).
function markFocus() {
  const d = state.detail;
  for (const node of document.querySelectorAll("#charts .chart")) {
    const [task, , metric] = node.dataset.chart.split("/");
    node.classList.toggle("focus", !!d && !!d.metric && metric === d.metric && (!d.task || task === d.task));
  }
}

/** Opens ``detail`` ({run, step, metric, task}). ``push``: a new history entry (Back closes it);
 *  ``reveal``: scroll its metric's chart into view (a link was followed: nothing on the page led there). */
async function openDetail(detail, { push = true, reveal = false } = {}) {
  state.detail = detail;
  if (push) writeHash(true);
  const { run, step, task } = detail;
  markSelected();
  markFocus();
  $("detail").hidden = false;
  document.body.classList.add("detail-open");
  // Once the page has laid out beside the open panel (its tables may stack, moving the charts).
  if (reveal) requestAnimationFrame(() => document.querySelector("#charts .chart.focus")?.scrollIntoView({ block: "center" }));
  $("detail-title").textContent = `${run} · step ${step}`;
  $("detail-link").href = window.location.hash;
  try {
    const info = await api(`/api/v1/runs/${encodeURIComponent(run)}/steps/${step}`);
    if (state.detail !== detail) return; // another step was opened meanwhile
    $("detail-title").textContent = `${run} · step ${step} · ${info.checkpoint}`;
    $("detail-metrics").replaceChildren(html("div", { class: "table-wrap" }, null));
    $("detail-metrics").firstChild.appendChild(metricsTable(info, detail));
    document.querySelector("#metrics-table tr.focus")?.scrollIntoView({ block: "nearest" });
    const alerts = $("detail-alerts");
    alerts.replaceChildren();
    if (info.alerts.length) {
      html("h3", {}, "Alerts at this step", alerts);
      for (const a of info.alerts) html("p", { class: `alert-text ${a.state}` }, `${a.state} · ${a.severity} · ${a.rule}: ${a.message}`, alerts);
    }
    showJobs($("detail-jobs"), info.jobs, api, html);
    const tasks = [...new Set(info.results.map((r) => r.task))];
    const select = $("detail-task");
    select.replaceChildren(...tasks.map((t) => html("option", { value: t }, t)));
    select.value = tasks.includes(task) ? task : tasks[0];
    select.hidden = tasks.length < 2;
    await loadSamples();
  } catch (e) {
    if (state.detail !== detail) return;
    $("detail-metrics").replaceChildren(html("p", { class: "muted" }, e.message));
    $("detail-alerts").replaceChildren();
    $("detail-jobs").replaceChildren();
    $("detail-samples").replaceChildren();
  }
}

function closeDetail({ push = true } = {}) {
  $("detail").hidden = true;
  document.body.classList.remove("detail-open");
  state.detail = null;
  if (push) writeHash(true);
  markSelected();
  markFocus();
}

async function loadSamples() {
  const { run, step } = state.detail;
  const task = $("detail-task").value;
  const wrong = $("wrong-only").checked;
  const box = $("detail-samples");
  try {
    const body = await api(`/api/v1/runs/${encodeURIComponent(run)}/steps/${step}/samples?task=${encodeURIComponent(task)}&wrong_only=${wrong}&limit=200`);
    box.replaceChildren(html("p", { class: "muted", id: "samples-summary" },
      `${body.matching_samples} ${wrong ? "wrong " : ""}of ${body.stored_samples} stored samples (${body.task}/${body.stage}, job ${body.job_id})` +
      (body.problems.length ? `; ${body.problems.length} inputs left out` : "")));
    for (const s of body.items) {
      // A likelihood sample (perplexity) has no right answer: its grade is null, shown as such.
      const grade = s.correct === null ? "ungraded" : s.correct ? "right" : "wrong";
      const said = { ungraded: "not graded", right: "correct", wrong: "wrong" }[grade];
      const sample = html("div", { class: `sample ${grade}`, "data-index": s.index }, null, box);
      html("div", {}, `#${s.index} · ${s.prompt_id} · ${said} · ${s.tokens} tokens${s.truncated ? " · truncated" : ""}${s.error ? " · error: " + s.error : ""}`, sample);
      html("div", { class: "muted" }, "prompt", sample); html("pre", {}, s.prompt, sample);
      html("div", { class: "muted" }, "response", sample); html("pre", {}, s.response, sample);
      html("div", {}, `extracted: ${s.extracted ?? "–"} · reference: ${s.reference}`, sample);
    }
    for (const p of body.problems) html("div", { class: "sample wrong" }, `left out: ${p.where}: ${p.message}`, box);
  } catch (e) {
    box.replaceChildren(html("p", { class: "muted" }, e.message));
  }
}

// ---- the paired comparison of two runs (compare.js); in the URL as compare=A,B&fdr=F
function syncCompareControls() {
  const names = state.runs.map((r) => r.name);
  for (const [id, run] of [["compare-a", state.compare?.a], ["compare-b", state.compare?.b]]) {
    const select = $(id);
    select.replaceChildren(...names.map((n) => html("option", { value: n }, n)));
    if (run) select.value = run;
  }
  $("compare-fdr").value = String(state.compare?.fdr ?? DEFAULT_FDR);
  $("open-compare").disabled = names.length < 2;
}

async function loadComparison() {
  const wanted = state.compare;
  const query = new URLSearchParams({ run_a: wanted.a, run_b: wanted.b, smooth: state.smooth, fdr: String(wanted.fdr) });
  const body = await api(`/api/v1/compare?${query}`);
  if (state.compare !== wanted) return; // another pair was chosen meanwhile
  state.comparison = body;
  renderComparison();
}

function renderComparison() {
  const body = state.comparison;
  if (!body || !state.compare) return;
  for (const box of $("compare-charts").querySelectorAll(".plot-box")) sized.unobserve(box);
  showComparison($("compare-box"), body, {
    html, swatch, colorOf, filter: state.filter, zooms: state.compareZooms,
    linkTo: stepLink,
    onPick: (run, step, group) => openDetail({ run, step, metric: group.metric, task: group.task }),
    placed: (node) => {
      node._width = node.querySelector(".plot-box").getBoundingClientRect().width;
      sized.observe(node.querySelector(".plot-box"));
      node._redraw();
    },
  });
  $("compare-box").dataset.ready = `${body.run_a},${body.run_b}`;
}

function comparisonFailed(e) {
  $("compare-summary").textContent = `Cannot compare: ${e.message}`;
  $("compare-rule").textContent = "";
  $("compare-unmatched").textContent = "";
  $("compare-charts").replaceChildren();
  $("compare-box").dataset.ready = "failed";
}

/** Opens the comparison of ``compare`` ({a, b, fdr}); ``push`` as openDetail's. */
function openCompare(compare, { push = true } = {}) {
  state.compare = compare;
  state.comparison = null;
  state.compareZooms = {};
  if (push) writeHash(true);
  syncCompareControls();
  $("compare-box").hidden = false;
  delete $("compare-box").dataset.ready;
  $("compare-summary").textContent = `comparing ${compare.b} with ${compare.a}…`;
  loadComparison().catch(comparisonFailed);
}

function closeCompare({ push = true } = {}) {
  state.compare = null;
  state.comparison = null;
  $("compare-box").hidden = true;
  $("compare-charts").replaceChildren();
  if (push) writeHash(true);
}

function compareFromControls() {
  const raw = Number($("compare-fdr").value);
  const fdr = raw > 0 && raw < 1 ? raw : DEFAULT_FDR;
  openCompare({ a: $("compare-a").value, b: $("compare-b").value, fdr });
}

function startCompare() {
  // The first two runs shown, else the first two runs.
  const names = state.selected.length >= 2 ? state.selected : state.runs.map((r) => r.name);
  if (names.length < 2) return;
  openCompare({ a: names[0], b: names[1], fdr: DEFAULT_FDR });
  $("compare-box").scrollIntoView({ block: "start" });
}

// ---- the view the URL names: on load, and when a link or Back/Forward changes it
function checkViewRuns() {
  const names = state.runs.map((r) => r.name);
  if (state.detail && !names.includes(state.detail.run)) {
    state.notices.push(`This link's run “${state.detail.run}” is not in the database (runs: ${names.join(", ") || "none"}).`);
    state.detail = null;
  }
  const missing = state.compare ? [state.compare.a, state.compare.b].filter((r) => !names.includes(r)) : [];
  if (missing.length) {
    state.notices.push(`This link compares “${missing.join("” and “")}”, not in the database (runs: ${names.join(", ") || "none"}).`);
    state.compare = null;
  }
  showNotices();
}

// The comparison on show: {a, b, fdr}, as drawn (null while none is).
function shownCompare() {
  const body = state.comparison;
  return body && !$("compare-box").hidden ? { a: body.run_a, b: body.run_b, fdr: body.fdr } : null;
}

function showView({ reveal = false } = {}) {
  if (state.detail) openDetail(state.detail, { push: false, reveal });
  else if (!$("detail").hidden) closeDetail({ push: false });
  const shown = shownCompare(), wanted = state.compare;
  // The same comparison is kept as drawn (a step opened from its table is a new URL, not a new pair).
  const same = shown && wanted && shown.a === wanted.a && shown.b === wanted.b && shown.fdr === wanted.fdr;
  if (wanted && !same) openCompare(wanted, { push: false });
  else if (!wanted && !$("compare-box").hidden) closeCompare({ push: false });
}

async function followUrl() {
  if (window.location.hash === state.applied) return;
  const before = `${state.selected.join(",")}|${state.smooth}`;
  readHash();
  state.applied = window.location.hash;
  state.selected = state.selected.filter((n) => state.runs.some((r) => r.name === n));
  checkViewRuns();
  syncControls();
  if (`${state.selected.join(",")}|${state.smooth}` !== before) {
    renderRunTable();
    await loadData().catch(loadFailed);
  } else {
    renderRunTable();
    render();
  }
  showView({ reveal: true });
  writeHash(); // the URL now says what is shown (a run or view it named that does not exist is left out)
}

// ---- live updates
function setLive() {
  const live = $("live");
  if (state.loadError) {
    live.textContent = `not updating: ${state.loadError}`;
    live.classList.add("stale");
  } else if (state.lastOk) {
    live.textContent = `live · updated ${state.lastOk.toLocaleTimeString()}`;
    live.classList.remove("stale");
  }
}

async function poll() {
  try {
    const { version } = await api("/api/v1/changes");
    // A load that failed (an outage) is tried again at the next poll, whether or not the data moved.
    if (version !== state.version || state.dataStale) {
      const first = state.version === null && !state.dataStale;
      state.version = version;
      if (!first) { await loadRuns(); await loadData(); }
    }
    state.lastOk = new Date();
    state.loadError = null;
    showError("");
  } catch (e) {
    state.loadError = e.message;
    state.dataStale = true;
  }
  setLive();
}

function wire() {
  const onSmooth = () => {
    state.smooth = smoothFromControls();
    syncControls();
    writeHash();
    loadData().catch(loadFailed);
  };
  $("smooth-kind").addEventListener("change", onSmooth);
  $("ema-weight").addEventListener("input", () => { $("ema-value").textContent = $("ema-weight").value; });
  $("ema-weight").addEventListener("change", onSmooth);
  $("window-width").addEventListener("change", onSmooth);
  $("filter").addEventListener("input", () => { state.filter = $("filter").value; writeHash(); render(); renderComparison(); });
  $("x-axis").addEventListener("change", () => { state.x = $("x-axis").value; state.zoom = {}; writeHash(); render(); });
  $("y-scale").addEventListener("change", () => {
    state.y = $("y-scale").value;
    for (const z of Object.values(state.zoom)) z.y = null; // a y range in the other scale's terms means nothing
    writeHash(); render();
  });
  $("outliers").addEventListener("change", () => { state.outliers = $("outliers").checked; writeHash(); render(); });
  const onGroup = () => {
    const v = $("group-by").value;
    if (v === "re:") {
      $("group-pattern").hidden = false;
      const pattern = $("group-pattern").value;
      const spec = "re:" + pattern;
      if (!pattern || groupProblem(spec)) { $("group-pattern").setCustomValidity(pattern ? groupProblem(spec) : "a pattern"); return; }
      $("group-pattern").setCustomValidity("");
      state.group = spec;
    } else {
      state.group = v;
    }
    syncGroupControl(); writeHash(); renderRunTable(); render();
  };
  $("group-by").addEventListener("change", onGroup);
  $("group-pattern").addEventListener("change", onGroup);
  $("select-all").addEventListener("click", () => setSelected(state.runs.map((r) => r.name)));
  $("select-none").addEventListener("click", () => setSelected([]));
  $("notice-close").addEventListener("click", () => { state.notices = []; showNotices(); });
  $("wrong-only").addEventListener("change", () => loadSamples());
  $("detail-task").addEventListener("change", () => loadSamples());
  $("close-detail").addEventListener("click", () => closeDetail());
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.detail) closeDetail(); });
  for (const id of ["run-table", "alert-table"]) tableSized.observe($(id).parentElement);
  $("alerts-state").addEventListener("change", () => { state.alertState = $("alerts-state").value; renderAlerts(); });
  $("open-compare").addEventListener("click", startCompare);
  $("close-compare").addEventListener("click", () => closeCompare());
  for (const id of ["compare-a", "compare-b", "compare-fdr"]) $(id).addEventListener("change", compareFromControls);
  // A link followed (the alert list's, a pasted one) or Back/Forward: show the view the URL names.
  window.addEventListener("popstate", () => { followUrl().catch(loadFailed); });
  window.addEventListener("hashchange", () => { followUrl().catch(loadFailed); });
}

async function start() {
  readHash();
  sections();
  syncControls();
  showNotices();
  wire();
  if (state.notices.length) writeHash(); // the URL now says what is shown
  try {
    // Runs named in the URL: their first chart comes before anything else, then their charts load beside
    // the run list instead of after it.
    let early = Promise.resolve(false);
    if (state.selected.length) {
      await firstChart();
      early = loadData().then(() => true, () => false);
    }
    await Promise.all([poll(), loadRuns()]);
    checkViewRuns();
    writeHash();
    if (!(await early)) { await firstChart(); await loadData(); }
    render(); // again, now that every run has its colour
    showView({ reveal: true });
    setLive();
    document.body.dataset.ready = "true";
  } catch (e) {
    loadFailed(e);
    document.body.dataset.ready = "true";
  }
  setInterval(poll, POLL_MS);
}

start();
