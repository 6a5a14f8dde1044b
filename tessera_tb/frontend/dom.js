// DOM and data helpers shared by every view. Text always goes in through textContent; no
// element ever gets an on* attribute or inline script (TensorBoard's CSP blocks them).

/** Create an element. `props`: className, text, title, href, target, type, value, dataset,
 * attrs (plain attributes), on (event name -> listener). Children: nodes or strings. */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "className") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "on") {
      for (const [ev, fn] of Object.entries(value)) node.addEventListener(ev, fn);
    } else if (key === "attrs") {
      for (const [a, v] of Object.entries(value)) {
        if (a.toLowerCase().startsWith("on")) throw new Error("no on* attributes");
        node.setAttribute(a, String(v));
      }
    } else node[key] = value;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Escape text for places that interpret HTML markup (plotly hover and tick labels). */
export function escapeHtml(text) {
  return String(text)
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;")
    .replaceAll("'", "&#39;");
}

/** Query string of the non-empty values of `params`. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  return q.toString();
}

/** GET a plugin route (relative to the plugin's base href) and parse its JSON. Errors carry
 * the server's one-line message. */
export async function getJSON(route, params = {}, signal = undefined) {
  const qs = query(params);
  const response = await fetch(`./${route}${qs ? "?" + qs : ""}`, { signal });
  if (!response.ok) {
    const text = (await response.text()).trim();
    throw new Error(`${route}: ${text || response.status}`);
  }
  return response.json();
}

/** Rows of a column-wise table payload ({columns, data}) as objects. */
export function rowsOf(table) {
  if (!table || !table.columns) return [];
  const n = table.data.length ? table.data[0].length : 0;
  const rows = new Array(n);
  for (let i = 0; i < n; i++) {
    const row = {};
    table.columns.forEach((c, j) => (row[c] = table.data[j][i]));
    rows[i] = row;
  }
  return rows;
}

/** One column of a table payload, or undefined when absent. */
export function column(table, name) {
  const j = table && table.columns ? table.columns.indexOf(name) : -1;
  return j < 0 ? undefined : table.data[j];
}

const UNIT_FORMATS = {
  ns: (v) => fmtDuration(v),
  ms: (v) => fmtNumber(v) + " ms",
  us: (v) => fmtNumber(v) + " µs",
  pct: (v) => fmtNumber(v) + " %",
  bytes: (v) => fmtBytes(v),
};
// The unit is the first unit word of a column name: dur_ns, busy_pct, win_ms_per_step,
// tensor_core_time_pct_est, size_bytes.
const UNIT_IN_NAME = /(?:^|_)(ns|ms|us|pct|bytes)(?:_|$)/;

/** Format a cell by the unit in its column's name (dur_ns -> "1.23 ms"). */
export function fmtCell(name, value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "number") {
    const m = UNIT_IN_NAME.exec(name);
    return m ? UNIT_FORMATS[m[1]](value) : fmtNumber(value);
  }
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

export function fmtNumber(v) {
  if (v === null || v === undefined) return "—";
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(3);
  return v.toLocaleString("en-US", { maximumFractionDigits: a >= 100 ? 1 : 3 });
}

export function fmtDuration(ns) {
  if (ns === null || ns === undefined) return "—";
  const a = Math.abs(ns);
  if (a >= 1e9) return (ns / 1e9).toFixed(3) + " s";
  if (a >= 1e6) return (ns / 1e6).toFixed(3) + " ms";
  if (a >= 1e3) return (ns / 1e3).toFixed(2) + " µs";
  return ns.toFixed(0) + " ns";
}

export function fmtBytes(b) {
  if (b === null || b === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let v = b;
  let i = 0;
  while (Math.abs(v) >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return (i ? v.toFixed(2) : v.toFixed(0)) + " " + units[i];
}

/** A sortable HTML table of a column-wise payload. `opts`: columns (names to show, default
 * all), labels, onRowClick(row), maxRows, caption. */
export function dataTable(table, opts = {}) {
  const names = opts.columns || table.columns;
  const labels = opts.labels || {};
  let rows = rowsOf(table);
  let sortKey = null;
  let sortDesc = true;
  const tbody = el("tbody");
  const fill = () => {
    tbody.replaceChildren();
    const shown = opts.maxRows ? rows.slice(0, opts.maxRows) : rows;
    for (const row of shown) {
      const tr = el(
        "tr",
        opts.onRowClick ? { className: "clickable", on: { click: () => opts.onRowClick(row) } } : {},
        names.map((c) =>
          el("td", { className: typeof row[c] === "number" ? "num" : "", text: fmtCell(c, row[c]) }),
        ),
      );
      tbody.append(tr);
    }
  };
  const head = el(
    "tr",
    {},
    names.map((c) =>
      el("th", {
        text: labels[c] || c,
        title: "sort by " + c,
        on: {
          click: () => {
            sortDesc = sortKey === c ? !sortDesc : true;
            sortKey = c;
            const sign = sortDesc ? -1 : 1;
            rows = [...rows].sort((a, b) => {
              const x = a[c];
              const y = b[c];
              if (x === y) return 0;
              if (x === null || x === undefined) return 1;
              if (y === null || y === undefined) return -1;
              return (x < y ? -1 : 1) * sign;
            });
            fill();
          },
        },
      }),
    ),
  );
  fill();
  return el(
    "table",
    { className: "data" },
    opts.caption ? el("caption", { text: opts.caption }) : null,
    el("thead", {}, head),
    tbody,
  );
}

/** A link that downloads a route's answer (CSV or trace) with the given parameters. */
export function downloadLink(label, route, params) {
  return el("a", {
    className: "download",
    text: label,
    href: `./${route}?${query(params)}`,
    attrs: { download: "" },
  });
}

/** A message box (info, warn or error). */
export function note(kind, ...content) {
  return el("div", { className: `note ${kind}` }, ...content);
}

// The run header's device and version lines, shared by the tab and the offline report.
export function describeDevices(header) {
  return header.devices
    .map(
      (d) =>
        `${d.count} × ${d.name} (${d.num_sms} SMs, ${(d.memory_bytes / 1e9).toFixed(1)} GB, ` +
        `compute ${d.compute_capability})`,
    )
    .join("; ");
}

export function describeVersions(header) {
  return Object.entries(header.versions)
    .map(([k, v]) => `${k} ${v}`)
    .join(", ");
}
