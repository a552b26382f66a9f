// Saving a chart: as SVG (the drawn chart, with its title and legend, standalone), as PNG (that SVG
// rendered on a canvas at twice its size) and its data as CSV (every stored point of every run on it, as
// the API gives them).
"use strict";

import { FONT, el } from "./chart.js";

const XML = '<?xml version="1.0" encoding="UTF-8"?>\n';
export const downloads = []; // what was saved, for the page's tests: {name, type, size}

function fileName(meta, ext) {
  const base = `${meta.metric}_${meta.task}_${meta.stage}`.replace(/[^A-Za-z0-9._@-]+/g, "-");
  return `${base}.${ext}`;
}

function save(blob, name) {
  downloads.push({ name, type: blob.type, size: blob.size });
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

/** The card's chart as a standalone SVG document: title above, legend below, no hover layer. */
export function svgDocument(card, meta, legend) {
  const plot = card.querySelector("svg.plot");
  const width = Number(plot.getAttribute("width")), height = Number(plot.getAttribute("height"));
  // Legend columns as wide as the longest label (11 px text, ~6.4 px a character) plus its swatch.
  const colW = Math.max(...legend.map((item) => item.label.length), 1) * 6.4 + 30;
  const head = 26, rowH = 16, perRow = Math.max(1, Math.floor((width - 10) / colW));
  const rows = Math.ceil(legend.length / perRow);
  const total = head + height + rows * rowH + 8;
  const doc = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  for (const [k, v] of Object.entries({ xmlns: "http://www.w3.org/2000/svg", width, height: total, viewBox: `0 0 ${width} ${total}`, "font-family": FONT })) doc.setAttribute(k, v);
  el("rect", { x: 0, y: 0, width, height: total, fill: "#ffffff" }, doc);
  const title = el("text", { x: 10, y: 18, "font-size": 13, "font-weight": 600, fill: "#1d2433" }, doc);
  title.textContent = `${meta.metric} · ${meta.task} · ${meta.stage}`;
  const body = el("g", { transform: `translate(0 ${head})` }, doc);
  for (const child of plot.children) {
    if (child.matches("g.hover, rect.zoom-sel")) continue;
    body.appendChild(child.cloneNode(true));
  }
  legend.forEach((item, i) => {
    const x = 10 + (i % perRow) * colW, y = head + height + 6 + Math.floor(i / perRow) * rowH;
    el("rect", { x, y, width: 10, height: 10, rx: 2, fill: item.color }, doc);
    const label = el("text", { x: x + 14, y: y + 9, "font-size": 11, fill: "#1d2433" }, doc);
    label.textContent = item.label;
  });
  return XML + new XMLSerializer().serializeToString(doc);
}

export function saveSvg(card, meta, legend) {
  save(new Blob([svgDocument(card, meta, legend)], { type: "image/svg+xml" }), fileName(meta, "svg"));
}

export async function savePng(card, meta, legend) {
  const source = svgDocument(card, meta, legend);
  const image = new Image();
  image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(source); // CSP: img-src data:
  await image.decode();
  const ratio = 2;
  const canvas = document.createElement("canvas");
  canvas.width = image.width * ratio;
  canvas.height = image.height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.drawImage(image, 0, 0);
  const blob = await new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
  save(blob, fileName(meta, "png"));
}

function cell(v) {
  if (v === null || v === undefined) return "";
  const s = String(v);
  return /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

/** The CSV of a chart: one row per stored point per run, the values exactly as the API sent them
 *  (JavaScript prints a float's shortest round-trip form, as Python's repr), smoothed columns when on. */
export function csvText(meta, lines) {
  const smoothed = lines.some(({ s }) => s.smoothed);
  const header = ["run", "task", "stage", "metric", "step", "value", "stderr", "n", "checkpoint", "evaluated_at"];
  if (smoothed) header.push("smoothed", "smoothed_stderr");
  const out = [header.join(",")];
  for (const { run, s } of lines) {
    s.step.forEach((step, i) => {
      const time = s.time && s.time[i] !== null ? new Date(s.time[i] * 1000).toISOString() : null;
      const row = [run, meta.task, meta.stage, meta.metric, step, s.value[i], s.stderr[i], s.n[i], s.checkpoint[i], time];
      if (smoothed) row.push(s.smoothed ? s.smoothed.value[i] : null, s.smoothed ? s.smoothed.stderr[i] : null);
      out.push(row.map(cell).join(","));
    });
  }
  return out.join("\r\n") + "\r\n";
}

export function saveCsv(meta, lines) {
  save(new Blob([csvText(meta, lines)], { type: "text/csv" }), fileName(meta, "csv"));
}
