"""One self-contained HTML file with a run's analyses, for people without TensorBoard
(`tessera-prof html RUN -o report.html`).

Sections: the run header (devices, versions, missing data), overview (step time breakdown,
GPU busy and tensor-core time, findings), top-k operators and kernels, roofline, stall
breakdown, collectives (heatmaps and tables) and memory.

Nothing is computed here: each section's data is the plugin route's answer for the same
selection (`plugin_data.standalone_view`, `plugin_data.run_header`), and each section is drawn
by the plugin's own view code (`frontend/dom.js`, `frontend/views.js`; `frontend/report.js`
lays the sections out), bundled into one classic script (`bundle_modules`). plotly.js is the
plotly package's own copy, inlined. The file loads nothing: no network request, no other
file. The views' controls (which ask the server for another answer) and download links are
hidden; hover, zoom and sorting work.

Names from traces are untrusted: the data travels as JSON in a `<script type=
"application/json">` element with `<`, `>` and `&` escaped (it cannot close the element), and
the views put text in with `textContent` and escape plotly hover text, as in the plugin.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Iterable

import plotly
from tensorboard import errors as tb_errors

from tessera_tb import __version__
from tessera_tb.trace.reader import Run

_FRONTEND_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "frontend")
_PLOTLY_JS = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")

# (section id, title, view of plugin_data.VIEWS, route parameters, view state)
SECTIONS: list[tuple[str, str, str, dict[str, str], dict[str, str]]] = [
    ("overview", "Overview", "overview", {}, {}),
    ("operators", "Operators", "topk", {"table": "operators", "k": "20"}, {"k": "20"}),
    ("kernels", "Kernels", "topk", {"table": "kernels", "k": "20"}, {"k": "20"}),
    ("roofline", "Roofline", "roofline", {"group": "kernel"}, {}),
    ("stalls", "Stalls", "stalls", {"group": "kernel"}, {"level": "kernel"}),
    ("collectives", "Collectives", "collectives", {"metric": "busbw"}, {"metric": "busbw"}),
    ("memory", "Memory", "memory", {}, {}),
]
# Modules of frontend/ bundled into the report, in load order; timeline.js is replaced by a
# stub (the timeline needs the server to fetch windows).
_MODULES = ("dom.js", "views.js", "report.js")
_TIMELINE_STUB = (
    '__modules["timeline.js"] = { renderTimeline: async (box) => '
    'box.replaceChildren("The timeline needs TensorBoard.") };\n'
)

_IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"\./(?:static/)?([\w.-]+)";[ \t]*$', re.M)
_EXPORT_DECL = re.compile(r"^export\s+(async\s+function|function|const|let|class)\s+(\w+)", re.M)
_EXPORT_LIST = re.compile(r"^export\s*\{([^}]*)\};?[ \t]*$", re.M)
_LEFTOVER = re.compile(r"^\s*(?:import|export)\b", re.M)
# Sequences that would end or derail an inline <script> element in an HTML parser.
_SCRIPT_BREAKERS = re.compile(r"<(?=/script|!--|script)", re.I)


def bundle_module(name: str, source: str) -> str:
    """An ES module of the frontend as a classic script: its body in a function scope that
    registers its exports in `__modules[name]`; `import {a, b} from "./x.js"` becomes
    `const {a, b} = __modules["x.js"]`. Raises ValueError for a form it does not handle."""
    exported: list[str] = []

    def declaration(m: re.Match) -> str:
        exported.append(m.group(2))
        return f"{m.group(1)} {m.group(2)}"

    def export_list(m: re.Match) -> str:
        exported.extend(n.strip() for n in m.group(1).split(",") if n.strip())
        return ""

    body = _EXPORT_DECL.sub(declaration, source)
    body = _EXPORT_LIST.sub(export_list, body)
    body = _IMPORT.sub(
        lambda m: f"const {{{m.group(1)}}} = __modules[{json.dumps(m.group(2))}];", body
    )
    if _LEFTOVER.search(body) or any(" as " in n for n in exported):
        raise ValueError(f"{name}: an import or export form the report cannot bundle")
    names = ", ".join(dict.fromkeys(exported))
    return f"__modules[{json.dumps(name)}] = (() => {{\n{body}\nreturn {{ {names} }};\n}})();\n"


def bundle_modules() -> str:
    """The plugin's view code (`_MODULES`) as one classic script."""
    parts = ["const __modules = {};\n", _TIMELINE_STUB]
    for name in _MODULES:
        with open(os.path.join(_FRONTEND_DIR, name), encoding="utf-8") as f:
            parts.append(bundle_module(name, f.read()))
    return "".join(parts)


def _inline_script(js: str) -> str:
    return _SCRIPT_BREAKERS.sub(r"\\x3C", js)


def _json_for_html(payload) -> str:
    """JSON that cannot close the element it sits in (and that `JSON.parse` reads back)."""
    text = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def report_data(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    name: str | None = None,
) -> dict:
    """What the report shows, as JSON-ready Python: the header and each section's route
    answer (or the one-line reason it has none). `workers`/`steps` select as in the plugin;
    the default is every worker and the run's default step range (`default_steps`). Raises
    ValueError for a selection that names no worker or step of the run."""
    from tessera_tb.backend import plugin_data
    from tessera_tb.backend.run_index import RunEntry

    label = name or run.name
    args: dict[str, str] = {}
    if workers is not None:
        args["workers"] = ",".join(workers)
    try:
        chosen = plugin_data.parse_workers(run, args.get("workers"))
        first = next((w for w in chosen if run.worker(w).steps), None)
        if steps is not None:
            args["steps"] = ",".join(str(s) for s in sorted(set(steps)))
        elif first is not None:
            args["steps"] = plugin_data.default_steps(run, first)
        plugin_data.parse_steps(run, chosen, args.get("steps"))
    except (tb_errors.NotFoundError, tb_errors.InvalidArgumentError) as exc:
        raise ValueError(f"run {label}: {exc}") from None
    entry = RunEntry(label, run.path, (), run)
    header = json.loads(plugin_data.encode_json(plugin_data.run_header(None, entry)))
    sections = []
    for sid, title, view, params, state in SECTIONS:
        section = {"id": sid, "title": title, "view": sid, "state": state, "error": None}
        try:
            section["payload"] = plugin_data.standalone_view(run, view, {**args, **params})
        except Exception as exc:  # one section that cannot be shown leaves the others
            section["error"] = " ".join(str(exc).split()) or type(exc).__name__
        sections.append(section)
    return {
        "run": label,
        "selection": {"workers": chosen, "steps": args.get("steps", "")},
        "tessera_version": __version__,
        "header": header,
        "sections": sections,
    }


_REPORT_CSS = """
.report-header h1 { font-size: 20px; margin: 8px 0 4px; }
.report-header .made { color: #757575; font-size: 11px; }
nav.sections { display: flex; flex-wrap: wrap; gap: 14px; margin: 8px 0;
  border-bottom: 2px solid #e0e0e0; padding-bottom: 6px; }
nav.sections a { color: #e65100; text-decoration: none; }
section.report-section { margin-top: 18px; border-top: 1px solid #eeeeee; }
section.report-section h2 { font-size: 17px; margin: 10px 0 4px; }
/* Controls and downloads ask a server for another answer: nothing to ask here. */
.view-controls, a.download, p.hint { display: none; }
"""


def render_report(
    run: Run,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    name: str | None = None,
) -> str:
    """The report of a run as one HTML document (text). See the module docstring."""
    data = report_data(run, workers, steps, name)
    with open(os.path.join(_FRONTEND_DIR, "style.css"), encoding="utf-8") as f:
        css = (f.read() + _REPORT_CSS).replace("</", "<\\/")  # cannot close <style>
    with open(_PLOTLY_JS, encoding="utf-8") as f:
        plotly_js = f.read()
    title = html.escape(f"Tessera Profiler report: {data['run']}")
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            f"<title>{title}</title>\n<style>\n{css}\n</style>\n",
            f"<script>\n{_inline_script(plotly_js)}\n</script>\n",
            '</head>\n<body>\n<div class="tessera">\n',
            f'<header class="report-header"><h1>{title}</h1>',
            f'<div class="made">tessera-profiler {html.escape(__version__)}: '
            "a self-contained report (no network needed)</div>",
            '<div id="run-header" class="run-header"></div></header>\n',
            '<nav id="sections-nav" class="sections"></nav>\n<main id="sections"></main>\n',
            "</div>\n",
            '<script type="application/json" id="tessera-data">',
            _json_for_html(data),
            "</script>\n",
            f"<script>\n{_inline_script(bundle_modules())}\n"
            '__modules["report.js"].renderReport();\n</script>\n',
            "</body>\n</html>\n",
        ]
    )


def write_report(
    run: Run,
    out_path: str,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    name: str | None = None,
) -> int:
    """Write the report to `out_path` atomically; returns its size in bytes."""
    from tessera_tb.trace.atomic import write_bytes_atomic

    data = render_report(run, workers, steps, name).encode("utf-8")
    write_bytes_atomic(out_path, data)
    return len(data)
