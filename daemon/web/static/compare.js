// The paired comparison of two runs, drawn from /api/v1/compare: the answer of `evald compare --format
// json` itself (the server calls the CLI's function and its JSON rendering), so the page and the command
// line never disagree. One card per (task, stage, metric) both runs have: both runs at their matched steps
// (the smoothed values when smoothing is on, shown for display only, as the CLI says: every test is on the
// raw values), a ◆ at the top of each step where B − A differs at the false discovery rate, and the table of
// every matched step (B − A ± its standard error, the test, the adjusted p) with links to each step's detail.
"use strict";

import { fmt } from "./axis.js";
import { drawChart } from "./chart.js";

const B_FALLBACK = "#d62728"; // run B's colour when both runs would get the same one

/** The rows of one (task, stage, metric) together, in step order. */
export function comparisonGroups(body) {
  const groups = new Map();
  for (const r of body.rows) {
    const key = `${r.task}/${r.stage}/${r.metric}`;
    if (!groups.has(key)) groups.set(key, { key, task: r.task, stage: r.stage, metric: r.metric, rows: [] });
    groups.get(key).rows.push(r);
  }
  for (const g of groups.values()) g.rows.sort((a, b) => a.step - b.step);
  return [...groups.values()];
}

const num = (v) => (v === null || v === undefined ? NaN : v);

function trace(run, color, rows, side, smoothed) {
  const points = rows.map((r) => {
    const raw = num(r[`value_${side}`]), se = num(r[`stderr_${side}`]);
    const y = smoothed ? num(r[`smoothed_${side}`]) : raw;
    // The band is the stored standard error, around the stored value: a smoothed line has none.
    return { step: r.step, x: r.step, y, raw, se, lo: smoothed ? NaN : raw - se, hi: smoothed ? NaN : raw + se };
  });
  return { name: run, run, kind: "run", color, count: points.length, smoothed, points, best: null };
}

function model(group, body, colors, width, zoom) {
  const smoothed = body.smoothing !== "none";
  const marks = group.rows.filter((r) => r.differs).map((r) => ({
    x: r.step, step: r.step,
    title: `step ${r.step}: ${body.run_b} − ${body.run_a} = ${fmt(r.diff)} ± ${fmt(r.combined_stderr)} (${r.test} test, adjusted p ${fmt(r.p_adjusted)} ≤ ${body.fdr})`,
  }));
  return {
    key: group.key, width, xmode: "step", ylog: false, outliers: false, zoom,
    xTitle: "step", yTitle: group.metric,
    traces: [trace(body.run_a, colors[0], group.rows, "a", smoothed), trace(body.run_b, colors[1], group.rows, "b", smoothed)],
    alerts: [], marks,
  };
}

function valueLink(html, linkTo, run, row, group, value) {
  const href = linkTo({ run, step: row.step, metric: group.metric, task: group.task });
  return html("a", { href, title: `open ${run} step ${row.step}` }, fmt(value));
}

// Six narrow columns, so a phone shows them all: the test each step was put to is in its row's tooltip
// and counted in the table's summary line.
function table(group, body, { html, linkTo }) {
  const t = html("table", { class: "diffs" });
  const head = html("tr", {}, null, html("thead", {}, null, t));
  const heads = [["step"], ["A", body.run_a], ["B", body.run_b], ["B − A", "± its standard error"], ["p adj", "Benjamini-Hochberg adjusted p"], ["differs"]];
  for (const [h, title] of heads) html("th", { title }, h, head);
  const tbody = html("tbody", {}, null, t);
  for (const r of group.rows) {
    const why = r.test === null ? "not tested" : `${r.test} z-test${r.pairs ? ` over ${r.pairs} shared prompts` : ""}`;
    const title = why + (r.why_not_paired ? ` (not paired: ${r.why_not_paired})` : "");
    const tr = html("tr", { class: r.differs ? "differs" : null, "data-step": r.step, title }, null, tbody);
    html("td", { class: "num" }, String(r.step), tr);
    html("td", { class: "num" }, null, tr).appendChild(valueLink(html, linkTo, body.run_a, r, group, r.value_a));
    html("td", { class: "num" }, null, tr).appendChild(valueLink(html, linkTo, body.run_b, r, group, r.value_b));
    // The space outside the standard error's span: a narrow table breaks the line there.
    const diff = html("td", { class: "num diff" }, `${fmt(r.diff)} `, tr);
    html("span", { class: "se" }, `± ${fmt(r.combined_stderr)}`, diff);
    html("td", { class: "num" }, fmt(r.p_adjusted), tr);
    html("td", {}, r.test === null ? "–" : r.differs ? "yes" : "no", tr);
  }
  return t;
}

function testCounts(rows) {
  const counts = {};
  for (const r of rows) if (r.test !== null) counts[r.test] = (counts[r.test] || 0) + 1;
  const said = Object.entries(counts).map(([kind, n]) => `${n} ${kind}`).join(", ");
  return said ? ` (${said} z-test${rows.length > 1 ? "s" : ""})` : " (none tested)";
}

function card(group, body, opts) {
  const { html } = opts;
  const node = html("div", { class: "chart compare-chart", "data-chart": group.key });
  const title = html("h2", {}, group.metric + " ", html("div", { class: "chart-head" }, null, node));
  html("span", { class: "sub" }, `${group.task} · ${group.stage}`, title);
  const box = html("div", { class: "plot-box" }, null, node);
  box.appendChild(document.createElementNS("http://www.w3.org/2000/svg", "svg")).setAttribute("class", "plot");
  html("div", { class: "tooltip", role: "tooltip" }, null, box).hidden = true;
  const legend = html("div", { class: "legend" }, null, node);
  opts.colors.forEach((color, i) => {
    const item = html("span", { class: "item" }, null, legend);
    opts.swatch(color, item);
    item.append(`${i ? "B" : "A"}: ${i ? body.run_b : body.run_a}`);
  });
  const differ = group.rows.filter((r) => r.differs).length;
  const tested = group.rows.filter((r) => r.test !== null).length;
  // Untested points (no standard error) are not "the same": the legend says which it is.
  const untested = [...new Set(group.rows.filter((r) => r.test === null).map((r) => r.why_not_paired).filter(Boolean))];
  const verdict = differ ? `◆ B − A differs (FDR ${body.fdr})` : tested ? "no step differs" : `not tested (${untested.join("; ") || "no test"})`;
  html("span", { class: "item" }, verdict, legend);
  const more = html("details", { class: "diffs" }, null, node);
  html("summary", {}, `${differ} of ${group.rows.length} matched steps differ${testCounts(group.rows)}`, more);
  more.appendChild(table(group, body, opts));
  node._redraw = () => {
    const zoom = opts.zooms[group.key] || null;
    drawChart(node, model(group, body, opts.colors, node._width, zoom), {
      onZoom: (z) => { if (z) opts.zooms[group.key] = z; else delete opts.zooms[group.key]; node._redraw(); },
      onPick: (run, step) => opts.onPick(run, step, group),
    });
  };
  return node;
}

/** Draws ``body`` (a /api/v1/compare answer) into ``box``: the summary, the rule, and one card per
 *  metric whose key contains ``opts.filter``. opts: {html, swatch, linkTo, colorOf, filter, zooms, onPick,
 *  placed(node)} — placed() is called for each new card once it is in the page (to measure and draw it). */
export function showComparison(box, body, opts) {
  const { html } = opts;
  let colors = [opts.colorOf(body.run_a), opts.colorOf(body.run_b)];
  if (colors[0] === colors[1]) colors = [colors[0], B_FALLBACK];
  const groups = comparisonGroups(body).filter((g) => !opts.filter || g.key.toLowerCase().includes(opts.filter.toLowerCase()));
  const summary = box.querySelector("#compare-summary");
  summary.textContent = `${body.run_b} − ${body.run_a}: ${body.differ} of ${body.tested} tested points differ `
    + `(${body.paired} paired over shared prompts, ${body.tested - body.paired} independent), at a false discovery rate of ${body.fdr}`;
  box.querySelector("#compare-rule").textContent = body.rule;
  box.querySelector("#compare-unmatched").textContent = body.unmatched.length ? `Not compared: ${body.unmatched.join("; ")}` : "";
  const grid = box.querySelector("#compare-charts");
  const cards = groups.map((g) => card(g, body, { ...opts, colors }));
  grid.replaceChildren(...cards);
  if (!groups.length) grid.appendChild(html("p", { class: "muted" }, opts.filter ? "No compared metric matches the filter." : "The two runs have no step in common."));
  for (const node of cards) opts.placed(node);
}
