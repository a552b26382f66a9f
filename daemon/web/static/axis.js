// Axes for the dashboard's charts: domains, scales, ticks and their labels. Pure functions, no DOM.
//
// Every axis gets at least MIN_TICKS labelled ticks and no more than fit side by side at the width the
// chart is drawn at, so labels are never squashed or overlapping. Three kinds of x axis (checkpoint step,
// wall time, time since the run's first result) and two kinds of y axis (linear, log).
"use strict";

export const MIN_TICKS = 4;

const NICE = [1, 2, 2.5, 5];
const SECOND = 1, MINUTE = 60, HOUR = 3600, DAY = 86400;
const TIME_STEPS = [1, 2, 5, 10, 15, 30, MINUTE, 2 * MINUTE, 5 * MINUTE, 10 * MINUTE, 15 * MINUTE, 30 * MINUTE,
  HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY, 14 * DAY, 30 * DAY];

/** A number as a short label: 4 significant digits, exponent form for very large or small. */
export function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "∞" : "−∞";
  if (v !== 0 && (Math.abs(v) >= 1e5 || Math.abs(v) < 1e-3)) return Number(v.toPrecision(4)).toExponential().replace("e+", "e");
  return Number(v.toPrecision(4)).toString();
}

/** Ticks of a linear axis over [lo, hi]: a 1/2/2.5/5 × 10^k spacing giving at least MIN_TICKS and at
 *  most ``most`` ticks, as near ``target`` as there is. ``integer`` axes (steps) never get fractions. */
export function linearTicks(lo, hi, most, integer = false, target = 6) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const options = [];
  const top = Math.ceil(Math.log10(span));
  for (let e = top; e >= top - 5; e--) {
    for (const f of [...NICE].reverse()) {
      const spacing = Number((f * Math.pow(10, e)).toPrecision(12));
      if (integer && (spacing < 1 || !Number.isInteger(spacing))) continue;
      const first = Math.ceil(lo / spacing - 1e-9), last = Math.floor(hi / spacing + 1e-9);
      options.push({ spacing, first, n: last - first + 1 });
    }
  }
  if (!options.length) return [lo, hi];
  return pick(options, most, target, (o) => {
    const ticks = [];
    for (let k = o.first; k < o.first + o.n; k++) ticks.push(Number((k * o.spacing).toPrecision(12)));
    return ticks;
  });
}

// The option whose tick count fits (MIN_TICKS..most) nearest the target; else the fewest above MIN_TICKS
// (a chart too narrow for four labels still gets four), else the most there are.
function pick(options, most, target, make) {
  const fits = options.filter((o) => o.n >= MIN_TICKS && o.n <= Math.max(most, MIN_TICKS));
  let chosen;
  if (fits.length) chosen = fits.reduce((a, b) => (Math.abs(b.n - target) < Math.abs(a.n - target) ? b : a));
  else {
    const above = options.filter((o) => o.n >= MIN_TICKS);
    chosen = above.length ? above.reduce((a, b) => (b.n < a.n ? b : a)) : options.reduce((a, b) => (b.n > a.n ? b : a));
  }
  return make(chosen);
}

/** Ticks of a log axis over [lo, hi] (both > 0): every k-th decade, then 1-3, 1-2-5, every digit; a
 *  range too short for any of those takes linear ticks (drawn at their log positions). */
export function logTicks(lo, hi, most, target = 6) {
  const d0 = Math.floor(Math.log10(lo)), d1 = Math.ceil(Math.log10(hi));
  const inside = (t) => t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9);
  const options = [];
  for (const every of [5, 3, 2, 1]) {
    const ticks = [];
    for (let d = Math.ceil(d0 / every) * every; d <= d1; d += every) if (inside(Math.pow(10, d))) ticks.push(Number(Math.pow(10, d).toPrecision(12)));
    options.push({ ticks, n: ticks.length });
  }
  for (const mantissas of [[1, 3], [1, 2, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]]) {
    const ticks = [];
    for (let d = d0; d <= d1; d++) for (const m of mantissas) { const t = Number((m * Math.pow(10, d)).toPrecision(12)); if (inside(t)) ticks.push(t); }
    options.push({ ticks, n: ticks.length });
  }
  if (!options.some((o) => o.n >= MIN_TICKS)) return linearTicks(lo, hi, most, false, target);
  return pick(options, most, target, (o) => o.ticks);
}

/** Ticks of a time axis (seconds) at round intervals, 1 s … 30 days. ``offset`` shifts the grid (the
 *  local time zone, so wall-clock hours fall on the hour). Returns the ticks and their interval. */
export function timeTicks(lo, hi, most, offset = 0, target = 6) {
  const span = hi - lo;
  if (!(span > 0)) return { ticks: [lo], interval: SECOND };
  const options = TIME_STEPS.map((interval) => {
    const first = Math.ceil((lo - offset) / interval), last = Math.floor((hi - offset) / interval);
    return { interval, first, n: last - first + 1 };
  });
  if (!options.some((o) => o.n >= MIN_TICKS)) {
    // Under a few seconds: plain seconds, with fractions.
    return { ticks: linearTicks(lo, hi, most, false, target), interval: span / MIN_TICKS };
  }
  let interval = SECOND;
  const ticks = pick(options, most, target, (o) => {
    interval = o.interval;
    const out = [];
    for (let k = o.first; k < o.first + o.n; k++) out.push(k * o.interval + offset);
    return out;
  });
  return { ticks, interval };
}

const pad2 = (n) => String(n).padStart(2, "0");

/** A wall-clock label (seconds since the epoch) as precise as the tick interval needs. */
export function fmtClock(t, interval, span) {
  const d = new Date(t * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  const day = `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}`;
  if (interval >= DAY) return day.slice(5);
  if (span >= DAY) return `${day.slice(5)} ${hm}`;
  if (interval < MINUTE) return `${hm}:${pad2(d.getSeconds())}`;
  return hm;
}

/** A duration label (seconds): 45s, 12m, 1h30m, 2d. */
export function fmtDuration(s, interval = 1) {
  const sign = s < 0 ? "−" : "";
  s = Math.abs(s);
  if (interval < SECOND) return sign + `${Number(s.toPrecision(3))}s`;
  if (s < MINUTE) return sign + `${Math.round(s)}s`;
  if (s < HOUR) {
    const m = Math.floor(s / MINUTE), sec = Math.round(s - m * MINUTE);
    return sign + (interval < MINUTE && sec ? `${m}m${pad2(sec)}s` : `${Math.round(s / MINUTE)}m`);
  }
  if (s < DAY || interval < DAY) {
    const h = Math.floor(s / HOUR), m = Math.round((s - h * HOUR) / MINUTE);
    return sign + (m ? `${h}h${pad2(m)}m` : `${h}h`);
  }
  const days = Math.floor(s / DAY), h = Math.round((s - days * DAY) / HOUR);
  return sign + (h ? `${days}d${h}h` : `${days}d`);
}

/** The y values that set the scale when outliers are ignored: inside Tukey's fences (1.5 IQR beyond the
 *  quartiles), as TensorBoard's "ignore outliers in chart scaling" keeps the bulk of the points in view. */
export function withoutOutliers(values) {
  if (values.length < 5) return values;
  const sorted = [...values].sort((a, b) => a - b);
  const q = (p) => {
    const i = (sorted.length - 1) * p, lo = Math.floor(i), hi = Math.ceil(i);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (i - lo);
  };
  const q1 = q(0.25), q3 = q(0.75), iqr = q3 - q1;
  const kept = values.filter((v) => v >= q1 - 1.5 * iqr && v <= q3 + 1.5 * iqr);
  return kept.length ? kept : values;
}

/** A scale: data → pixels over [p0, p1], linear or log10. */
export function scale(d0, d1, p0, p1, log = false) {
  const f = log ? Math.log10 : (v) => v;
  const a = f(d0), b = f(d1);
  const to = (v) => (b === a ? (p0 + p1) / 2 : p0 + ((f(v) - a) / (b - a)) * (p1 - p0));
  const from = (p) => {
    const u = a + ((p - p0) / (p1 - p0)) * (b - a);
    return log ? Math.pow(10, u) : u;
  };
  return { to, from, domain: [d0, d1], log };
}

/** Pads a data extent so points do not sit on the frame; a single value gets a range around it. */
export function padded(lo, hi, { log = false, integer = false } = {}) {
  if (log) {
    if (!(hi > lo)) return [lo / 2, hi * 2];
    const f = Math.pow(hi / lo, 0.05);
    return [lo / f, hi * f];
  }
  if (integer) {
    const span = hi - lo;
    // At least MIN_TICKS integer ticks fit: a range of three steps or more.
    const need = Math.max(MIN_TICKS - span, 0);
    const margin = Math.max(span * 0.03, need / 2);
    return [lo - margin, hi + margin];
  }
  if (!(hi > lo)) {
    const d = Math.abs(lo) * 0.05 || 0.5;
    return [lo - d, hi + d];
  }
  const m = (hi - lo) * 0.06;
  return [lo - m, hi + m];
}
