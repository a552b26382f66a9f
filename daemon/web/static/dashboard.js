// evald dashboard: plain SVG charts over the read-only JSON API, no library and no build step.
//
// One chart per (task, stage, metric); every selected run is a line on it, with its standard-error band,
// the raw curve faint behind the smoothed one (smoothing is computed by the server, daemon/smoothing.py,
// the same function as `evald compare`), alert markers at their steps (red: firing, grey: resolved) and
// the best checkpoint ringed. Clicking a point opens that checkpoint's metrics and samples. The page polls
// /api/v1/changes every 2 s and reloads its data when the database moved.
"use strict";

const POLL_MS = 2000;
const FIRST_WAIT_MS = 3000; // the longest the first chart holds back the rest of the first load
const MARKERS_MAX = 200; // above this many points a line has no clickable dots; a click takes the nearest
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];
const SVG = "http://www.w3.org/2000/svg";
const W = 600, H = 220, M = { left: 52, right: 12, top: 10, bottom: 24 }, PAD = 10;

const state = {
  runs: [],          // every run the API lists
  selected: [],      // run names shown
  series: {},        // run -> series list from /series
  alerts: {},        // run -> alert list
  version: null,     // /changes version last loaded
  detail: null,      // {run, step}
  smooth: "none",
  filter: "",
  lastOk: null,
  complete: false,   // every curve of the selected runs has been loaded once (the first chart is not needed)
};
window.evald = state; // the browser test reads what was drawn from here and from the DOM

const $ = (id) => document.getElementById(id);

async function api(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" }, credentials: "same-origin" });
  if (response.status === 401) { window.location.href = "/login"; throw new Error("token required"); }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
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

function el(tag, attrs = {}, parent = null, ns = SVG) {
  const node = document.createElementNS(ns, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function html(tag, attrs = {}, text = null, parent = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3)) return v.toExponential(3);
  return Number(v.toPrecision(4)).toString();
}

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) { const d = Math.abs(lo) || 1; lo -= d * 0.05; hi += d * 0.05; }
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * mag).find((s) => s >= raw) || raw;
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return { lo, hi, ticks };
}

// ---- state in the URL: #runs=a,b&smooth=ema:0.6&filter=acc
function readHash() {
  const params = new URLSearchParams(window.location.hash.slice(1));
  if (params.get("runs")) state.selected = params.get("runs").split(",").filter(Boolean);
  if (params.get("smooth")) state.smooth = params.get("smooth");
  if (params.get("filter")) state.filter = params.get("filter");
}

function writeHash() {
  const params = new URLSearchParams();
  params.set("runs", state.selected.join(","));
  params.set("smooth", state.smooth);
  if (state.filter) params.set("filter", state.filter);
  history.replaceState(null, "", "#" + params.toString());
}

function syncSmoothControls() {
  const [kind, arg] = state.smooth.split(":");
  $("smooth-kind").value = kind;
  if (kind === "ema") { $("ema-weight").value = arg; $("ema-value").textContent = arg; }
  if (kind === "window") $("window-width").value = arg;
  $("ema-label").hidden = kind !== "ema";
  $("window-label").hidden = kind !== "window";
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

// ---- loading
async function loadRuns() {
  state.runs = await pages("/api/v1/runs?limit=1000");
  const names = state.runs.map((r) => r.name);
  state.selected = state.selected.filter((n) => names.includes(n));
  if (!state.selected.length && names.length) state.selected = [names[0]];
  const box = $("runs");
  box.replaceChildren(html("legend", {}, "Runs"));
  state.runs.forEach((run, i) => {
    const label = html("label", { title: `${run.root}\nlatest step ${run.latest_step}` }, null, box);
    const input = html("input", { type: "checkbox", value: run.name, "data-run": run.name }, null, label);
    input.checked = state.selected.includes(run.name);
    input.addEventListener("change", () => {
      state.selected = state.runs.map((r) => r.name).filter((n) => box.querySelector(`input[value="${CSS.escape(n)}"]`).checked);
      writeHash();
      loadData().catch((e) => showError(e.message));
    });
    const sw = html("span", { class: "swatch" }, null, label);
    sw.setAttribute("data-color", i);
    label.append(run.name + (run.firing_alerts ? ` (${run.firing_alerts} firing)` : ""));
  });
  paintSwatches();
}

function colorOf(run) {
  const i = state.runs.findIndex((r) => r.name === run);
  return COLORS[(i < 0 ? 0 : i) % COLORS.length];
}

function paintSwatches() {
  // CSP forbids inline styles; an SVG square carries the colour instead.
  document.querySelectorAll("#runs .swatch").forEach((sw) => {
    const run = sw.parentElement.querySelector("input").value;
    const svg = el("svg", { width: 10, height: 10, viewBox: "0 0 10 10" });
    el("rect", { width: 10, height: 10, rx: 2, fill: colorOf(run) }, svg);
    sw.replaceChildren(svg);
  });
}

async function loadData() {
  const smooth = encodeURIComponent(state.smooth);
  const loaded = await Promise.all(state.selected.map(async (run) => {
    const enc = encodeURIComponent(run);
    const [series, alerts] = await Promise.all([
      api(`/api/v1/runs/${enc}/series?smooth=${smooth}`),
      pages(`/api/v1/alerts?run=${enc}&limit=10000`),
    ]);
    return [run, series.series, alerts];
  }));
  state.complete = true;
  state.series = {}; state.alerts = {};
  for (const [run, series, alerts] of loaded) { state.series[run] = series; state.alerts[run] = alerts; }
  render();
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

// ---- charts
function chartKeys() {
  const keys = new Map();
  for (const run of state.selected) {
    for (const s of state.series[run] || []) {
      const key = `${s.task}/${s.stage}/${s.metric}`;
      if (!keys.has(key)) keys.set(key, { task: s.task, stage: s.stage, metric: s.metric });
    }
  }
  const filter = state.filter.toLowerCase();
  return [...keys.entries()].filter(([key]) => !filter || key.toLowerCase().includes(filter));
}

function render() {
  const box = $("charts");
  const keys = chartKeys();
  const existing = new Map([...box.children].map((c) => [c.dataset.chart, c]));
  const wanted = new Set(keys.map(([k]) => k));
  for (const [key, node] of existing) if (!wanted.has(key)) node.remove();
  if (!keys.length) {
    box.replaceChildren(html("p", { class: "muted" }, state.selected.length ? "No results yet for the selected runs." : "No runs in the database yet."));
    return;
  }
  box.querySelector("p.muted")?.remove();
  for (const [key, meta] of keys) {
    let card = existing.get(key);
    if (!card) {
      card = html("div", { class: "chart", "data-chart": key });
      const title = html("h2", {}, meta.metric + " ", card);
      html("span", { class: "sub" }, `${meta.task} · ${meta.stage}`, title);
      card.appendChild(el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }));
      html("div", { class: "legend" }, "", card);
    }
    box.appendChild(card); // (re)placed in key order: a chart drawn early keeps its place among the rest
    drawChart(card, meta);
  }
}

function drawChart(card, meta) {
  const svg = card.querySelector("svg");
  svg.replaceChildren();
  const lines = [];
  for (const run of state.selected) {
    const s = (state.series[run] || []).find((x) => x.task === meta.task && x.stage === meta.stage && x.metric === meta.metric);
    if (s) lines.push({ run, s });
  }
  let xs = [], ys = [];
  for (const { s } of lines) {
    const shown = s.smoothed ? s.smoothed.value : s.value;
    const se = s.smoothed ? s.smoothed.stderr : s.stderr;
    s.step.forEach((step, i) => {
      xs.push(step);
      for (const v of [s.value[i], shown[i], shown[i] !== null && se[i] !== null ? shown[i] - se[i] : null, shown[i] !== null && se[i] !== null ? shown[i] + se[i] : null]) {
        if (v !== null && Number.isFinite(v)) ys.push(v);
      }
    });
  }
  if (!xs.length) return;
  const xr = niceTicks(Math.min(...xs), Math.max(...xs), 6);
  const yr = niceTicks(Math.min(...ys), Math.max(...ys), 5);
  const x0 = Math.min(xr.lo, Math.min(...xs)), x1 = Math.max(xr.hi, Math.max(...xs));
  const y0 = Math.min(yr.lo, Math.min(...ys)), y1 = Math.max(yr.hi, Math.max(...ys));
  // Points sit a little inside the axes, so a ring on the first step does not cover the tick labels.
  const px = (x) => M.left + PAD + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (W - M.left - M.right - 2 * PAD);
  const py = (y) => H - M.bottom - (y1 === y0 ? 0.5 : (y - y0) / (y1 - y0)) * (H - M.top - M.bottom);

  const grid = el("g", { class: "grid axis" }, svg);
  for (const t of yr.ticks) {
    if (t < y0 || t > y1) continue;
    el("line", { x1: M.left, x2: W - M.right, y1: py(t), y2: py(t) }, grid);
    el("text", { x: M.left - 4, y: py(t) + 3, "text-anchor": "end" }, grid).textContent = fmt(t);
  }
  for (const t of xr.ticks) {
    if (t < x0 || t > x1) continue;
    el("text", { x: px(t), y: H - 6, "text-anchor": "middle" }, grid).textContent = fmt(t);
  }

  // Alerts first, under the lines: a dashed rule at the step, a triangle on top.
  for (const { run } of lines) {
    for (const a of state.alerts[run] || []) {
      if (a.step === null || a.metric !== meta.metric || (a.task && a.task !== meta.task)) continue;
      if (a.step < x0 || a.step > x1) continue;
      const g = el("g", { class: `alert ${a.state}`, "data-step": a.step, "data-run": run }, svg);
      el("line", { x1: px(a.step), x2: px(a.step), y1: M.top, y2: H - M.bottom }, g);
      el("path", { d: `M${px(a.step) - 5},${M.top} h10 l-5,7 z` }, g);
      el("title", {}, g).textContent = `${a.state}: ${a.rule} (${a.severity}) at step ${a.step}\n${a.message}`;
    }
  }

  const legend = [];
  for (const { run, s } of lines) {
    const color = colorOf(run);
    const shown = s.smoothed ? s.smoothed.value : s.value;
    const se = s.smoothed ? s.smoothed.stderr : s.stderr;
    const upper = [], lower = [];
    s.step.forEach((step, i) => {
      if (shown[i] === null || se[i] === null) return;
      upper.push(`${px(step)},${py(shown[i] + se[i])}`);
      lower.unshift(`${px(step)},${py(shown[i] - se[i])}`);
    });
    if (upper.length > 1) el("polygon", { class: "band", fill: color, points: upper.concat(lower).join(" "), "data-run": run }, svg);
    const pts = (vals) => s.step.map((step, i) => (vals[i] === null ? null : `${px(step)},${py(vals[i])}`)).filter(Boolean).join(" ");
    if (s.smoothed) el("polyline", { class: "raw", stroke: color, points: pts(s.value), "data-run": run }, svg);
    el("polyline", { class: "line", stroke: color, points: pts(shown), "data-run": run, "data-points": s.step.length }, svg);
    if (s.step.length <= MARKERS_MAX) {
      s.step.forEach((step, i) => {
        if (shown[i] === null) return;
        const dot = el("circle", { class: "pt", cx: px(step), cy: py(shown[i]), r: 3.2, fill: color, "data-run": run, "data-step": step }, svg);
        if (state.detail && state.detail.run === run && state.detail.step === step) dot.classList.add("selected");
        el("title", {}, dot).textContent = `${run} step ${step}: ${fmt(s.value[i])}` + (s.stderr[i] !== null ? ` ± ${fmt(s.stderr[i])}` : "");
      });
    }
    if (s.best) {
      // Ringed at its raw value: the best checkpoint is a stored result, not a smoothed one.
      const best = el("circle", { class: "best", cx: px(s.best.step), cy: py(s.best.value), r: 6, fill: "none", stroke: color, "data-run": run, "data-step": s.best.step }, svg);
      el("title", {}, best).textContent = `best of ${run}: step ${s.best.step} (${fmt(s.best.value)})`;
    }
    const last = s.value.length - 1;
    legend.push(`${run}: ${fmt(s.value[last])} @ ${s.step[last]}` + (s.best ? ` · best ${fmt(s.best.value)} @ ${s.best.step}` : ""));
  }
  card.querySelector(".legend").textContent = legend.join("  |  ");

  const hover = el("g", { class: "hover" }, svg);
  const nearest = (event) => {
    const box = svg.getBoundingClientRect();
    const mx = ((event.clientX - box.left) / box.width) * W, my = ((event.clientY - box.top) / box.height) * H;
    let best = null;
    for (const { run, s } of lines) {
      const shown = s.smoothed ? s.smoothed.value : s.value;
      s.step.forEach((step, i) => {
        if (shown[i] === null) return;
        const d = Math.abs(px(step) - mx) * 4 + Math.abs(py(shown[i]) - my);
        if (!best || d < best.d) best = { d, run, step, i, s };
      });
    }
    return best;
  };
  svg.onmousemove = (event) => {
    const hit = nearest(event);
    hover.replaceChildren();
    if (!hit) return;
    el("line", { x1: px(hit.step), x2: px(hit.step), y1: M.top, y2: H - M.bottom }, hover);
    const se = hit.s.stderr[hit.i];
    const label = `${hit.run} · step ${hit.step}: ${fmt(hit.s.value[hit.i])}` + (se !== null ? ` ± ${fmt(se)}` : "");
    const right = px(hit.step) > W / 2;
    el("text", { class: "tooltip", x: px(hit.step) + (right ? -6 : 6), y: M.top + 10, "text-anchor": right ? "end" : "start" }, hover).textContent = label;
  };
  svg.onmouseleave = () => hover.replaceChildren();
  svg.onclick = (event) => {
    const target = event.target.closest("[data-step][data-run]");
    if (target && target.classList.contains("pt")) return openDetail(target.dataset.run, Number(target.dataset.step), meta.task);
    const hit = nearest(event);
    if (hit) openDetail(hit.run, hit.step, meta.task);
  };
}

// ---- detail: one checkpoint's metrics, alerts and samples
async function openDetail(run, step, task) {
  state.detail = { run, step, task };
  document.querySelectorAll("circle.pt.selected").forEach((c) => c.classList.remove("selected"));
  document.querySelectorAll(`circle.pt[data-run="${CSS.escape(run)}"][data-step="${step}"]`).forEach((c) => c.classList.add("selected"));
  $("detail").hidden = false;
  $("detail-title").textContent = `${run} · step ${step}`;
  const enc = encodeURIComponent(run);
  try {
    const info = await api(`/api/v1/runs/${enc}/steps/${step}`);
    $("detail-title").textContent = `${run} · step ${step} · ${info.checkpoint}`;
    const table = html("table", { id: "metrics-table" });
    const head = html("tr", {}, null, html("thead", {}, null, table));
    for (const h of ["task", "stage", "metric", "value", "± stderr", "n"]) html("th", {}, h, head);
    const body = html("tbody", {}, null, table);
    for (const r of info.results) {
      const tr = html("tr", {}, null, body);
      html("td", {}, r.task, tr); html("td", {}, r.stage, tr); html("td", {}, r.metric, tr);
      html("td", { class: "num" }, fmt(r.value), tr); html("td", { class: "num" }, fmt(r.stderr), tr); html("td", { class: "num" }, fmt(r.n), tr);
    }
    $("detail-metrics").replaceChildren(table);
    const alerts = $("detail-alerts");
    alerts.replaceChildren();
    if (info.alerts.length) {
      html("h3", {}, "Alerts at this step", alerts);
      for (const a of info.alerts) html("p", { class: `alert-text ${a.state}` }, `${a.state} · ${a.severity} · ${a.rule}: ${a.message}`, alerts);
    }
    const tasks = [...new Set(info.results.map((r) => r.task))];
    const select = $("detail-task");
    select.replaceChildren(...tasks.map((t) => { const o = html("option", { value: t }, t); return o; }));
    select.value = tasks.includes(task) ? task : tasks[0];
    select.hidden = tasks.length < 2;
    await loadSamples();
  } catch (e) {
    $("detail-metrics").replaceChildren(html("p", { class: "muted" }, e.message));
    $("detail-samples").replaceChildren();
  }
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
      const card = html("div", { class: `sample ${s.correct ? "right" : "wrong"}`, "data-index": s.index }, null, box);
      html("div", {}, `#${s.index} · ${s.prompt_id} · ${s.correct ? "correct" : "wrong"} · ${s.tokens} tokens${s.truncated ? " · truncated" : ""}${s.error ? " · error: " + s.error : ""}`, card);
      html("div", { class: "muted" }, "prompt", card); html("pre", {}, s.prompt, card);
      html("div", { class: "muted" }, "response", card); html("pre", {}, s.response, card);
      html("div", {}, `extracted: ${s.extracted ?? "–"} · reference: ${s.reference}`, card);
    }
    for (const p of body.problems) html("div", { class: "sample wrong" }, `left out: ${p.where}: ${p.message}`, box);
  } catch (e) {
    box.replaceChildren(html("p", { class: "muted" }, e.message));
  }
}

// ---- live updates
async function poll() {
  try {
    const { version } = await api("/api/v1/changes");
    if (version !== state.version) {
      const first = state.version === null;
      state.version = version;
      if (!first) { await loadRuns(); await loadData(); }
    }
    state.lastOk = new Date();
    $("live").textContent = `live · updated ${state.lastOk.toLocaleTimeString()}`;
    $("live").classList.remove("stale");
    showError("");
  } catch (e) {
    $("live").textContent = `not updating: ${e.message}`;
    $("live").classList.add("stale");
  }
}

async function start() {
  readHash();
  syncSmoothControls();
  $("filter").value = state.filter;
  const onSmooth = () => {
    state.smooth = smoothFromControls();
    syncSmoothControls();
    writeHash();
    loadData().catch((e) => showError(e.message));
  };
  $("smooth-kind").addEventListener("change", onSmooth);
  $("ema-weight").addEventListener("input", () => { $("ema-value").textContent = $("ema-weight").value; });
  $("ema-weight").addEventListener("change", onSmooth);
  $("window-width").addEventListener("change", onSmooth);
  $("filter").addEventListener("input", () => { state.filter = $("filter").value; writeHash(); render(); });
  $("wrong-only").addEventListener("change", () => loadSamples());
  $("detail-task").addEventListener("change", () => loadSamples());
  $("close-detail").addEventListener("click", () => { $("detail").hidden = true; state.detail = null; });
  try {
    // Runs named in the URL: their first chart comes before anything else, then their charts load beside
    // the run list instead of after it.
    let early = Promise.resolve(false);
    if (state.selected.length) {
      await firstChart();
      early = loadData().then(() => true, () => false);
    }
    await Promise.all([poll(), loadRuns()]);
    writeHash();
    if (!(await early)) { await firstChart(); await loadData(); }
    render(); // again, now that every run has its colour
    document.body.dataset.ready = "true";
  } catch (e) {
    showError(e.message);
  }
  setInterval(poll, POLL_MS);
}

start();
