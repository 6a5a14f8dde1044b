"""Connecting to a Dask distributed cluster: `--dask SCHEDULER` of `tessera-prof import` and
`report`, the `dask=` argument of `tessera.analyze` (docs/SHARING.md, "Past one machine").

A scheduler is named by its address (`tcp://host:8786`, any address `distributed.Client`
takes), by `local:N` (a LocalCluster of N worker processes on this machine, one thread each,
on 127.0.0.1, no dashboard, closed when the work is done), or given as a `distributed.Client`
already connected. Dask is imported only here, and only when a scheduler is given: `pip
install 'tessera-profiler[dask]'`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

_LOCAL = re.compile(r"^local:(\d+)$")


class DaskUnavailable(ValueError):
    """The scheduler cannot be used: Dask is not installed, the spec is malformed, or the
    scheduler cannot be reached. One line naming the scheduler."""


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise DaskUnavailable(
            "--dask needs Dask distributed: pip install 'tessera-profiler[dask]'"
        ) from None
    return distributed


@contextlib.contextmanager
def client_for(scheduler: Any) -> Iterator[Any]:
    """A `distributed.Client` for `scheduler` (see the module doc), closed on exit unless it
    was given as a Client."""
    distributed = _import_distributed()
    if isinstance(scheduler, distributed.Client):
        yield scheduler
        return
    if not isinstance(scheduler, str) or not scheduler.strip():
        raise DaskUnavailable(f"bad Dask scheduler {scheduler!r}: use tcp://host:8786 or local:N")
    spec = scheduler.strip()
    m = _LOCAL.match(spec)
    if m:
        n = int(m.group(1))
        if not 1 <= n <= 512:
            raise DaskUnavailable(f"bad Dask scheduler {spec!r}: local:N takes N in 1..512")
        cluster = distributed.LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        )
        try:
            with distributed.Client(cluster) as client:
                yield client
        finally:
            cluster.close()
        return
    if "://" not in spec:
        raise DaskUnavailable(f"bad Dask scheduler {spec!r}: use tcp://host:8786 or local:N")
    try:
        client = distributed.Client(spec, timeout="20s")
    except OSError as exc:
        raise DaskUnavailable(f"cannot reach the Dask scheduler {spec}: {exc}") from None
    try:
        yield client
    finally:
        client.close()
