"""Runs under an fsspec URL: `s3://bucket/runs/exp1`, `gs://...`, any fsspec protocol.

Reading (`RemoteFiles`, used through `layout.run_files`): the reader, the plugin's run index
and the kernel counters read a run under a URL with the same code as a directory. Listings and
file versions (`RemoteFiles.listdir`, `signature`: the ETag, else the modification time) are
cached for `ttl_s` seconds, so a bucket with thousands of step files answers from memory
between refreshes; the plugin re-reads a worker's meta.pb only when its version changes, and
never lists a worker's step files (the step index in meta.pb names them).

Writing (`upload_run`, `RunUploader`, `import_traces_to_url`): a run is written locally (the
same writer, atomic per file) and each finished file is uploaded with one PUT, which object
stores apply atomically: a reader sees the old object or the new one. Step files, counters
and event files go first, each worker's meta.pb last, so a step index never names a step file
that is not there yet.

Storage options: S3 takes its endpoint from `S3_ENDPOINT` (the variable TensorBoard's own S3
reader uses), else `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, and passes it to s3fs as
`client_kwargs={"endpoint_url": ...}`, so one setting serves TensorBoard and the plugin.
Credentials and region come from the usual AWS variables and files (boto3's chain). fsspec and
its backends are optional: `pip install 'tessera-profiler[s3]'` (or `[gcs]`).

Every storage problem (unreachable endpoint, denied access, missing bucket, missing backend)
is a `RemoteStorageError` naming the URL, with a one-line reason.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from tessera_tb.trace import layout
from tessera_tb.trace.errors import TraceFormatError

ENDPOINT_ENV = ("S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# Environment that changes which S3 account or endpoint a file system talks to.
_S3_ENV = (*ENDPOINT_ENV, "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION")
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
DEFAULT_TTL_S = 10.0
# Fail fast on an unreachable endpoint (a request of the plugin waits on it).
_S3_CONFIG = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}}


class RemoteStorageError(TraceFormatError):
    """Remote storage could not be used: names the URL and the reason, in one line."""


def protocol_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def s3_endpoint() -> str | None:
    """The S3 endpoint URL from the environment (S3_ENDPOINT first, as TensorBoard reads it),
    with `https://` added when it has no scheme (`S3_USE_HTTPS=0`: `http://`)."""
    for name in ENDPOINT_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            if "://" not in value:
                https = os.environ.get("S3_USE_HTTPS", "1") not in ("0", "false")
                value = ("https://" if https else "http://") + value
            return value
    return None


def storage_options(protocol: str) -> dict[str, Any]:
    """fsspec options for a protocol: our own listing cache only (fsspec's never expires),
    and for S3 the endpoint of `s3_endpoint` and short timeouts."""
    if protocol in ("s3", "s3a"):
        opts: dict[str, Any] = {"use_listings_cache": False, "config_kwargs": dict(_S3_CONFIG)}
        endpoint = s3_endpoint()
        if endpoint:
            opts["client_kwargs"] = {"endpoint_url": endpoint}
        return opts
    if protocol in ("gs", "gcs"):
        return {"use_listings_cache": False}
    return {}


def describe_error(exc: BaseException) -> str:
    """A one-line reason for a storage exception (botocore, aiohttp, gcsfs, OSError)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    names = {c.__name__ for c in type(exc).__mro__}
    if isinstance(exc, PermissionError) or "AccessDenied" in text:
        return f"access denied ({text})"
    if isinstance(exc, FileNotFoundError):
        return f"not found ({text})"
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"} or (
        isinstance(exc, ConnectionError)
    ):
        return f"cannot reach the storage endpoint ({text})"
    if "NoCredentialsError" in names:
        return "no credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
    return f"{type(exc).__name__}: {text}"


def _env_key(protocol: str) -> tuple:
    if protocol in ("s3", "s3a"):
        return tuple(os.environ.get(k, "") for k in _S3_ENV)
    return ()


_FILESYSTEMS: dict[tuple, RemoteFiles] = {}
_FS_LOCK = threading.Lock()


def files_for(url: str) -> RemoteFiles:
    """The `RemoteFiles` of a URL's protocol under the current environment (one per protocol,
    storage options and credentials variables, kept for the process)."""
    protocol = protocol_of(url)
    key = (protocol, _env_key(protocol))
    with _FS_LOCK:
        found = _FILESYSTEMS.get(key)
        if found is None:
            found = RemoteFiles(protocol, url)
            _FILESYSTEMS[key] = found
    return found


def clear_cache() -> None:
    """Forget every file system and cached listing (after changing credentials in-process)."""
    with _FS_LOCK:
        _FILESYSTEMS.clear()


class RemoteFiles(layout.RunFiles):
    """One fsspec file system, read with cached listings and versions (see the module doc).

    Paths are full URLs. A file's version is its ETag (S3, GCS), else its modification time.
    """

    def __init__(self, protocol: str, example_url: str, ttl_s: float = DEFAULT_TTL_S):
        self.protocol = protocol
        self.ttl_s = ttl_s
        self._cache: dict[tuple[str, str], tuple[float, Any]] = {}
        self._lock = threading.Lock()
        try:
            import fsspec
        except ImportError:
            raise RemoteStorageError(example_url, self._missing_backend("fsspec")) from None
        try:
            cls = fsspec.get_filesystem_class(protocol)
            self.fs = cls(skip_instance_cache=True, **storage_options(protocol))
        except ImportError as exc:
            raise RemoteStorageError(example_url, self._missing_backend(str(exc))) from None
        except Exception as exc:  # an unknown protocol, credentials a backend refuses at start
            raise RemoteStorageError(example_url, describe_error(exc)) from None

    def _missing_backend(self, what: str) -> str:
        extra = EXTRAS.get(self.protocol)
        hint = f"pip install 'tessera-profiler[{extra}]'" if extra else "install its fsspec backend"
        return f"{self.protocol}:// needs fsspec and its backend ({hint}; {what})"

    # Paths and errors -------------------------------------------------------------------------

    def key(self, url: str) -> str:
        """The file system's path of a URL (`bucket/runs/exp1`)."""
        return self.fs._strip_protocol(url).rstrip("/")

    def url(self, key: str) -> str:
        return f"{self.protocol}://{key}"

    def _call(self, url: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except RemoteStorageError:
            raise
        except Exception as exc:
            raise RemoteStorageError(url, describe_error(exc)) from None

    def _cached(self, kind: str, url: str, compute: Callable[[], Any]) -> Any:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get((kind, url))
        if hit is not None and hit[0] > now:
            return hit[1]
        value = compute()
        with self._lock:
            self._cache[(kind, url)] = (now + self.ttl_s, value)
        return value

    def invalidate(self, url_prefix: str = "") -> None:
        """Drop cached listings and versions under a URL (all of them by default)."""
        with self._lock:
            for k in [k for k in self._cache if k[1].startswith(url_prefix)]:
                del self._cache[k]

    # Reading -----------------------------------------------------------------------------------

    def info(self, url: str) -> dict | None:
        """The file system's info of a path (None when it does not exist), cached."""

        def fetch():
            try:
                return self.fs.info(self.key(url))
            except FileNotFoundError:
                return None

        return self._cached("info", url, lambda: self._call(url, fetch))

    def ls(self, url: str) -> dict[str, str]:
        """{name: "file" | "directory"} of a directory's entries (empty when it does not
        exist), cached. One listing request with a delimiter: never recursive."""

        def fetch():
            try:
                entries = self.fs.ls(self.key(url), detail=True)
            except FileNotFoundError:
                return {}
            base = self.key(url)
            out = {}
            for e in entries:
                name = e["name"].rstrip("/")
                if name == base:
                    continue
                out[posixpath.basename(name)] = e.get("type", "file")
            return out

        return self._cached("ls", url, lambda: self._call(url, fetch))

    def check_reachable(self, url: str) -> None:
        """Raise `RemoteStorageError` when the URL cannot be listed (unreachable endpoint,
        denied access, missing bucket); a prefix that does not exist yet in a readable bucket
        is fine."""
        key = self.key(url)

        def probe():
            try:
                self.fs.ls(key, detail=False)
            except FileNotFoundError:
                self.fs.ls(key.split("/", 1)[0], detail=False)  # the bucket must exist

        self._call(url, probe)

    def read_bytes(self, path: str) -> bytes:
        return self._call(path, lambda: self.fs.cat_file(self.key(path)))

    def isfile(self, path: str) -> bool:
        info = self.info(path)
        return info is not None and info.get("type") != "directory"

    def isdir(self, path: str) -> bool:
        return bool(self.ls(path))

    def listdir(self, path: str) -> list[str]:
        return sorted(self.ls(path))

    def signature(self, path: str) -> tuple | None:
        info = self.info(path)
        if info is None or info.get("type") == "directory":
            return None
        version = (
            info.get("ETag")
            or info.get("etag")
            or info.get("md5Hash")
            or info.get("generation")
            or str(info.get("LastModified") or info.get("mtime") or info.get("updated") or "")
        )
        return (str(version), int(info.get("size") or 0))

    # Writing -----------------------------------------------------------------------------------

    def put_bytes(self, url: str, data: bytes) -> None:
        """One PUT of a whole object (atomic in S3 and GCS)."""
        self._call(url, lambda: self.fs.pipe_file(self.key(url), data))
        self.invalidate(url)

    def delete(self, url: str) -> None:
        self._call(url, lambda: self.fs.rm_file(self.key(url)))
        self.invalidate(url)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


def find_runs(logdir_url: str, max_depth: int = 8) -> dict[str, str]:
    """Runs under a URL, like `layout.find_runs` for a directory: {name: run URL}.

    Walks one listing per directory level (a delimiter listing, never recursive), skipping
    hidden directories and never listing inside `plugins/` beyond `plugins/tessera`'s
    existence, so step files are never listed. Raises `RemoteStorageError` when the bucket
    cannot be read.
    """
    files = files_for(logdir_url)
    root = logdir_url.rstrip("/")
    files.check_reachable(root)
    runs: dict[str, str] = {}

    def walk(url: str, rel: str, depth: int) -> None:
        entries = files.ls(url)
        if entries.get("plugins") == "directory" and files.ls(join(url, "plugins")).get(
            layout.PLUGIN_NAME
        ):
            runs[rel or "."] = url
        if depth >= max_depth:
            return
        for name, kind in sorted(entries.items()):
            if kind == "directory" and not name.startswith(".") and name != "plugins":
                walk(join(url, name), f"{rel}/{name}" if rel else name, depth + 1)

    walk(root, "", 0)
    return runs


# Writing runs -------------------------------------------------------------------------------


def _local_files(run_dir: str) -> list[str]:
    """Relative paths ('/'-separated) of a local run's files, hidden ones (temporary files of
    atomic writes) left out."""
    out = []
    for dirpath, dirnames, filenames in os.walk(run_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if not f.startswith("."):
                rel = os.path.relpath(os.path.join(dirpath, f), run_dir)
                out.append(rel.replace(os.sep, "/"))
    return out


def _upload_order(rel: str) -> tuple[int, str]:
    """Step files, counters and event files first; meta.pb (the step index) last."""
    return (1 if posixpath.basename(rel) == layout.META_FILE else 0, rel)


class RunUploader:
    """Mirror a run directory that is being written locally to a URL, file by file.

    `sync()` uploads every file that is new or changed since the last call (by size and
    modification time), meta.pb files last, one PUT each. Call it after each step file is
    written and once at the end; it is what a writer needs to put a run on S3 or GCS.
    """

    def __init__(self, local_run_dir: str, url: str):
        self.local_run_dir = local_run_dir
        self.url = url.rstrip("/")
        self.files = files_for(url)
        self._sent: dict[str, tuple[int, int]] = {}
        self.uploaded_bytes = 0

    def sync(self) -> list[str]:
        """Upload what changed; returns the relative paths uploaded."""
        done = []
        for rel in sorted(_local_files(self.local_run_dir), key=_upload_order):
            path = os.path.join(self.local_run_dir, *rel.split("/"))
            try:
                st = os.stat(path)
                version = (st.st_mtime_ns, st.st_size)
                if self._sent.get(rel) == version:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue  # replaced between the walk and the read: the next sync sends it
            self.files.put_bytes(join(self.url, rel), data)
            self._sent[rel] = version
            self.uploaded_bytes += len(data)
            done.append(rel)
        return done

    def remove_others(self) -> list[str]:
        """Delete objects under the URL that the local run does not have (after `sync`, when
        replacing an older run); returns their relative paths."""
        local = set(_local_files(self.local_run_dir))
        removed = []
        for rel in self._remote_files():
            if rel not in local:
                self.files.delete(join(self.url, rel))
                removed.append(rel)
        return removed

    def _remote_files(self) -> list[str]:
        key = self.files.key(self.url)
        fs = self.files.fs
        found = self.files._call(self.url, lambda: fs.find(key))
        return sorted(posixpath.relpath(k, key) for k in found)


def upload_run(local_run_dir: str, url: str, *, overwrite: bool = False) -> RunUploader:
    """Upload a finished local run to `url` (meta.pb files last). An existing run there is
    refused (ValueError) unless `overwrite`, which then also deletes its objects that the new
    run does not have."""
    files = files_for(url)
    files.check_reachable(url)
    files.invalidate(url)
    if files.isdir(layout.plugin_dir(url)) and not overwrite:
        raise ValueError(f"{url}: run already exists (pass --overwrite to replace it)")
    uploader = RunUploader(local_run_dir, url)
    uploader.sync()
    if overwrite:
        uploader.remove_others()
    files.invalidate(url)
    return uploader


def import_traces_to_url(paths: list[str], logdir_url: str, run: str | None = None, **kwargs):
    """`kineto_import.import_traces` into a URL logdir: the run is imported into a local
    temporary logdir, then uploaded (`upload_run`). Returns the ImportResult with `run_dir`
    set to the run's URL. Raises ImportFailed (one line) like `import_traces`, also for
    storage problems."""
    from tessera_tb.importers.kineto_import import ImportFailed, import_traces

    overwrite = bool(kwargs.pop("overwrite", False))
    staging = tempfile.mkdtemp(prefix="tessera-upload-")
    try:
        try:
            files = files_for(logdir_url)
            files.check_reachable(logdir_url)
            target = join(logdir_url, run) if run else None
            if target and not overwrite and files.isdir(layout.plugin_dir(target)):
                raise ImportFailed(f"{target}: run already exists (pass --overwrite to replace it)")
        except RemoteStorageError as exc:
            raise ImportFailed(str(exc)) from None
        result = import_traces(paths, staging, run, **kwargs)
        name = os.path.relpath(result.run_dir, staging).replace(os.sep, "/")
        url = join(logdir_url, name)
        try:
            upload_run(result.run_dir, url, overwrite=overwrite)
        except (RemoteStorageError, ValueError) as exc:
            raise ImportFailed(str(exc)) from None
        result.run_dir = url
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)
