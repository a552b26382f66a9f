// The alert list: every alert the API lists (/api/v1/alerts), firing ones first, then the newest: its
// state, run, metric, rule, onset step (the step a person rolls back to; to the last step it was seen at)
// and when it fired (and resolved). Each onset is a link to that step's detail (a deep link, links.js), so
// an entry opens in place, in a new tab, or is copied like any other link.
"use strict";

const SHOWN_MAX = 200; // a list longer than this says how many more the state filter would narrow
const WHEN = { year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hour12: false };

function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString(undefined, WHEN);
}

export function onsetOf(alert) {
  return alert.first_step ?? alert.step;
}

function ordered(alerts) {
  const firing = (a) => (a.state === "firing" ? 0 : 1);
  return [...alerts].sort((a, b) => firing(a) - firing(b) || String(b.fired_at).localeCompare(String(a.fired_at)) || b.id - a.id);
}

function row(alert, body, { html, linkTo }) {
  const onset = onsetOf(alert);
  const tr = html("tr", { class: `alert-row ${alert.state}`, "data-alert": alert.id, "data-run": alert.run, "data-step": onset, "data-state": alert.state, title: alert.message }, null, body);
  html("td", { class: `state ${alert.state}`, "data-label": "state" }, alert.state, tr);
  html("td", { class: "name", "data-label": "run" }, alert.run, tr);
  const metric = html("td", { class: "metric", "data-label": "metric" }, alert.metric, tr);
  if (alert.task) html("span", { class: "sub" }, ` ${alert.task}`, metric);
  html("td", { "data-label": "rule" }, `${alert.rule} (${alert.severity})`, tr);
  const steps = html("td", { class: "onset", "data-label": "onset" }, null, tr);
  if (onset === null || onset === undefined) steps.textContent = "–";
  else {
    const href = linkTo({ run: alert.run, step: onset, metric: alert.metric, task: alert.task });
    html("a", { class: "step-link", href, title: `open ${alert.run} step ${onset}` }, `step ${onset}`, steps);
    const last = alert.last_step;
    if (last !== null && last !== undefined && last !== onset) steps.append(` → ${last}`);
  }
  const time = html("td", { class: "when", "data-label": "time" }, `fired ${when(alert.fired_at)}`, tr);
  if (alert.resolved_at) html("div", { class: "muted" }, `resolved ${when(alert.resolved_at)}`, time);
}

/** Fills ``table`` with ``alerts`` (those in ``only``'s state when given); returns [shown, total]. */
export function showAlerts(table, alerts, { html, linkTo, only }) {
  const kept = ordered(alerts.filter((a) => !only || a.state === only));
  const head = html("tr");
  for (const h of ["state", "run", "metric", "rule", "onset step", "time"]) html("th", {}, h, head);
  const body = html("tbody");
  for (const alert of kept.slice(0, SHOWN_MAX)) row(alert, body, { html, linkTo });
  if (kept.length > SHOWN_MAX) {
    const more = html("tr", { class: "more" }, null, body);
    html("td", { colspan: 6, class: "muted" }, `and ${kept.length - SHOWN_MAX} more (choose firing or resolved to narrow the list)`, more);
  }
  const thead = html("thead");
  thead.appendChild(head);
  table.replaceChildren(thead, body);
  return [Math.min(kept.length, SHOWN_MAX), kept.length];
}
