"""A real TensorBoard on a copy of the demo runs, and headless Chromium driving the tab.

The logdir holds, besides the three demo runs:
- `HOSTILE_RUN`: a copy of ddp_gpt_2rank under a directory named with HTML, whose heaviest
  kernel is renamed to `HOSTILE_KERNEL` (HTML again) in every step file of both ranks;
- `broken_run`: one worker whose meta.pb is garbage (the run is listed with an error);
- `corrupt_step`: a copy of gpt_1gpu whose step 5 file is cut in half.

Browser tests need Debian's chromium (`apt-get install -y chromium`; never `playwright
install`). Without it they skip, unless TESSERA_REQUIRE_BROWSER=1 (set by
scripts/run_tests.sh, so CI fails instead of skipping).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.conftest import DEMO_RUNS

CHROMIUM = "/usr/bin/chromium"
HOSTILE_RUN = "<img src=x onerror=alert(1)>"
HOSTILE_KERNEL = "<img src=x onerror=alert(2)><b>kernel</b>"
SCREENSHOTS = os.path.join(os.path.dirname(__file__), "screenshots")
CSP_HOOK = (
    "window.__csp=[];document.addEventListener('securitypolicyviolation',"
    "e=>window.__csp.push(e.violatedDirective+' '+e.blockedURI));"
)
# Console messages that are not errors of ours (see the E2E recipe).
_CONSOLE_NOISE = ("Multiple instances of Three.js", "GPU stall due to ReadPixels")


def _rename_heaviest_kernel(run_dir: str, new_name: str) -> str:
    """Rename the kernel with the most total time (over every step file) to `new_name`."""
    from tessera_tb.trace.atomic import write_bytes_atomic
    from tessera_tb.trace.reader import open_run
    from tessera_tb.trace.step import KIND
    from tessera_tb.trace.writer import step_to_proto

    run = open_run(run_dir)
    totals: dict[str, int] = {}
    for _, step in run.iter_steps():
        ev = step.events
        kern = ev["kind"] == KIND["kernel"]
        names = step.string_values(ev["name_id"][kern])
        for name, dur in zip(names, ev["dur_ns"][kern]):
            totals[name] = totals.get(name, 0) + int(dur)
    old = max(totals, key=totals.get)
    for worker, info in run.workers.items():
        for s in info.steps:
            step = run.load_step(worker, s)
            if old not in step.strings:
                continue
            strings = [new_name if x == old else x for x in step.strings]
            data = step_to_proto(dataclasses.replace(step, strings=strings)).SerializeToString()
            write_bytes_atomic(info.step_path(s), data)
    return old


def make_logdir(root) -> str:
    """The test logdir (see the module docstring); returns its path."""
    logdir = os.path.join(str(root), "logdir")
    shutil.copytree(DEMO_RUNS, logdir)
    hostile = os.path.join(logdir, HOSTILE_RUN)
    shutil.copytree(os.path.join(DEMO_RUNS, "ddp_gpt_2rank"), hostile)
    _rename_heaviest_kernel(hostile, HOSTILE_KERNEL)
    broken = os.path.join(logdir, "broken_run", "plugins", "tessera", "rank0")
    os.makedirs(broken)
    with open(os.path.join(broken, "meta.pb"), "wb") as f:
        f.write(b"\xff\xfe not a protobuf \x00\x01")
    corrupt = os.path.join(logdir, "corrupt_step")
    shutil.copytree(os.path.join(DEMO_RUNS, "gpt_1gpu"), corrupt)
    step5 = os.path.join(corrupt, "plugins", "tessera", "worker0", "step_00000005.pb")
    with open(step5, "rb") as f:
        data = f.read()
    with open(step5, "wb") as f:
        f.write(data[: len(data) // 2])
    return logdir


@pytest.fixture(scope="session")
def plugin_logdir(tmp_path_factory) -> str:
    return make_logdir(tmp_path_factory.mktemp("tessera_plugin"))


def start_tensorboard(logdir: str, errlog, *extra: str):
    """Start `tensorboard --logdir` on a free port; returns (process, base URL)."""
    with open(errlog, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", logdir]
            + ["--host", "127.0.0.1", "--port", "0", *extra],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    deadline = time.time() + 90
    pattern = r"TensorBoard \S+ at (http://127\.0\.0\.1:\d+(?:/[^ ]*?)?)/? "
    while not (m := re.search(pattern, errlog.read_text())):
        if proc.poll() is not None or time.time() > deadline:
            stop_tensorboard(proc)
            pytest.fail("tensorboard did not start:\n" + errlog.read_text())
        time.sleep(0.2)
    return proc, m.group(1).rstrip("/")


def stop_tensorboard(proc) -> None:
    proc.terminate()  # its data-server child exits too (--die-after-stdin)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def tb_url(plugin_logdir, tmp_path_factory):
    """Base URL of a TensorBoard (default fast loader) on the test logdir."""
    errlog = tmp_path_factory.mktemp("tb") / "stderr.txt"
    proc, url = start_tensorboard(plugin_logdir, errlog)
    try:
        yield url
    finally:
        stop_tensorboard(proc)


def http_get(url: str) -> tuple[int, bytes, dict]:
    """(status, body, headers) of a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def route_url(base: str, route: str, **params) -> str:
    q = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    return f"{base}/data/plugin/tessera/{route}" + (f"?{q}" if q else "")


def get_json(base: str, route: str, **params):
    status, body, _ = http_get(route_url(base, route, **params))
    assert status == 200, f"{route} {params}: {status} {body[:300]!r}"
    return json.loads(body)


def rows(table: dict) -> list[dict]:
    """Rows of a column-wise table payload."""
    return [dict(zip(table["columns"], values)) for values in zip(*table["data"])]


@pytest.fixture(scope="session")
def browser():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("TESSERA_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
        pytest.skip("no chromium: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


class Tab:
    """The Tessera tab in a TensorBoard page; records console errors, dialogs, CSP reports."""

    def __init__(self, browser, base_url: str, shots_dir: str):
        self.base_url = base_url
        self.shots_dir = shots_dir
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.add_init_script(CSP_HOOK)  # runs in every frame, the plugin's included
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", self._dialog)
        self.failed: list[str] = []  # URLs answered with an HTTP error
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(r.url))
        self.frame = None

    def _console(self, m) -> None:
        # A failed load is judged by its URL in assert_clean (TensorBoard's own font requests
        # 404 under --path_prefix).
        if m.text.startswith("Failed to load resource"):
            return
        if m.type == "error" and not any(n in m.text for n in _CONSOLE_NOISE):
            self.errors.append(m.text)

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, **state) -> None:
        """Load the page with the tab's state in the hash (t.run=..., t.view=...)."""
        frag = "&".join(f"t.{k}={urllib.parse.quote(str(v), safe='')}" for k, v in state.items())
        self.page.goto("about:blank")  # a new hash alone would not reload the page
        self.page.goto(f"{self.base_url}/#tessera" + (f"&{frag}" if frag else ""))
        iframe = self.page.wait_for_selector('iframe[src*="name=tessera"]', timeout=60_000)
        self.frame = iframe.content_frame()
        self.wait_ready(state.get("view", "overview"))

    def wait_ready(self, view: str, timeout_ms: int = 60_000) -> None:
        self.frame.wait_for_selector(
            f'body[data-tessera-ready="{view}"], body[data-tessera-ready="error"]',
            timeout=timeout_ms,
            state="attached",
        )

    def switch(self, view: str) -> None:
        """Click the view's tab and wait until it has rendered."""
        self.frame.click(f'nav.views button[data-view="{view}"]')
        self.wait_ready(view)

    def csp(self) -> list[str]:
        return self.frame.evaluate("window.__csp")

    def screenshot(self, name: str, height: int = 1800) -> str:
        """A screenshot of the page, made tall enough to show the whole view."""
        os.makedirs(self.shots_dir, exist_ok=True)
        path = os.path.join(self.shots_dir, f"{name}.png")
        size = self.page.viewport_size
        self.page.set_viewport_size({"width": size["width"], "height": height})
        self.page.wait_for_timeout(300)  # plotly's responsive charts redraw
        self.page.screenshot(path=path)
        self.page.set_viewport_size(size)
        return path

    def assert_clean(self) -> None:
        assert [u for u in self.failed if "/font-roboto/" not in u] == []
        assert self.errors == []
        assert self.dialogs == []
        assert self.csp() == []
        assert self.frame.locator("#tessera-error").count() == 0
        assert self.frame.locator(".no-webgl").count() == 0

    def close(self) -> None:
        self.context.close()


@pytest.fixture(scope="module")
def tab(browser, tb_url):
    t = Tab(browser, tb_url, SCREENSHOTS)
    yield t
    t.close()


def canvas_has_ink(frame, selector: str) -> bool:
    """Whether a canvas (2-D or WebGL) holds non-background pixels."""
    return frame.evaluate(
        """(sel) => {
          const cs = [...document.querySelectorAll(sel)];
          for (const c of cs) {
            if (!c.width || !c.height) continue;
            const tmp = document.createElement('canvas');
            tmp.width = c.width; tmp.height = c.height;
            const g = tmp.getContext('2d');
            g.drawImage(c, 0, 0);
            const d = g.getImageData(0, 0, c.width, c.height).data;
            for (let i = 0; i < d.length; i += 4) {
              const a = d[i + 3];
              if (a > 0 && !(d[i] > 245 && d[i + 1] > 245 && d[i + 2] > 245)) return true;
            }
          }
          return false;
        }""",
        selector,
    )


def plot_data(frame, selector: str) -> list[dict]:
    """type, name, x, y, z of each trace of the plotly chart at `selector`."""
    return frame.evaluate(
        "(sel) => document.querySelector(sel).data.map(t => ({type: t.type, name: t.name, "
        "x: t.x, y: t.y, z: t.z}))",
        selector,
    )
