"""The plugin is registered with TensorBoard and its loader is cheap to import."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

from tests.plugin.conftest import http_get


def test_loader_is_registered_in_the_tensorboard_plugins_group():
    eps = {ep.name: ep.value for ep in entry_points(group="tensorboard_plugins")}
    assert eps["tessera"] == "tessera_tb.plugin_loader:TesseraLoader"


def test_importing_the_loader_imports_neither_numpy_pandas_nor_the_plugin():
    code = (
        "import sys, tessera_tb.plugin_loader as m; "
        "print(sorted(x for x in ('numpy', 'pandas', 'plotly', 'tessera_tb.backend.plugin') "
        "if x in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_loader_builds_the_plugin_with_its_name_and_tab(tmp_path):
    from tensorboard.plugins import base_plugin

    from tessera_tb.plugin_loader import TesseraLoader

    plugin = TesseraLoader().load(base_plugin.TBContext(logdir=str(tmp_path)))
    assert plugin.plugin_name == "tessera"
    meta = plugin.frontend_metadata()
    assert meta.tab_name == "Tessera Profiler"
    assert meta.es_module_path == "/index.js"
    assert plugin.is_active() is False  # an empty logdir has no run


def test_tensorboard_lists_the_tab_as_active(tb_url):
    status, body, _ = http_get(tb_url + "/data/plugins_listing")
    assert status == 200
    listing = json.loads(body)["tessera"]
    assert listing["enabled"] is True
    assert listing["tab_name"] == "Tessera Profiler"
    assert listing["loading_mechanism"] == {
        "type": "IFRAME",
        "module_path": "/data/plugin/tessera/index.js",
    }
