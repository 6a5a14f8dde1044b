"""`tessera-prof import --dask SCHEDULER`: one rank (worker) per task on a Dask cluster.

Each task runs `kineto_import.import_worker`, the per-rank unit of the local import, on one
worker of the cluster, so the files it writes are those of a local import byte for byte.

- Directory logdir (a file system every Dask worker mounts at the same path, as the
  client does): tasks write into the import's hidden staging directory beside the
  destination; the client renames it into place when every task finished
  (`kineto_import.import_traces`), so a reader never sees half a run.
- URL logdir (`s3://...`, `import_traces_dask_to_url`): a task imports its rank into a
  temporary directory on its machine and uploads the step and event files straight to the
  run's URL; it hands back the worker's meta.pb (the step index), and the client writes
  every meta.pb last, once every task finished. A reader lists a worker only by its
  meta.pb, so it never sees a half-written rank.

A failing rank fails the import with that rank's one-line error: tasks not started yet skip
their work (a Dask `Event` tells them), the running ones end, and what was written is
removed. Trace files are read by the Dask workers at the paths the client names: they must
be on a shared file system.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field

from tessera_tb.dask_cluster import DaskUnavailable, client_for
from tessera_tb.importers import kineto_decode
from tessera_tb.importers.kineto_import import (
    ImportFailed,
    ImportResult,
    Progress,
    WorkerImport,
    import_worker,
    nvml_file_of,
    select_workers_and_run,
)
from tessera_tb.trace import layout
from tessera_tb.trace.errors import TraceFormatError


@dataclass
class RankOutcome:
    """What one task hands back: its import, messages and warnings, or its error."""

    worker: str
    result: WorkerImport | None = None
    messages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    meta_pb: bytes | None = None
    uploaded: list[str] = field(default_factory=list)
    skipped: bool = False
    dask_worker: str = ""
    # The map of the cross-rank analyses over this rank's steps (collectives.worker_kernels),
    # made while its files are fresh, for the run's derived index (backend/cross_rank.py).
    kernels: object = None


def _aborted(event_name: str) -> bool:
    from distributed import Event

    return Event(event_name).is_set()


def _dask_worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return ""


def import_rank_task(
    worker: str,
    files: list[str],
    target: str,
    steps: set[int] | None,
    nvml: str | None,
    abort_event: str,
) -> RankOutcome:
    """The task: import one worker into `target` (a staging run directory, or a run URL).

    Never raises for bad input: the error travels back as text (`RankOutcome.error`), the
    one line the local import would print."""
    out = RankOutcome(worker, dask_worker=_dask_worker_address())
    if _aborted(abort_event):
        out.skipped = True
        return out
    try:
        with kineto_decode.gc_paused():
            if layout.is_url(target):
                _import_to_url(out, worker, files, target, steps, nvml)
            else:
                out.result = import_worker(
                    worker,
                    files,
                    target,
                    steps=steps,
                    nvml=nvml,
                    progress=out.messages.append,
                    warnings=out.warnings,
                )
                out.kernels = _rank_kernels(target, worker)
    except (TraceFormatError, ImportFailed) as exc:
        out.error = str(exc)
    except OSError as exc:
        out.error = f"{worker}: {exc}"
    return out


def _import_to_url(
    out: RankOutcome,
    worker: str,
    files: list[str],
    run_url: str,
    steps: set[int] | None,
    nvml: str | None,
) -> None:
    from tessera_tb.trace import remote

    staging = tempfile.mkdtemp(prefix="tessera-rank-")
    try:
        out.result = import_worker(
            worker,
            files,
            staging,
            steps=steps,
            nvml=nvml,
            progress=out.messages.append,
            warnings=out.warnings,
        )
        out.kernels = _rank_kernels(staging, worker)
        store = remote.files_for(run_url)
        meta_rel = f"plugins/{layout.PLUGIN_NAME}/{worker}/{layout.META_FILE}"
        for rel in remote._local_files(staging):
            with open(os.path.join(staging, *rel.split("/")), "rb") as f:
                data = f.read()
            if rel == meta_rel:
                out.meta_pb = data
                continue
            store.put_bytes(remote.join(run_url, rel), data)
            out.uploaded.append(rel)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _rank_kernels(run_dir: str, worker: str):
    """The cross-rank map of one imported rank, read back from its fresh step files."""
    from tessera_tb.backend import cross_rank
    from tessera_tb.trace.reader import read_meta

    meta = read_meta(os.path.join(layout.worker_dir(run_dir, worker), layout.META_FILE))
    return cross_rank.worker_map(run_dir, worker, meta, None, "collective_kernels")


def _summary_of(run_path: str, metas: dict, outcomes: dict[str, RankOutcome]):
    """The run's derived index from the tasks' maps (the reduce, here on the client)."""
    from tessera_tb.backend import cross_rank
    from tessera_tb.trace.reader import Run, WorkerInfo

    run = Run(
        run_path,
        {w: WorkerInfo(w, layout.worker_dir(run_path, w), m) for w, m in metas.items()},
    )
    frames = [outcomes[w].kernels for w in sorted(metas)]
    return run, cross_rank.build_run_summary(run, kernel_frames=frames)


def _run_tasks(
    client,
    by_worker: dict[str, list[str]],
    target: str,
    steps: set[int] | None,
    nvml: str | None,
    progress: Progress,
) -> tuple[dict[str, RankOutcome], str | None]:
    """Submit one task per worker; (outcomes by worker, the first error or None). Waits for
    every task to end (after an error, those not started skip their work)."""
    from distributed import Event, as_completed

    event_name = f"tessera-import-abort-{uuid.uuid4().hex}"
    abort = Event(event_name, client=client)
    futures = []
    for worker, files in by_worker.items():
        nvml_path = nvml if nvml is not None else nvml_file_of(files, worker)
        futures.append(
            client.submit(
                import_rank_task,
                worker,
                files,
                target,
                steps,
                nvml_path,
                event_name,
                key=f"tessera-import-{worker}-{uuid.uuid4().hex[:8]}",
                pure=False,
            )
        )
    outcomes: dict[str, RankOutcome] = {}
    first_error: str | None = None
    for future in as_completed(futures):
        try:
            outcome = future.result()
        except Exception as exc:  # a task that died (worker lost, out of memory)
            name = str(future.key).removeprefix("tessera-import-").rsplit("-", 1)[0]
            outcome = RankOutcome(name, error=f"{name}: task failed on Dask: {exc}")
        outcomes[outcome.worker] = outcome
        if outcome.error is not None:
            if first_error is None:
                first_error = outcome.error
                abort.set()
            continue
        if outcome.skipped:
            continue
        for msg in outcome.messages:
            progress(f"{msg} [{outcome.dask_worker}]" if outcome.dask_worker else msg)
    return outcomes, first_error


def import_workers_on_dask(
    scheduler,
    by_worker: dict[str, list[str]],
    run_dir: str,
    steps: set[int] | None,
    nvml: str | None,
    progress: Progress,
    warnings: list[str],
) -> list[WorkerImport]:
    """Every worker's import as one task each, into the staging run directory `run_dir`
    (on a file system the Dask workers share); results in worker order. Raises ImportFailed
    with the first failing rank's error once every task ended."""
    try:
        with client_for(scheduler) as client:
            outcomes, error = _run_tasks(
                client, by_worker, os.path.abspath(run_dir), steps, nvml, progress
            )
    except DaskUnavailable as exc:
        raise ImportFailed(str(exc)) from None
    if error is not None:
        raise ImportFailed(error)
    for w in by_worker:
        warnings.extend(outcomes[w].warnings)
    from tessera_tb.backend import cross_rank
    from tessera_tb.trace.reader import read_meta

    metas = {
        w: read_meta(os.path.join(layout.worker_dir(run_dir, w), layout.META_FILE))
        for w in by_worker
    }
    run, summary = _summary_of(run_dir, metas, outcomes)
    cross_rank.write_run_summary(run, summary)  # inside the staging directory: renamed with it
    return [outcomes[w].result for w in by_worker]


def import_traces_dask_to_url(
    paths: list[str],
    logdir_url: str,
    run: str | None = None,
    *,
    dask,
    steps: set[int] | None = None,
    workers: set[str] | None = None,
    nvml: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    jobs: int = 0,
) -> ImportResult:
    """Import into a URL logdir with one Dask task per rank (see the module doc). Raises
    ImportFailed (one line); on failure every object the tasks wrote is deleted."""
    from tessera_tb.trace import remote

    del jobs  # the cluster's workers set the parallelism
    t0 = time.perf_counter()
    progress = progress or (lambda _msg: None)
    if overwrite:
        raise ImportFailed(
            "--overwrite of a run under a URL is not done on Dask (object stores cannot rename "
            "a run into place): delete the run first, or import without --dask"
        )
    by_worker, run = select_workers_and_run(paths, workers, nvml, run)
    run_url = remote.join(logdir_url, run)
    try:
        store = remote.files_for(logdir_url)
        store.check_reachable(logdir_url)
        store.invalidate(run_url)
        if store.isdir(run_url):
            raise ImportFailed(f"{run_url}: run already exists (pass --overwrite to replace it)")
    except remote.RemoteStorageError as exc:
        raise ImportFailed(str(exc)) from None
    outcomes: dict[str, RankOutcome] = {}
    try:
        try:
            with client_for(dask) as client:
                outcomes, error = _run_tasks(client, by_worker, run_url, steps, nvml, progress)
        except DaskUnavailable as exc:
            raise ImportFailed(str(exc)) from None
        if error is not None:
            raise ImportFailed(error)
        results = [outcomes[w].result for w in by_worker]
        if not any(r.steps for r in results):
            raise ImportFailed(f"no steps selected: the traces hold none of {sorted(steps or [])}")
        from tessera_tb.proto import trace_pb2 as pb

        metas = {w: pb.WorkerMeta.FromString(outcomes[w].meta_pb) for w in by_worker}
        run_obj, summary = _summary_of(run_url, metas, outcomes)
        from tessera_tb.backend import cross_rank

        cross_rank.write_run_summary(run_obj, summary)
        # The step indexes last: a worker becomes visible only with all its files there.
        for w in by_worker:
            meta_rel = f"plugins/{layout.PLUGIN_NAME}/{w}/{layout.META_FILE}"
            store.put_bytes(remote.join(run_url, meta_rel), outcomes[w].meta_pb)
    except BaseException:
        _remove_run_objects(store, run_url)
        raise
    warnings = [m for w in by_worker for m in outcomes[w].warnings]
    store.invalidate(run_url)
    return ImportResult(run_url, results, time.perf_counter() - t0, warnings)


def _remove_run_objects(store, run_url: str) -> None:
    """Delete every object under a run URL (a failed import's partial uploads)."""
    key = store.key(run_url)
    try:
        found = store.fs.find(key)
    except Exception:  # nothing to list: nothing was written
        return
    for k in found:
        try:
            store.fs.rm_file(k)
        except Exception:  # best effort: the error being raised is the one to report
            continue
    store.invalidate(run_url)
