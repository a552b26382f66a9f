// One chart as plain SVG, drawn at the pixel size of its card (so text is never stretched), with its
// interactions: a tooltip listing every run at the hovered x, drag to zoom (shift-drag pans), double-click
// to reset, click for a checkpoint's detail.
//
// Everything visual is a presentation attribute, not CSS, so the same SVG saved as a file (export.js)
// looks as it does in the page.
"use strict";

import { MIN_TICKS, fmt, fmtClock, fmtDuration, linearTicks, logTicks, padded, scale, timeTicks, withoutOutliers } from "./axis.js";

const SVG = "http://www.w3.org/2000/svg";
export const FONT = "system-ui, -apple-system, 'Segoe UI', sans-serif";
const INK = "#1d2433", MUTED = "#6b7280", GRID = "#e5e7eb", FRAME = "#9ca3af";
const FIRING = "#d62728", RESOLVED = "#8c8c8c";
const MARKERS_MAX = 200; // above this many points a line has no dots; a click takes the nearest point
const CHAR_PX = 6.4; // an 11 px label's average character width, to keep labels apart
const CLICK_DELAY_MS = 230; // a click waits this long for a second one (double-click resets the zoom)

export function el(tag, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function text(parent, x, y, content, attrs = {}) {
  const node = el("text", { x, y, "font-size": 11, fill: MUTED, ...attrs }, parent);
  node.textContent = content;
  return node;
}

let clipIds = 0;

function spaced(ticks, at, gap) {
  const kept = [];
  for (const t of ticks) if (!kept.length || Math.abs(at(t) - at(kept[kept.length - 1])) >= gap) kept.push(t);
  return kept.length >= MIN_TICKS ? kept : ticks;
}

/** The x-axis label of a value in the model's mode (step, wall, relative; time in seconds). */
function xLabeler(mode, interval, span) {
  if (mode === "wall") return (t) => fmtClock(t, interval, span);
  if (mode === "relative") return (t) => fmtDuration(t, interval);
  return (v) => fmt(v);
}

function xTicks(mode, lo, hi, most) {
  if (mode === "step") return { ticks: linearTicks(lo, hi, most, true), interval: 1 };
  const offset = mode === "wall" ? new Date(lo * 1000).getTimezoneOffset() * 60 : 0;
  return timeTicks(lo, hi, most, offset);
}

// Min and max by a loop: spreading 100 runs x 1,000 points into Math.min overflows the call stack.
function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
  return [lo, hi];
}

/** The data extent the chart shows: its zoom, else every point (y: those inside the x range), with
 *  outliers left out of the y scale when asked and non-positive values left out on a log scale. */
function domains(model) {
  const xs = [];
  for (const t of model.traces) for (const p of t.points) if (Number.isFinite(p.x)) xs.push(p.x);
  if (!xs.length) return null;
  let [x0, x1] = model.zoom?.x ?? padded(...extent(xs), { integer: model.xmode === "step" });
  if (!model.zoom?.x && model.xmode !== "step" && !(x1 > x0)) [x0, x1] = [x0 - 30, x1 + 30];
  const ys = [], bands = [];
  for (const t of model.traces) {
    for (const p of t.points) {
      if (!(p.x >= x0 && p.x <= x1)) continue;
      for (const v of [p.y, p.raw]) if (Number.isFinite(v) && (!model.ylog || v > 0)) ys.push(v);
      for (const v of [p.lo, p.hi]) if (Number.isFinite(v) && (!model.ylog || v > 0)) bands.push({ v, y: p.y });
    }
  }
  if (model.zoom?.y) return { x: [x0, x1], y: model.zoom.y };
  if (!ys.length) return { x: [x0, x1], y: model.ylog ? [0.1, 10] : [0, 1] };
  const kept = model.outliers ? withoutOutliers(ys) : ys;
  let [lo, hi] = extent(kept);
  // A band widens the scale only around points that are themselves in it.
  for (const b of bands) if (Number.isFinite(b.y) && b.y >= lo && b.y <= hi) { lo = Math.min(lo, b.v); hi = Math.max(hi, b.v); }
  return { x: [x0, x1], y: padded(lo, hi, { log: model.ylog }) };
}

/**
 * Draws ``model`` into ``card``'s svg.plot. model: {key, width, xmode, ylog, outliers, zoom, xTitle, yTitle,
 * traces: [{id, name, color, kind: run|group|member, run, count, points: [{x, step, y, raw, se, n, lo, hi}],
 * best}], alerts: [{x, xLast, state, step, lastStep, run, title}], marks: [{x, step, title}] (optional)}.
 * handlers: {onZoom(zoom|null),
 * onPick(run, step)}. Returns what was drawn (domains and tick labels), also left on the svg's dataset.
 */
export function drawChart(card, model, handlers) {
  const svg = card.querySelector("svg.plot");
  // The width is measured by the caller for every card at once (one layout, not one per chart).
  const width = Math.max(240, Math.floor(model.width ?? svg.parentElement.getBoundingClientRect().width));
  const height = width < 480 ? 220 : 250;
  for (const [k, v] of Object.entries({ width, height, viewBox: `0 0 ${width} ${height}`, "font-family": FONT })) svg.setAttribute(k, v);
  svg.replaceChildren();
  const dom = domains(model);
  if (!dom) return null;
  const ylog = model.ylog;

  // y ticks first: their widest label sets the left margin.
  const top = 10, bottom = 40;
  const plotH = height - top - bottom;
  const yMost = Math.max(MIN_TICKS, Math.floor(plotH / 24));
  const ys = scale(dom.y[0], dom.y[1], top + plotH, top, ylog);
  // Log ticks are unevenly spaced: those nearer than a label's height to the one below are dropped.
  const yt = ylog ? spaced(logTicks(dom.y[0], dom.y[1], yMost), ys.to, 16) : linearTicks(dom.y[0], dom.y[1], yMost);
  const yLabels = yt.map(fmt);
  const left = 22 + Math.max(...yLabels.map((s) => s.length)) * CHAR_PX + 6;
  const right = 14;
  const plotW = width - left - right;
  const xs = scale(dom.x[0], dom.x[1], left, left + plotW);

  // x ticks: as many as fit with their labels apart (labels measured by their length).
  let most = Math.max(MIN_TICKS, Math.floor(plotW / 70));
  let xt, xLabels;
  for (let round = 0; round < 4; round++) {
    xt = xTicks(model.xmode, dom.x[0], dom.x[1], most);
    const label = xLabeler(model.xmode, xt.interval, dom.x[1] - dom.x[0]);
    xLabels = xt.ticks.map(label);
    const widest = Math.max(...xLabels.map((s) => s.length)) * CHAR_PX + 14;
    const fit = Math.floor(plotW / widest);
    if (xt.ticks.length <= Math.max(fit, MIN_TICKS) || fit >= most) break;
    most = Math.max(MIN_TICKS, fit);
  }

  el("rect", { class: "bg", x: 0, y: 0, width, height, fill: "#ffffff" }, svg);
  const grid = el("g", { class: "grid", stroke: GRID, "stroke-width": 1 }, svg);
  const yAxis = el("g", { class: "axis y" }, svg);
  yt.forEach((t, i) => {
    const y = ys.to(t);
    el("line", { x1: left, x2: left + plotW, y1: y, y2: y }, grid);
    text(yAxis, left - 6, y + 3.5, yLabels[i], { "text-anchor": "end", class: "tick" });
  });
  const xAxis = el("g", { class: "axis x" }, svg);
  xt.ticks.forEach((t, i) => {
    const x = xs.to(t);
    el("line", { x1: x, x2: x, y1: top, y2: top + plotH, "stroke-dasharray": "2 3" }, grid);
    el("line", { x1: x, x2: x, y1: top + plotH, y2: top + plotH + 4, stroke: FRAME }, xAxis);
    text(xAxis, x, top + plotH + 16, xLabels[i], { "text-anchor": "middle", class: "tick" });
  });
  el("path", { class: "frame", d: `M${left},${top} V${top + plotH} H${left + plotW}`, fill: "none", stroke: FRAME }, svg);
  text(svg, left + plotW / 2, height - 6, model.xTitle, { "text-anchor": "middle", fill: INK, class: "axis-title x" });
  text(svg, 0, 0, model.yTitle, { "text-anchor": "middle", fill: INK, class: "axis-title y", transform: `translate(12 ${top + plotH / 2}) rotate(-90)` });

  // Clipped to the plot only when something can lie outside it (a zoom, outliers off the scale): clipping
  // long paths costs the browser's painting.
  let clipRef = null;
  if (model.zoom || model.outliers) {
    const clipId = `clip-${++clipIds}`;
    const clip = el("clipPath", { id: clipId }, el("defs", {}, svg));
    el("rect", { x: left, y: top - 6, width: plotW, height: plotH + 12 }, clip);
    clipRef = `url(#${clipId})`;
  }
  const body = el("g", { "clip-path": clipRef }, svg);
  const visible = (p) => Number.isFinite(p.y) && (!ylog || p.y > 0);
  const inX = (x) => x >= dom.x[0] && x <= dom.x[1];

  // Alerts under the lines: a dashed rule at the onset, a triangle on top, a bar to the last step seen.
  for (const a of model.alerts) {
    if (!Number.isFinite(a.x) || !inX(a.x)) continue;
    const color = a.state === "firing" ? FIRING : RESOLVED;
    const g = el("g", { class: `alert ${a.state}`, "data-step": a.step, "data-last-step": a.lastStep, "data-run": a.run }, body);
    const x = xs.to(a.x);
    el("line", { x1: x, x2: x, y1: top, y2: top + plotH, stroke: color, "stroke-width": 1.2, "stroke-dasharray": "4 3" }, g);
    if (Number.isFinite(a.xLast) && a.xLast > a.x) {
      el("rect", { x, y: top, width: Math.max(1, xs.to(Math.min(a.xLast, dom.x[1])) - x), height: 3, fill: color, opacity: 0.5 }, g);
    }
    el("path", { d: `M${x - 5},${top} h10 l-5,7 z`, fill: color }, g);
    el("title", {}, g).textContent = a.title;
  }

  let skipped = 0, clipped = 0;
  const drawn = { x: dom.x, y: dom.y, xTicks: xLabels, yTicks: yLabels };
  for (const t of model.traces) {
    const pts = t.points.filter((p) => {
      const ok = Number.isFinite(p.x) && visible(p);
      if (!ok && Number.isFinite(p.y) && ylog) skipped++;
      return ok;
    });
    const member = t.kind === "member";
    if (!member) {
      const band = pts.filter((p) => Number.isFinite(p.lo) && Number.isFinite(p.hi) && (!ylog || p.lo > 0));
      if (band.length > 1) {
        const upper = band.map((p) => `${xs.to(p.x).toFixed(1)},${ys.to(p.hi).toFixed(1)}`);
        const lower = band.map((p) => `${xs.to(p.x).toFixed(1)},${ys.to(p.lo).toFixed(1)}`).reverse();
        el("polygon", { class: `band ${t.kind}`, fill: t.color, opacity: t.kind === "group" ? 0.2 : 0.15, points: upper.concat(lower).join(" "), "data-run": t.name }, body);
      }
      const raw = pts.filter((p) => Number.isFinite(p.raw) && (!ylog || p.raw > 0));
      if (raw.length && t.smoothed) {
        el("polyline", { class: "raw", fill: "none", stroke: t.color, "stroke-width": 1, opacity: 0.35, points: raw.map((p) => `${xs.to(p.x).toFixed(1)},${ys.to(p.raw).toFixed(1)}`).join(" "), "data-run": t.name }, body);
      }
    }
    const vertices = pts.map((p) => `${xs.to(p.x).toFixed(1)},${ys.to(p.y).toFixed(1)}`).join(" ");
    const line = el("polyline", {
      class: member ? "member" : t.kind === "group" ? "line group-mean" : "line",
      fill: "none", stroke: t.color, "stroke-width": member ? 1 : t.kind === "group" ? 2.4 : 1.8, opacity: member ? 0.35 : 1,
      points: vertices, "data-run": t.name, "data-points": t.count, "data-drawn": pts.length,
    }, body);
    if (t.kind === "group") line.setAttribute("data-runs", t.runs.join(","));
    if (!member && pts.length <= MARKERS_MAX) {
      for (const p of pts) {
        const dot = el("circle", { class: "pt", cx: xs.to(p.x).toFixed(1), cy: ys.to(p.y).toFixed(1), r: 3.2, fill: t.color, stroke: "#ffffff", "stroke-width": 1, "data-run": t.run ?? t.name, "data-step": p.step }, body);
        if (t.kind === "group") dot.setAttribute("data-group", t.name);
        if (handlers.selected && handlers.selected(t.run, p.step)) dot.classList.add("selected");
      }
    }
    if (t.best && visible(t.best) && inX(t.best.x)) {
      // Ringed at its raw value: the best checkpoint is a stored result, not a smoothed one.
      const ring = el("circle", { class: "best", cx: xs.to(t.best.x), cy: ys.to(t.best.y), r: 6, fill: "none", stroke: t.color, "stroke-width": 1.5, "data-run": t.name, "data-step": t.best.step }, body);
      el("title", {}, ring).textContent = `best of ${t.name}: step ${t.best.step} (${fmt(t.best.y)})`;
    }
    if (model.outliers && !model.zoom?.y) {
      // A point outside the scale is marked at the edge it left by, so nothing disappears unsaid.
      for (const p of pts) {
        if (p.y >= dom.y[0] && p.y <= dom.y[1] || !inX(p.x)) continue;
        clipped++;
        const x = xs.to(p.x), up = p.y > dom.y[1], y = up ? top + 1 : top + plotH - 1;
        const caret = el("path", { class: "off-scale", d: up ? `M${x - 4},${y + 6} l4,-6 l4,6 z` : `M${x - 4},${y - 6} l4,6 l4,-6 z`, fill: t.color, "data-run": t.name, "data-step": p.step }, svg);
        el("title", {}, caret).textContent = `${t.name} step ${p.step}: ${fmt(p.y)} (outside the scale)`;
      }
    }
  }
  for (const t of model.traces) {
    if (t.kind === "member") continue;
    // A metric over no samples (n = 0) has no value to draw: a hollow mark on the x axis at its step says
    // so where the line breaks, rather than a silent gap.
    for (const p of t.points) {
      if (p.n !== 0 || Number.isFinite(p.y) || !inX(p.x)) continue;
      const mark = el("circle", { class: "no-samples", cx: xs.to(p.x).toFixed(1), cy: top + plotH - 5, r: 4, fill: "#ffffff", stroke: t.color, "stroke-width": 1.5, "stroke-dasharray": "2 1.5", "data-run": t.run ?? t.name, "data-step": p.step }, svg);
      el("title", {}, mark).textContent = `${t.name} step ${p.step}: no samples (n = 0), no value`;
    }
  }
  for (const m of model.marks || []) {
    // A step singled out (the comparison's differing steps): a diamond on the plot's top edge.
    if (!Number.isFinite(m.x) || !inX(m.x)) continue;
    const x = xs.to(m.x);
    const mark = el("path", { class: "mark", d: `M${x},${top} l4.5,5 l-4.5,5 l-4.5,-5 z`, fill: INK, "data-step": m.step }, svg);
    el("title", {}, mark).textContent = m.title;
  }
  Object.assign(svg.dataset, { x0: dom.x[0], x1: dom.x[1], y0: dom.y[0], y1: dom.y[1], skipped, clipped });
  el("g", { class: "hover" }, svg);
  el("rect", { class: "zoom-sel", x: 0, y: 0, width: 0, height: 0, fill: "#1f77b4", opacity: 0.12, visibility: "hidden" }, svg);
  interact(card, svg, model, handlers, { xs, ys, left, top, plotW, plotH, dom });
  return { ...drawn, skipped, clipped };
}

/** The hovered x's rows: each trace's point there (step mode: that step; time: the nearest, if near). */
function rowsAt(model, x) {
  const span = model.zoom?.x ? model.zoom.x[1] - model.zoom.x[0] : null;
  const rows = [];
  for (const t of model.traces) {
    let hit = null;
    for (const p of t.points) {
      if (!Number.isFinite(p.x)) continue;
      if (model.xmode === "step") { if (p.x === x) hit = p; continue; }
      if (!hit || Math.abs(p.x - x) < Math.abs(hit.x - x)) hit = p;
    }
    if (hit && model.xmode !== "step" && span !== null && Math.abs(hit.x - x) > span * 0.05) hit = null;
    rows.push({ t, p: hit });
  }
  return rows;
}

function nearestX(model, x) {
  let best = null;
  for (const t of model.traces) for (const p of t.points) if (Number.isFinite(p.x) && Number.isFinite(p.y) && (best === null || Math.abs(p.x - x) < Math.abs(best - x))) best = p.x;
  return best;
}

function tooltip(card, model, x, px, geometry) {
  const tip = card.querySelector(".tooltip");
  const rows = rowsAt(model, x);
  const groups = rows.filter((r) => r.t.kind !== "member");
  groups.sort((a, b) => (b.p && Number.isFinite(b.p.y) ? b.p.y : -Infinity) - (a.p && Number.isFinite(a.p.y) ? a.p.y : -Infinity));
  tip.replaceChildren();
  const head = document.createElement("div");
  head.className = "tip-head";
  const step = groups.find((r) => r.p)?.p;
  head.textContent = model.xmode === "step" ? `step ${x}` : model.xmode === "wall" ? new Date(x * 1000).toLocaleString() : `${fmtDuration(x)} after the first result`;
  tip.appendChild(head);
  const row = (r, cls) => {
    const line = document.createElement("div");
    line.className = cls;
    line.dataset.run = r.t.name;
    line.dataset.value = r.p && Number.isFinite(r.p.y) ? String(r.p.y) : "";
    if (r.p) line.dataset.step = r.p.step;
    const sw = document.createElement("span");
    sw.className = "sw";
    sw.style.background = r.t.color; // CSSOM, which the page's CSP allows (an inline style attribute it does not)
    line.appendChild(sw);
    const name = document.createElement("span");
    name.className = "tip-name";
    name.textContent = r.t.name;
    line.appendChild(name);
    const value = document.createElement("span");
    value.className = "tip-value";
    if (!r.p) value.textContent = "no result here";
    else if (!Number.isFinite(r.p.y)) value.textContent = r.p.n === 0 ? "no samples (n = 0)" : fmt(r.p.y);
    else {
      const spread = r.t.kind === "group" ? (Number.isFinite(r.p.std) ? ` ± ${fmt(r.p.std)} std (${r.p.members} runs)` : ` (${r.p.members} run)`)
        : Number.isFinite(r.p.se) ? ` ± ${fmt(r.p.se)}` : "";
      value.textContent = fmt(r.p.y) + spread + (r.t.smoothed && r.p.raw !== r.p.y ? ` · raw ${fmt(r.p.raw)}` : "")
        + (model.xmode !== "step" || r.p.step !== x ? ` · step ${r.p.step}` : "");
      if (r.t.kind === "group") { line.dataset.mean = String(r.p.y); line.dataset.std = Number.isFinite(r.p.std) ? String(r.p.std) : ""; }
    }
    line.appendChild(value);
    tip.appendChild(line);
  };
  for (const r of groups) {
    row(r, r.t.kind === "group" ? "tip-row group" : "tip-row");
    if (r.t.kind === "group") for (const m of rows.filter((m) => m.t.kind === "member" && m.t.group === r.t.name)) row(m, "tip-row member");
  }
  tip.hidden = false;
  const box = card.getBoundingClientRect(), svgBox = card.querySelector("svg.plot").getBoundingClientRect();
  const wide = tip.offsetWidth;
  let leftPx = svgBox.left - box.left + px + 14;
  if (leftPx + wide > box.width - 4) leftPx = Math.max(4, svgBox.left - box.left + px - wide - 14);
  tip.style.left = `${leftPx}px`;
  tip.style.top = `${svgBox.top - box.top + geometry.top + 4}px`;
  return step;
}

function interact(card, svg, model, handlers, g) {
  const hover = svg.querySelector("g.hover"), sel = svg.querySelector("rect.zoom-sel");
  const tip = card.querySelector(".tooltip");
  // In the svg's own units: a card narrowed since it was drawn shows the chart scaled down (CSS
  // max-width) until it is redrawn at its new width, and a pointer on it still finds its points.
  const ratio = () => svg.getBoundingClientRect().width / svg.width.baseVal.value || 1;
  const local = (event) => {
    const box = svg.getBoundingClientRect(), k = ratio();
    return { px: (event.clientX - box.left) / k, py: (event.clientY - box.top) / k };
  };
  const inside = ({ px, py }) => px >= g.left && px <= g.left + g.plotW && py >= g.top - 4 && py <= g.top + g.plotH + 4;
  let drag = null, clickTimer = null;
  const hide = () => { hover.replaceChildren(); tip.hidden = true; };
  const showHover = (pos) => {
    const x = nearestX(model, g.xs.from(pos.px));
    if (x === null) return hide();
    hover.replaceChildren();
    const hx = g.xs.to(x);
    el("line", { x1: hx, x2: hx, y1: g.top, y2: g.top + g.plotH, stroke: FRAME, "stroke-width": 1 }, hover);
    for (const { t, p } of rowsAt(model, x)) {
      if (!p || !Number.isFinite(p.y) || (model.ylog && p.y <= 0) || t.kind === "member") continue;
      const cy = g.ys.to(p.y);
      if (cy >= g.top && cy <= g.top + g.plotH) el("circle", { cx: g.xs.to(p.x), cy, r: 4.5, fill: "none", stroke: t.color, "stroke-width": 2 }, hover);
    }
    tooltip(card, model, x, hx * ratio(), g);
  };
  svg.onpointerdown = (event) => {
    const pos = local(event);
    if (event.button !== 0 || !inside(pos)) return;
    drag = { start: pos, last: pos, pan: event.shiftKey, moved: false, dom: g.dom };
    svg.setPointerCapture(event.pointerId);
  };
  svg.onpointermove = (event) => {
    const pos = local(event);
    if (!drag) { if (inside(pos)) showHover(pos); else hide(); return; }
    if (Math.abs(pos.px - drag.start.px) > 4 || Math.abs(pos.py - drag.start.py) > 4) drag.moved = true;
    if (!drag.moved) return;
    hide();
    if (drag.pan) {
      const dx = g.xs.from(drag.start.px) - g.xs.from(pos.px);
      const yShift = (v) => (model.ylog ? v * (g.ys.from(drag.start.py) / g.ys.from(pos.py)) : v + g.ys.from(drag.start.py) - g.ys.from(pos.py));
      drag.zoom = { x: [drag.dom.x[0] + dx, drag.dom.x[1] + dx], y: [yShift(drag.dom.y[0]), yShift(drag.dom.y[1])] };
      sel.setAttribute("visibility", "hidden");
      return;
    }
    const x0 = Math.max(g.left, Math.min(drag.start.px, pos.px)), x1 = Math.min(g.left + g.plotW, Math.max(drag.start.px, pos.px));
    const tall = Math.abs(pos.py - drag.start.py) >= g.plotH * 0.2;
    const y0 = tall ? Math.max(g.top, Math.min(drag.start.py, pos.py)) : g.top;
    const y1 = tall ? Math.min(g.top + g.plotH, Math.max(drag.start.py, pos.py)) : g.top + g.plotH;
    for (const [k, v] of Object.entries({ x: x0, y: y0, width: x1 - x0, height: y1 - y0, visibility: "visible" })) sel.setAttribute(k, v);
    drag.zoom = { x: [g.xs.from(x0), g.xs.from(x1)], y: tall ? [g.ys.from(y1), g.ys.from(y0)] : null };
  };
  svg.onpointerup = (event) => {
    const d = drag;
    drag = null;
    if (!d) return;
    sel.setAttribute("visibility", "hidden");
    if (d.moved) {
      if (d.zoom && d.zoom.x[1] > d.zoom.x[0]) handlers.onZoom(d.zoom);
      return;
    }
    const pos = local(event);
    clearTimeout(clickTimer);
    clickTimer = setTimeout(() => {
      const x = nearestX(model, g.xs.from(pos.px));
      if (x === null) return;
      // The point nearest the pointer among the runs at that x.
      let best = null;
      for (const { t, p } of rowsAt(model, x)) {
        if (!p || !Number.isFinite(p.y) || t.kind === "group") continue;
        if (model.traces.some((o) => o.kind === "group") && t.kind !== "member") continue;
        const dy = Math.abs(g.ys.to(p.y) - pos.py);
        if (!best || dy < best.dy) best = { dy, run: t.run ?? t.name, step: p.step };
      }
      if (best) handlers.onPick(best.run, best.step);
    }, CLICK_DELAY_MS);
  };
  svg.ondblclick = (event) => {
    clearTimeout(clickTimer);
    event.preventDefault();
    handlers.onZoom(null);
  };
  svg.onpointerleave = () => { if (!drag) hide(); };
}
