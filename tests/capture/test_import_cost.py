"""Importing tessera (and its capture API) stays cheap: no torch, no pandas, no protobuf."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ROOT

PROBE = """
import json, sys
import tessera
before = sorted(m for m in ("torch", "pandas", "tessera.profile") if m in sys.modules)
from tessera import profile
after = sorted(m for m in ("torch", "pandas", "google.protobuf") if m in sys.modules)
print(json.dumps({"before": before, "after": after, "lazy": tessera.profile is profile}))
"""


def test_import_tessera_and_profile_loads_no_heavy_module():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"before": [], "after": [], "lazy": True}
