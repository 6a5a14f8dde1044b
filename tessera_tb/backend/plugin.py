"""The Tessera Profiler TensorBoard plugin: its route table and tiny HTTP handlers.

Every handler parses its query, calls a function of `plugin_data` (where run, worker and step
parameters are resolved against the discovered runs) and answers through
`http_util.Respond`. Errors are `tensorboard.errors` exceptions, which TensorBoard turns into
a 400/404 with a one-line message.
"""

from __future__ import annotations

import gzip
import os
import threading

import plotly
from tensorboard import errors
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from tessera_tb.backend import plugin_data
from tessera_tb.backend.run_index import RunIndex

PLUGIN_NAME = "tessera"
TAB_NAME = "Tessera Profiler"

_FRONTEND_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "frontend")
_PLOTLY_JS = os.path.join(os.path.dirname(plotly.__file__), "package_data", "plotly.min.js")
_JS = "text/javascript"
# Files the static route may serve, by the name in the URL: a whitelist, so "..", "%2e%2e"
# or "sub/x" never reach the file system.
_STATIC = {
    "plotly.min.js": (_PLOTLY_JS, _JS),
    **{
        name: (os.path.join(_FRONTEND_DIR, name), "text/css" if name.endswith(".css") else _JS)
        for name in sorted(os.listdir(_FRONTEND_DIR))
        if name.endswith((".js", ".css")) and name != "index.js"
    },
}
_STATIC_EXPIRES_S = 3600
_JSON = "application/json"


class TesseraPlugin(base_plugin.TBPlugin):
    """Serves the Tessera Profiler tab: runs, run header, one route per view, downloads."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext):
        flags = getattr(context, "flags", None)
        refresh_s = float(getattr(flags, "tessera_refresh_s", 5.0) or 5.0)
        self._index = RunIndex(context.logdir or "", refresh_s=refresh_s)
        self._index.start()
        self._gzipped: dict[str, bytes] = {}
        self._gzip_lock = threading.Lock()

    def get_plugin_apps(self):
        return {
            "/index.js": self._serve_index_js,
            "/static/*": self._serve_static,
            "/runs": self._serve_runs,
            "/header": self._serve_header,
            "/overview": self._view_app("overview"),
            "/timeline": self._view_app("timeline"),
            "/event": self._view_app("event"),
            "/topk": self._view_app("topk"),
            "/roofline": self._view_app("roofline"),
            "/stalls": self._view_app("stalls"),
            "/collectives": self._view_app("collectives"),
            "/memory": self._view_app("memory"),
            "/compare": self._serve_compare,
            "/trace": self._serve_trace,
            "/csv": self._serve_csv,
        }

    def is_active(self) -> bool:
        # TensorBoard asks on every page load; a first scan of a huge logdir may take longer
        # than that page should wait (the tab turns active at the next load).
        # A logdir URL that cannot be read keeps the tab, so that it can say why.
        return bool(self._index.entries(wait_s=5.0)) or self._index.logdir_error is not None

    def frontend_metadata(self):
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name=TAB_NAME)

    # Static files ---------------------------------------------------------------------------

    @wrappers.Request.application
    def _serve_index_js(self, request):
        with open(os.path.join(_FRONTEND_DIR, "index.js"), "rb") as f:
            return http_util.Respond(request, f.read(), _JS)

    @wrappers.Request.application
    def _serve_static(self, request):
        name = request.path.rsplit("/static/", 1)[-1]
        if name not in _STATIC:
            raise errors.NotFoundError(f"no static file {name!r}")
        path, content_type = _STATIC[name]
        if name == "plotly.min.js":  # 4.8 MB: gzip once, not on every request
            return http_util.Respond(
                request,
                self._gzip_once(path),
                content_type,
                expires=_STATIC_EXPIRES_S,
                content_encoding="gzip",
            )
        with open(path, "rb") as f:
            return http_util.Respond(request, f.read(), content_type)

    def _gzip_once(self, path: str) -> bytes:
        with self._gzip_lock:
            if path not in self._gzipped:
                with open(path, "rb") as f:
                    self._gzipped[path] = gzip.compress(f.read(), compresslevel=6, mtime=0)
            return self._gzipped[path]

    # Data -----------------------------------------------------------------------------------

    @wrappers.Request.application
    def _serve_runs(self, request):
        return http_util.Respond(request, plugin_data.runs_json(self._index), _JSON)

    @wrappers.Request.application
    def _serve_header(self, request):
        entry = plugin_data.resolve_run(self._index, request.args.get("run"))
        body = plugin_data.header_json(self._index, entry)
        return http_util.Respond(request, body, _JSON)

    def _view_app(self, view: str):
        @wrappers.Request.application
        def serve(request):
            body = plugin_data.view_json(self._index, view, request.args)
            return http_util.Respond(request, body, _JSON)

        return serve

    @wrappers.Request.application
    def _serve_compare(self, request):
        body = plugin_data.compare_json(self._index, request.args)
        return http_util.Respond(request, body, _JSON)

    @wrappers.Request.application
    def _serve_trace(self, request):
        body, filename = plugin_data.chrome_trace(self._index, request.args)
        return http_util.Respond(
            request,
            body,
            _JSON,
            headers=[("Content-Disposition", f'attachment; filename="{filename}"')],
        )

    @wrappers.Request.application
    def _serve_csv(self, request):
        body, filename = plugin_data.table_csv(self._index, request.args)
        return http_util.Respond(
            request,
            body,
            "text/csv",
            headers=[("Content-Disposition", f'attachment; filename="{filename}"')],
        )
