// A checkpoint's jobs in the detail panel, each with its attempts as `evald history` lists them (read
// from /api/v1/jobs/{job}): automatic retries and those `evald retry` queued, where each ran (the Slurm job
// id and nodes), how long it waited in Slurm's queue and ran, the state it ended in and its error (the
// first line, the whole text one click away). A job that was tried more than once, failed or is not
// done is opened at once; the others open with a click on their line.
"use strict";

const SLURM_COLUMNS = ["slurm job", "nodes", "queue wait", "exit state"];

export function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return `${Number(s).toFixed(s < 10 ? 1 : 0)} s`;
  const whole = Math.round(s);
  if (whole < 3600) return `${Math.floor(whole / 60)}m ${String(whole % 60).padStart(2, "0")}s`;
  return `${Math.floor(whole / 3600)}h ${String(Math.floor((whole % 3600) / 60)).padStart(2, "0")}m`;
}

const WHEN = { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hour12: false };

function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString(undefined, WHEN);
}

// The error's first line, the rest behind a click: a worker's log tail must not stretch the table.
function errorCell(error, td, html) {
  const lines = error.trim().split("\n");
  if (lines.length === 1) { td.textContent = lines[0]; return; }
  const more = html("details", { class: "error-more" }, null, td);
  html("summary", {}, `${lines[0]} (${lines.length - 1} more line${lines.length > 2 ? "s" : ""})`, more);
  html("pre", {}, error, more);
}

function attemptsTable(rows, html) {
  const slurm = rows.some((r) => r.slurm_job_id !== null && r.slurm_job_id !== undefined);
  const table = html("table", { class: "attempts" });
  const head = html("tr", {}, null, html("thead", {}, null, table));
  const columns = ["attempt", "outcome", "started", "took", ...(slurm ? SLURM_COLUMNS : [])];
  for (const h of columns) html("th", {}, h, head);
  const body = html("tbody", {}, null, table);
  for (const r of rows) {
    // A claim with no end yet (running, or waiting in Slurm's queue) says where it stands instead.
    const current = r.claimed_by !== undefined || r.duration_s === null;
    const tr = html("tr", { "data-attempt": r.attempt, "data-outcome": r.outcome, class: current ? "attempt current" : "attempt" }, null, body);
    html("td", { class: "num" }, String(r.attempt), tr);
    html("td", { class: `outcome ${r.outcome}` }, r.outcome + (r.executor_state ? ` · ${r.executor_state}` : ""), tr);
    html("td", { class: "when" }, when(r.started_at), tr);
    html("td", { class: "num" }, r.duration_s === null ? "–" : seconds(r.duration_s), tr);
    if (slurm) {
      html("td", {}, r.slurm_job_id ?? "–", tr);
      html("td", {}, r.nodes ?? "–", tr);
      const waited = r.queue_wait_s ?? null;
      const sofar = current && r.since_claim_s !== null && r.since_claim_s !== undefined;
      html("td", { class: "num" }, waited !== null ? seconds(waited) : sofar ? `${seconds(r.since_claim_s)} so far` : "–", tr);
      html("td", {}, r.exit_state ?? "–", tr);
    }
    // The error on a line of its own under its attempt, as wide as the table.
    if (r.error) {
      const line = html("tr", { class: "error-row", "data-attempt": r.attempt }, null, body);
      const td = html("td", { class: "error", colspan: columns.length }, null, line);
      errorCell(r.error_kind ? `${r.error_kind}: ${r.error}` : r.error, td, html);
    }
  }
  return table;
}

async function loadAttempts(job, box, api, html) {
  try {
    const body = await api(`/api/v1/jobs/${job.id}`);
    const rows = body.attempts;
    box.replaceChildren();
    if (!rows.length) { html("p", { class: "muted" }, "no worker run of it recorded", box); return; }
    html("div", { class: "table-wrap" }, null, box).appendChild(attemptsTable(rows, html));
  } catch (e) {
    box.replaceChildren(html("p", { class: "muted" }, `attempts not read: ${e.message}`));
  }
}

function opensAtOnce(job) {
  return job.attempts > 1 || job.state !== "succeeded" || job.error !== null;
}

export function showJobs(box, jobs, api, html) {
  box.replaceChildren();
  if (!jobs || !jobs.length) return;
  html("h3", {}, `Jobs at this step (${jobs.length})`, box);
  for (const job of jobs) {
    const item = html("details", { class: `job ${job.state}`, "data-job": job.id }, null, box);
    const tries = `${job.attempts} attempt${job.attempts === 1 ? "" : "s"}`;
    html("summary", {}, `job ${job.id} · ${job.task}/${job.stage} · ${job.state} · ${tries}`, item);
    const inside = html("div", { class: "attempts-box" }, null, item);
    html("p", { class: "muted" }, "loading…", inside);
    let loaded = false;
    item.addEventListener("toggle", () => {
      if (!item.open || loaded) return;
      loaded = true;
      loadAttempts(job, inside, api, html);
    });
    if (opensAtOnce(job)) item.open = true;
  }
}
