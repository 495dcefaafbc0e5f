// The sagegate dashboard: polls the same-origin feed /admin/dashboard and draws it with plain SVG.
// No build step and no library; window.sagegateDashboard.refresh() redraws now (the browser test uses it).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#3b82f6", "#e4572e", "#2a9d5b", "#9b59b6", "#f39c12", "#16a085", "#7f8c8d"];
const params = new URLSearchParams(location.search);
const INTERVAL_MS = Math.max(250, Number(params.get("interval_ms")) || 1000);

function fmt(v, digits = 0) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number(v).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function el(tag, attrs = {}, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function cell(field, text, cls = "num") {
  return el("td", { "data-field": field, class: cls }, text);
}

function kvBar(b) {
  const svg = el("svg:svg", { class: "kvbar", viewBox: "0 0 160 14", "data-field": "kv_bar" });
  const cap = b.capacity_tokens || 1;
  const x = (v) => Math.max(0, Math.min(160, (160 * v) / cap));
  svg.append(el("svg:rect", { x: 0, y: 2, width: 160, height: 10, fill: "#eef1f7" }));
  if (b.kv_used_tokens !== null && b.kv_used_tokens !== undefined) {
    svg.append(el("svg:rect", { x: 0, y: 2, width: x(b.kv_used_tokens), height: 10, fill: "var(--kv)" }));
  }
  svg.append(el("svg:rect", { x: x(b.projected_peak_tokens) - 1, y: 0, width: 2, height: 14, fill: "var(--peak)" }));
  svg.append(el("svg:line", { x1: x(b.limit_tokens), x2: x(b.limit_tokens), y1: 0, y2: 14, stroke: "var(--limit)", "stroke-dasharray": "2,2" }));
  return svg;
}

function drawBackends(feed) {
  const body = document.querySelector("#backends tbody");
  body.replaceChildren();
  for (const b of feed.backends) {
    const state = b.circuit_open ? "circuit open" : b.healthy ? "healthy" : "down";
    const row = el("tr", { "data-backend": b.name });
    const name = el("td", { "data-field": "name", title: b.url }, b.name);
    row.append(
      name,
      cell("state", state, b.healthy && !b.circuit_open ? "state-ok" : "state-bad"),
      el("td", {}),
      cell("kv_used_tokens", fmt(b.kv_used_tokens)),
      cell("projected_peak_tokens", fmt(b.projected_peak_tokens)),
      cell("reserved_tokens", fmt(b.reserved_tokens)),
      cell("limit_tokens", fmt(b.limit_tokens)),
      cell("capacity_tokens", fmt(b.capacity_tokens)),
      cell("running", fmt(b.running)),
      cell("waiting", fmt(b.waiting)),
      cell("inflight", fmt(b.inflight)),
    );
    row.children[2].append(kvBar(b));
    body.append(row);
  }
}

function drawQueue(feed) {
  document.getElementById("queue-depth").textContent = fmt(feed.queued);
  document.getElementById("queue-tokens").textContent = fmt(feed.queued_tokens);
  const head = feed.head;
  document.getElementById("head-reason").textContent = head
    ? `head ${head.id}: ${head.reason}`
    : feed.queued ? "" : "nothing waiting";
  const body = document.querySelector("#queue tbody");
  body.replaceChildren();
  for (const r of feed.requests) {
    const p = r.prediction;
    const row = el("tr", { "data-rid": String(r.id) });
    row.append(
      cell("rank", fmt(r.rank)),
      cell("id", String(r.id), ""),
      cell("tenant", r.tenant, ""),
      cell("prompt_tokens", fmt(r.prompt_tokens)),
      cell("p50", p ? fmt(p.p50) : "–"),
      cell("band", p ? `${fmt(p.p10)} – ${fmt(p.p90)}` : "–", ""),
      cell("predictor_path", r.predictor_path, ""),
      cell("wait_s", fmt(r.wait_s, 2)),
    );
    body.append(row);
  }
}

// A line chart of several series over the timeline's t (seconds ago on the x axis).
function lineChart(svg, t, series, { legend } = {}) {
  const w = svg.clientWidth || 320;
  const h = svg.clientHeight || 150;
  const pad = { l: 36, r: 6, t: 6, b: 16 };
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.replaceChildren();
  const now = t.length ? t[t.length - 1] : 0;
  const t0 = t.length ? t[0] : 0;
  const values = series.flatMap((s) => s.values.filter((v) => v !== null && v !== undefined));
  const top = Math.max(1e-9, ...values, 0) * 1.1 || 1;
  const X = (x) => pad.l + ((w - pad.l - pad.r) * (x - t0)) / Math.max(1e-9, now - t0);
  const Y = (y) => h - pad.b - ((h - pad.t - pad.b) * y) / top;
  svg.append(el("svg:line", { x1: pad.l, x2: w - pad.r, y1: Y(0), y2: Y(0), stroke: "#d9dde6" }));
  svg.append(el("svg:text", { x: 2, y: pad.t + 8, "font-size": 10, fill: "#6b7385" }, fmt(top, top < 10 ? 2 : 0)));
  svg.append(el("svg:text", { x: 2, y: Y(0), "font-size": 10, fill: "#6b7385" }, "0"));
  svg.append(el("svg:text", { x: pad.l, y: h - 3, "font-size": 10, fill: "#6b7385" }, t.length ? `${fmt(now - t0)} s ago` : "no data yet"));
  series.forEach((s, i) => {
    let d = "";
    let pen = "M";
    s.values.forEach((v, k) => {
      if (v === null || v === undefined) { pen = "M"; return; }
      d += `${pen}${X(t[k]).toFixed(1)},${Y(v).toFixed(1)} `;
      pen = "L";
    });
    const colour = s.colour || COLOURS[i % COLOURS.length];
    svg.append(el("svg:path", { d, fill: "none", stroke: colour, "stroke-width": 1.5, "stroke-dasharray": s.dash || "" }));
  });
  if (legend) {
    const box = document.getElementById(legend);
    box.replaceChildren(...series.map((s, i) => {
      const item = el("span");
      const swatch = el("i");
      swatch.style.background = s.colour || COLOURS[i % COLOURS.length];
      item.append(swatch, document.createTextNode(s.name));
      return item;
    }));
  }
}

function drawTimeline(feed) {
  const s = feed.series;
  lineChart(document.getElementById("chart-queue"), s.t, [{ name: "queue depth", values: s.queue_depth }]);
  const flow = [{ name: "admitted", values: s.admitted, colour: COLOURS[2] }];
  Object.entries(s.rejected).forEach(([reason, values], i) => flow.push({ name: `rejected: ${reason}`, values, colour: COLOURS[(i + 1) % COLOURS.length] === COLOURS[2] ? COLOURS[5] : COLOURS[(i + 1) % COLOURS.length] }));
  lineChart(document.getElementById("chart-flow"), s.t, flow, { legend: "flow-legend" });
  lineChart(document.getElementById("chart-latency"), s.t, [
    { name: "TTFT p50", values: s.ttft_p50, colour: COLOURS[0] },
    { name: "TTFT p90", values: s.ttft_p90, colour: COLOURS[0], dash: "4,3" },
    { name: "TTLT p50", values: s.ttlt_p50, colour: COLOURS[1] },
    { name: "TTLT p90", values: s.ttlt_p90, colour: COLOURS[1], dash: "4,3" },
  ], { legend: "latency-legend" });
}

// Predicted median (with its 10–90% band) against the actual length, both axes logarithmic.
function drawQuality(feed) {
  const q = feed.quality;
  document.getElementById("quality-n").textContent = fmt(q.n);
  document.getElementById("tau").textContent = fmt(q.tau, 2);
  document.getElementById("coverage").textContent = q.coverage === null ? "–" : `${fmt(100 * q.coverage)}%`;
  const err = feed.forecast ? feed.forecast.median_error : {};
  for (const what of ["ttft", "ttlt"]) {
    const v = err[what];
    document.getElementById(`forecast-${what}`).textContent = v === null || v === undefined ? "–" : `${fmt(100 * v)}%`;
  }
  const svg = document.getElementById("chart-quality");
  const w = svg.clientWidth || 400;
  const h = svg.clientHeight || 260;
  const pad = 34;
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.replaceChildren();
  const all = q.points.flatMap(([p50, p10, p90, actual]) => [p50, p10, p90, actual]).filter((v) => v > 0);
  const lo = Math.log10(Math.max(1, Math.min(...all, 1)));
  const hi = Math.log10(Math.max(10, ...all)) + 0.05;
  const X = (v) => pad + ((w - 2 * pad) * (Math.log10(Math.max(1, v)) - lo)) / (hi - lo);
  const Y = (v) => h - pad - ((h - 2 * pad) * (Math.log10(Math.max(1, v)) - lo)) / (hi - lo);
  svg.append(el("svg:line", { x1: X(10 ** lo), y1: Y(10 ** lo), x2: X(10 ** hi), y2: Y(10 ** hi), stroke: "#d9dde6" }));
  svg.append(el("svg:text", { x: w / 2 - 40, y: h - 6, "font-size": 10, fill: "#6b7385" }, "predicted median (tokens)"));
  svg.append(el("svg:text", { x: 2, y: 12, "font-size": 10, fill: "#6b7385" }, "actual"));
  for (const [p50, p10, p90, actual] of q.points) {
    svg.append(el("svg:line", { x1: X(p10), x2: X(p90), y1: Y(actual), y2: Y(actual), stroke: "#b8c7e6" }));
    svg.append(el("svg:circle", { cx: X(p50), cy: Y(actual), r: 2.2, fill: "#3b82f6" }));
  }
}

function draw(feed) {
  document.getElementById("policy").textContent = `policy ${feed.policy}`;
  document.getElementById("admission").textContent = `admission ${feed.admission.rule} ≤ ${fmt(100 * feed.admission.target)}%`;
  drawBackends(feed);
  drawQueue(feed);
  drawTimeline(feed);
  drawQuality(feed);
  document.getElementById("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

async function refresh() {
  const resp = await fetch("/admin/dashboard", { credentials: "same-origin", cache: "no-store" });
  if (!resp.ok) {
    const body = await resp.json().catch(() => ({}));
    document.getElementById("status").textContent = `feed: ${resp.status} ${body?.error?.message || ""}`;
    return null;
  }
  const feed = await resp.json();
  window.sagegateDashboard.last = feed;
  draw(feed);
  return feed;
}

async function loop() {
  if (document.visibilityState !== "hidden") {
    try { await refresh(); } catch (exc) { document.getElementById("status").textContent = `feed unreachable (${exc})`; }
  }
  setTimeout(loop, INTERVAL_MS);
}

window.sagegateDashboard = { refresh, last: null };
loop();
