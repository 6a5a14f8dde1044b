"""Capture per-step traces while training runs: `from tessera import profile`.

```python
from tessera import profile

with profile.session(
    activities=["cpu", "gpu", "memory", "power"],
    schedule=profile.schedule(wait=1, warmup=1, active=3, repeat=2),
    exporters=[profile.chrome("trace.{rank}.json"), profile.summary("summary.{rank}.csv")],
    tensorboard_dir="runs/exp1",
) as sess:
    for batch in loader:
        with profile.region("forward"):
            loss = model(batch)
        profile.counter(name="loss", value=float(loss), unit="scalar")
        sess.step()
```

docs/CAPTURE.md describes the API, the schedule, what each activity needs, caps, failure
behaviour, exporters and the portable records. Importing this package does not import torch.
"""

from tessera.profile.exporters import chrome, otlp, summary
from tessera.profile.failures import TesseraWarning
from tessera.profile.scheduling import Schedule, schedule
from tessera.profile.session import Session, session
from tessera.profile.sources.host import counter, mark, region

__all__ = [
    "Schedule",
    "Session",
    "TesseraWarning",
    "chrome",
    "counter",
    "mark",
    "otlp",
    "region",
    "schedule",
    "session",
    "summary",
]
