// The views of the Tessera tab. Each view is `async (box, ctx) => void`: it fetches its
// route (ctx.fetch adds run, workers and steps), builds DOM with textContent and draws charts
// with plotly (hover text escaped: names come from traces). Numbers are shown as the server
// computed them; no metric is recomputed here.

import { column, dataTable, downloadLink, el, escapeHtml, fmtCell, note, rowsOf } from "./dom.js";
import { renderTimeline } from "./timeline.js";

const PLOT_CONFIG = { displaylogo: false, responsive: true };

/** A select bound to a state key. */
function stateSelect(ctx, key, options, current, cls) {
  return el(
    "select",
    { className: cls, on: { change: (e) => ctx.setState({ [key]: e.target.value || undefined }) } },
    options.map(([v, t]) => el("option", { value: v, text: t, selected: String(v) === String(current) })),
  );
}

/** A text input bound to a state key (applied on Enter / blur). */
function stateInput(ctx, key, placeholder, cls) {
  return el("input", {
    className: cls,
    type: "search",
    placeholder,
    value: ctx.state[key] || "",
    on: { change: (e) => ctx.setState({ [key]: e.target.value.trim() || undefined }) },
  });
}

async function newPlot(ctx, node, traces, layout) {
  const Plotly = await ctx.loadPlotly();
  await Plotly.newPlot(node, traces, { margin: { t: 30, r: 20 }, ...layout }, PLOT_CONFIG);
  return node;
}

// Operators and kernels (backend/topk.py) ----------------------------------------------------

const OP_COLUMNS = [
  "name", "input_dims", "calls", "device_self_ns", "device_self_pct", "device_total_ns",
  "host_self_ns", "host_self_pct", "host_total_ns", "device_self_mean_ns", "host_self_mean_ns",
];
const KERNEL_COLUMNS = [
  "name", "kind", "calls", "total_dur_ns", "total_pct", "mean_dur_ns", "min_dur_ns", "max_dur_ns",
  "grid", "block", "registers_per_thread", "shared_memory_bytes", "est_occupancy_pct", "top_op",
  "top_op_pct",
];

function topkView(table) {
  return async (box, ctx) => {
    const s = ctx.state;
    const params = { table, k: s.k || 20, sort: s.sort, q: s.q, by_shape: s.level === "shape" ? 1 : undefined };
    const data = await ctx.fetch("topk", params);
    ctx.showErrors(data.errors);
    const payload = data.tables[table];
    const numeric = payload.columns.filter((c) => /_(ns|pct)$|^calls$/.test(c));
    const controls = el(
      "div",
      { className: "view-controls" },
      el("label", {}, "Top ", stateSelect(ctx, "k", [10, 20, 50, 100, 500].map((k) => [k, k]), params.k, "topk-k")),
      el(
        "label",
        {},
        "Sort by ",
        stateSelect(ctx, "sort", [["", "default"], ...numeric.map((c) => [c, c])], s.sort || "", "topk-sort"),
      ),
      el("label", {}, "Search ", stateInput(ctx, "q", "name contains…", "topk-search")),
      table === "operators"
        ? el(
            "label",
            {},
            el("input", {
              type: "checkbox",
              className: "topk-by-shape",
              checked: s.level === "shape",
              on: { change: (e) => ctx.setState({ level: e.target.checked ? "shape" : undefined }) },
            }),
            " group by input shape",
          )
        : null,
      downloadLink("CSV", "csv", { ...ctx.selection, ...params, view: "topk" }),
    );
    const shown = (table === "operators" ? OP_COLUMNS : KERNEL_COLUMNS).filter(
      (c) => payload.columns.includes(c) && (c !== "input_dims" || s.level === "shape"),
    );
    box.replaceChildren(
      controls,
      el("p", {
        className: "hint",
        text: "Click a row to find it on the timeline. The (other) row sums everything below the top rows.",
      }),
      dataTable(payload, {
        columns: shown,
        onRowClick: (row) => {
          if (row.is_other) return;
          ctx.setState({ view: "timeline", q: row.name, k: undefined, sort: undefined });
        },
      }),
    );
    box.querySelector("table").classList.add(`topk-${table}`);
  };
}

// Overview (backend/breakdown.py, summary.py, findings.py) ----------------------------------

const CATEGORY_COLORS = {
  compute: "#1e88e5",
  collective: "#8e24aa",
  memcpy: "#fb8c00",
  memset: "#fdd835",
  runtime: "#e53935",
  dataloader: "#6d4c41",
  host_other: "#43a047",
  idle: "#bdbdbd",
};

function card(label, value, basis, cls) {
  return el(
    "div",
    { className: `card ${cls || ""}` },
    el("div", { className: "label", text: label }),
    el("div", { className: "value", text: value }),
    basis ? el("div", { className: "basis", text: basis }) : null,
  );
}

// Settings a finding's link replaces (the rest of the selection is the link's own).
const LINK_RESET = ["step", "k", "sort", "q", "table", "metric", "t0", "t1", "items", "level"];

/** The state keys of a finding's deep link (`#tessera&t.view=...`, findings.finding_link). */
function linkState(link) {
  const state = {};
  for (const part of String(link || "").replace(/^#/, "").split("&")) {
    const eq = part.indexOf("=");
    if (eq < 0 || !part.startsWith("t.")) continue;
    state[decodeURIComponent(part.slice(2, eq))] = decodeURIComponent(part.slice(eq + 1));
  }
  return state;
}

/** "show": opens the view and selection of a finding. In the tab it changes the selection
 * (the run stays the one shown); in the HTML report it jumps to the section of that view,
 * or says where to look in TensorBoard when the report has no such section. */
function findingLink(ctx, link) {
  if (!link) return null;
  const target = linkState(link);
  if (ctx.app) {
    const patch = Object.fromEntries(LINK_RESET.map((k) => [k, undefined]));
    delete target.run;
    return el("a", {
      className: "finding-link",
      href: link,
      text: " show",
      on: {
        click: (e) => {
          e.preventDefault();
          ctx.setState({ ...patch, ...target });
        },
      },
    });
  }
  const section = ctx.sectionLink ? ctx.sectionLink(target.view) : null;
  const at = target.t0 !== undefined ? ` (${(Number(target.t0) / 1e6).toFixed(2)}-${(Number(target.t1) / 1e6).toFixed(2)} ms)` : "";
  const where = `${target.view}${target.q ? ` (search "${target.q}")` : ""}${at}`;
  return section
    ? el("a", { className: "finding-link", href: section, title: where, text: ` show: ${where}` })
    : el("span", { className: "finding-link", text: ` see ${where} in TensorBoard` });
}

async function overviewView(box, ctx) {
  const data = await ctx.fetch("overview");
  ctx.showErrors(data.errors);
  const t = data.tables;
  const summary = rowsOf(t.summary);
  const perStep = rowsOf(t.step_summary);
  const multi = summary.length > 1;
  const cards = el("div", { className: "cards" });
  // One worker: cards; several: the per-worker summary table below says it all.
  for (const s of multi ? [] : summary) {
    const who = "";
    cards.append(
      card(who + "step time (median)", fmtCell("step_time_ms", s.step_time_ms), null, "card-step"),
      card(who + "GPU busy", fmtCell("gpu_busy_pct", s.gpu_busy_pct), "union of device work / step span", "card-busy"),
      card(who + "tensor-core kernel time", fmtCell("tc_pct", s.tensor_core_time_pct_est), s.tensor_core_basis, "card-tc"),
      card(who + "occupancy (estimated)", fmtCell("est_occupancy_pct", s.est_occupancy_pct), `Kineto estimate over ${fmtCell("est_occupancy_coverage_pct", s.est_occupancy_coverage_pct)} of kernel time`, "card-occ"),
    );
  }
  // Stacked bars: one bar per (step, worker), one trace per category.
  const bars = rowsOf(t.breakdown);
  const x = multi
    ? [bars.map((r) => `step ${r.step}`), bars.map((r) => r.worker)]
    : bars.map((r) => `step ${r.step}`);
  const traces = data.categories.map((c) => ({
    type: "bar",
    name: c,
    x,
    y: bars.map((r) => r[`${c}_ns`] / 1e6),
    customdata: bars.map((r) => [escapeHtml(r.worker), r.step, fmtCell(`${c}_pct`, r[`${c}_pct`])]),
    hovertemplate: `${c}: %{y:.3f} ms (%{customdata[2]})<br>%{customdata[0]} step %{customdata[1]}<extra></extra>`,
    marker: { color: CATEGORY_COLORS[c] },
  }));
  const breakdownChart = el("div", { className: "chart breakdown-chart" });
  const utilChart = el("div", { className: "chart util-chart" });
  const findingsBox = el("div", { className: "findings" });
  const found = rowsOf(t.findings);
  if (!found.length) findingsBox.append(note("info", "No findings: nothing in this selection wastes more than 2% of a step."));
  findingsBox.append(
    el(
      "ol",
      {},
      found.map((f) =>
        el(
          "li",
          { className: `finding ${f.severity}` },
          el("span", { className: "severity", text: f.severity.toUpperCase() }),
          el("span", { className: "title", text: f.title }),
          el("span", { className: "win", text: ` — up to ${fmtCell("win_ms_per_step", f.win_ms_per_step)}/step (${fmtCell("win_pct_of_step", f.win_pct_of_step)})` }),
          multi ? el("span", { className: "who", text: ` [${f.worker}]` }) : null,
          findingLink(ctx, f.link),
          el("details", {}, el("summary", { text: "evidence" }), el("div", { className: "evidence", text: f.evidence })),
        ),
      ),
    ),
  );
  // A large run: step files of a few ranks; the rank x step heatmap of every selected rank
  // comes from the run's derived index.
  const rankStepChart = t.rank_step ? el("div", { className: "chart heatmap-step-time" }) : null;
  box.replaceChildren(
    data.capped ? el("div", { className: "note info overview-capped", text: data.capped.note }) : "",
    cards,
    rankStepChart ? el("h3", { text: "Step time, rank × step (every selected rank)" }) : "",
    rankStepChart || "",
    el(
      "div",
      {},
      multi
        ? dataTable(t.summary, {
            columns: ["worker", "rank", "step_time_ms", "gpu_busy_pct", "tensor_core_time_pct_est", "est_occupancy_pct"],
            labels: { tensor_core_time_pct_est: "tensor_core_time_pct (est.)" },
            caption: "Median over the selected steps",
          })
        : null,
    ),
    el("h3", { text: "Step time breakdown" }),
    breakdownChart,
    el("h3", { text: "GPU busy and tensor-core time per step" }),
    utilChart,
    el("h3", { text: "Findings" }),
    findingsBox,
    el("h3", { text: "Per step" }),
    el(
      "div",
      {},
      ...["step_summary", "breakdown", "summary", "findings"].map((tb) =>
        downloadLink(`${tb} CSV`, "csv", { ...ctx.selection, view: "overview", table: tb }),
      ),
    ),
    dataTable(t.step_summary, {
      columns: ["worker", "step", "step_time_ms", "gpu_busy_pct", "tensor_core_time_pct_est", "est_occupancy_pct", "sm_occupancy_note"],
      labels: { tensor_core_time_pct_est: "tensor_core_time_pct (est.)" },
    }),
  );
  box.querySelector("table.data:last-of-type").classList.add("step-summary-table");
  if (rankStepChart) {
    const rs = rowsOf(t.rank_step);
    const ranks = [...new Set(rs.map((r) => r.rank))].sort((a, b) => a - b);
    const stepsSeen = [...new Set(rs.map((r) => r.step))].sort((a, b) => a - b);
    const at = new Map(rs.map((r) => [`${r.rank}:${r.step}`, r.step_time_ns / 1e6]));
    await newPlot(ctx, rankStepChart, [{
      type: "heatmap",
      x: stepsSeen.map(String),
      y: ranks.map(String),
      z: ranks.map((k) => stepsSeen.map((st) => at.get(`${k}:${st}`) ?? null)),
      colorscale: "Viridis",
      hoverongaps: false,
      hovertemplate: "rank %{y} · step %{x}<br>step time: %{z:.3f} ms<extra></extra>",
    }], {
      height: 320,
      xaxis: { title: { text: "step" }, type: "category" },
      yaxis: { title: { text: "rank" } },
      margin: { t: 10 },
    });
  }
  await newPlot(ctx, breakdownChart, traces, {
    barmode: "stack",
    yaxis: { title: { text: "ms" } },
    height: 380,
    legend: { orientation: "h", y: 1.12 },
  });
  const workers = [...new Set(perStep.map((r) => r.worker))];
  const util = [];
  for (const w of workers) {
    const rs = perStep.filter((r) => r.worker === w);
    for (const [col, label, dash] of [["gpu_busy_pct", "GPU busy %", "solid"], ["tensor_core_time_pct_est", "tensor-core % (est.)", "dot"]]) {
      util.push({
        type: "scatter",
        mode: "lines+markers",
        name: `${escapeHtml(w)} ${label}`,
        x: rs.map((r) => r.step),
        y: rs.map((r) => r[col]),
        line: { dash },
        hovertemplate: `${escapeHtml(w)} step %{x}: %{y:.1f}% ${label}<extra></extra>`,
      });
    }
  }
  await newPlot(ctx, utilChart, util, {
    height: 280,
    xaxis: { title: { text: "step" }, dtick: 1 },
    yaxis: { title: { text: "%" }, range: [0, 100] },
  });
}

// Collectives (backend/collectives.py) ---------------------------------------------------------

const COLLECTIVE_METRICS = [
  ["busbw", "bus bandwidth (GB/s)"],
  ["wait", "wait (ns)"],
  ["overlap", "overlap with compute (%)"],
  ["count", "kernels"],
];

function heatmapTrace(h, metricLabel) {
  return {
    type: "heatmap",
    x: h.columns.map((c) => escapeHtml(c)),
    y: h.rows.map((r) => escapeHtml(r)),
    z: h.z,
    colorscale: "Viridis",
    hoverongaps: false,
    hovertemplate: `%{y} · %{x}<br>${metricLabel} (${h.value_column}): %{z}<extra></extra>`,
  };
}

// Smallest colour range of the rank x step heatmap, in % from the median: a spread of a few
// percent (264-270 GB/s) stays one colour; a rank 10% off or more stands out.
const RANK_STEP_MIN_RANGE_PCT = 10;

/** The rank x step heatmap coloured by each cell's difference from the median of all cells
 * (%, diverging scale centred on 0, at least ±RANK_STEP_MIN_RANGE_PCT), so that uniform reads
 * as uniform; the hover shows the value itself. Raw values where the median is 0. */
function rankStepTrace(h, metricLabel) {
  const trace = heatmapTrace(h, metricLabel);
  const values = h.z.flat().filter((v) => v !== null && Number.isFinite(v)).sort((a, b) => a - b);
  if (!values.length) return trace;
  const mid = values.length >> 1;
  const median = values.length % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
  if (!(median > 0)) return trace;
  const pct = h.z.map((row) => row.map((v) => (v === null ? null : (100 * (v - median)) / median)));
  const spread = Math.max(RANK_STEP_MIN_RANGE_PCT, ...pct.flat().filter((v) => v !== null).map(Math.abs));
  return {
    ...trace,
    z: pct,
    customdata: h.z,
    zmid: 0,
    zmin: -spread,
    zmax: spread,
    colorscale: "RdBu",
    colorbar: { title: { text: `% vs median<br>${median.toPrecision(4)}` } },
    hovertemplate:
      `%{y} · %{x}<br>${metricLabel} (${h.value_column}): %{customdata}` +
      `<br>%{z:+.1f}% vs the median ${median.toPrecision(4)}<extra></extra>`,
  };
}

async function collectivesView(box, ctx) {
  const metric = ctx.state.metric || "busbw";
  const data = await ctx.fetch("collectives", { metric });
  ctx.showErrors(data.errors);
  const label = COLLECTIVE_METRICS.find(([m]) => m === metric)[1];
  const controls = el(
    "div",
    { className: "view-controls" },
    el("label", {}, "Colour ", stateSelect(ctx, "metric", COLLECTIVE_METRICS, metric, "metric-select")),
    ...["type_size", "rank_step", "instances", "stragglers", "mismatches"].map((tb) =>
      downloadLink(`${tb} CSV`, "csv", { ...ctx.selection, view: "collectives", metric, table: tb }),
    ),
  );
  if (!data.num_kernels) {
    box.replaceChildren(controls, note("info", "No NCCL collective kernels in this selection."));
    return;
  }
  const typeSize = el("div", { className: "chart heatmap-type-size" });
  const rankStep = el("div", { className: "chart heatmap-rank-step" });
  const t = data.tables;
  box.replaceChildren(
    controls,
    data.index ? el("div", { className: "note info collectives-index", text: data.index.note }) : "",
    el(
      "div",
      { className: "two-col" },
      el("div", {}, el("h3", { text: "Collective type × message size" }), typeSize),
      el("div", {}, el("h3", { text: "Rank × step" }), rankStep),
    ),
    el("h3", { text: "Type × size" }),
    dataTable(t.type_size, { className: "type-size" }),
    el("h3", { text: "Stragglers (ranks the others waited for)" }),
    dataTable(t.stragglers),
    el("h3", { text: "Rank × step" }),
    dataTable(t.rank_step),
    el("h3", { text: `Instances (${t.instances.total_rows})` }),
    dataTable(t.instances, {
      columns: ["process_group", "step", "ordinal", "collective_type", "size_bytes", "n_members", "complete", "transfer_ns", "max_wait_ns", "straggler_worker", "algbw_gbps", "busbw_gbps", "busbw_note"],
      maxRows: 200,
    }),
    el("div", {}, t.mismatches.total_rows ? [el("h3", { text: "Mismatched instances" }), dataTable(t.mismatches)] : null),
  );
  const tables = box.querySelectorAll("table.data");
  tables[0].classList.add("collectives-type-size");
  tables[2].classList.add("collectives-rank-step");
  await newPlot(ctx, typeSize, [heatmapTrace(data.heatmaps.type_size, label)], {
    height: 300,
    margin: { l: 120, b: 90, t: 10 },
  });
  await newPlot(ctx, rankStep, [rankStepTrace(data.heatmaps.rank_step, label)], {
    height: 300,
    xaxis: { title: { text: "step" }, type: "category" },
    yaxis: { title: { text: "rank" }, type: "category" },
    margin: { t: 10 },
  });
}

// Memory (backend/memory.py) ------------------------------------------------------------------

async function memoryView(box, ctx) {
  const data = await ctx.fetch("memory");
  ctx.showErrors(data.errors);
  const t = data.tables;
  const curves = rowsOf(t.curves);
  const peaks = rowsOf(t.peaks);
  const links = el(
    "div",
    { className: "view-controls" },
    ...["curves", "peaks", "allocations"].map((tb) =>
      downloadLink(`${tb} CSV`, "csv", { ...ctx.selection, view: "memory", table: tb }),
    ),
  );
  if (!curves.length) {
    box.replaceChildren(links, note("info", "No [memory] events in this selection: profile with profile_memory=True to see allocations."));
    return;
  }
  const chart = el("div", { className: "chart memory-chart" });
  const peakBox = el(
    "div",
    { className: "cards" },
    peaks.map((p) =>
      el(
        "div",
        { className: "card memory-peak" },
        el("div", { className: "label", text: `${p.worker} · ${p.device_type === 1 ? "GPU" : "CPU"} ${p.device_id} · peak allocated` }),
        el("div", { className: "value", text: fmtCell("peak_allocated_bytes", p.peak_allocated_bytes ?? p.peak_net_bytes) }),
        el("div", { className: "basis", text: `at ${fmtCell("t_ns", p.peak_ts_from_origin_ns)} (step ${p.peak_step}) in ${p.op || "no op"}` }),
        p.stack ? el("div", { className: "basis stack", text: p.stack }) : null,
        el("div", { className: "basis", text: `peak reserved ${fmtCell("peak_reserved_bytes", p.peak_reserved_bytes)}` }),
      ),
    ),
  );
  box.replaceChildren(
    links,
    peakBox,
    chart,
    el("h3", { text: `Allocations (${t.allocations.total_rows}, largest first)` }),
    dataTable(t.allocations, {
      columns: ["worker", "device_id", "size_bytes", "op", "alloc_ts_from_origin_ns", "free_ts_from_origin_ns", "lifetime_ns", "alloc_step", "addr"],
      labels: { alloc_ts_from_origin_ns: "alloc at", free_ts_from_origin_ns: "freed at", lifetime_ns: "lifetime" },
      maxRows: 500,
    }),
  );
  box.querySelector("table.data").classList.add("memory-allocations");
  const series = new Map();
  for (const r of curves) {
    if (r.device_type !== 1) continue;
    const key = `${r.worker} GPU ${r.device_id}`;
    if (!series.has(key)) series.set(key, []);
    series.get(key).push(r);
  }
  const traces = [];
  for (const [key, rs] of series) {
    const x = rs.map((r) => r.ts_from_origin_ns / 1e6);
    const name = escapeHtml(key);
    const hasTotal = rs.some((r) => r.allocated_bytes !== null);
    traces.push({
      type: "scatter",
      mode: "lines",
      line: { shape: "hv" },
      name: `${name} allocated`,
      x,
      y: rs.map((r) => (hasTotal ? r.allocated_bytes : r.net_bytes)),
      hovertemplate: `${name} allocated %{y:.4s}B at %{x:.3f} ms<extra></extra>`,
    });
    if (hasTotal) {
      traces.push({
        type: "scatter",
        mode: "lines",
        line: { shape: "hv", dash: "dot" },
        name: `${name} reserved`,
        x,
        y: rs.map((r) => r.reserved_bytes),
        hovertemplate: `${name} reserved %{y:.4s}B at %{x:.3f} ms<extra></extra>`,
      });
    }
  }
  for (const p of peaks) {
    if (p.device_type !== 1) continue;
    traces.push({
      type: "scatter",
      mode: "markers",
      marker: { size: 10, symbol: "star", color: "#d50000" },
      name: `peak ${escapeHtml(p.worker)} GPU ${p.device_id}`,
      x: [p.peak_ts_from_origin_ns / 1e6],
      y: [p.peak_allocated_bytes ?? p.peak_net_bytes],
      hovertemplate: `peak %{y:.4s}B<br>${escapeHtml(p.op || "no op")}<extra></extra>`,
    });
  }
  await newPlot(ctx, chart, traces, {
    height: 380,
    xaxis: { title: { text: "ms since the first selected step" } },
    yaxis: { title: { text: "bytes" }, tickformat: ".3s" },
    legend: { orientation: "h", y: -0.25 },
  });
}

// Roofline (backend/roofline.py, devices.py) ---------------------------------------------------

const ROOF_COLORS = { fp64: "#6d4c41", fp64_tensor: "#8d6e63", fp32: "#43a047", tf32: "#00897b", bf16: "#1e88e5", fp16: "#3949ab", fp8: "#8e24aa" };

function shortName(name, n = 90) {
  return name.length > n ? name.slice(0, n - 1) + "…" : name;
}

async function rooflineView(box, ctx) {
  const group = ctx.state.level === "op" ? "op" : "kernel";
  const data = await ctx.fetch("roofline", { group });
  ctx.showErrors(data.errors);
  const points = rowsOf(data.tables.points);
  const roofs = rowsOf(data.tables.roofs);
  const nameCol = group === "op" ? "op_name" : "kernel_name";
  const placeable = points.filter((p) => p.intensity_flops_per_byte > 0 && p.flops_per_s > 0);
  const unplaced = points.length - placeable.length;
  const controls = el(
    "div",
    { className: "view-controls" },
    el("label", {}, "Points per ", stateSelect(ctx, "level", [["", "kernel"], ["op", "operator"]], ctx.state.level === "op" ? "op" : "", "roofline-group")),
    downloadLink("points CSV", "csv", { ...ctx.selection, view: "roofline", group, table: "points" }),
    downloadLink("roofs CSV", "csv", { ...ctx.selection, view: "roofline", group, table: "roofs" }),
  );
  const chart = el("div", { className: "chart roofline-chart" });
  const devices = [...new Set(roofs.map((r) => r.device))];
  box.replaceChildren(
    controls,
    note(
      "info",
      `Roofs: dense datasheet peaks of ${devices.join(", ")} (${roofs[0] ? roofs[0].source : ""}). ` +
        `Filled circles: FLOPs and bytes measured by counters on these launches; filled diamonds: measured on another launch of the same kernel (name, grid, block: measured:same-kernel-instance); open points: derived from input shapes (compulsory bytes). ` +
        `${unplaced} of ${points.length} ${group === "op" ? "operators" : "kernels"} have no FLOPs or bytes to place and are only in the table.`,
    ),
    chart,
    el("h3", { text: `Points (${data.tables.points.total_rows})` }),
    dataTable(data.tables.points, {
      columns: [nameCol, ...(group === "op" ? ["op_input_dims"] : ["counters_same_instance_pct"]), "flops_source", "count", "dur_ns", "flops", "dram_bytes", "intensity_flops_per_byte", "flops_per_s", "path", "efficiency_pct", "headroom_ms", "bytes_source", "flops_note"],
      maxRows: 300,
    }),
  );
  box.querySelector("table.data").classList.add("roofline-points");
  const xs = placeable.map((p) => p.intensity_flops_per_byte);
  const xmin = Math.min(0.01, ...xs) / 2;
  const xmax = Math.max(1e4, ...xs) * 2;
  const traces = [];
  const memory = roofs.filter((r) => r.kind === "memory");
  const compute = roofs.filter((r) => r.kind === "compute");
  for (const m of memory) {
    const ridgeMax = Math.max(...compute.map((c) => c.ridge_flops_per_byte));
    traces.push({
      type: "scatter",
      mode: "lines",
      name: escapeHtml(`HBM ${(m.bw_bytes_per_s / 1e12).toFixed(2)} TB/s (${m.device})`),
      x: [xmin, ridgeMax],
      y: [m.bw_bytes_per_s * xmin, m.bw_bytes_per_s * ridgeMax],
      line: { color: "#424242", width: 2 },
      hoverinfo: "skip",
    });
  }
  for (const c of compute) {
    traces.push({
      type: "scatter",
      mode: "lines",
      name: escapeHtml(`${c.path} ${(c.peak_flops_per_s / 1e12).toFixed(0)} TFLOP/s`),
      x: [c.ridge_flops_per_byte, xmax],
      y: [c.peak_flops_per_s, c.peak_flops_per_s],
      line: { color: ROOF_COLORS[c.path] || "#757575", dash: "dash", width: 1.5 },
      hoverinfo: "skip",
    });
  }
  // Counters of the kernel's own launches (measured), of another launch of the same kernel
  // name, grid and block (measured:same-kernel-instance), or FLOPs/bytes from shapes (derived).
  const kindOf = (p) => (!p.measured ? "derived" : p.counters_same_instance_pct === 100 ? "instance" : "own");
  for (const [kind, label, symbol] of [["own", "measured", "circle"], ["instance", "measured on another launch of the same kernel", "diamond"], ["derived", "derived", "circle-open"]]) {
    const measured = kind !== "derived";
    const ps = placeable.filter((p) => kindOf(p) === kind);
    traces.push({
      type: "scatter",
      mode: "markers",
      name: `${label} (${ps.length})`,
      x: ps.map((p) => p.intensity_flops_per_byte),
      y: ps.map((p) => p.flops_per_s),
      marker: {
        symbol,
        size: ps.map((p) => 6 + Math.min(14, Math.sqrt(p.dur_ns / 1e5))),
        color: measured ? "#d84315" : "#1565c0",
        line: { width: 1.5, color: measured ? "#bf360c" : "#1565c0" },
      },
      customdata: ps.map((p) => [
        escapeHtml(shortName(p[nameCol])),
        fmtCell("n", p.flops),
        fmtCell("x_bytes", p.dram_bytes),
        fmtCell("x_pct", p.efficiency_pct),
        escapeHtml(p.flops_source),
        fmtCell("x_ns", p.dur_ns),
        escapeHtml(p.path || "?"),
      ]),
      hovertemplate:
        "%{customdata[0]}<br>FLOPs %{customdata[1]} · DRAM bytes %{customdata[2]}<br>" +
        "%{x:.3g} FLOP/byte · %{y:.3s}FLOP/s · %{customdata[6]}<br>" +
        "efficiency %{customdata[3]} of the roof · time %{customdata[5]} · %{customdata[4]}<extra></extra>",
    });
  }
  await newPlot(ctx, chart, traces, {
    height: 520,
    xaxis: { type: "log", title: { text: "operational intensity (FLOP / DRAM byte)" }, range: [Math.log10(xmin), Math.log10(xmax)] },
    yaxis: { type: "log", title: { text: "achieved FLOP/s" }, tickformat: ".2s" },
    legend: { orientation: "v" },
  });
}

// Stalls (backend/stalls.py) -------------------------------------------------------------------

const STALL_COLORS = { memory: "#1e88e5", dependency: "#fb8c00", structural: "#8e24aa", "not a stall": "#9e9e9e" };
const STALL_GROUPS = [["kernel", "kernel"], ["op", "operator"], ["step", "worker and step"], ["total", "all kernels"]];
const MAX_STALL_GROUPS = 25;

async function stallsView(box, ctx) {
  const group = STALL_GROUPS.some(([g]) => g === ctx.state.level) ? ctx.state.level : "kernel";
  const data = await ctx.fetch("stalls", { group });
  ctx.showErrors(data.errors);
  const controls = el(
    "div",
    { className: "view-controls" },
    el("label", {}, "Group by ", stateSelect(ctx, "level", STALL_GROUPS, group, "stall-group")),
    data.available ? downloadLink("reasons CSV", "csv", { ...ctx.selection, view: "stalls", group, table: "reasons" }) : null,
  );
  if (!data.available) {
    box.replaceChildren(
      controls,
      note(
        "warn",
        el("b", { text: "No stall breakdown: " }),
        `${data.note}. Stall reasons come only from Nsight Compute counters; nothing is estimated without them. Collect them with:`,
        el("pre", { className: "collect-command", text: data.collect_command }),
        el("details", {}, el("summary", { text: `missing counters (${data.missing_counters.length})` }), el("ul", {}, data.missing_counters.map((m) => el("li", { text: m })))),
      ),
    );
    return;
  }
  const keys = data.group_keys;
  const label = (r) => (keys.length ? keys.map((k) => r[k]).join(" · ") : "all kernels");
  const cats = rowsOf(data.tables.categories);
  const groups = [...new Set(cats.map(label))].slice(0, MAX_STALL_GROUPS);
  const chart = el("div", { className: "chart stall-chart" });
  const drill = el("div", { className: "stall-drill" });
  box.replaceChildren(
    controls,
    note("info", `${data.note}. Shares of stall warp-cycles; click a bar for its reasons.`),
    chart,
    drill,
  );
  const traces = Object.keys(data.category_reasons).map((c) => {
    const byGroup = new Map(cats.filter((r) => r.category === c).map((r) => [label(r), r.share_pct]));
    return {
      type: "bar",
      orientation: "h",
      name: c,
      y: groups.map((g) => escapeHtml(shortName(g, 60))),
      x: groups.map((g) => byGroup.get(g) ?? 0),
      customdata: groups.map((g) => escapeHtml(shortName(g, 200))),
      marker: { color: STALL_COLORS[c] },
      hovertemplate: `%{customdata}<br>${c}: %{x:.1f}% of stall cycles<extra></extra>`,
    };
  });
  const reasons = rowsOf(data.tables.reasons);
  const showReasons = async (g) => {
    const rs = reasons.filter((r) => label(r) === g && r.share_pct !== null);
    drill.replaceChildren(el("h3", { className: "drill-title", text: `Reasons: ${shortName(g, 160)}` }));
    const reasonChart = el("div", { className: "chart stall-reasons-chart" });
    drill.append(reasonChart);
    // same_instance_kernels: kernels whose counters were measured on another launch of the
    // same kernel (measured:same-kernel-instance), not on their own
    const cols = ["reason", "category", "share_pct", "cycles_per_issued_inst", "kernels", "same_instance_kernels", "low_confidence_kernels"];
    const table = {
      columns: cols,
      data: cols.map((c) => reasons.filter((r) => label(r) === g).map((r) => r[c] ?? null)),
    };
    drill.append(dataTable(table));
    await newPlot(ctx, reasonChart, [
      {
        type: "bar",
        x: rs.map((r) => r.reason),
        y: rs.map((r) => r.share_pct),
        marker: { color: rs.map((r) => STALL_COLORS[r.category]) },
        customdata: rs.map((r) => [r.category, r.cycles_per_issued_inst]),
        hovertemplate: "%{x} (%{customdata[0]}): %{y:.1f}%<br>%{customdata[1]:.3f} cycles per issued instruction<extra></extra>",
      },
    ], { height: 300, yaxis: { title: { text: "% of stall cycles" } } });
  };
  await newPlot(ctx, chart, traces, {
    barmode: "stack",
    height: Math.max(260, 26 * groups.length + 90),
    margin: { l: 420, t: 30 },
    xaxis: { title: { text: "% of stall warp-cycles" }, range: [0, 100] },
    yaxis: { autorange: "reversed", automargin: false },
    legend: { orientation: "h", y: 1.08 },
  });
  chart.on("plotly_click", (ev) => {
    const i = ev.points[0].pointIndex;
    showReasons(groups[i]);
  });
  if (groups.length) await showReasons(groups[0]);
}

// Compare (backend/compare.py) ----------------------------------------------------------------

const DELTA_COLUMNS = {
  op_deltas: ["name", "status", "a_device_self_ns", "b_device_self_ns", "delta_device_self_ns", "a_host_self_ns", "b_host_self_ns", "delta_host_self_ns", "a_calls", "b_calls"],
  kernel_deltas: ["kernel", "op", "kind", "status", "a_total_dur_ns", "b_total_dur_ns", "delta_total_dur_ns", "a_calls", "b_calls"],
  kernel_changes: ["status", "kernel", "op", "kind", "a_total_dur_ns", "b_total_dur_ns", "a_calls", "b_calls", "a_name", "b_name"],
  collective_deltas: ["collective_type", "size_bucket", "status", "a_busbw_median_gbps", "b_busbw_median_gbps", "delta_busbw_median_gbps", "delta_busbw_pct", "a_n_instances", "b_n_instances"],
};
const DELTA_LABELS = {
  a_device_self_ns: "A device self", b_device_self_ns: "B device self", delta_device_self_ns: "Δ device self",
  a_host_self_ns: "A host self", b_host_self_ns: "B host self", delta_host_self_ns: "Δ host self",
  a_total_dur_ns: "A time", b_total_dur_ns: "B time", delta_total_dur_ns: "Δ time",
  a_calls: "A calls", b_calls: "B calls", a_name: "A full name", b_name: "B full name",
  a_busbw_median_gbps: "A busbw (GB/s)", b_busbw_median_gbps: "B busbw (GB/s)",
  delta_busbw_median_gbps: "Δ busbw (GB/s)", delta_busbw_pct: "Δ busbw %",
  a_n_instances: "A instances", b_n_instances: "B instances",
};
const MAX_DELTA_ROWS = 50;

async function compareView(box, ctx) {
  const runs = (ctx.app ? ctx.app.listing.runs : []).filter((r) => !r.error).map((r) => r.name);
  const baseline = ctx.state.baseline || runs.find((r) => r !== ctx.state.run);
  const controls = el(
    "div",
    { className: "view-controls" },
    el("label", {}, "Baseline (A) ", stateSelect(ctx, "baseline", runs.map((r) => [r, r]), baseline, "baseline-select")),
    el("span", { className: "compare-run", text: ` against the run (B) ${ctx.state.run}` }),
  );
  if (!baseline) {
    box.replaceChildren(controls, note("info", "Choose a baseline run to compare against."));
    return;
  }
  const data = await ctx.fetch("compare", { baseline });
  for (const e of data.errors) ctx.showErrors([{ worker: `${e.side} ${e.run} ${e.worker}`, step: e.step, error: e.error }]);
  const t = data.tables;
  const medians = rowsOf(t.step_medians);
  const step = medians.find((r) => r.figure === "step_time_ms");
  const slower = data.slowdown_pct > 0;
  const verdict = data.slowdown_pct === 0 ? "B is as fast" : slower ? "B is slower" : "B is faster";
  const sign = (v) => (v > 0 ? "+" : "");
  const cards = el(
    "div",
    { className: "cards" },
    card(`A: ${data.baseline}`, fmtCell("step_time_ms", step.a), "median step time", "card-a"),
    card(`B: ${data.run}`, fmtCell("step_time_ms", step.b), "median step time", "card-b"),
    card(
      verdict,
      `${sign(step.delta)}${fmtCell("x_ms", step.delta)} (${sign(data.slowdown_pct)}${fmtCell("x_pct", data.slowdown_pct)})`,
      "medians over each run's (worker, step) pairs",
      `card-delta ${slower ? "slower" : "faster"}`,
    ),
  );
  const chart = el("div", { className: "chart compare-chart" });
  const section = (title, key) =>
    el(
      "div",
      { className: `compare-section ${key}` },
      el("h3", { text: `${title} (${t[key].total_rows})` }),
      t[key].total_rows
        ? dataTable(t[key], { columns: DELTA_COLUMNS[key], labels: DELTA_LABELS, maxRows: MAX_DELTA_ROWS })
        : note("info", "none"),
      downloadLink("CSV", "csv", { ...ctx.selection, baseline, view: "compare", table: key }),
    );
  box.replaceChildren(
    controls,
    cards,
    dataTable(t.runs, { caption: "Compared selections" }),
    el("h3", { text: "Per-step medians" }),
    chart,
    dataTable(t.step_medians),
    section("New and vanished kernels", "kernel_changes"),
    section("Kernels by change in time per worker-step", "kernel_deltas"),
    section("Operators by change in self time per worker-step", "op_deltas"),
    section("Collectives: bus bandwidth by type and size", "collective_deltas"),
  );
  box.querySelector("table.data").classList.add("compare-runs");
  const ms = medians.filter((r) => r.figure.endsWith("_ms"));
  const traces = [["a", data.baseline, "#90a4ae"], ["b", data.run, "#1e88e5"]].map(([k, name, color]) => ({
    type: "bar",
    name: `${k.toUpperCase()}: ${escapeHtml(name)}`,
    x: ms.map((r) => r.figure.replace(/_ms$/, "")),
    y: ms.map((r) => r[k]),
    marker: { color },
    hovertemplate: `%{x}: %{y:.3f} ms<extra>${k.toUpperCase()}</extra>`,
  }));
  await newPlot(ctx, chart, traces, {
    barmode: "group",
    height: 320,
    yaxis: { title: { text: "ms per step (median)" } },
    legend: { orientation: "h", y: 1.15 },
  });
}

export const VIEWS = {
  overview: overviewView,
  timeline: renderTimeline,
  operators: topkView("operators"),
  kernels: topkView("kernels"),
  memory: memoryView,
  roofline: rooflineView,
  stalls: stallsView,
  collectives: collectivesView,
  compare: compareView,
};

export { column, escapeHtml, fmtCell, newPlot, rowsOf, stateInput, stateSelect };
