// edge-ldp collector dashboard: live fleet aggregates from /api/events
// (server-sent events), falling back to polling /api/channels.
//
// Each channel's charts over time are drawn from the server's history
// (/api/channels/<name>/history, fetched when the channel first appears) and
// extended with the latest window of every event; they keep at most what the
// server's history holds, so the page may stay open for days without growing.
// The DOM of a channel card is built once and then only its text changes.
// Canvases are drawn by hand (no libraries, no CDN).
//
// `?static=1`: a static view (printing, screenshots, tests): /api/channels and
// each channel's history are fetched once, no event stream is opened and no
// timer is left running; <html data-state> says "ready" (or "error") when done.
//
// The view controls (one for the page: the collector's resolutions and the
// results store are the same for every channel, and channels compare best over
// the same time) choose a resolution and a time range.  The finest resolution
// and "live" is the live view above; anything else asks each channel's history
// of the results store (?resolution=&start=&end=), again every REFRESH_MS while
// the range reaches the present.  The view is also in the page's URL (resolution,
// range, from, to), so the static view and a bookmark show the same.
(() => {
  "use strict";

  const POLL_MS = 2000;         // polling period when the event stream fails
  const STREAM_RETRY_MS = 30000; // while polling, try the event stream again this often
  const MAX_POINTS = 10000;     // points per channel history at most (the server's own cap)
  const EPS = 1e-6;             // seconds: slack when comparing window times
  const DASH = "–";
  const MINUS = "−";            // U+2212, for every negative number shown
  const TAU = 2 * Math.PI;
  const MAX_BARS = 64;          // categories drawn at most (the largest shares)
  const MAX_CHOICES = 256;      // categories offered for the share-over-time chart at most
  const REFRESH_MS = 30000;     // a query of the results store is asked again this often
  const QUERIES_AT_ONCE = 2;    // results store queries in flight at most (the server takes 4)
  // The time ranges of the view controls: seconds before the collector's latest time.
  const RANGES = { hour: 3600, day: 86400, week: 7 * 86400, month: 30 * 86400 };
  const RANGE_WORDS = { hour: "last hour", day: "last day", week: "last week",
    month: "last 30 days" };
  // Hover text of every chart over time (each point's own replaces it under the pointer).
  const LEGEND = "line: the estimate per window; shaded band: its 95% interval; "
    + "hollow grey markers: too few reports (not a measurement)";
  const STATIC = (() => {
    const value = new URLSearchParams(window.location.search).get("static");
    return value !== null && value !== "0" && value !== "false";
  })();

  // ---- formatting -------------------------------------------------------

  const isNum = (x) => typeof x === "number" && Number.isFinite(x);
  const countFormat = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const sigFormats = new Map();

  // `digits` significant digits in plain decimal, never in exponent form
  // (-6.788e-4 is "−0.0006788", 1.2e7 is "12,000,000"), trailing zeros dropped,
  // digits grouped by thousands, a true minus sign.  null, NaN and missing
  // values show as a dash.
  function fmt(x, digits = 4) {
    if (!isNum(x)) return DASH;
    if (x === 0) return "0";
    let format = sigFormats.get(digits);
    if (!format) {
      format = new Intl.NumberFormat("en-US", { maximumSignificantDigits: digits });
      sigFormats.set(digits, format);
    }
    return format.format(x).replace("-", MINUS);
  }

  const fmtCount = (n) => (isNum(n) ? countFormat.format(n).replace("-", MINUS) : DASH);
  // A share in [0, 1] as a percentage with one decimal.
  const fmtShare = (x) => (isNum(x) ? `${(x * 100).toFixed(1)}%`.replace("-", MINUS) : DASH);

  function fmtTime(t) {
    if (!isNum(t)) return DASH;
    return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
  }

  // Local date and time, e.g. "2025-11-22 03:53:20" (the static view's "as of").
  function fmtDateTime(t) {
    if (!isNum(t)) return DASH;
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
      + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  // To the minute, for the ends of a time range: "2025-11-22 03:53".
  const fmtMinute = (t) => (isNum(t) ? fmtDateTime(t).slice(0, 16) : DASH);

  // A datetime-local input's value (local time, "2025-11-22T03:53") and back.
  function toLocalInput(t) {
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${String(d.getFullYear()).padStart(4, "0")}-${pad(d.getMonth() + 1)}-`
      + `${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }
  function fromLocalInput(text) {
    if (!text) return null;
    const ms = new Date(text).getTime();  // no offset in the text: local time
    return Number.isFinite(ms) ? ms / 1000 : null;
  }

  // A resolution's name as the collector writes it ("1m", "1h", "1d") in seconds.
  const DURATION_UNITS = { s: 1, m: 60, h: 3600, d: 86400, w: 604800 };
  function durationSeconds(name) {
    const match = /^(\d+(?:\.\d+)?)([smhdw])$/.exec(String(name));
    return match ? Number(match[1]) * DURATION_UNITS[match[2]] : NaN;
  }

  // A duration in the largest unit that keeps it readable: 40 s, 59 min, 3 h, 2 d.
  function fmtDuration(seconds) {
    if (!isNum(seconds)) return DASH;
    if (seconds < 120) return `${fmt(seconds, 3)} s`;
    if (seconds < 7200) return `${fmt(seconds / 60, 3)} min`;
    if (seconds < 172800) return `${fmt(seconds / 3600, 3)} h`;
    return `${fmt(seconds / 86400, 3)} d`;
  }

  // A channel's unit as the API gives it (a string, else none).
  const unitOf = (unit) => (typeof unit === "string" && unit.trim() ? unit.trim() : "");
  // A number with its unit, for text drawn on canvases and tooltips.
  const withUnit = (text, unit) => (unit && text !== DASH ? `${text} ${unit}` : text);

  // Radian domains also in degrees; others (e.g. hour of day) stay as they are.
  const isRadians = (period) => isNum(period) && Math.abs(period - TAU) < 1e-6;
  const degrees = (x) => (isNum(x) ? fmt((x * 180) / Math.PI, 3) + "°" : DASH);

  // ---- DOM helpers --------------------------------------------------------

  function el(tag, attrs = {}, children = []) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
    for (const child of [].concat(children)) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // Writes only when the text differs: no needless layout work once a second.
  function setText(node, text) {
    if (node && node.textContent !== text) node.textContent = text;
  }

  // The same for an attribute (a tooltip, a data- attribute): attribute values
  // are text, never markup.
  function setAttr(node, name, text) {
    if (node.getAttribute(name) !== text) node.setAttribute(name, text);
  }

  // A position or length in percent of the parent, clamped to [0, 100] (the
  // CSP allows the CSSOM, not style attributes).
  function setPercent(node, property, percent) {
    const css = `${Math.min(Math.max(percent, 0), 100).toFixed(3)}%`;
    if (node.style[property] !== css) node.style[property] = css;
  }

  // A statistic's value element; `fields` maps its key to it for updates.
  function value(fields, key, cls = "") {
    const node = el("span", { "data-stat": key, class: cls }, DASH);
    fields[key] = node;
    return node;
  }

  // The unit after a value (nothing when the channel names none).
  function unitNode(unit) {
    return unit ? el("span", { class: "unit", "data-unit": unit }, ` ${unit}`) : "";
  }

  // "±" with what it means, for the eye (a label) and the pointer (a tooltip).
  function plusMinus(meaning) {
    return el("span", { class: "pm", title: meaning }, " ± ");
  }
  const standardError = () => el("span", { class: "sub", "data-label": "stderr",
    title: "± one standard error" }, " (s.e.)");
  const halfWidth = () => el("span", { class: "sub", "data-label": "half-width",
    title: "± the half-width of the 95% interval" }, " (95% half-width)");

  function term(label, ...parts) {
    return el("div", {}, [el("dt", {}, label), el("dd", {}, parts)]);
  }

  // A term on a row of its own: an estimate with its ± and what the ± is.
  function wideTerm(label, ...parts) {
    const node = term(label, ...parts);
    node.className = "wide";
    return node;
  }

  const qs = (selector) => document.querySelector(selector);
  // Header statistics: scoped, since cards have stats of the same names (count, messages).
  const headerStat = (key) => document.querySelector(`#fleet [data-stat="${key}"]`);

  // GET a JSON document; an HTTP error throws with its status and the server's message.
  async function getJSON(url) {
    const response = await fetch(url, { cache: "no-store" });
    const text = await response.text();
    if (!response.ok) {
      let message = "";
      try {
        const body = JSON.parse(text);
        if (body && typeof body.error === "string") message = ` ${body.error}`;
      } catch (err) {
        message = response.statusText ? ` ${response.statusText}` : "";
      }
      throw new Error(`HTTP ${response.status}${message}`);
    }
    return JSON.parse(text);
  }

  // ---- theme (chart colours come from style.css) --------------------------

  let theme = null;
  function readTheme() {
    const css = getComputedStyle(document.documentElement);
    const v = (name) => css.getPropertyValue(name).trim();
    theme = { fg: v("--fg"), muted: v("--muted"), grid: v("--grid"), accent: v("--accent"),
      raw: v("--raw"), font: "11px system-ui, sans-serif" };
  }

  // Matches the bitmap to the CSS size (sharp on high-DPI screens) and clears it.
  function prepare(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const h = canvas.clientHeight;
    const pw = Math.max(1, Math.round(w * dpr));
    const ph = Math.max(1, Math.round(h * dpr));
    if (canvas.width !== pw || canvas.height !== ph) {
      canvas.width = pw;
      canvas.height = ph;
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = theme.font;
    ctx.lineJoin = "round";
    return { ctx, w, h };
  }

  function noData(ctx, w, h, text = "no data yet") {
    ctx.fillStyle = theme.muted;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText(text, w / 2, h / 2);
  }

  function finiteRange(values) {
    let lo = Infinity;
    let hi = -Infinity;
    for (const x of values) {
      if (isNum(x)) {
        if (x < lo) lo = x;
        if (x > hi) hi = x;
      }
    }
    return lo <= hi ? [lo, hi] : null;
  }

  // ---- charts ---------------------------------------------------------------

  // An estimate over time, one point per window of the channel's history, with
  // its 95% interval as a band.  `set` takes samples {start, end, value, y, lo,
  // hi, tooFew}: `value` the estimate as served, `y` where it is drawn (a circular
  // mean may be unwrapped), `lo`/`hi` the interval's ends, `tooFew` a window with
  // too few reports to be a measurement: no line through it and no band, a hollow
  // grey marker instead (and the label says how many).  The canvas carries what it
  // shows for tests and tools: data-points (windows), data-first/data-last (their
  // starts), data-last-value, data-y-low/data-y-high, data-too-few (windows with
  // too few reports), data-band-points (windows in the band) and data-bands (the
  // band's polygons, as last drawn); its label says the span covered.
  // `options`: format (of the y values, e.g. a share as a percentage) and clamp
  // (the values' domain, [lo, hi]: the band is cut to it).
  class SeriesChart {
    constructor(chart, title, unit, { format = fmt, clamp = null, titleNodes = null } = {}) {
      this.canvas = el("canvas", { class: "trend", "data-chart": chart, "data-points": "0",
        "data-too-few": "0", "data-band-points": "0", "data-bands": "0", role: "img",
        "aria-label": title, title: LEGEND });
      this.title = title;
      this.unit = unit;
      this.format = format;
      this.clamp = clamp;
      this.samples = [];
      this.info = {};
      this.geometry = null;  // where the last drawing put the samples (for the hover text)
      this.span = el("span", { class: "span", "data-span": "0" }, "");
      this.few = el("span", { class: "too-few-note", "data-too-few-note": "0" }, "");
      this.label = el("div", { class: "chart-label", "data-label": chart },
        [].concat(titleNodes || title, [this.span, this.few]));
      this.canvas.addEventListener("mousemove", (ev) => this.hover(ev));
      this.canvas.addEventListener("mouseleave", () => setAttr(this.canvas, "title", LEGEND));
    }

    // `info`: {windowSeconds, loading, error, resolution, range} of the history;
    // `range`: the [start, end] of a query of the results store (none: the live view).
    set(samples, info) {
      this.samples = samples;
      this.info = info;
      const n = samples.length;
      const first = samples[0];
      const last = samples[n - 1];
      const span = n ? last.end - first.start : 0;
      let few = 0;
      let band = 0;
      for (const p of samples) {
        if (p.tooFew) few += 1;
        else if (isNum(p.lo) && isNum(p.hi)) band += 1;
      }
      setAttr(this.canvas, "data-points", String(n));
      setAttr(this.canvas, "data-first", n ? String(first.start) : "");
      setAttr(this.canvas, "data-last", n ? String(last.start) : "");
      setAttr(this.canvas, "data-last-value", n && isNum(last.value) ? String(last.value) : "");
      setAttr(this.canvas, "data-too-few", String(few));
      setAttr(this.canvas, "data-band-points", String(band));
      // What the y axis spans (before its margins): a circular mean's, unwrapped.
      const range = this.yRange();
      setAttr(this.canvas, "data-y-low", range ? String(range[0]) : "");
      setAttr(this.canvas, "data-y-high", range ? String(range[1]) : "");
      setAttr(this.span, "data-span", String(span));
      const windows = `${fmtCount(n)} window${n === 1 ? "" : "s"}`;
      const of = info.resolution ? ` of ${info.resolution}`
        : isNum(info.windowSeconds) ? ` of ${fmtDuration(info.windowSeconds)}` : "";
      let text;
      if (info.range) {
        text = `, ${fmtMinute(info.range[0])} – ${fmtMinute(info.range[1])} `
          + `(${n ? windows + of : "no window with reports"})`;
      } else if (n) {
        text = `, last ${fmtDuration(span)} (${windows}${of})`;
      } else {
        text = info.loading ? " (loading the history…)" : "";
      }
      setText(this.span, text);
      let note = "";
      if (few && few === n) {
        note = "; too few reports in every window: no measurement to draw";
      } else if (few) {
        note = `; ○ ${fmtCount(few)} window${few === 1 ? "" : "s"} with too few reports `
          + "(hollow markers, not measurements)";
      }
      setText(this.few, note);
      setAttr(this.few, "data-too-few-note", String(few));
      setAttr(this.canvas, "aria-label", `${this.title}: ${windows}`
        + (few ? `, ${fmtCount(few)} with too few reports` : ""));
    }

    // The values' range: the measurements' estimates and intervals; if every window
    // has too few reports, their estimates.
    yRange() {
      const measured = this.samples.filter((p) => !p.tooFew);
      let range = finiteRange(measured.flatMap((p) => [p.y, p.lo, p.hi]))
        || finiteRange(this.samples.map((p) => p.y));
      if (range && this.clamp) {
        range = [Math.max(range[0], this.clamp[0]), Math.min(range[1], this.clamp[1])];
        if (!(range[0] <= range[1])) range = this.clamp.slice();
      }
      return range;
    }

    draw() {
      const { ctx, w, h } = prepare(this.canvas);
      const pts = this.samples;
      const info = this.info || {};
      this.geometry = null;
      const yr = this.yRange();
      if (!yr) {
        setAttr(this.canvas, "data-bands", "0");
        const text = info.error ? "no data: the history could not be read"
          : pts.length ? "too few reports" : info.loading ? "loading…" : "no data yet";
        return noData(ctx, w, h, text);
      }
      let [y0, y1] = yr;
      const pad = (y1 - y0) * 0.1 || Math.abs(y0) * 0.1 || 1;
      y0 -= pad;
      y1 += pad;
      if (this.clamp) {
        y0 = Math.max(y0, this.clamp[0]);
        y1 = Math.min(y1, this.clamp[1]);
      }
      const left = 4;
      const right = w - 4;
      const top = 12;
      const bottom = h - 12;
      const mid = (p) => (p.start + p.end) / 2;
      // A query's range spans the axis (empty stretches show as such); else the windows.
      let t0 = mid(pts[0]);
      let t1 = mid(pts[pts.length - 1]);
      if (info.range) {
        t0 = Math.min(info.range[0], t0);
        t1 = Math.max(info.range[1], t1);
      }
      const width = t1 - t0;
      const x = (p) => (width > 0 ? left + ((mid(p) - t0) / width) * (right - left) : right);
      const y = (v) => bottom - ((Math.min(Math.max(v, y0), y1) - y0) / (y1 - y0)) * (bottom - top);

      // Interval band, one polygon per run of measured points that have both ends.
      let bands = 0;
      ctx.fillStyle = theme.accent;
      ctx.globalAlpha = 0.2;
      for (const run of runs(pts, (p) => !p.tooFew && isNum(p.lo) && isNum(p.hi))) {
        bands += 1;
        if (run.length === 1) {
          ctx.fillRect(x(run[0]) - 2, y(run[0].hi), 4, y(run[0].lo) - y(run[0].hi));
          continue;
        }
        ctx.beginPath();
        run.forEach((p, i) => (i ? ctx.lineTo(x(p), y(p.hi)) : ctx.moveTo(x(p), y(p.hi))));
        for (let i = run.length - 1; i >= 0; i--) ctx.lineTo(x(run[i]), y(run[i].lo));
        ctx.closePath();
        ctx.fill();
      }
      ctx.globalAlpha = 1;
      setAttr(this.canvas, "data-bands", String(bands));

      // The estimates: a line through each run of measurements (a window with too
      // few reports, a missing estimate or a gap in time breaks it).
      ctx.strokeStyle = theme.accent;
      ctx.fillStyle = theme.accent;
      ctx.lineWidth = 1.5;
      for (const run of runs(pts, (p) => !p.tooFew && isNum(p.y))) {
        if (run.length === 1) {
          ctx.beginPath();
          ctx.arc(x(run[0]), y(run[0].y), 2.5, 0, TAU);
          ctx.fill();
          continue;
        }
        ctx.beginPath();
        run.forEach((p, i) => (i ? ctx.lineTo(x(p), y(p.y)) : ctx.moveTo(x(p), y(p.y))));
        ctx.stroke();
      }

      // Too few reports: a hollow grey marker where the estimate would be (on the
      // chart's edge when it is beyond the measurements' range).
      ctx.strokeStyle = theme.muted;
      ctx.lineWidth = 1.2;
      let few = 0;
      for (const p of pts) {
        if (!p.tooFew) continue;
        few += 1;
        if (!isNum(p.y)) continue;
        ctx.beginPath();
        ctx.arc(x(p), y(p.y), 3, 0, TAU);
        ctx.stroke();
      }

      ctx.fillStyle = theme.muted;
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      ctx.fillText(withUnit(this.format(y1, 3), this.unit), left, 0);
      ctx.textBaseline = "bottom";
      ctx.fillText(withUnit(this.format(y0, 3), this.unit), left, h);
      ctx.textAlign = "right";
      ctx.fillText(info.range ? `${fmtMinute(info.range[0])} – ${fmtMinute(info.range[1])}`
        : `last ${fmtDuration(pts[pts.length - 1].end - pts[0].start)}`, right, h);
      if (few === pts.length) {
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        ctx.fillText("too few reports", w / 2, h / 2);
      }
      this.geometry = { x, pts };
    }

    // The point under the pointer, as a tooltip: when, the estimate and its interval,
    // and whether it has too few reports.
    hover(ev) {
      const g = this.geometry;
      if (!g || !g.pts.length) return;
      const mx = ev.clientX - this.canvas.getBoundingClientRect().left;
      let best = g.pts[0];
      for (const p of g.pts) if (Math.abs(g.x(p) - mx) < Math.abs(g.x(best) - mx)) best = p;
      setAttr(this.canvas, "title", this.describe(best));
    }

    describe(p) {
      const f = (v) => this.format(v);
      // An unwrapped interval is told around the estimate as served.
      const shift = isNum(p.value) && isNum(p.y) ? p.value - p.y : 0;
      const interval = isNum(p.lo) && isNum(p.hi)
        ? `, 95% interval [${f(p.lo + shift)}, ${f(p.hi + shift)}]` : ", no interval";
      return `${fmtDateTime(p.start)} – ${fmtDateTime(p.end)}\n`
        + `${withUnit(f(p.value), this.unit)}${interval}`
        + (p.tooFew ? "\ntoo few reports: not a measurement" : "");
    }
  }

  // Consecutive stretches of points satisfying `ok`; a missing point or a gap
  // between windows (no reports for a while) breaks the line.
  function runs(points, ok) {
    const out = [];
    let current = [];
    for (const p of points) {
      const prev = current[current.length - 1];
      if (prev && !(p.start <= prev.end + EPS)) {
        out.push(current);
        current = [];
      }
      if (ok(p)) current.push(p);
      else if (current.length) {
        out.push(current);
        current = [];
      }
    }
    if (current.length) out.push(current);
    return out;
  }

  // A window whose interval spans most of what the value can be (the server's
  // `too_few`, on the whole window: every block of it).
  const tooFew = (p) => p.too_few === true;

  // Linear samples: a history point's mean estimate and its 95% interval.
  function meanSamples(points, pick) {
    return points.map((p) => {
      const m = ((pick(p) || {}).mean) || {};
      const ci = Array.isArray(m.ci95) ? m.ci95 : [];
      return { start: p.start, end: p.end, value: m.estimate, y: m.estimate, lo: ci[0], hi: ci[1],
        tooFew: tooFew(p) };
    });
  }

  // Categorical samples: category i's consistent share and the 95% interval of its
  // unbiased share (as the bars and their whiskers show the totals).
  function shareSamples(points, i) {
    return points.map((p) => {
      const f = p.frequencies || {};
      const share = Array.isArray(f.shares) ? f.shares[i] : null;
      const ci = Array.isArray(f.ci95) && Array.isArray(f.ci95[i]) ? f.ci95[i] : [];
      return { start: p.start, end: p.end, value: share, y: share, lo: ci[0], hi: ci[1],
        tooFew: tooFew(p) };
    });
  }

  // Circular samples: the mean direction ± the 95% half-width, unwrapped around
  // the latest mean (each drawn within half a period of it), so that a mean
  // moving across the domain's ends is not drawn as a jump across the chart.
  function directionSamples(points, pick, period) {
    const views = points.map((p) => pick(p) || {});
    // The latest measured mean, else the latest of any.
    let ref = null;
    for (let i = views.length - 1; i >= 0 && ref === null; i--) {
      if (isNum(views[i].circular_mean) && !tooFew(points[i])) ref = views[i].circular_mean;
    }
    for (let i = views.length - 1; i >= 0 && ref === null; i--) {
      if (isNum(views[i].circular_mean)) ref = views[i].circular_mean;
    }
    const P = isNum(period) && period > 0 ? period : TAU;
    return points.map((p, i) => {
      const mean = views[i].circular_mean;
      const half = views[i].half_width;
      const y = isNum(mean) ? mean - P * Math.round((mean - ref) / P) : null;
      const band = isNum(y) && isNum(half);
      return { start: p.start, end: p.end, value: mean, y,
        lo: band ? y - half : null, hi: band ? y + half : null, tooFew: tooFew(p) };
    });
  }

  // Raw report shares as bars, the reconstructed distribution as a line.
  class HistogramChart {
    constructor(unit) {
      this.canvas = el("canvas", { class: "histogram", "data-chart": "histogram" });
      this.unit = unit;
      this.histogram = null;
      this.mean = null;
    }

    set(histogram, mean) {
      this.histogram = histogram;
      this.mean = mean;
    }

    draw() {
      const { ctx, w, h } = prepare(this.canvas);
      const hist = this.histogram || {};
      const raw = Array.isArray(hist.raw) ? hist.raw : [];
      const est = Array.isArray(hist.estimate) ? hist.estimate : [];
      const bins = Math.max(raw.length, est.length);
      const yr = finiteRange(raw.concat(est));
      if (!bins || !yr || yr[1] <= 0) return noData(ctx, w, h);
      const edges = Array.isArray(hist.edges) && hist.edges.length === bins + 1 ? hist.edges : null;
      const x0 = edges ? edges[0] : 0;
      const x1 = edges ? edges[bins] : bins;
      const edge = (i) => (edges ? edges[i] : i);
      const top = 4;
      const bottom = h - 14;
      const x = (v) => ((v - x0) / (x1 - x0 || 1)) * w;
      const y = (p) => bottom - (p / (yr[1] * 1.08)) * (bottom - top);

      ctx.fillStyle = theme.raw;
      ctx.globalAlpha = 0.45;
      for (let i = 0; i < bins; i++) {
        if (!isNum(raw[i]) || raw[i] <= 0) continue;
        const a = x(edge(i));
        const b = x(edge(i + 1));
        ctx.fillRect(a + 0.5, y(raw[i]), Math.max(b - a - 1, 0.5), bottom - y(raw[i]));
      }
      ctx.globalAlpha = 1;

      ctx.strokeStyle = theme.grid;
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(0, bottom + 0.5);
      ctx.lineTo(w, bottom + 0.5);
      ctx.stroke();

      ctx.strokeStyle = theme.accent;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let drawing = false;
      for (let i = 0; i < bins; i++) {
        if (!isNum(est[i])) {
          drawing = false;
          continue;
        }
        const cx = x((edge(i) + edge(i + 1)) / 2);
        if (drawing) ctx.lineTo(cx, y(est[i]));
        else ctx.moveTo(cx, y(est[i]));
        drawing = true;
      }
      ctx.stroke();

      // The mean estimate as a dashed marker.
      const m = this.mean && this.mean.estimate;
      if (isNum(m) && m >= Math.min(x0, x1) && m <= Math.max(x0, x1)) {
        ctx.setLineDash([3, 3]);
        ctx.strokeStyle = theme.fg;
        ctx.lineWidth = 1;
        ctx.beginPath();
        ctx.moveTo(x(m), top);
        ctx.lineTo(x(m), bottom);
        ctx.stroke();
        ctx.setLineDash([]);
      }

      ctx.fillStyle = theme.muted;
      ctx.textBaseline = "bottom";
      ctx.textAlign = "left";
      ctx.fillText(edges ? withUnit(fmt(x0, 3), this.unit) : fmt(x0, 3), 0, h);
      ctx.textAlign = "right";
      ctx.fillText(edges ? withUnit(fmt(x1, 3), this.unit) : fmt(x1, 3), w, h);
    }
  }
  // Polar bar chart of a circular histogram.  Radius ∝ √share so that wedge
  // area is proportional to the share; angle 0 to the right, counter-clockwise.
  class RoseChart {
    constructor(unit) {
      this.canvas = el("canvas", { class: "rose", "data-chart": "rose" });
      this.unit = unit;
      this.block = null;
    }

    set(block) {
      this.block = block;
    }

    draw() {
      const { ctx, w, h } = prepare(this.canvas);
      const block = this.block || {};
      const hist = block.histogram || {};
      const raw = Array.isArray(hist.raw) ? hist.raw : [];
      const est = Array.isArray(hist.estimate) ? hist.estimate : [];
      const edges = Array.isArray(hist.edges) ? hist.edges : [];
      const bins = edges.length - 1;
      const yr = finiteRange(raw.concat(est));
      if (bins < 1 || !yr || yr[1] <= 0) return noData(ctx, w, h);
      const period = edges[bins] - edges[0];
      const angle = (v) => (TAU * v) / period;  // domain value -> radians on the circle
      const cx = w / 2;
      const cy = h / 2;
      const R = Math.max(Math.min(w / 2 - 32, h / 2 - 14), 4);  // room for the labels
      const r = (p) => R * Math.sqrt(Math.max(p, 0) / yr[1]);

      // Grid: two rings and four spokes, labelled.
      ctx.strokeStyle = theme.grid;
      ctx.lineWidth = 1;
      for (const f of [0.5, 1]) {
        ctx.beginPath();
        ctx.arc(cx, cy, R * f, 0, TAU);
        ctx.stroke();
      }
      ctx.fillStyle = theme.muted;
      ctx.textBaseline = "middle";
      for (let q = 0; q < 4; q++) {
        const a = (q * TAU) / 4;
        ctx.beginPath();
        ctx.moveTo(cx, cy);
        ctx.lineTo(cx + R * Math.cos(a), cy - R * Math.sin(a));
        ctx.stroke();
        ctx.textAlign = ["left", "center", "right", "center"][q];  // text grows away from the circle
        ctx.fillText(this.label(q, period, edges[0]), cx + (R + 4) * Math.cos(a), cy - (R + 8) * Math.sin(a));
      }

      ctx.fillStyle = theme.raw;
      ctx.globalAlpha = 0.45;
      for (let i = 0; i < bins; i++) {
        if (!isNum(raw[i]) || raw[i] <= 0) continue;
        ctx.beginPath();
        ctx.moveTo(cx, cy);
        // Screen y points down, so a math angle a is drawn at -a.
        ctx.arc(cx, cy, r(raw[i]), -angle(edges[i]), -angle(edges[i + 1]), true);
        ctx.closePath();
        ctx.fill();
      }
      ctx.globalAlpha = 1;

      ctx.strokeStyle = theme.accent;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let n = 0;
      for (let i = 0; i < bins; i++) {
        if (!isNum(est[i])) continue;
        const a = angle((edges[i] + edges[i + 1]) / 2);
        const px = cx + r(est[i]) * Math.cos(a);
        const py = cy - r(est[i]) * Math.sin(a);
        if (n++) ctx.lineTo(px, py);
        else ctx.moveTo(px, py);
      }
      if (n === bins) ctx.closePath();  // the histogram wraps around
      ctx.stroke();

      // Mean direction, length = estimated resultant length (1 = all aligned), and its
      // 95% interval as an arc on the outer ring.
      const mean = block.circular_mean;
      const length = block.resultant_length && block.resultant_length.estimate;
      const half = block.direction && block.direction.half_width;
      if (isNum(mean) && isNum(half)) {
        ctx.strokeStyle = theme.fg;
        ctx.lineWidth = 3;
        ctx.beginPath();
        ctx.arc(cx, cy, R, -angle(mean + half), -angle(mean - half));
        ctx.stroke();
      }
      if (isNum(mean) && isNum(length)) {
        const a = angle(mean);
        const L = R * Math.min(Math.max(length, 0), 1);
        const tx = cx + L * Math.cos(a);
        const ty = cy - L * Math.sin(a);
        ctx.strokeStyle = theme.fg;
        ctx.fillStyle = theme.fg;
        ctx.lineWidth = 2;
        ctx.beginPath();
        ctx.moveTo(cx, cy);
        ctx.lineTo(tx, ty);
        ctx.stroke();
        ctx.beginPath();
        ctx.moveTo(tx, ty);
        ctx.lineTo(tx - 7 * Math.cos(a - 0.4), ty + 7 * Math.sin(a - 0.4));
        ctx.lineTo(tx - 7 * Math.cos(a + 0.4), ty + 7 * Math.sin(a + 0.4));
        ctx.closePath();
        ctx.fill();
      }
    }

    // Label of spoke q (0..3, counter-clockwise from the right) in the domain's unit.
    label(q, period, origin) {
      if (isRadians(period)) return ["0°", "90°", "180°", "−90°"][q];
      let v = (q * period) / 4;
      while (v >= origin + period) v -= period;
      while (v < origin) v += period;
      return this.unit === "deg" ? `${fmt(v, 3)}°` : withUnit(fmt(v, 3), this.unit);
    }
  }

  // ---- blocks: the statistics of one value (linear) or angle (circular) -----
  // A block with a chart over time has `setHistory(points, info)`: the channel's
  // history points, from which it picks its own (`point(p)`, e.g. a vector axis).

  class LinearBlock {
    constructor(name, title, { withCount = false, unit = "" } = {}) {
      this.fields = {};
      const trendTitle = `mean estimate${unit ? ` (${unit})` : ""} and 95% interval per window`;
      this.trend = new SeriesChart("trend", trendTitle, unit);
      this.histogram = new HistogramChart(unit);
      const f = this.fields;
      const u = () => unitNode(unit);
      const stats = el("dl", { class: "stats" }, [
        wideTerm("mean", value(f, "mean-estimate", "main"), plusMinus("standard error"),
          value(f, "stderr"), u(), standardError()),
        wideTerm("95% CI", "[", value(f, "ci-low"), ", ", value(f, "ci-high"), "]", u()),
        term("method", value(f, "method")),
        term("raw mean", value(f, "mean-raw"), u()),
        term("median", value(f, "median"), u()),
        term("5–95%", value(f, "q05"), " … ", value(f, "q95"), u()),
        term("bias bound", value(f, "bias-bound"), u()),
        term("histogram", value(f, "histogram-method")),
      ]);
      if (withCount) stats.append(term("count", value(f, "axis-count")));
      // Why the interval is wide when the mechanism cannot place the data (mean.note).
      this.note = el("p", { class: "caveat", "data-field": "note", hidden: "" });
      this.root = el("div", { class: "block", "data-block": name }, [
        title ? el("h3", {}, title) : "",
        stats,
        this.note,
        this.trend.label,
        this.trend.canvas,
        el("div", { class: "chart-label" },
          `distribution${unit ? ` (${unit})` : ""}: raw reports (bars), estimate (line)`),
        this.histogram.canvas,
      ]);
    }

    update(block) {
      const b = block || {};
      const mean = b.mean || {};
      const ci = Array.isArray(mean.ci95) ? mean.ci95 : [];
      const q = b.quantiles || {};
      const f = this.fields;
      setText(f["mean-estimate"], fmt(mean.estimate));
      setText(f.stderr, fmt(mean.stderr));
      setText(f["ci-low"], fmt(ci[0]));
      setText(f["ci-high"], fmt(ci[1]));
      setText(f.method, mean.method || DASH);
      setText(f["mean-raw"], fmt(mean.raw));
      setText(f.median, fmt(q["0.5"]));
      setText(f.q05, fmt(q["0.05"]));
      setText(f.q95, fmt(q["0.95"]));
      setText(f["bias-bound"], fmt(mean.bias_bound));
      const histogram = b.histogram || {};
      setText(f["histogram-method"], histogram.method === "raw" ? "raw reports"
        : histogram.method ? `reconstruction, smoothing ${fmt(histogram.smoothing)}` : DASH);
      setText(this.note, mean.note || "");
      this.note.hidden = !mean.note;
      if (f["axis-count"]) setText(f["axis-count"], fmtCount(b.count));
      this.histogram.set(b.histogram, mean);
    }

    setHistory(points, info, pick) {
      this.trend.set(meanSamples(points, pick), info);
    }

    charts() {
      return [this.trend, this.histogram];
    }
  }

  // A linear channel whose wearers report under guarantees of their own (the API's
  // fleet_mean): the mean of all its wearers over the strata, each weighed by its
  // share of the wearers, and that mean per window.
  class FleetBlock {
    constructor(unit) {
      this.fields = {};
      const f = this.fields;
      const u = () => unitNode(unit);
      this.trend = new SeriesChart("fleet-trend", `mean of all wearers${unit ? ` (${unit})` : ""}`
        + " and 95% interval per window", unit);
      this.root = el("div", { class: "block", "data-block": "fleet" }, [
        el("h3", {}, "all wearers"),
        el("dl", { class: "stats" }, [
          wideTerm("fleet mean", value(f, "fleet-estimate", "main"), plusMinus("standard error"),
            value(f, "fleet-stderr"), u(), standardError()),
          wideTerm("95% CI", "[", value(f, "fleet-ci-low"), ", ", value(f, "fleet-ci-high"), "]",
            u()),
          term("bias bound", value(f, "fleet-bias-bound"), u()),
          wideTerm("guarantees", value(f, "fleet-strata")),
        ]),
        this.trend.label,
        this.trend.canvas,
      ]);
    }

    update(fleet) {
      const mean = (fleet && fleet.mean) || {};
      const ci = Array.isArray(mean.ci95) ? mean.ci95 : [];
      const f = this.fields;
      setText(f["fleet-estimate"], fmt(mean.estimate));
      setText(f["fleet-stderr"], fmt(mean.stderr));
      setText(f["fleet-ci-low"], fmt(ci[0]));
      setText(f["fleet-ci-high"], fmt(ci[1]));
      setText(f["fleet-bias-bound"], fmt(mean.bias_bound));
      setText(f["fleet-strata"], strataText(fleet && fleet.strata));
    }

    setHistory(points, info) {
      this.trend.set(meanSamples(points, (p) => p), info);
    }

    charts() {
      return [this.trend];
    }
  }

  // "ε 4: 6 wearers (75%); ε 1: 2 wearers (25%)": each stratum's weight in the mean.
  function strataText(strata) {
    if (!Array.isArray(strata) || !strata.length) return DASH;
    return strata.map((s) => `ε ${fmt(s.mechanism && s.mechanism.epsilon)}: `
      + `${fmtCount(s.agents)} wearer${s.agents === 1 ? "" : "s"} (${fmt(100 * s.weight, 3)}%)`)
      .join("; ");
  }

  class CircularBlock {
    constructor(name, title, period, unit) {
      this.fields = {};
      this.rose = new RoseChart(unit);
      this.period = period;
      // The degrees beside radians (also when an older collector names no unit).
      this.inDegrees = unit === "rad" || (!unit && isRadians(period));
      const trendTitle = `circular mean${unit ? ` (${unit})` : ""} and 95% interval per window, `
        + "unwrapped around the latest";
      this.trend = new SeriesChart("direction-trend", trendTitle, unit);
      const f = this.fields;
      const u = () => unitNode(unit);
      // Why the direction interval or the circular std is missing (text from the API).
      this.reason = el("p", { class: "caveat", "data-stat": "circular-reason", hidden: "" });
      this.root = el("div", { class: "block", "data-block": name }, [
        title ? el("h3", {}, title) : "",
        el("dl", { class: "stats" }, [
          wideTerm("circular mean", value(f, "circular-mean", "main"),
            plusMinus("half-width of the 95% interval"), value(f, "circular-half-width"), u(),
            halfWidth(), " ", value(f, "circular-mean-deg", "sub")),
          term("95% CI", "[", value(f, "direction-low"), ", ", value(f, "direction-high"), "]", u()),
          wideTerm("resultant length", value(f, "resultant-estimate", "main"),
            plusMinus("standard error"), value(f, "resultant-stderr"), standardError(), " ",
            el("span", { class: "sub" }, ["(raw ", value(f, "resultant-raw"), ")"])),
          term("95% CI", "[", value(f, "resultant-low"), ", ", value(f, "resultant-high"), "]"),
          term("circular std", value(f, "circular-std"), u()),
        ]),
        this.reason,
        this.trend.label,
        this.trend.canvas,
        el("div", { class: "chart-label" },
          "rose: raw reports (wedges), estimate (line), mean direction (arrow) and its 95% "
          + "interval (arc)"),
        this.rose.canvas,
      ]);
    }

    update(block) {
      const b = block || {};
      const length = b.resultant_length || {};
      const direction = b.direction || {};
      const dci = Array.isArray(direction.ci95) ? direction.ci95 : [];
      const rci = Array.isArray(length.ci95) ? length.ci95 : [];
      const half = direction.half_width;
      const f = this.fields;
      setText(f["circular-mean"], fmt(b.circular_mean));
      setText(f["circular-half-width"], fmt(half));
      setText(f["circular-mean-deg"], !this.inDegrees || !isNum(b.circular_mean) ? ""
        : isNum(half) ? `(${degrees(b.circular_mean)} ± ${degrees(half)})`
          : `(${degrees(b.circular_mean)})`);
      // The interval runs counter-clockwise from its first end to its second (through
      // the origin when the first is larger).
      setText(f["direction-low"], fmt(dci[0]));
      setText(f["direction-high"], fmt(dci[1]));
      setText(f["resultant-estimate"], fmt(length.estimate));
      setText(f["resultant-stderr"], fmt(length.stderr));
      setText(f["resultant-raw"], fmt(length.raw));
      setText(f["resultant-low"], fmt(rci[0]));
      setText(f["resultant-high"], fmt(rci[1]));
      setText(f["circular-std"], fmt(b.circular_std));
      // Said only once there are reports: "any direction" and why, or why no circular std.
      const reasons = isNum(b.circular_mean)
        ? [direction.reason, b.circular_std_reason].filter((r) => typeof r === "string" && r)
        : [];
      setText(this.reason, reasons.join("; "));
      this.reason.hidden = reasons.length === 0;
      this.rose.set(b);
    }

    setHistory(points, info, pick) {
      this.trend.set(directionSamples(points, pick, this.period), info);
    }

    charts() {
      return [this.trend, this.rose];
    }
  }
  // Frequencies of a categorical channel as horizontal bars, one per category:
  // length = consistent share (non-negative, summing to 1), whisker = 95%
  // interval of the unbiased share.  DOM, not canvas: labels come from the
  // network and are only ever text nodes, and each bar carries its tooltip.
  // The rows are built once; at most MAX_BARS, the largest shares, when there
  // are more categories.  `withTrend` (a collector that keeps windows): one
  // category's share over time too, the category chosen beside the chart (the
  // largest share at first, among the first MAX_CHOICES categories).
  class CategoricalBlock {
    constructor(name, labels, unit, withTrend = false) {
      this.labels = labels;
      this.fields = {};
      this.rows = [];
      this.trend = null;
      this.category = 0;
      this.chosen = false;     // by the first shares, or by the reader
      this.history = null;     // the last setHistory's (points, info)
      const f = this.fields;
      for (let i = 0; i < Math.min(labels.length, MAX_BARS); i++) {
        const row = {
          label: el("span", { class: "bar-label" }),
          bar: el("div", { class: "bar" }),
          whisker: el("div", { class: "whisker", hidden: "" }),
          share: el("span", { class: "bar-value" }, DASH),
        };
        row.root = el("div", { class: "bar-row" }, [
          row.label, el("div", { class: "bar-track" }, [row.bar, row.whisker]), row.share]);
        this.rows.push(row);
      }
      this.chart = el("div", { class: "bars", "data-chart": "bars" }, this.rows.map((r) => r.root));
      const capped = labels.length > MAX_BARS;
      this.root = el("div", { class: "block", "data-block": name }, [
        el("div", { class: "chart-label" }, [
          capped ? `top ${MAX_BARS} of ${fmtCount(labels.length)} categories by share; ` : "",
          "consistent share (bars), 95% interval of the unbiased share (whiskers); axis 0–",
          value(f, "bars-scale"),
          unit ? `; bin edges in ${unit}` : "",
        ]),
        this.chart,
      ]);
      if (withTrend) this.addTrend(name);
    }

    addTrend(name) {
      const choices = this.labels.slice(0, MAX_CHOICES);
      this.choice = el("select", { "data-control": "category" },
        choices.map((label, i) => el("option", { value: String(i) }, label)));
      this.choice.addEventListener("change", () => {
        this.chosen = true;
        this.choose(Number(this.choice.value));
      });
      const title = "share over time and 95% interval per window";
      this.trend = new SeriesChart("share-trend", title, "", { format: fmtShare, clamp: [0, 1],
        titleNodes: [el("label", {}, ["share of ", this.choice]),
          " (consistent share: line; 95% interval of the unbiased share: band) per window"] });
      this.root.append(this.trend.label, this.trend.canvas);
    }

    choose(i) {
      this.category = i;
      if (this.choice.value !== String(i)) this.choice.value = String(i);
      if (this.history) this.setHistory(...this.history);
      if (!document.hidden) this.trend.draw();
    }

    setHistory(points, info) {
      if (!this.trend) return;
      this.history = [points, info];
      this.trend.set(shareSamples(points, this.category), info);
    }

    update(block) {
      const freq = (block && block.frequencies) || {};
      const list = (key) => (Array.isArray(freq[key]) ? freq[key] : []);
      const shares = list("shares");
      const estimate = list("estimate");
      const stderr = list("stderr");
      const raw = list("raw");
      const ci = list("ci95").map((c) => (Array.isArray(c) ? c : []));
      const n = this.labels.length;
      let order = [...Array(n).keys()];
      if (n > MAX_BARS) {
        const key = (i) => (isNum(shares[i]) ? shares[i] : -1);
        order = order.sort((a, b) => key(b) - key(a) || a - b).slice(0, MAX_BARS);
      }
      // The axis: the largest share or interval end shown, rounded up to 10%
      // (0–100% with no data yet).
      let top = 0;
      for (const i of order) {
        for (const x of [shares[i], ci[i][1]]) if (isNum(x) && x > top) top = x;
      }
      const scale = top > 0 ? Math.min(Math.max(Math.ceil(top * 10 - 1e-9) / 10, 0.1), 1) : 1;
      setAttr(this.chart, "data-scale", String(scale));
      setText(this.fields["bars-scale"], `${Math.round(scale * 100)}%`);

      order.forEach((i, r) => {
        const row = this.rows[r];
        const label = this.labels[i];
        const share = shares[i];
        const [lo, hi] = ci[i];
        setAttr(row.root, "data-category", String(i));
        setText(row.label, label);
        setText(row.share, fmtShare(share));
        setPercent(row.bar, "width", isNum(share) ? (share / scale) * 100 : 0);
        const interval = isNum(lo) && isNum(hi);
        if (row.whisker.hidden === interval) row.whisker.hidden = !interval;
        if (interval) {
          setPercent(row.whisker, "left", (lo / scale) * 100);
          setPercent(row.whisker, "width", ((Math.min(hi, scale) - Math.max(lo, 0)) / scale) * 100);
        }
        setAttr(row.root, "title", isNum(share) || isNum(estimate[i])
          ? `${label}: share ${fmtShare(share)}\n` +
            `unbiased estimate ${fmt(estimate[i])} ± ${fmt(stderr[i])} (standard error)\n` +
            `95% interval [${fmt(lo)}, ${fmt(hi)}]\nraw reports ${fmtShare(raw[i])}`
          : `${label}: no data yet`);
      });
      // Over time: the largest share's category once there are shares (then it
      // stays, not to jump between close shares), unless the reader chose one.
      if (this.trend && !this.chosen) {
        let best = -1;
        for (let i = 0; i < Math.min(n, MAX_CHOICES); i++) {
          if (isNum(shares[i]) && (best < 0 || shares[i] > shares[best])) best = i;
        }
        if (best >= 0) {
          this.chosen = true;
          if (best !== this.category) this.choose(best);
        }
      }
    }

    charts() {
      return this.trend ? [this.trend] : [];
    }
  }

  // Category names, always as strings: the frequencies' own, else the
  // mechanism's, else numbers.
  function categoryLabels(ch) {
    const freq = ch.frequencies || {};
    const mech = ch.mechanism || {};
    let labels = Array.isArray(freq.labels) ? freq.labels : mech.labels;
    if (!Array.isArray(labels)) {
      const k = isNum(mech.categories) ? Math.min(Math.max(Math.floor(mech.categories), 0), 1e5) : 0;
      labels = [...Array(k).keys()];
    }
    return labels.map((x) => String(x));
  }

  const ORACLES = {
    grr: "generalized randomized response",
    oue: "optimized unary encoding",
    sue: "symmetric unary encoding",
    olh: "optimized local hashing",
  };

  // The period of a circular block: from its histogram (the truth of what is
  // drawn), else the mechanism's, else a full turn in radians.
  function periodOf(block, mechanism) {
    const edges = block && block.histogram && block.histogram.edges;
    if (Array.isArray(edges) && edges.length > 1 && isNum(edges[edges.length - 1] - edges[0])) {
      return edges[edges.length - 1] - edges[0];
    }
    return mechanism && isNum(mechanism.period) ? mechanism.period : TAU;
  }

  // ---- channel histories ------------------------------------------------------

  const validPoint = (p) => p && typeof p === "object" && isNum(p.start) && isNum(p.end);

  // A channel's windowed estimates, oldest first: the server's history, extended
  // with the `window` of every event (same start: the window under way, replaced;
  // a later start: appended).  The server keeps its most recent `windows_kept`
  // windows (the history says how many): so does the page, without asking again.
  // At most MAX_POINTS in any case.
  class History {
    constructor(name) {
      this.url = `api/channels/${encodeURIComponent(name)}/history`;
      this.points = [];
      this.windowSeconds = null;
      this.kept = null;        // windows the server keeps (its history's length at most)
      this.error = "";
      this.loading = null;     // the fetch under way (a promise)
      this.onChange = () => {};
      this.followers = [];     // histories read from the same document (FleetHistory)
    }

    info() {
      return { windowSeconds: this.windowSeconds, loading: this.loading !== null,
        error: this.error, range: null };
    }

    load() {
      if (this.loading) return this.loading;
      this.loading = getJSON(this.url)
        .then((doc) => this.merge(doc), (err) => this.failed(err))
        .finally(() => {
          this.loading = null;
          this.onChange();
        });
      return this.loading;
    }

    merge(doc) {
      const served = (doc && Array.isArray(doc.points) ? doc.points : []).filter(validPoint);
      if (doc && isNum(doc.window_seconds) && doc.window_seconds > 0) {
        this.windowSeconds = doc.window_seconds;
      }
      this.kept = doc && Number.isInteger(doc.windows_kept) && doc.windows_kept > 0
        ? doc.windows_kept : null;
      const lastStart = served.length ? served[served.length - 1].start : -Infinity;
      this.points = served.concat(this.points.filter((p) => p.start > lastStart));
      this.error = "";
      this.trim();
      for (const follower of this.followers) follower.merge(doc);
    }

    failed(err) {
      this.error = `history unavailable: ${err && err.message ? err.message : err}`;
    }

    extend(point) {
      if (!validPoint(point)) return;
      const pts = this.points;
      const last = pts[pts.length - 1];
      if (last && Math.abs(point.start - last.start) <= EPS) pts[pts.length - 1] = point;
      else if (!last || point.start > last.start) pts.push(point);
      else return;  // older than the latest: already superseded
      this.trim();
    }

    trim() {
      // The server keeps its most recent `kept` windows: so does the page.
      const pts = this.points;
      const most = Math.min(this.kept || MAX_POINTS, MAX_POINTS);
      if (pts.length > most) pts.splice(0, pts.length - most);
    }
  }

  // The fleet's mean per window over a channel's strata: the history's fleet_points
  // (a follower of the channel's History: one fetch), extended with every event's
  // fleet_window.
  class FleetHistory extends History {
    merge(doc) {
      super.merge({ ...(doc || {}), points: doc && doc.fleet_points });
    }
  }

  // At most QUERIES_AT_ONCE results store queries in flight (the server answers
  // 503 beyond a few at once): the others wait their turn.
  const queryQueue = { running: 0, waiting: [] };
  function limited(task) {
    return new Promise((resolve, reject) => {
      const run = () => {
        queryQueue.running += 1;
        Promise.resolve().then(task).then(resolve, reject).finally(() => {
          queryQueue.running -= 1;
          const next = queryQueue.waiting.shift();
          if (next) next();
        });
      };
      if (queryQueue.running < QUERIES_AT_ONCE) run();
      else queryQueue.waiting.push(run);
    });
  }

  const STALE = {};  // a query's answer that another query has replaced meanwhile

  // A channel's windows at one resolution over a time range, from the results
  // store (GET .../history?resolution=&start=&end=).  `key` names the view asked
  // for: a new one clears what was shown (state "loading"), the same one asked
  // again (a refresh) keeps it until the answer.  An answer to an older request
  // than the latest is dropped.  A failed query shows no points, and the server's
  // message as `error`.
  class RangeQuery {
    constructor(name) {
      this.url = `api/channels/${encodeURIComponent(name)}/history`;
      this.key = null;
      this.doc = null;
      this.points = [];
      this.error = "";
      this.state = "idle";     // "loading" (nothing for the key yet), "ready" or "error"
      this.generation = 0;
      this.onChange = () => {};
    }

    info() {
      const doc = this.doc || {};
      return { windowSeconds: isNum(doc.window_seconds) ? doc.window_seconds : null,
        loading: this.state === "loading", error: this.error,
        resolution: typeof doc.resolution === "string" ? doc.resolution : "",
        range: isNum(doc.start) && isNum(doc.end) ? [doc.start, doc.end] : null };
    }

    load(params, key) {
      const generation = ++this.generation;
      if (key !== this.key) {
        this.key = key;
        this.doc = null;
        this.points = [];
        this.error = "";
        this.state = "loading";
      }
      const url = `${this.url}?${params}`;
      return limited(() => (generation === this.generation ? getJSON(url) : STALE))
        .then((doc) => {
          if (doc === STALE || generation !== this.generation) return;
          this.doc = doc && typeof doc === "object" ? doc : {};
          const points = Array.isArray(this.doc.points) ? this.doc.points.filter(validPoint) : [];
          this.points = points.slice(-MAX_POINTS);
          this.error = "";
          this.state = "ready";
        }, (err) => {
          if (generation !== this.generation) return;
          this.doc = null;
          this.points = [];
          this.error = `history query failed: ${err && err.message ? err.message : err}`;
          this.state = "error";
        })
        .finally(() => {
          if (generation === this.generation) this.onChange();
        });
    }

    // Back to the live view: an answer still on its way is dropped, and the next
    // query starts afresh.
    cancel() {
      this.generation += 1;
      this.key = null;
    }
  }

  // ---- channel cards ----------------------------------------------------------

  // Cards are rebuilt only when this changes (kind, mechanism, units, a vector's
  // axes, or a categorical channel's labels): a new series, with its own history.
  function signature(ch) {
    const axes = ch.kind === "vector" && ch.axes ? Object.keys(ch.axes).join(",") : "";
    const labels = ch.kind === "categorical" ? JSON.stringify(categoryLabels(ch)) : "";
    return JSON.stringify([ch.kind, ch.mechanism || null, unitOf(ch.unit), unitOf(ch.angle_unit),
      axes, labels, ch.kind === "linear" && Boolean(ch.fleet_mean)]);
  }

  class Card {
    constructor(name, ch) {
      this.signature = signature(ch);
      this.fields = {};
      this.blocks = [];  // {block, pick(channel) -> its statistics, point(history point) -> its}
      this.removed = false;
      const f = this.fields;
      const meta = el("dl", { class: "meta" }, [
        term(ch.kind === "categorical" ? "oracle" : "mechanism", value(f, "mechanism")),
        term("ε", value(f, "epsilon"), value(f, "delta")),
        term("count", value(f, "count")),
        term("messages", value(f, "messages")),
        term("agents", value(f, "agents")),
      ]);
      const attrs = { class: "card", "data-channel": name, "data-kind": String(ch.kind) };
      this.root = el("section", attrs, [
        el("header", { class: "card-head" }, [el("h2", {}, name), value(f, "kind", "badge")]),
        meta,
      ]);
      // Why the charts over time show nothing: the server's message.
      f["history-error"] = el("p", { class: "history-error", "data-stat": "history-error",
        role: "status", hidden: "" });
      this.root.append(f["history-error"]);
      this.addBlocks(ch, meta);
      // Wearers under guarantees of their own: the mean of them all first.
      this.fleet = ch.kind === "linear" && ch.fleet_mean ? new FleetBlock(unitOf(ch.unit)) : null;
      if (this.fleet) meta.after(this.fleet.root);
      f["other-series"] = el("p", { class: "other", "data-stat": "other-series" });
      this.root.append(f["other-series"]);
      this.resolutions = resolutionsOf(ch);
      this.mode = "live";  // what the charts over time show: "live", or "query" (the store's)
      this.history = new History(name);
      this.query = new RangeQuery(name);
      const changed = () => {
        if (this.removed) return;
        this.showHistory();
        if (!document.hidden) this.draw();
      };
      this.history.onChange = changed;
      this.query.onChange = changed;
      if (this.fleet) {
        this.fleetHistory = new FleetHistory(name);
        this.history.followers.push(this.fleetHistory);
        this.fleetQuery = new RangeQuery(name);
        this.fleetQuery.onChange = changed;
      }
      // Channels with charts over time draw the past from the server's history (the
      // live view's, or the results store's at the view's resolution and range).
      this.charted = this.blocks.some((b) => b.point);
      this.historyLoaded = this.follow();
    }

    // Shows the page's view (the controls): the live history, or a query of the
    // results store (asked again when called again: the periodic refresh).  The
    // live history is asked again on the way back to it (the page kept extending
    // it meanwhile, but windows may have closed since).
    follow() {
      if (!this.charted) return Promise.resolve();
      const live = viewIsLive(this.resolutions);
      const was = this.mode;
      this.mode = live ? "live" : "query";
      const loading = [];
      if (live) {
        this.query.cancel();
        if (this.fleet) this.fleetQuery.cancel();
        if (was !== "live" || !this.history.points.length
          || (this.fleet && !this.fleetHistory.points.length)) {
          loading.push(this.history.load());
        }
      } else {
        const params = queryParams(this.resolutions);
        loading.push(this.query.load(params, viewKey()));
        if (this.fleet) {
          const fleet = new URLSearchParams(params);
          fleet.set("series", "fleet");
          loading.push(this.fleetQuery.load(fleet, viewKey()));
        }
      }
      this.showHistory();
      return Promise.all(loading);
    }

    addBlocks(ch, meta) {
      const f = this.fields;
      const add = (block, pick, point = null) => {
        this.blocks.push({ block, pick, point });
        this.root.append(block.root);
      };
      const mech = ch.mechanism;
      const unit = unitOf(ch.unit);
      switch (ch.kind) {
        case "linear":
          add(new LinearBlock("value", "", { unit }), (c) => c, (p) => p);
          break;
        case "circular":
          add(new CircularBlock("value", "", periodOf(ch, mech), unit), (c) => c, (p) => p);
          break;
        case "polar": {
          const angleUnit = unitOf(ch.angle_unit);
          add(new LinearBlock("radius", "radius", { unit }), (c) => c.radius, (p) => p.radius);
          add(new CircularBlock("angle", "angle", periodOf(ch.angle, mech), angleUnit),
            (c) => c.angle, (p) => p.angle);
          const vec = el("div", { class: "block", "data-block": "mean-vector" }, [
            el("h3", {}, "mean vector"),
            el("dl", { class: "stats" }, [
              term("x", value(f, "mean-vector-x"), unitNode(unit)),
              term("y", value(f, "mean-vector-y"), unitNode(unit)),
              term("magnitude", value(f, "mean-vector-magnitude"), unitNode(unit)),
              term("direction", value(f, "mean-vector-direction"), unitNode(angleUnit)),
            ]),
          ]);
          this.root.append(vec);
          break;
        }
        case "categorical": {
          const labels = categoryLabels(ch);
          meta.append(term("categories", value(f, "categories")));
          setText(f.categories, fmtCount(labels.length));
          // Shares over time where the collector keeps windows (its entries carry the
          // latest, or the resolutions it keeps).
          const windowed = "window" in ch || Array.isArray(ch.resolutions);
          add(new CategoricalBlock("frequencies", labels, unit, windowed), (c) => c,
            windowed ? (p) => p : null);
          break;
        }
        case "vector":
          meta.append(term("strategy", value(f, "strategy")));
          for (const axis of Object.keys(ch.axes || {})) {
            add(new LinearBlock(axis, axis, { withCount: true, unit }),
              (c) => (c.axes || {})[axis], (p) => (p.axes || {})[axis]);
          }
          break;
        default:
          this.root.append(el("p", { class: "other" },
            `kind "${ch.kind}" is not shown by this dashboard`));
      }
    }

    update(ch) {
      const f = this.fields;
      const mech = ch.mechanism || {};
      setText(f.kind, String(ch.kind));
      setText(f.mechanism, mech.name || DASH);
      if (ch.kind === "categorical") setAttr(f.mechanism, "title", ORACLES[mech.name] || "");
      setText(f.epsilon, fmt(mech.epsilon));
      setText(f.delta, isNum(mech.delta) && mech.delta > 0 ? `, δ ${fmt(mech.delta)}` : "");
      setText(f.count, fmtCount(ch.count));
      setText(f.messages, fmtCount(ch.messages));
      setText(f.agents, fmtCount(ch.agents));
      if (f.strategy) {
        const s = ch.strategy || {};
        setText(f.strategy,
          `${fmtCount(s.k)} of ${fmtCount(s.d)} axes, ε ${fmt(s.epsilon)} per reading`);
      }
      if (f["mean-vector-x"]) {
        const v = ch.mean_vector || {};
        setText(f["mean-vector-x"], fmt(v.x));
        setText(f["mean-vector-y"], fmt(v.y));
        setText(f["mean-vector-magnitude"], fmt(v.magnitude));
        setText(f["mean-vector-direction"], fmt(v.direction));
      }
      setText(f["other-series"], otherSeries(ch));
      this.resolutions = resolutionsOf(ch);
      for (const { block, pick } of this.blocks) block.update(pick(ch));
      // The live history follows every event, also while a query is shown (it is
      // shown again on the way back); a query's points change only with its answers.
      if (ch.window) this.history.extend(ch.window);
      if (this.fleet) {
        this.fleet.update(ch.fleet_mean);
        if (ch.fleet_window) this.fleetHistory.extend(ch.fleet_window);
      }
      if (this.mode === "live") this.showHistory();
    }

    showHistory() {
      if (!this.charted) return;
      const live = this.mode === "live";
      const source = live ? this.history : this.query;
      const points = source.points;
      const info = source.info();
      for (const { block, point } of this.blocks) {
        if (point) block.setHistory(points, info, point);
      }
      if (this.fleet) {
        const fleet = live ? this.fleetHistory : this.fleetQuery;
        this.fleet.setHistory(fleet.points, fleet.info());
      }
      const state = live ? (this.history.error ? "error" : "live") : this.query.state;
      setAttr(this.root, "data-history", state);
      setAttr(this.root, "data-mode", this.mode);
      const error = this.fields["history-error"];
      setText(error, source.error || "");
      if (error.hidden !== !source.error) error.hidden = !source.error;
    }

    remove() {
      this.removed = true;
      this.root.remove();
    }

    draw() {
      for (const { block } of this.blocks) for (const chart of block.charts()) chart.draw();
      if (this.fleet) for (const chart of this.fleet.charts()) chart.draw();
    }
  }

  function otherSeries(ch) {
    const list = ch.other_series;
    if (!Array.isArray(list) || !list.length) return "";
    const parts = list.map(
      (s) => `ε ${fmt(s.mechanism && s.mechanism.epsilon)}: ${fmtCount(s.count)} values`);
    if (ch.kind === "linear" && ch.fleet_mean) {
      return `The statistics after “all wearers” are of the series with the most wearers; `
        + `the others, in “all wearers” too: ${parts.join("; ")}`;
    }
    return `Earlier series with other mechanism parameters (kept apart): ${parts.join("; ")}`;
  }

  // ---- the view: resolution and time range of the charts over time ---------------

  // resolution: "" (each channel's finest) or a resolution's name; range: "live",
  // a key of RANGES or "custom" (from .. to, Unix seconds).
  const view = { resolution: "", range: "live", from: null, to: null };
  let latestT = null;        // the collector's time as of the latest document
  let refreshTimer = 0;
  let refreshDue = false;    // a refresh came while the tab was hidden: done when shown
  const controls = {};

  // A channel's resolutions, finest first (none from an older collector).
  function resolutionsOf(ch) {
    return Array.isArray(ch.resolutions)
      ? ch.resolutions.filter((r) => typeof r === "string" && r) : [];
  }

  // The live view: the finest resolution (a channel's first), no range.  A channel
  // from a collector without resolutions has only that.
  function viewIsLive(resolutions) {
    return !resolutions.length
      || (view.range === "live" && (!view.resolution || view.resolution === resolutions[0]));
  }

  const viewKey = () => JSON.stringify([view.resolution, view.range, view.from, view.to]);
  const collectorNow = () => (isNum(latestT) ? latestT : Date.now() / 1000);

  // The query of the view for a channel: its resolution, and a range ending at the
  // collector's latest time ("live" at a coarser resolution: the server's recent
  // windows).
  function queryParams(resolutions) {
    const params = new URLSearchParams();
    params.set("resolution", view.resolution || resolutions[0]);
    if (view.range in RANGES) {
      const end = collectorNow();
      params.set("start", String(Math.max(0, end - RANGES[view.range])));
      params.set("end", String(end));
    } else if (view.range === "custom") {
      params.set("start", String(view.from));
      params.set("end", String(view.to));
    }
    return params;
  }

  // Whether the view's windows may still change: its range reaches the present.
  function viewReachesNow() {
    if (view.range !== "custom") return true;
    const span = durationSeconds(view.resolution) || 0;
    return isNum(view.to) && view.to >= collectorNow() - span;
  }

  // The view as URL parameters (none for the live view).
  function viewParams() {
    const params = new URLSearchParams();
    if (view.resolution) params.set("resolution", view.resolution);
    if (view.range !== "live") params.set("range", view.range);
    if (view.range === "custom") {
      if (isNum(view.from)) params.set("from", String(view.from));
      if (isNum(view.to)) params.set("to", String(view.to));
    }
    return params;
  }

  function readViewFromURL() {
    const params = new URLSearchParams(window.location.search);
    const resolution = params.get("resolution");
    if (resolution && Number.isFinite(durationSeconds(resolution))) view.resolution = resolution;
    const range = params.get("range");
    if (range === "custom") {
      const from = Number(params.get("from"));
      const to = Number(params.get("to"));
      if (params.get("from") !== null && params.get("to") !== null
          && Number.isFinite(from) && Number.isFinite(to)) {
        Object.assign(view, { range, from, to });
      }
    } else if (range in RANGES) {
      view.range = range;
    }
  }

  function initControls() {
    const root = qs("#view");
    if (!root) return;
    const control = (name) => root.querySelector(`[data-control="${name}"]`);
    Object.assign(controls, { root, resolution: control("resolution"), range: control("range"),
      custom: control("custom"), from: control("from"), to: control("to"),
      state: root.querySelector('[data-stat="view"]'), names: "" });
    controls.range.value = view.range;
    if (view.range === "custom") {
      controls.from.value = toLocalInput(view.from);
      controls.to.value = toLocalInput(view.to);
    }
    controls.resolution.addEventListener("change", () => {
      view.resolution = controls.resolution.selectedIndex <= 0 ? "" : controls.resolution.value;
      applyView();
    });
    controls.range.addEventListener("change", () => {
      view.range = controls.range.value;
      if (view.range === "custom") {
        // From a day before the collector's time to it (to the minute), to edit.
        if (!controls.to.value) controls.to.value = toLocalInput(Math.ceil(collectorNow() / 60) * 60);
        if (!controls.from.value) {
          controls.from.value = toLocalInput(fromLocalInput(controls.to.value) - 86400);
        }
        readCustom();
      }
      applyView();
    });
    for (const input of [controls.from, controls.to]) {
      input.addEventListener("change", () => {
        readCustom();
        applyView();
      });
    }
    syncControls();
  }

  function readCustom() {
    view.from = fromLocalInput(controls.from.value);
    view.to = fromLocalInput(controls.to.value);
  }

  // The resolution options: every channel's, finest first (the first stands for each
  // channel's finest, the live view's).  The controls show once a channel has any.
  function updateResolutions() {
    if (!controls.root) return;
    const found = new Set();
    for (const card of cards.values()) for (const r of card.resolutions) found.add(r);
    if (view.resolution) found.add(view.resolution);  // from the URL: the server judges it
    const names = [...found].sort((a, b) => durationSeconds(a) - durationSeconds(b));
    const key = names.join(",");
    if (key !== controls.names) {
      controls.names = key;
      controls.resolution.replaceChildren(...names.map((name, i) => el("option", { value: name },
        i === 0 ? `${name} (finest)` : name)));
      syncControls();
    }
    const hidden = names.length === 0;
    if (controls.root.hidden !== hidden) controls.root.hidden = hidden;
  }

  // The controls, the URL and the view link say what the view is.
  function syncControls() {
    if (!controls.root) return;
    const select = controls.resolution;
    if (view.resolution) select.value = view.resolution;
    else if (select.options.length) select.selectedIndex = 0;
    if (controls.range.value !== view.range) controls.range.value = view.range;
    const custom = view.range === "custom";
    if (controls.custom.hidden === custom) controls.custom.hidden = !custom;
    const backwards = custom && isNum(view.from) && isNum(view.to) && view.from >= view.to;
    setAttr(controls.to, "aria-invalid", backwards ? "true" : "false");
    const resolution = view.resolution || (select.options.length ? select.options[0].value : "");
    const live = view.range === "live" && (!view.resolution || select.selectedIndex === 0);
    let text;
    if (live) {
      text = "live: each channel's recent windows, extended as they come";
    } else {
      const range = custom ? `${fmtMinute(view.from)} to ${fmtMinute(view.to)}`
        : view.range === "live" ? "the most recent" : RANGE_WORDS[view.range];
      text = `${resolution} windows, ${range}`
        + (STATIC || !viewReachesNow() ? "" : `, asked again every ${REFRESH_MS / 1000} s`);
    }
    setText(controls.state, text);
    setAttr(controls.root, "data-live", String(live));
    const own = viewParams().toString();
    if (!STATIC) {
      const url = own ? `?${own}` : window.location.pathname;
      if (window.location.search !== (own ? `?${own}` : "")) window.history.replaceState(null, "", url);
    }
    viewLink(own);
  }

  // A new view: every card follows it; a query is asked again every REFRESH_MS while
  // its range reaches the present (not in the static view).
  function applyView() {
    if (view.range === "custom" && !(isNum(view.from) && isNum(view.to))) {
      setText(controls.state, "custom range: choose both from and to");
      return;
    }
    syncControls();
    refreshDue = false;
    for (const card of cards.values()) card.follow();
    if (!document.hidden) drawAll();
    scheduleRefresh();
  }

  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = 0;
    const querying = [...cards.values()].some((card) => card.mode === "query");
    if (STATIC || !querying || !viewReachesNow()) return;
    refreshTimer = setTimeout(refresh, REFRESH_MS);
  }

  function refresh() {
    refreshTimer = 0;
    if (document.hidden) {  // a background tab asks nothing; it does when shown again
      refreshDue = true;
      return;
    }
    for (const card of cards.values()) if (card.mode === "query") card.follow();
    scheduleRefresh();
  }

  // ---- applying a document --------------------------------------------------------

  const cards = new Map();
  let updates = 0;

  function apply(doc) {
    if (!doc || typeof doc !== "object" || typeof doc.channels !== "object" || !doc.channels) return;
    renderHeader(doc);
    renderRange(doc.range, doc.channels);
    if (isNum(doc.t)) latestT = doc.t;
    renderChannels(doc);
    updateResolutions();
    // New cards of a view from the URL, or the first query card: the refresh starts.
    if (!refreshTimer && !refreshDue) scheduleRefresh();
    updates += 1;
    document.body.dataset.updated = String(updates);
  }
  const rejectNodes = new Map();

  // "10m" -> "10 minutes", "1d" -> "day" (the agents' [privacy] guarantees' own words).
  const PERIOD_WORDS = { s: "second", m: "minute", h: "hour", d: "day", w: "week" };
  function periodWords(per) {
    const match = /^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$/.exec(String(per));
    if (!match) return String(per);
    const n = Number(match[1]), unit = PERIOD_WORDS[match[2]];
    return n === 1 ? unit : `${n} ${unit}s`;
  }

  // What the online agents promise every wearer, as their statuses state it: the most
  // common set of guarantees, and how many agents state another one.
  function promiseText(fleet) {
    const promises = fleet && Array.isArray(fleet.promises) ? fleet.promises : [];
    if (!promises.length) return DASH;
    const words = promises[0].guarantees.map((g) =>
      `any ${periodWords(g.per)}: ε ≤ ${fmt(g.epsilon)}` + (g.delta ? `, δ ≤ ${g.delta}` : ""));
    const differ = promises.slice(1).reduce((n, p) => n + p.agents, fleet.others || 0);
    return words.join("; ") + (differ ? ` (${fmtCount(differ)} agents state another)` : "");
  }

  function renderHeader(doc) {
    const ingest = doc.ingest || {};
    setText(headerStat("promise"), promiseText(doc.guarantees));
    setText(headerStat("fleet"), doc.fleet || DASH);
    setText(headerStat("agents-online"), fmtCount(doc.agents_online));
    setText(headerStat("agents-total"), fmtCount(doc.agents ? Object.keys(doc.agents).length : null));
    setText(headerStat("messages"), fmtCount(ingest.messages));
    setText(headerStat("values"), fmtCount(ingest.values));
    setText(headerStat("duplicates"), fmtCount(ingest.duplicates));
    setText(headerStat("updated-at"), fmtTime(doc.t));
    renderBroker(doc.broker);

    const rejects = ingest.rejects && typeof ingest.rejects === "object" ? ingest.rejects : {};
    const box = headerStat("rejects");
    let total = 0;
    for (const [reason, n] of Object.entries(rejects)) {
      if (isNum(n)) total += n;
      let node = rejectNodes.get(reason);
      if (!node) {
        node = el("span", { "data-reject": reason });
        rejectNodes.set(reason, node);
        box.append(node);
      }
      setText(node, `${reason} ${fmtCount(n)}`);
    }
    for (const [reason, node] of rejectNodes) {
      if (!(reason in rejects)) {
        node.remove();
        rejectNodes.delete(reason);
      }
    }
    setText(headerStat("rejects-total"), fmtCount(total));
  }

  // Latest private min/max per channel (GET /api/range; also in every document).
  // A result shows its estimate with the search's own error bound and the interval
  // that holds the true min (max), in the channel's unit; an insufficient one shows
  // why, not its numbers.
  function rangeCell(result, unit) {
    if (!result || typeof result !== "object") return DASH;
    const stat = (key, text) => el("span", { "data-range-stat": key }, text);
    if (result.status !== "done") {
      return el("span", { class: "range-insufficient", "data-status": result.status || "unknown" }, [
        stat("status", result.status || DASH), ": ",
        stat("reason", result.reason || "no reason given"),
      ]);
    }
    const p = result.parameters || {};
    const about = ` (${fmtCount(result.participants)} agents, ${p.strategy || DASH}, ` +
      `ε ${fmt(p.epsilon, 3)}, ${fmtCount(result.rounds)} rounds, ${fmtTime(result.finished_at)})`;
    const interval = Array.isArray(result.interval) && result.interval.length === 2 ? result.interval : null;
    if (!isNum(result.error_bound) || !interval) {  // from a coordinator older than error bounds
      return el("span", { "data-status": "done" }, [
        stat("estimate", fmt(result.estimate)), unitNode(unit), " ",
        el("span", { class: "caveat", "data-range-stat": "no-bound" }, "(no error bound: an older coordinator)"),
        about,
      ]);
    }
    const level = isNum(result.confidence) ? `${Math.round(result.confidence * 100)}%` : DASH;
    return el("span", { "data-status": "done" }, [
      stat("estimate", fmt(result.estimate)), plusMinus("the search's error bound"),
      stat("bound", fmt(result.error_bound)), unitNode(unit),
      ` (${level} in [`, stat("interval-low", fmt(interval[0])), ", ",
      stat("interval-high", fmt(interval[1])), "]", unitNode(unit), ")", about,
    ]);
  }

  function renderRange(range, channels) {
    const section = qs("#range");
    const names = range && typeof range === "object" ? Object.keys(range).sort() : [];
    section.hidden = names.length === 0;
    const body = section.querySelector("tbody");
    const rows = names.map((name) => el("tr", { "data-range": name }, [
      el("td", {}, [name]),
      el("td", { "data-side": "min" }, [rangeCell(range[name].min, unitOf((channels[name] || {}).unit))]),
      el("td", { "data-side": "max" }, [rangeCell(range[name].max, unitOf((channels[name] || {}).unit))]),
    ]));
    body.replaceChildren(...rows);
  }

  // Whether the collector holds its MQTT subscriptions (reports queue at the
  // broker meanwhile, so the numbers may lag).
  function renderBroker(broker) {
    const node = headerStat("broker");
    const connected = broker && typeof broker.connected === "boolean" ? broker.connected : null;
    const state = connected === null ? "unknown" : connected ? "connected" : "disconnected";
    if (node.dataset.state !== state) node.dataset.state = state;
    const since = broker && isNum(broker.since) ? ` since ${fmtTime(broker.since)}` : "";
    setText(node, connected === null ? DASH : state + (connected ? "" : since));
  }

  function renderChannels(doc) {
    const container = qs("#channels");
    const names = Object.keys(doc.channels);
    let reorder = false;
    for (const name of names) {
      const ch = doc.channels[name] || {};
      let card = cards.get(name);
      if (!card || card.signature !== signature(ch)) {
        if (card) card.remove();
        card = new Card(name, ch);
        cards.set(name, card);
        reorder = true;
      }
      card.update(ch);
    }
    for (const [name, card] of cards) {
      if (!(name in doc.channels)) {
        card.remove();
        cards.delete(name);
      }
    }
    // Appending an attached node moves it: this puts cards in document order.
    if (reorder) for (const name of names) container.append(cards.get(name).root);
    qs("#empty").hidden = names.length > 0;
    // A background tab keeps its numbers and history current but skips the
    // drawing; it redraws when shown again.
    if (!document.hidden) drawAll();
  }

  function drawAll() {
    for (const card of cards.values()) card.draw();
  }

  // Resizes redraw at most once per frame.
  let redrawPending = false;
  function scheduleRedraw() {
    if (redrawPending) return;
    redrawPending = true;
    requestAnimationFrame(() => {
      redrawPending = false;
      drawAll();
    });
  }

  // ---- transport: event stream, else polling -------------------------------------

  const link = { stream: null, pollGeneration: 0, pollTimer: 0, retryTimer: 0 };

  function setConnection(state, text) {
    const node = headerStat("connection");
    if (node.dataset.state !== state) node.dataset.state = state;
    setText(node, text);
  }

  function applyText(text) {
    let doc;
    try {
      doc = JSON.parse(text);
    } catch (err) {
      console.warn("collector sent invalid JSON", err);
      setConnection("error", "invalid data from the collector");
      return;
    }
    apply(doc);
  }

  function startStream() {
    clearTimeout(link.retryTimer);
    if (typeof EventSource !== "function") {
      startPolling();
      return;
    }
    const stream = new EventSource("api/events");
    link.stream = stream;
    stream.addEventListener("channels", (ev) => {
      stopPolling();
      setConnection("live", "live");
      applyText(ev.data);
    });
    stream.addEventListener("source-error", () => setConnection("error", "collector error"));
    stream.onerror = () => {
      // EventSource would retry on its own, but a proxy that breaks streams
      // would leave the page frozen: poll, and try the stream again later.
      stream.close();
      if (link.stream === stream) link.stream = null;
      startPolling();
      link.retryTimer = setTimeout(startStream, STREAM_RETRY_MS);
    };
  }

  function startPolling() {
    stopPolling();
    const generation = ++link.pollGeneration;
    setConnection("polling", "polling");
    poll(generation);
  }

  function stopPolling() {
    link.pollGeneration += 1;  // an answer still on its way is ignored
    clearTimeout(link.pollTimer);
  }

  async function poll(generation) {
    try {
      const response = await fetch("api/channels", { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const text = await response.text();
      if (generation !== link.pollGeneration) return;
      applyText(text);
      setConnection("polling", `polling every ${POLL_MS / 1000} s`);
    } catch (err) {
      if (generation !== link.pollGeneration) return;
      setConnection("offline", "collector unreachable, retrying");
    }
    if (generation === link.pollGeneration) {
      link.pollTimer = setTimeout(() => poll(generation), POLL_MS);
    }
  }

  // ---- the static view (?static=1) -------------------------------------------------

  // The document and every channel's history, fetched once: no event stream, no
  // polling, no timer left behind (a headless browser's virtual time runs out and
  // its screenshot is taken).  <html data-state> ends "ready" or "error".
  async function staticView() {
    const root = document.documentElement;
    root.dataset.state = "loading";
    setConnection("static", "static view: loading…");
    let doc;
    try {
      doc = await getJSON("api/channels");
    } catch (err) {
      const message = `could not load the collector's data (api/channels): ${err.message}`;
      setConnection("error", message);
      const empty = qs("#empty");
      setText(empty, message);
      empty.hidden = false;
      empty.dataset.state = "error";
      root.dataset.state = "error";
      return;
    }
    apply(doc);
    if (!doc || typeof doc.channels !== "object" || !doc.channels) {
      setConnection("error", "the collector's answer is not a channels document");
      root.dataset.state = "error";
      return;
    }
    // Each card fetched its history when it was made; a failed one says so on its charts.
    await Promise.all([...cards.values()].map((card) => card.historyLoaded));
    if (!cards.size) setText(qs("#empty"), "No channels yet.");
    drawAll();
    setConnection("static", `static view as of ${fmtDateTime(doc.t)}`);
    root.dataset.state = "ready";
  }

  // The footer's link to the other view (relative: works under a proxy's sub-path),
  // with the view's resolution and range (`own`: as URL parameters).
  function viewLink(own = "") {
    const link = qs('[data-link="view"]');
    if (!link) return;
    const href = STATIC ? (own ? `?${own}` : ".") : `?static=1${own ? `&${own}` : ""}`;
    setAttr(link, "href", href);
    setText(link, STATIC ? "live view" : "static view (for printing)");
  }

  // ---- start ------------------------------------------------------------------------

  function init() {
    readTheme();
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
      readTheme();
      scheduleRedraw();
    });
    window.addEventListener("resize", scheduleRedraw);
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) return;
      scheduleRedraw();
      if (refreshDue) {
        refreshDue = false;
        refresh();
      }
    });
    // Column widths also change without a window resize (a scrollbar appears).
    if (typeof ResizeObserver === "function") new ResizeObserver(scheduleRedraw).observe(qs("#channels"));
    readViewFromURL();
    viewLink(viewParams().toString());
    initControls();
    if (STATIC) staticView();
    else startStream();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
