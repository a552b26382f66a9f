// Deep links: the view a URL opens. The fragment holds the page's state (runs, smoothing, axes, ...) and,
// beside it, the view: `run=R&step=S&metric=M` (and `task=T`) opens that checkpoint's detail with the
// metric marked; `compare=A,B` (and `fdr=F`) the paired comparison of two runs. Pure functions: the page
// reads a view from the URL here, and writes one back here, so a link and the page agree on the format.
"use strict";

export const DEFAULT_FDR = 0.05;
const VIEW_KEYS = ["run", "step", "metric", "task", "compare", "fdr"];
const MAX_STEP = 2147483647;
// A plain decimal, as the API's fdr parameter takes it (daemon/web/params.py: DECIMAL).
const DECIMAL = /^[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?$/;

function detailFrom(params, problems) {
  const run = params.get("run"), step = params.get("step");
  if (!run && !step) return null;
  if (!run || !step) {
    problems.push(`This link names a ${run ? "run" : "step"} without a ${run ? "step" : "run"}: a step's detail needs both (run=R&step=S).`);
    return null;
  }
  if (!/^\d+$/.test(step) || Number(step) > MAX_STEP) {
    problems.push(`This link's step “${step}” is not a step number (a whole number from 0).`);
    return null;
  }
  return { run, step: Number(step), metric: params.get("metric") || null, task: params.get("task") || null };
}

function compareFrom(params, problems) {
  if (!params.has("compare")) return null;
  const runs = params.get("compare").split(",");
  if (runs.length !== 2 || runs.some((r) => !r)) {
    problems.push(`This link's comparison “${params.get("compare")}” is not two runs (compare=A,B).`);
    return null;
  }
  let fdr = DEFAULT_FDR;
  if (params.has("fdr")) {
    const raw = params.get("fdr");
    if (DECIMAL.test(raw) && Number(raw) > 0 && Number(raw) < 1) fdr = Number(raw);
    else problems.push(`This link's false discovery rate “${raw}” is not a number between 0 and 1: using ${DEFAULT_FDR}.`);
  }
  return { a: runs[0], b: runs[1], fdr };
}

/** The view a URL's fragment names: {detail: {run, step, metric, task} | null, compare: {a, b, fdr} |
 *  null, problems: [what was wrong with it, in words]}. */
export function viewFrom(params) {
  const problems = [];
  return { detail: detailFrom(params, problems), compare: compareFrom(params, problems), problems };
}

/** ``params`` (the page's state) with ``view`` written into it, replacing any view it had. */
export function withView(params, view) {
  const out = new URLSearchParams(params);
  for (const k of VIEW_KEYS) out.delete(k);
  const d = view.detail;
  if (d) {
    out.set("run", d.run);
    out.set("step", String(d.step));
    if (d.metric) out.set("metric", d.metric);
    if (d.task) out.set("task", d.task);
  }
  const c = view.compare;
  if (c) {
    out.set("compare", `${c.a},${c.b}`);
    if (c.fdr !== DEFAULT_FDR) out.set("fdr", String(c.fdr));
  }
  return out;
}
