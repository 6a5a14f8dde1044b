// The offline HTML report (`tessera-prof html`, tessera_tb/exporters/html_report.py): draws the
// run header and every section with the plugin's own views. Each section's data is the route
// answer the report embeds (JSON in #tessera-data), handed to the view as if fetched; nothing
// is requested from anywhere.

import { describeDevices, describeVersions, el, note } from "./dom.js";
import { VIEWS } from "./views.js";

function renderHeader(data) {
  const h = data.header;
  const devices = describeDevices(h);
  const facts = [
    devices || "no device information",
    `${h.num_workers} worker(s)` + (h.world_size ? `, world size ${h.world_size}` : ""),
    `shown: workers ${data.selection.workers.join(", ")}; steps ${data.selection.steps}`,
    describeVersions(h),
  ];
  const box = document.getElementById("run-header");
  box.append(el("div", { className: "facts" }, facts.map((f) => el("span", { className: "fact", text: f }))));
  if (h.missing.length) {
    box.append(
      el(
        "details",
        { className: "missing" },
        el("summary", { text: `Missing data (${h.missing.length})` }),
        el(
          "ul",
          {},
          h.missing.map((m) => el("li", {}, el("b", { text: m.name }), `: ${m.status}, ${m.reason || "no reason given"}`)),
        ),
      ),
    );
  }
}

/** Draw the report; resolves when every section has rendered (body[data-tessera-ready]). */
export async function renderReport() {
  const data = JSON.parse(document.getElementById("tessera-data").textContent);
  renderHeader(data);
  const nav = document.getElementById("sections-nav");
  const main = document.getElementById("sections");
  const pending = [];
  for (const s of data.sections) {
    nav.append(el("a", { href: "#section-" + s.id, text: s.title }));
    const box = el("div", { className: "view-body", dataset: { view: s.view } });
    const errors = el("div", { className: "errors" });
    main.append(el("section", { className: "report-section", id: "section-" + s.id }, el("h2", { text: s.title }), errors, box));
    if (s.error) {
      box.append(note("warn", `Not available: ${s.error}`));
      box.dataset.rendered = "unavailable";
      continue;
    }
    const ctx = {
      app: null,
      state: { ...s.state },
      selection: {},
      fetch: async () => s.payload,
      setState: () => {},
      showErrors: (errs) => {
        if (errs && errs.length) errors.append(note("warn", `Left out: ${errs.length} step file(s)`));
      },
      isCurrent: () => true,
      loadPlotly: async () => window.Plotly,
      // A finding's link goes to the first section drawn by the view it names.
      sectionLink: (view) => {
        const id = view === "operators" || view === "kernels" ? view : (data.sections.find((x) => x.view === view) || {}).id;
        return id && data.sections.some((x) => x.id === id) ? "#section-" + id : null;
      },
    };
    pending.push(
      VIEWS[s.view](box, ctx).then(
        () => {
          box.dataset.rendered = "ok";
        },
        (e) => {
          box.replaceChildren(note("error", e.message));
          box.dataset.rendered = "error";
        },
      ),
    );
  }
  await Promise.all(pending);
  document.body.dataset.tesseraReady = "report";
}
