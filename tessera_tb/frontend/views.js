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

// Views not built yet answer with the route's own message.
async function pendingView(box, ctx) {
  const route = ctx.state.view;
  const data = await ctx.fetch(route);
  box.replaceChildren(note("info", `No renderer for ${route} yet.`), el("pre", { text: JSON.stringify(data).slice(0, 2000) }));
}

export const VIEWS = {
  overview: pendingView,
  timeline: renderTimeline,
  operators: topkView("operators"),
  kernels: topkView("kernels"),
  memory: pendingView,
  roofline: pendingView,
  stalls: pendingView,
  collectives: pendingView,
};

export { column, escapeHtml, fmtCell, newPlot, rowsOf, stateInput, stateSelect };
