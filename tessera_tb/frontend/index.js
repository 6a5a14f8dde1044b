// Tessera Profiler: the TensorBoard tab. TensorBoard loads this ES module in the plugin's
// iframe (base href "plugin/tessera/") and calls render(). Every request is relative, so the
// tab works under --path_prefix. The selection (run, workers, steps, view and the view's own
// settings) lives in the page URL's hash, so a copied link opens the same view.

import { describeDevices, describeVersions, el, getJSON, note } from "./static/dom.js";
import { VIEWS } from "./static/views.js";

const STATE_PREFIX = "t.";
const STATE_KEYS = [
  "run", "workers", "steps", "view", "step", "k", "sort", "q", "table", "metric",
  "t0", "t1", "items", "level", "baseline",
];
const VIEW_LABELS = [
  ["overview", "Overview"],
  ["timeline", "Timeline"],
  ["operators", "Operators"],
  ["kernels", "Kernels"],
  ["memory", "Memory"],
  ["roofline", "Roofline"],
  ["stalls", "Stalls"],
  ["collectives", "Collectives"],
  ["compare", "Compare"],
];
const LISTING_POLL_MS = 30000;

// The URL whose hash holds the state: TensorBoard's page (same origin) when reachable, so a
// link to the page reopens the view; else this frame.
function stateWindow() {
  try {
    if (window.parent && window.parent !== window && window.parent.location.href) {
      return window.parent;
    }
  } catch (e) {
    // another origin: keep the state in this frame
  }
  return window;
}

function readState() {
  const state = {};
  const hash = stateWindow().location.hash.replace(/^#/, "");
  for (const part of hash.split("&")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const key = decodeURIComponent(part.slice(0, eq));
    if (key.startsWith(STATE_PREFIX)) {
      state[key.slice(STATE_PREFIX.length)] = decodeURIComponent(part.slice(eq + 1));
    }
  }
  return state;
}

function writeState(state) {
  const win = stateWindow();
  const hash = win.location.hash.replace(/^#/, "");
  const kept = hash
    .split("&")
    .filter((p) => p && !decodeURIComponent(p.split("=")[0]).startsWith(STATE_PREFIX));
  if (win !== window && kept.length === 0) kept.push("tessera");
  for (const key of STATE_KEYS) {
    const v = state[key];
    if (v !== undefined && v !== null && v !== "") {
      kept.push(encodeURIComponent(STATE_PREFIX + key) + "=" + encodeURIComponent(v));
    }
  }
  const url = new URL(win.location.href);
  url.hash = kept.join("&");
  win.history.replaceState(win.history.state, "", url.toString());
}

let plotlyPromise = null;
/** Load plotly.js once, from the plugin's own static route (no CDN). */
export function loadPlotly() {
  if (!plotlyPromise) {
    plotlyPromise = new Promise((resolve, reject) => {
      if (window.Plotly) return resolve(window.Plotly);
      const script = el("script", { src: "./static/plotly.min.js" });
      script.addEventListener("load", () => resolve(window.Plotly));
      script.addEventListener("error", () => reject(new Error("plotly.min.js did not load")));
      document.head.append(script);
    });
  }
  return plotlyPromise;
}

class App {
  constructor(root) {
    this.root = root;
    this.state = readState();
    this.listing = null;
    this.header = null;
    this.renderToken = 0;
  }

  get run() {
    return this.listing.runs.find((r) => r.name === this.state.run);
  }

  /** Workers of the current run that can be read. */
  get workers() {
    return (this.run ? this.run.workers : []).filter((w) => !w.error);
  }

  async start() {
    this.root.replaceChildren(el("div", { className: "loading", text: "Loading runs…" }));
    this.listing = await getJSON("runs");
    this.normalizeState();
    this.layout();
    await this.showHeader();
    await this.showView();
    setInterval(() => this.pollListing(), LISTING_POLL_MS);
    // A link entered or pasted into the open tab (only the hash differs) changes the view
    // in place; the page does not reload for it.
    stateWindow().addEventListener("hashchange", () => this.followHash());
  }

  /** Take the state from the URL's hash when it differs from what is on screen. */
  followHash() {
    const next = readState();
    const same = STATE_KEYS.every((k) => (next[k] ?? "") === (this.state[k] ?? ""));
    if (same) return;
    const runChanged = (next.run ?? "") !== (this.state.run ?? "");
    this.state = next;
    this.normalizeState();
    this.fillSelectors();
    if (runChanged) this.showHeader();
    this.showView();
  }

  async pollListing() {
    try {
      const listing = await getJSON("runs");
      if (JSON.stringify(listing) !== JSON.stringify(this.listing)) {
        this.listing = listing;
        this.fillSelectors();
      }
    } catch (e) {
      // the next poll tries again
    }
  }

  showLogdirError() {
    const problem = this.listing.logdir_error;
    this.logdirBox.replaceChildren(problem ? note("error", `Log directory: ${problem}`) : "");
  }

  normalizeState() {
    const runs = this.listing.runs.filter((r) => !r.error);
    if (!this.run || this.run.error) this.state.run = runs.length ? runs[0].name : undefined;
    if (!this.state.view || !VIEWS[this.state.view]) this.state.view = "overview";
    writeState(this.state);
  }

  setState(patch, { rerender = true, header = false } = {}) {
    Object.assign(this.state, patch);
    for (const [k, v] of Object.entries(patch)) if (v === undefined) delete this.state[k];
    writeState(this.state);
    if (header) this.showHeader();
    if (rerender) this.showView();
  }

  layout() {
    this.runSelect = el("select", {
      className: "run-select",
      on: {
        change: () =>
          this.setState(
            { run: this.runSelect.value, workers: undefined, steps: undefined, step: undefined },
            { header: true },
          ),
      },
    });
    this.workerSelect = el("select", {
      className: "worker-select",
      on: { change: () => this.setState({ workers: this.workerSelect.value || undefined }) },
    });
    this.rankInput = el("input", {
      className: "rank-input",
      type: "text",
      placeholder: "ranks e.g. 0-3",
      title: "select workers by rank range (Enter)",
      on: {
        change: () => {
          const v = this.rankInput.value.trim();
          this.setState({ workers: v ? "ranks:" + v : undefined });
        },
      },
    });
    this.stepFrom = el("select", { className: "step-from", on: { change: () => this.stepsChanged() } });
    this.stepTo = el("select", { className: "step-to", on: { change: () => this.stepsChanged() } });
    this.tabs = el(
      "nav",
      { className: "views" },
      VIEW_LABELS.map(([id, label]) =>
        el("button", {
          className: "view-tab",
          dataset: { view: id },
          text: label,
          on: { click: () => this.setState({ view: id }) },
        }),
      ),
    );
    this.headerBox = el("div", { className: "run-header" });
    this.logdirBox = el("div", { className: "logdir-error" });
    this.errorBox = el("div", { className: "errors" });
    this.viewBox = el("div", { className: "view" });
    this.root.replaceChildren(
      el(
        "div",
        { className: "toolbar" },
        el("label", {}, "Run ", this.runSelect),
        el("label", {}, "Workers ", this.workerSelect, " ", this.rankInput),
        el("label", {}, "Steps ", this.stepFrom, " – ", this.stepTo),
      ),
      this.logdirBox,
      this.headerBox,
      this.tabs,
      this.errorBox,
      this.viewBox,
    );
    this.fillSelectors();
  }

  fillSelectors() {
    this.showLogdirError();
    this.runSelect.replaceChildren(
      ...this.listing.runs.map((r) =>
        el("option", {
          value: r.name,
          text: r.error ? `${r.name} (unreadable)` : r.name,
          title: r.error || "",
          disabled: !!r.error,
          selected: r.name === this.state.run,
        }),
      ),
    );
    const workers = this.workers;
    const options = [["", `all workers (${workers.length})`]];
    const hosts = [...new Set(workers.map((w) => w.host).filter((h) => h))];
    if (hosts.length > 1) for (const h of hosts) options.push(["host:" + h, "host " + h]);
    const groups = new Map();
    for (const w of workers) for (const pg of w.process_groups || []) groups.set(pg.name, pg);
    if (groups.size > 1) {
      for (const pg of groups.values()) {
        options.push(["pg:" + pg.name, `group ${pg.desc || pg.name} (ranks ${pg.ranks_text})`]);
      }
    }
    for (const w of workers) {
      options.push([w.name, w.rank >= 0 ? `${w.name} (rank ${w.rank})` : w.name]);
    }
    const current = this.state.workers || "";
    if (current && !options.some(([v]) => v === current)) options.push([current, current]);
    this.workerSelect.replaceChildren(
      ...options.map(([v, t]) => el("option", { value: v, text: t, selected: v === current })),
    );
    const steps = [...new Set(workers.flatMap((w) => w.steps.map((s) => s.step)))].sort((a, b) => a - b);
    let [lo, hi] = [steps[0], steps[steps.length - 1]];
    const chosen = this.state.steps || (this.run ? this.run.default_steps : "");
    if (chosen) {
      const m = chosen.match(/^(-?\d+)(?:-(-?\d+))?$/);
      if (m) [lo, hi] = [Number(m[1]), Number(m[2] ?? m[1])];
    }
    const stepOptions = (sel) =>
      steps.map((s) => el("option", { value: String(s), text: String(s), selected: s === sel }));
    this.stepFrom.replaceChildren(...stepOptions(lo));
    this.stepTo.replaceChildren(...stepOptions(hi));
    for (const b of this.tabs.querySelectorAll("button")) {
      b.classList.toggle("active", b.dataset.view === this.state.view);
    }
  }

  stepsChanged() {
    let lo = Number(this.stepFrom.value);
    let hi = Number(this.stepTo.value);
    if (hi < lo) [lo, hi] = [hi, lo];
    this.setState({ steps: lo === hi ? String(lo) : `${lo}-${hi}`, step: undefined });
  }

  async showHeader() {
    const box = this.headerBox;
    box.replaceChildren();
    if (!this.state.run) {
      box.append(note("warn", "No readable Tessera run in this logdir."));
      return;
    }
    try {
      this.header = await getJSON("header", { run: this.state.run });
    } catch (e) {
      box.append(note("error", e.message));
      return;
    }
    const h = this.header;
    const devices = describeDevices(h);
    const clocks = [];
    if (h.clocks.sm_clock_mhz !== null) clocks.push(`SM ${h.clocks.sm_clock_mhz} MHz`);
    if (h.clocks.mem_clock_mhz !== null) clocks.push(`memory ${h.clocks.mem_clock_mhz} MHz`);
    const versions = describeVersions(h);
    box.append(
      el(
        "div",
        { className: "facts" },
        el("span", { className: "fact devices", text: devices || "no device information" }),
        el("span", {
          className: "fact clocks",
          text: clocks.length ? `clocks: ${clocks.join(", ")}` : "clocks: not sampled",
          title: h.clocks.source || "",
        }),
        el("span", {
          className: "fact workers",
          text: `${h.num_workers} worker(s)` + (h.world_size ? `, world size ${h.world_size}` : ""),
        }),
        el("span", { className: "fact versions", text: versions }),
      ),
    );
    if (h.missing.length) {
      box.append(
        el(
          "details",
          { className: "missing" },
          el("summary", { text: `Missing data (${h.missing.length})` }),
          el(
            "ul",
            {},
            h.missing.map((m) =>
              el("li", {}, el("b", { text: m.name }), `: ${m.status}, ${m.reason || "no reason given"}`),
            ),
          ),
        ),
      );
    }
  }

  /** Selection parameters every data route takes; without a chosen step range, the run's
   * default range (every step of a short run, a bounded window of a long one). */
  selection() {
    const steps = this.state.steps || (this.run ? this.run.default_steps : undefined) || undefined;
    return { run: this.state.run, workers: this.state.workers, steps };
  }

  async showView() {
    const token = ++this.renderToken;
    document.body.dataset.tesseraReady = "";
    this.fillSelectors();
    this.errorBox.replaceChildren();
    const box = el("div", { className: "view-body", dataset: { view: this.state.view } });
    this.viewBox.replaceChildren(box);
    if (!this.state.run) return;
    const ctx = {
      app: this,
      state: this.state,
      selection: this.selection(),
      fetch: (route, params = {}) => getJSON(route, { ...this.selection(), ...params }),
      setState: (patch, opts) => this.setState(patch, opts),
      showErrors: (errs) => this.showErrors(errs),
      isCurrent: () => token === this.renderToken,
      loadPlotly,
    };
    try {
      box.append(el("div", { className: "loading", text: "Loading…" }));
      await VIEWS[this.state.view](box, ctx);
      if (token === this.renderToken) document.body.dataset.tesseraReady = this.state.view;
    } catch (e) {
      if (token !== this.renderToken) return;
      box.replaceChildren(note("error", e.message));
      box.append(el("div", { id: "tessera-error", text: e.message }));
      document.body.dataset.tesseraReady = this.state.view;
    }
  }

  showErrors(errs) {
    if (!errs || !errs.length) return;
    this.errorBox.append(
      note(
        "warn",
        el("b", { text: "Left out of this view: " }),
        el(
          "ul",
          {},
          errs.map((e) => el("li", { className: "step-error", text: `${e.worker} step ${e.step}: ${e.error}` })),
        ),
      ),
    );
  }
}

function addStylesheet() {
  if (document.querySelector("link[data-tessera]")) return;
  document.head.append(
    el("link", { rel: "stylesheet", href: "./static/style.css", dataset: { tessera: "1" } }),
  );
}

/** Entry point called by TensorBoard. */
export async function render() {
  addStylesheet();
  const root = el("div", { className: "tessera" });
  document.body.append(root);
  const app = new App(root);
  try {
    await app.start();
  } catch (e) {
    root.replaceChildren(note("error", e.message), el("div", { id: "tessera-error", text: e.message }));
    document.body.dataset.tesseraReady = "error";
  }
}
