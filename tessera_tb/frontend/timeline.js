// Operator timeline, drawn on a 2-D canvas. The server answers each window with at most a few
// thousand drawable items per worker (events, or summary boxes where events are narrower
// than the resolution: backend/timeline.py); zooming and panning fetch a new window. All
// selected workers (ranks) share one time axis; times are ns offsets from the run's origin
// for the selected steps (the server sends the epoch origin as text).

import { downloadLink, el, fmtDuration, fmtNumber, getJSON, note, query } from "./dom.js";

const GUTTER_PX = 220;
const RULER_PX = 26;
const ROW_PX = 13;
const WORKER_HEADER_PX = 20;
const TRACK_GAP_PX = 5;
const COUNTER_PX = 30;
const DEFAULT_ITEMS_PER_WORKER = 6000;
const FETCH_DEBOUNCE_MS = 180;
const LANE_ORDER = ["device", "gpu_annotations", "ops", "python", "other", "instants"];
const KIND_HUES = {
  kernel: 210,
  collective: 285,
  memcpy: 30,
  memset: 50,
  cpu_op: 120,
  annotation: 175,
  runtime: 0,
  driver: 350,
  python: 25,
  gpu_annotation: 265,
  sync: 330,
  mark: 0,
  memory: 200,
  region: 190,
};
const SUMMARY_COLOR = "rgba(120,120,120,0.55)";
const SELECTED_COLOR = "#ff1744";

function hashString(s) {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}

function colorFor(kind, name) {
  const hue = KIND_HUES[kind] ?? 0;
  if (kind === "mark" || kind === "memory") return "#424242";
  const h = hashString(name);
  const light = 38 + (h % 5) * 6;
  const shift = ((h >> 3) % 21) - 10;
  return `hsl(${hue + shift},${kind === "runtime" || kind === "driver" ? 65 : 55}%,${light}%)`;
}

function niceStep(rangeNs, targetTicks) {
  const raw = rangeNs / targetTicks;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

function trackOrder(t) {
  // Devices first, by device then stream; then host threads by name; then the rest.
  if (t.kind === "device_stream") return [0, t.device, t.stream, ""];
  if (t.kind === "host_thread") return [1, 0, 0, t.name];
  return [2, 0, 0, t.name];
}

function compareKeys(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] < b[i]) return -1;
    if (a[i] > b[i]) return 1;
  }
  return 0;
}

class TimelineView {
  constructor(box, ctx) {
    this.box = box;
    this.ctx = ctx;
    this.workers = [];
    this.answers = new Map(); // worker -> window answer
    this.extentNs = 0;
    this.viewT0 = 0;
    this.viewT1 = 1;
    this.selected = null; // {worker, step, row}
    this.showCounters = false;
    this.showFlows = false;
    this.fetchTimer = null;
    this.fetchSeq = 0;
    this.drag = null;
    // Drawable items asked per worker and window (the server caps it and keeps answers < 2 MB).
    this.maxItems = Number(ctx.state.items) || DEFAULT_ITEMS_PER_WORKER;
  }

  params(extra = {}) {
    const s = this.ctx.state;
    return { ...this.ctx.selection, steps: this.steps, q: s.q, ...extra };
  }

  async start() {
    const s = this.ctx.state;
    const run = this.ctx.app.run;
    this.steps = s.steps || (run.default_step !== null ? String(run.default_step) : undefined);
    const first = await this.ctx.fetch("timeline", {
      steps: this.steps,
      q: s.q,
      max_items: this.maxItems,
      t0: s.t0,
      t1: s.t1,
    });
    this.ctx.showErrors(first.errors);
    // A large selection is drawn for its first ranks only (the server says how many).
    this.workers = first.shown_workers || first.selection.workers;
    this.workersNote = first.workers_note || null;
    this.showCounters = this.workers.length === 1;
    this.extentNs = first.extent_ns;
    this.origin = first.origin_ns;
    this.viewT0 = first.start_ns;
    this.viewT1 = first.end_ns;
    this.answers.set(first.worker, first);
    this.buildDom();
    await this.fetchOthers(first.worker);
    this.layout();
    this.redraw();
    this.updateInfo();
  }

  async fetchOthers(done) {
    const rest = this.workers.filter((w) => w !== done);
    const answers = await Promise.all(
      rest.map((w) =>
        getJSON(
          "timeline",
          this.params({ worker: w, t0: this.viewT0, t1: this.viewT1, max_items: this.maxItems }),
        ),
      ),
    );
    rest.forEach((w, i) => this.answers.set(w, answers[i]));
  }

  buildDom() {
    const s = this.ctx.state;
    this.search = el("input", {
      type: "search",
      className: "timeline-search",
      placeholder: "search names…",
      value: s.q || "",
      on: { change: () => this.ctx.setState({ q: this.search.value.trim() || undefined }) },
    });
    this.info = el("span", { className: "timeline-info" });
    this.traceLink = el("a", { className: "download trace-download", text: "Chrome trace of this window", attrs: { download: "" } });
    this.perfetto = el("button", {
      className: "open-perfetto",
      text: "Open in Perfetto ↗",
      title: "opens ui.perfetto.dev in a new tab and sends it this window",
      on: { click: () => this.openPerfetto() },
    });
    const controls = el(
      "div",
      { className: "view-controls" },
      el("label", {}, "Search ", this.search),
      el("button", { className: "reset-zoom", text: "Reset zoom", on: { click: () => this.setWindow(0, this.extentNs) } }),
      el("label", {}, el("input", { type: "checkbox", className: "toggle-counters", checked: this.showCounters, on: { change: (e) => { this.showCounters = e.target.checked; this.layout(); this.redraw(); } } }), " counters"),
      el("label", {}, el("input", { type: "checkbox", className: "toggle-flows", checked: this.showFlows, on: { change: (e) => { this.showFlows = e.target.checked; this.redraw(); } } }), " launch links"),
      this.traceLink,
      this.perfetto,
      this.info,
    );
    this.canvas = el("canvas", { className: "timeline-canvas" });
    this.tooltip = el("div", { className: "timeline-tooltip" });
    this.scroller = el("div", { className: "timeline-wrap" }, this.canvas, this.tooltip);
    this.details = el("div", { className: "timeline-details" });
    this.box.replaceChildren(
      controls,
      el("p", { className: "hint", text: "Wheel to zoom, drag to pan, click a box for details; click a grey (merged) box to zoom into it." }),
      this.workersNote ? el("div", { className: "note info timeline-capped", text: this.workersNote }) : "",
      this.scroller,
      this.details,
    );
    this.canvas.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    this.canvas.addEventListener("mousedown", (e) => this.onDown(e));
    window.addEventListener("mousemove", (e) => this.onMove(e));
    window.addEventListener("mouseup", (e) => this.onUp(e));
    this.canvas.addEventListener("mouseleave", () => (this.tooltip.style.display = "none"));
  }

  get plotWidth() {
    return this.width - GUTTER_PX - 8;
  }

  /** Rows of the canvas from the answers' tracks and lanes; items in flat typed arrays. */
  layout() {
    this.width = Math.max(600, this.box.clientWidth || 1200);
    const rows = []; // {y, h, label, kind: "row"|"counter"|"header", worker, ...}
    const rowIndex = new Map();
    let y = RULER_PX;
    const labels = [];
    const blocks = [];
    for (const w of this.workers) {
      const a = this.answers.get(w);
      if (!a) continue;
      const block = { worker: w, y0: y };
      blocks.push(block);
      labels.push({ y, text: w, header: true });
      y += WORKER_HEADER_PX;
      const tracks = [...a.tracks].sort((p, q) => compareKeys(trackOrder(p), trackOrder(q)));
      for (const t of tracks) {
        const lanes = LANE_ORDER.filter((l) => t.lanes[l]);
        if (!lanes.length) continue;
        labels.push({ y, text: t.name });
        for (const lane of lanes) {
          for (let d = 0; d < t.lanes[lane]; d++) {
            rowIndex.set(`${w}|${t.id}|${a.lanes.indexOf(lane)}|${d}`, rows.length);
            rows.push({ y, h: ROW_PX, worker: w });
            y += ROW_PX;
          }
        }
        y += TRACK_GAP_PX;
      }
      if (this.showCounters) {
        for (const c of a.counters) {
          labels.push({ y, text: `${c.name}${c.device >= 0 ? " gpu" + c.device : ""}` });
          rows.push({ y, h: COUNTER_PX, worker: w, counter: c });
          y += COUNTER_PX;
        }
      }
      block.y1 = y;
      y += 6;
    }
    this.blocks = blocks;
    this.rows = rows;
    this.labels = labels;
    this.height = y + 4;
    // Flat item arrays over all workers.
    let n = 0;
    for (const a of this.answers.values()) n += a.events.row.length + a.summaries.track.length;
    const x0 = new Float64Array(n);
    const x1 = new Float64Array(n);
    const row = new Int32Array(n);
    const color = new Int32Array(n);
    const ref = new Array(n); // [worker, "e"|"s", index]
    const palette = new Map([[SUMMARY_COLOR, 0]]);
    let i = 0;
    for (const [w, a] of this.answers) {
      const ev = a.events;
      for (let j = 0; j < ev.row.length; j++) {
        const r = rowIndex.get(`${w}|${ev.track[j]}|${ev.lane[j]}|${ev.depth[j]}`);
        if (r === undefined) continue;
        const kind = a.kinds[ev.kind[j]];
        const c = colorFor(kind, a.names[ev.name[j]]);
        if (!palette.has(c)) palette.set(c, palette.size);
        x0[i] = ev.start_ns[j];
        x1[i] = ev.start_ns[j] + ev.dur_ns[j];
        row[i] = r;
        color[i] = palette.get(c);
        ref[i] = [w, "e", j];
        i++;
      }
      const sm = a.summaries;
      for (let j = 0; j < sm.track.length; j++) {
        const r = rowIndex.get(`${w}|${sm.track[j]}|${sm.lane[j]}|${sm.depth[j]}`);
        if (r === undefined) continue;
        x0[i] = sm.start_ns[j];
        x1[i] = sm.end_ns[j];
        row[i] = r;
        color[i] = 0;
        ref[i] = [w, "s", j];
        i++;
      }
    }
    this.n = i;
    this.x0 = x0;
    this.x1 = x1;
    this.row = row;
    this.ref = ref;
    this.palette = [...palette.keys()];
    // Draw order grouped by colour (one fill per colour); hit-test order by row then start.
    const idx = Array.from({ length: i }, (_, k) => k);
    this.byColor = Int32Array.from([...idx].sort((p, q) => color[p] - color[q]));
    this.colorOf = color;
    this.byRow = Int32Array.from(idx.sort((p, q) => row[p] - row[q] || x0[p] - x0[q]));
    this.rowStart = new Int32Array(rows.length + 1).fill(-1);
    for (let k = this.byRow.length - 1; k >= 0; k--) this.rowStart[row[this.byRow[k]]] = k;
    this.rowStart[rows.length] = this.byRow.length;
    for (let r = rows.length - 1; r >= 0; r--) if (this.rowStart[r] < 0) this.rowStart[r] = this.rowStart[r + 1];
    this.rowIndex = rowIndex;
    const dpr = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(this.width * dpr);
    this.canvas.height = Math.round(this.height * dpr);
    this.canvas.style.width = `${this.width}px`;
    this.canvas.style.height = `${this.height}px`;
    this.dpr = dpr;
  }

  xOf(t) {
    return GUTTER_PX + ((t - this.viewT0) / (this.viewT1 - this.viewT0)) * this.plotWidth;
  }

  tOf(x) {
    return this.viewT0 + ((x - GUTTER_PX) / this.plotWidth) * (this.viewT1 - this.viewT0);
  }

  redraw() {
    performance.mark("tessera-timeline-redraw-start");
    const g = this.canvas.getContext("2d");
    g.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    g.fillStyle = "#fff";
    g.fillRect(0, 0, this.width, this.height);
    const t0 = this.viewT0;
    const scale = this.plotWidth / (this.viewT1 - this.viewT0);
    const left = GUTTER_PX;
    const right = GUTTER_PX + this.plotWidth;
    const { x0, x1, row, rows, byColor, colorOf } = this;
    let drawn = 0;
    g.save();
    g.beginPath();
    g.rect(left, 0, this.plotWidth, this.height);
    g.clip();
    let current = -1;
    for (let k = 0; k < byColor.length; k++) {
      const i = byColor[k];
      if (colorOf[i] !== current) {
        if (current >= 0) g.fill();
        current = colorOf[i];
        g.fillStyle = this.palette[current];
        g.beginPath();
      }
      let a = left + (x0[i] - t0) * scale;
      let b = left + (x1[i] - t0) * scale;
      if (b < left || a > right) continue;
      if (a < left - 1) a = left - 1;
      if (b > right + 1) b = right + 1;
      const r = rows[row[i]];
      g.rect(a, r.y + 1, Math.max(1, b - a), r.h - 2);
      drawn++;
    }
    if (current >= 0) g.fill();
    this.drawLabelsInBoxes(g, scale);
    this.drawCounters(g);
    this.drawSteps(g);
    if (this.showFlows) this.drawFlows(g);
    this.drawSelection(g);
    g.restore();
    this.drawGutter(g);
    this.drawRuler(g);
    performance.measure("tessera-timeline-redraw", "tessera-timeline-redraw-start");
    const m = performance.getEntriesByName("tessera-timeline-redraw");
    window.__tesseraTimeline = {
      items: this.n,
      drawn,
      redrawMs: m.length ? m[m.length - 1].duration : null,
      viewT0: this.viewT0,
      viewT1: this.viewT1,
      rows: this.rows.length,
    };
  }

  drawLabelsInBoxes(g, scale) {
    g.font = "10px Roboto, sans-serif";
    g.fillStyle = "#fff";
    g.textBaseline = "middle";
    let budget = 1500;
    for (let k = 0; k < this.n && budget > 0; k++) {
      const w = (this.x1[k] - this.x0[k]) * scale;
      if (w < 40) continue;
      const [worker, type, j] = this.ref[k];
      if (type !== "e") continue;
      const a = GUTTER_PX + (this.x0[k] - this.viewT0) * scale;
      if (a > GUTTER_PX + this.plotWidth || a + w < GUTTER_PX) continue;
      const ans = this.answers.get(worker);
      const name = ans.names[ans.events.name[j]];
      const r = this.rows[this.row[k]];
      const x = Math.max(a, GUTTER_PX) + 2;
      const room = Math.min(a + w, GUTTER_PX + this.plotWidth) - x - 2;
      if (room < 20) continue;
      const chars = Math.floor(room / 5.5);
      g.fillText(name.length > chars ? name.slice(0, Math.max(1, chars - 1)) + "…" : name, x, r.y + r.h / 2);
      budget--;
    }
  }

  drawCounters(g) {
    if (!this.showCounters) return;
    for (const r of this.rows) {
      if (!r.counter) continue;
      const c = r.counter;
      const vals = c.value.filter((v) => v !== null);
      if (!vals.length) continue;
      const lo = Math.min(...vals);
      const hi = Math.max(...vals);
      const span = hi - lo || 1;
      g.strokeStyle = "#00897b";
      g.lineWidth = 1.2;
      g.beginPath();
      // A sample holds until the next one (NVML samples every ~10 ms): a step line.
      let prevY = null;
      c.t_ns.forEach((t, i) => {
        const v = c.value[i];
        if (v === null) return;
        const x = this.xOf(t);
        const y = r.y + r.h - 4 - ((v - lo) / span) * (r.h - 8);
        if (prevY === null) g.moveTo(x, y);
        else {
          g.lineTo(x, prevY);
          g.lineTo(x, y);
        }
        prevY = y;
      });
      if (prevY !== null) g.lineTo(GUTTER_PX + this.plotWidth, prevY);
      g.stroke();
      g.fillStyle = "#00695c";
      g.font = "10px Roboto, sans-serif";
      g.fillText(`max ${fmtNumber(hi)}${c.unit ? " " + c.unit : ""}`, GUTTER_PX + 4, r.y + 8);
    }
  }

  drawSteps(g) {
    g.strokeStyle = "rgba(230,81,0,0.8)";
    g.setLineDash([4, 3]);
    g.lineWidth = 1;
    g.fillStyle = "#e65100";
    g.font = "11px Roboto, sans-serif";
    for (const b of this.blocks) {
      const a = this.answers.get(b.worker);
      for (const s of a.steps) {
        for (const t of [s.start_ns, s.end_ns]) {
          const x = this.xOf(t);
          g.beginPath();
          g.moveTo(x, b.y0);
          g.lineTo(x, b.y1);
          g.stroke();
        }
        g.fillText(`step ${s.step}`, this.xOf(s.start_ns) + 3, b.y0 + 10);
      }
    }
    g.setLineDash([]);
  }

  /** Centre of an event's box, if it is in the loaded data: [x, y] or null. */
  eventPoint(worker, step, row) {
    const a = this.answers.get(worker);
    if (!a) return null;
    const ev = a.events;
    for (let j = 0; j < ev.row.length; j++) {
      if (ev.row[j] === row && ev.step[j] === step) {
        const r = this.rowIndex.get(`${worker}|${ev.track[j]}|${ev.lane[j]}|${ev.depth[j]}`);
        if (r === undefined) return null;
        return [this.xOf(ev.start_ns[j]), this.rows[r].y + ROW_PX / 2, this.xOf(ev.start_ns[j] + ev.dur_ns[j])];
      }
    }
    return null;
  }

  drawArrow(g, x0, y0, x1, y1) {
    g.beginPath();
    g.moveTo(x0, y0);
    g.lineTo(x1, y1);
    g.stroke();
    const ang = Math.atan2(y1 - y0, x1 - x0);
    g.beginPath();
    g.moveTo(x1, y1);
    g.lineTo(x1 - 6 * Math.cos(ang - 0.4), y1 - 6 * Math.sin(ang - 0.4));
    g.lineTo(x1 - 6 * Math.cos(ang + 0.4), y1 - 6 * Math.sin(ang + 0.4));
    g.closePath();
    g.fill();
  }

  drawFlows(g) {
    g.strokeStyle = "rgba(0,0,0,0.35)";
    g.fillStyle = "rgba(0,0,0,0.35)";
    g.lineWidth = 1;
    for (const [w, a] of this.answers) {
      const f = a.flows;
      const n = Math.min(f.from_ns ? f.from_ns.length : 0, 3000);
      for (let j = 0; j < n; j++) {
        const r0 = this.rowIndex.get(`${w}|${f.from_track[j]}|${f.from_lane[j]}|${f.from_depth[j]}`);
        const r1 = this.rowIndex.get(`${w}|${f.to_track[j]}|${f.to_lane[j]}|${f.to_depth[j]}`);
        if (r0 === undefined || r1 === undefined) continue;
        this.drawArrow(g, this.xOf(f.from_ns[j]), this.rows[r0].y + ROW_PX / 2, this.xOf(f.to_ns[j]), this.rows[r1].y + ROW_PX / 2);
      }
    }
  }

  drawSelection(g) {
    if (!this.selected) return;
    const { worker, step, row, detail } = this.selected;
    const p = this.eventPoint(worker, step, row);
    if (p) {
      g.strokeStyle = SELECTED_COLOR;
      g.lineWidth = 2;
      g.strokeRect(p[0] - 1, p[1] - ROW_PX / 2, Math.max(2, p[2] - p[0]) + 2, ROW_PX);
    }
    if (!detail || !p) return;
    g.strokeStyle = SELECTED_COLOR;
    g.fillStyle = SELECTED_COLOR;
    g.lineWidth = 1.5;
    if (detail.launched_by) {
      const q = this.eventPoint(worker, step, detail.launched_by.row);
      if (q) this.drawArrow(g, q[0], q[1], p[0], p[1]);
    }
    for (const l of detail.launches || []) {
      const q = this.eventPoint(worker, step, l.row);
      if (q) this.drawArrow(g, p[0], p[1], q[0], q[1]);
    }
  }

  drawGutter(g) {
    g.fillStyle = "#fafafa";
    g.fillRect(0, RULER_PX, GUTTER_PX - 4, this.height - RULER_PX);
    g.textBaseline = "middle";
    for (const l of this.labels) {
      g.fillStyle = l.header ? "#e65100" : "#424242";
      g.font = l.header ? "bold 12px Roboto, sans-serif" : "11px Roboto, sans-serif";
      const text = l.text.length > 34 ? l.text.slice(0, 33) + "…" : l.text;
      g.fillText(text, 6, l.y + (l.header ? WORKER_HEADER_PX / 2 : ROW_PX / 2));
      if (l.header) {
        g.strokeStyle = "#ffcc80";
        g.beginPath();
        g.moveTo(0, l.y);
        g.lineTo(this.width, l.y);
        g.stroke();
      }
    }
  }

  drawRuler(g) {
    g.fillStyle = "#fff";
    g.fillRect(0, 0, this.width, RULER_PX);
    g.strokeStyle = "#9e9e9e";
    g.fillStyle = "#616161";
    g.font = "10px Roboto, sans-serif";
    g.textBaseline = "alphabetic";
    const range = this.viewT1 - this.viewT0;
    const step = niceStep(range, Math.max(2, this.plotWidth / 110));
    for (let t = Math.ceil(this.viewT0 / step) * step; t <= this.viewT1; t += step) {
      const x = this.xOf(t);
      g.beginPath();
      g.moveTo(x, RULER_PX - 6);
      g.lineTo(x, RULER_PX);
      g.stroke();
      g.fillText(fmtDuration(t), x + 2, RULER_PX - 9);
    }
    g.beginPath();
    g.moveTo(GUTTER_PX, RULER_PX - 0.5);
    g.lineTo(this.width, RULER_PX - 0.5);
    g.stroke();
  }

  /** The item under canvas point (x, y): its index, or -1. */
  hit(x, y) {
    let lo = 0;
    let hi = this.rows.length - 1;
    let r = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const row = this.rows[mid];
      if (y < row.y) hi = mid - 1;
      else if (y >= row.y + row.h) lo = mid + 1;
      else {
        r = mid;
        break;
      }
    }
    if (r < 0 || this.rows[r].counter) return -1;
    const t = this.tOf(x);
    const tol = (3 * (this.viewT1 - this.viewT0)) / this.plotWidth;
    let best = -1;
    let bestDist = Infinity;
    for (let k = this.rowStart[r]; k < this.rowStart[r + 1]; k++) {
      const i = this.byRow[k];
      if (this.x0[i] - tol > t) break;
      const d = t < this.x0[i] ? this.x0[i] - t : t > this.x1[i] ? t - this.x1[i] : 0;
      if (d <= tol && d < bestDist) {
        best = i;
        bestDist = d;
      }
    }
    return best;
  }

  canvasPoint(e) {
    const rect = this.canvas.getBoundingClientRect();
    return [e.clientX - rect.left, e.clientY - rect.top];
  }

  describe(i) {
    const [w, type, j] = this.ref[i];
    const a = this.answers.get(w);
    if (type === "e") {
      const ev = a.events;
      const name = a.names[ev.name[j]];
      const short = name.length > 240 ? name.slice(0, 239) + "…" : name;
      return `${short}\n${a.kinds[ev.kind[j]]} · ${fmtDuration(ev.dur_ns[j])} · ${w} step ${ev.step[j]}`;
    }
    const s = a.summaries;
    return `${s.count[j]} events merged (click to zoom in)\nbusy ${fmtDuration(s.busy_ns[j])} of ${fmtDuration(s.end_ns[j] - s.start_ns[j])}\nmostly ${a.names[s.name[j]]}`;
  }

  onWheel(e) {
    e.preventDefault();
    const [x] = this.canvasPoint(e);
    if (x < GUTTER_PX) return;
    const t = this.tOf(x);
    const f = Math.pow(1.0015, e.deltaY);
    const span = Math.max(1000, (this.viewT1 - this.viewT0) * f);
    const frac = (t - this.viewT0) / (this.viewT1 - this.viewT0);
    this.setWindow(t - frac * span, t + (1 - frac) * span);
  }

  onDown(e) {
    const [x, y] = this.canvasPoint(e);
    this.drag = { x, y, t0: this.viewT0, t1: this.viewT1, moved: false };
  }

  onMove(e) {
    if (!this.canvas.isConnected) return;
    const [x, y] = this.canvasPoint(e);
    if (this.drag) {
      const dx = x - this.drag.x;
      if (Math.abs(dx) > 3) this.drag.moved = true;
      if (this.drag.moved) {
        const dt = (dx / this.plotWidth) * (this.drag.t1 - this.drag.t0);
        this.setWindow(this.drag.t0 - dt, this.drag.t1 - dt);
      }
      return;
    }
    if (x < 0 || y < 0 || x > this.width || y > this.height) return;
    const i = x >= GUTTER_PX ? this.hit(x, y) : -1;
    if (i < 0) {
      this.tooltip.style.display = "none";
      return;
    }
    this.tooltip.textContent = this.describe(i);
    this.tooltip.style.display = "block";
    this.tooltip.style.left = `${Math.min(x + 12, this.width - 300)}px`;
    this.tooltip.style.top = `${y + 14}px`;
  }

  onUp(e) {
    if (!this.drag) return;
    const drag = this.drag;
    this.drag = null;
    if (drag.moved) return;
    const [x, y] = this.canvasPoint(e);
    const i = x >= GUTTER_PX ? this.hit(x, y) : -1;
    if (i >= 0) this.clickItem(i);
  }

  async clickItem(i) {
    const [w, type, j] = this.ref[i];
    const a = this.answers.get(w);
    if (type === "s") {
      const s = a.summaries;
      const pad = Math.max(1000, (s.end_ns[j] - s.start_ns[j]) * 0.05);
      this.setWindow(s.start_ns[j] - pad, s.end_ns[j] + pad);
      return;
    }
    const ev = a.events;
    const sel = { worker: w, step: ev.step[j], row: ev.row[j], detail: null };
    this.selected = sel;
    this.redraw();
    const detail = await getJSON("event", { ...this.ctx.selection, steps: sel.step, worker: w, step: sel.step, row: sel.row });
    if (this.selected !== sel) return;
    sel.detail = detail;
    this.showDetail(detail);
    this.redraw();
  }

  showDetail(d) {
    const line = (k, v) => el("div", {}, el("b", { text: `${k}: ` }), String(v));
    const brief = (b) => (b ? `${b.name} (${b.kind}, ${fmtDuration(b.dur_ns)})` : "—");
    this.details.replaceChildren(
      el("div", { className: "detail-name", text: d.name }),
      line("kind", `${d.kind} (${d.category})`),
      line("worker / step / row", `${d.worker} / ${d.step} / ${d.row}`),
      line("track", d.track.name),
      line("duration", fmtDuration(d.dur_ns)),
      line("start in step", fmtDuration(d.start_in_step_ns)),
      line("correlation / external id", `${d.correlation} / ${d.external_id}`),
      line("owning op", brief(d.owning_op)),
      line("launched by", brief(d.launched_by)),
      line("launches", d.launches.length ? d.launches.map(brief).join("; ") : "—"),
      line("parents", d.parents.length ? d.parents.map((p) => p.name).join(" › ") : "—"),
      el(
        "details",
        { open: true },
        el("summary", { text: "arguments" }),
        ...Object.entries(d.attrs).map(([k, v]) => line(k, typeof v === "string" ? v : JSON.stringify(v))),
      ),
    );
  }

  setWindow(t0, t1) {
    if (t1 - t0 < 100) return;
    this.viewT0 = t0;
    this.viewT1 = t1;
    this.redraw();
    clearTimeout(this.fetchTimer);
    this.fetchTimer = setTimeout(() => this.refetch(), FETCH_DEBOUNCE_MS);
  }

  async refetch() {
    const seq = ++this.fetchSeq;
    const t0 = Math.floor(this.viewT0);
    const t1 = Math.ceil(this.viewT1);
    this.ctx.app.state.t0 = String(t0);
    this.ctx.app.state.t1 = String(t1);
    this.ctx.setState({}, { rerender: false });
    const answers = await Promise.all(
      this.workers.map((w) => getJSON("timeline", this.params({ worker: w, t0, t1, max_items: this.maxItems }))),
    );
    if (seq !== this.fetchSeq || !this.canvas.isConnected) return;
    this.workers.forEach((w, i) => this.answers.set(w, answers[i]));
    this.layout();
    this.redraw();
    this.updateInfo();
    document.body.dataset.tesseraTimelineFetched = String(seq);
  }

  windowParams() {
    return this.params({ t0: Math.floor(this.viewT0), t1: Math.ceil(this.viewT1), workers: this.ctx.state.workers });
  }

  updateInfo() {
    let events = 0;
    let boxes = 0;
    let inWindow = 0;
    for (const a of this.answers.values()) {
      events += a.events.row.length;
      boxes += a.summaries.track.length;
      inWindow += a.events_in_window;
    }
    const q = this.ctx.state.q;
    this.info.textContent =
      `${fmtDuration(this.viewT1 - this.viewT0)} window · ${inWindow.toLocaleString("en-US")} events` +
      (q ? ` matching “${q}”` : "") +
      ` · drawn as ${events.toLocaleString("en-US")} events + ${boxes.toLocaleString("en-US")} merged boxes`;
    this.traceLink.href = `./trace?${query(this.windowParams())}`;
  }

  async openPerfetto() {
    const url = `./trace?${query(this.windowParams())}`;
    const win = window.open("https://ui.perfetto.dev/#!/", "_blank", "noopener=no");
    if (!win) return;
    const buffer = await (await fetch(url)).arrayBuffer();
    const origin = "https://ui.perfetto.dev";
    let tries = 0;
    const onMessage = (e) => {
      if (e.origin !== origin || e.data !== "PONG") return;
      clearInterval(timer);
      window.removeEventListener("message", onMessage);
      win.postMessage({ perfetto: { buffer, title: "Tessera window", fileName: "tessera_window.json" } }, origin);
    };
    window.addEventListener("message", onMessage);
    const timer = setInterval(() => {
      if (++tries > 100) return clearInterval(timer);
      win.postMessage("PING", origin);
    }, 100);
  }
}

export async function renderTimeline(box, ctx) {
  const view = new TimelineView(box, ctx);
  try {
    await view.start();
  } catch (e) {
    box.replaceChildren(note("error", e.message));
    throw e;
  }
  window.__tesseraTimelineView = view;
  return view;
}

export { downloadLink };
