"""Run bundles: one zip file that holds a run, for sending to someone (`tessera-prof pack`).

A bundle is read in place (a `*.tessera.zip` in a logdir is a run of the plugin, and
`open_run("exp1.tessera.zip")` opens it) or unpacked into a run directory
(`tessera-prof unpack`). Its members are the run directory's files at the same relative paths,
plus a manifest:

    tessera-bundle.json                         the manifest (below)
    plugins/tessera/<worker>/meta.pb            as in a run directory (docs/FORMAT.md)
    plugins/tessera/<worker>/step_%08d.pb
    plugins/tessera/<worker>/kernel_counters.pb when the run has Nsight Compute counters
    events.out.tfevents.*                       the TensorBoard scalars

Manifest (JSON): `format` ("tessera-bundle"), `format_version` (1), `run` (the run's name when
packed), `tessera_version`, `workers`, `steps`, and `files`: one `{"path", "size_bytes",
"sha256"}` per member other than the manifest.

A bundle comes from someone else, so nothing in it is trusted. Opening one checks, before any
member is read: member names (no absolute paths, drive letters, backslashes, empty, `.` or
`..` parts; no symlink, directory-only, encrypted or unknown-compression members; no
duplicates), the limits of `BundleLimits` (file count, bytes per file and in total, compression
ratio: zip bombs), and that the manifest lists exactly the members, with their sizes. Each
member's SHA-256 is checked against the manifest the first time it is read (`check_bundle`
reads them all). Every problem is a `BundleError` naming the bundle.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import stat
import struct
import tempfile
import threading
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field

from tessera_tb import __version__
from tessera_tb.proto import trace_pb2 as pb
from tessera_tb.trace import layout, run_placement
from tessera_tb.trace.errors import TraceFormatError

BUNDLE_SUFFIX = layout.BUNDLE_SUFFIX
MANIFEST_NAME = "tessera-bundle.json"
FORMAT_NAME = "tessera-bundle"
FORMAT_VERSION = 1
EVENT_FILE_PREFIX = "events.out.tfevents."
_MAX_MANIFEST_BYTES = 64 << 20
_DRIVE = re.compile(r"^[A-Za-z]:")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BundleError(TraceFormatError):
    """A bundle that cannot be used; the message names the bundle and the problem."""


@dataclass(frozen=True)
class BundleLimits:
    """What a bundle may hold. A member counts against `max_ratio` (uncompressed bytes per
    compressed byte) only from `ratio_floor_bytes` uncompressed bytes on: small files of
    repeated bytes compress very well and are harmless."""

    max_files: int = 200_000
    max_file_bytes: int = 4 << 30
    max_total_bytes: int = 32 << 30
    max_ratio: float = 200.0
    ratio_floor_bytes: int = 1 << 20


DEFAULT_LIMITS = BundleLimits()


# Reading -------------------------------------------------------------------------------------


def _member_problem(info: zipfile.ZipInfo) -> str | None:
    """Why a zip member may not be in a bundle, or None."""
    name = info.filename
    if name.startswith("/") or _DRIVE.match(name):
        return f"member {name!r} has an absolute path"
    if "\\" in name or "\x00" in name:
        return f"member {name!r} has a backslash or NUL in its name"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"member {name!r} escapes the bundle or has empty path parts"
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return f"member {name!r} is a symbolic link"
    if info.flag_bits & 0x1:
        return f"member {name!r} is encrypted"
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        return f"member {name!r} uses an unsupported compression ({info.compress_type})"
    return None


class BundleFiles(layout.RunFiles):
    """A checked bundle, read as if it were the run directory at its own path.

    Paths are `<bundle path>/<member>` (`/x/exp1.tessera.zip/plugins/tessera/rank0/meta.pb`).
    Reads are thread-safe.
    """

    def __init__(self, path: str, limits: BundleLimits = DEFAULT_LIMITS):
        self.path = path
        self.limits = limits
        self._lock = threading.Lock()
        self._verified: set[str] = set()
        try:
            st = os.stat(path)
            self.version = (st.st_mtime_ns, st.st_size)
            self._zip = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, ValueError) as exc:
            raise BundleError(path, f"not a readable zip file ({exc})") from None
        try:
            self._members, self.manifest = self._check()
        except BaseException:
            self._zip.close()
            raise
        self._dirs: dict[str, set[str]] = {"": set()}
        for name in self._members:
            parts = name.split("/")
            for i in range(len(parts)):
                parent = "/".join(parts[:i])
                self._dirs.setdefault(parent, set()).add(parts[i])

    def _error(self, problem: str) -> BundleError:
        return BundleError(self.path, problem)

    def _check(self) -> tuple[dict[str, zipfile.ZipInfo], dict]:
        lim = self.limits
        infos = self._zip.infolist()
        if len(infos) > lim.max_files + 1:
            raise self._error(f"holds {len(infos)} members, more than the limit of {lim.max_files}")
        members: dict[str, zipfile.ZipInfo] = {}
        total = 0
        for info in infos:
            problem = _member_problem(info)
            if problem is None and info.is_dir():
                problem = f"member {info.filename!r} is a directory entry"
            if problem is not None:
                raise self._error(problem)
            if info.filename in members:
                raise self._error(f"member {info.filename!r} appears twice")
            if info.file_size > lim.max_file_bytes:
                raise self._error(
                    f"member {info.filename!r} is {info.file_size:,} bytes uncompressed, over "
                    f"the limit of {lim.max_file_bytes:,}"
                )
            ratio = info.file_size / max(info.compress_size, 1)
            if info.file_size >= lim.ratio_floor_bytes and ratio > lim.max_ratio:
                raise self._error(
                    f"member {info.filename!r} expands {ratio:,.0f}x ({info.compress_size:,} -> "
                    f"{info.file_size:,} bytes), over the limit of {lim.max_ratio:,.0f}x "
                    "(a zip bomb?)"
                )
            total += info.file_size
            if total > lim.max_total_bytes:
                raise self._error(
                    f"holds more than {lim.max_total_bytes:,} bytes uncompressed, over the limit"
                )
            members[info.filename] = info
        manifest_info = members.pop(MANIFEST_NAME, None)
        if manifest_info is None:
            raise self._error(f"has no {MANIFEST_NAME} (not a Tessera bundle)")
        if manifest_info.file_size > _MAX_MANIFEST_BYTES:
            raise self._error(f"{MANIFEST_NAME} is too large")
        manifest = self._parse_manifest(self._read_member(manifest_info))
        listed = {f["path"]: f for f in manifest["files"]}
        missing = sorted(set(listed) - set(members))
        extra = sorted(set(members) - set(listed))
        if missing:
            raise self._error(f"{MANIFEST_NAME} lists {missing[0]!r}, which the bundle lacks")
        if extra:
            raise self._error(f"member {extra[0]!r} is not in {MANIFEST_NAME}")
        for name, info in members.items():
            if listed[name]["size_bytes"] != info.file_size:
                raise self._error(
                    f"member {name!r} is {info.file_size:,} bytes, {MANIFEST_NAME} says "
                    f"{listed[name]['size_bytes']:,}"
                )
        self._sha256 = {name: f["sha256"] for name, f in listed.items()}
        return members, manifest

    def _parse_manifest(self, data: bytes) -> dict:
        try:
            manifest = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise self._error(f"{MANIFEST_NAME} is not JSON ({exc})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            raise self._error(f"{MANIFEST_NAME} is not a Tessera bundle manifest")
        version = manifest.get("format_version")
        if not isinstance(version, int) or version < 1:
            raise self._error(f"{MANIFEST_NAME} has no valid format_version")
        if version > FORMAT_VERSION:
            raise self._error(
                f"bundle format {version} is newer than this reader's {FORMAT_VERSION}: "
                "upgrade tessera-profiler to read it"
            )
        files = manifest.get("files")
        ok = isinstance(files, list) and all(
            isinstance(f, dict)
            and isinstance(f.get("path"), str)
            and isinstance(f.get("size_bytes"), int)
            and isinstance(f.get("sha256"), str)
            and _SHA256.match(f["sha256"])
            for f in files
        )
        if not ok:
            raise self._error(f"{MANIFEST_NAME} has a malformed file list")
        return manifest

    def _read_member(self, info: zipfile.ZipInfo) -> bytes:
        try:
            with self._lock, self._zip.open(info) as f:
                data = f.read(info.file_size + 1)
        except (OSError, zipfile.BadZipFile, EOFError, ValueError, RuntimeError) as exc:
            raise self._error(f"member {info.filename!r} is corrupt ({exc})") from None
        if len(data) != info.file_size:
            raise self._error(f"member {info.filename!r} does not hold its stated size")
        return data

    def _inner(self, path: str) -> str:
        """The member name of a path under the bundle ("" for the bundle itself)."""
        if path == self.path:
            return ""
        prefix = self.path + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path!r} is not inside the bundle {self.path!r}")
        return os.path.normpath(path[len(prefix) :]).replace(os.sep, "/").strip("/")

    @property
    def members(self) -> list[str]:
        """Member names other than the manifest."""
        return sorted(self._members)

    def read_bytes(self, path: str) -> bytes:
        name = self._inner(path)
        info = self._members.get(name)
        if info is None:
            raise FileNotFoundError(2, "no such member in the bundle", path)
        data = self._read_member(info)
        if name not in self._verified:
            if hashlib.sha256(data).hexdigest() != self._sha256[name]:
                raise self._error(f"member {name!r} does not match its SHA-256 in the manifest")
            self._verified.add(name)
        return data

    def isfile(self, path: str) -> bool:
        return self._inner(path) in self._members

    def isdir(self, path: str) -> bool:
        return self._inner(path) in self._dirs

    def listdir(self, path: str) -> list[str]:
        name = self._inner(path)
        if name not in self._dirs:
            raise FileNotFoundError(2, "no such directory in the bundle", path)
        return sorted(self._dirs[name])

    def signature(self, path: str) -> tuple | None:
        info = self._members.get(self._inner(path))
        if info is None:
            return None
        return ((*self.version, info.CRC), info.file_size)

    def close(self) -> None:
        self._zip.close()


_OPEN: dict[str, tuple[tuple[int, int], BundleFiles | BundleError]] = {}
_OPEN_LOCK = threading.Lock()


def files_for(path: str, limits: BundleLimits | None = None) -> BundleFiles:
    """The checked bundle at `path`, opened once per version of the file (its mtime and size)
    and kept open; raises the `BundleError` of a bundle that fails its checks (remembered per
    version too). `limits` other than the module's `DEFAULT_LIMITS` open a fresh, uncached
    reader."""
    if limits is not None and limits != DEFAULT_LIMITS:
        return BundleFiles(path, limits)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BundleError(path, f"cannot read ({exc.strerror or exc})") from None
    version = (st.st_mtime_ns, st.st_size)
    with _OPEN_LOCK:
        cached = _OPEN.get(path)
    if cached is not None and cached[0] == version:
        found = cached[1]
    else:
        try:
            found = BundleFiles(path, DEFAULT_LIMITS)
        except BundleError as exc:
            found = exc
        with _OPEN_LOCK:
            _OPEN[path] = (version, found)
    if isinstance(found, BundleError):
        raise found
    return found


def check_bundle(path: str, limits: BundleLimits | None = None) -> dict:
    """Open a bundle and read every member, checking each against its SHA-256; returns the
    manifest. Raises `BundleError`."""
    files = BundleFiles(path, limits or DEFAULT_LIMITS)
    try:
        for name in files.members:
            files.read_bytes(f"{path}/{name}")
        return files.manifest
    finally:
        files.close()


# Writing -------------------------------------------------------------------------------------


@dataclass
class PackResult:
    """What `pack_run` wrote: the bundle, its members and sizes."""

    path: str
    run: str
    workers: list[str]
    steps: list[int]
    files: list[dict] = field(default_factory=list)
    uncompressed_bytes: int = 0
    bundle_bytes: int = 0


def _filter_event_file(data: bytes, steps: set[int]) -> bytes:
    """A TensorBoard event file keeping only the summaries of `steps` (other events, such as
    the file version record, are kept). Records are TFRecords: length, its CRC, data, CRC."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    out = io.BytesIO()
    writer = RecordWriter(out)
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        record = data[pos + 12 : pos + 12 + length]
        pos += 12 + length + 4
        if len(record) != length:
            break  # a torn tail: the writer was interrupted
        event = event_pb2.Event.FromString(record)
        if not event.HasField("summary") or event.step in steps:
            writer.write(record)
    return out.getvalue()


def _member_data(
    run, workers: list[str], steps: list[int] | None
) -> Iterable[tuple[str, bytes, int]]:
    """(member name, bytes, zip compression) of every file a bundle of this selection holds."""
    files = layout.run_files(run.path)
    chosen = set(steps) if steps is not None else None
    for w in workers:
        info = run.worker(w)
        wdir = info.directory
        keep = [e for e in info.meta.steps if chosen is None or e.step in chosen]
        meta_path = os.path.join(wdir, layout.META_FILE)
        if len(keep) == len(info.meta.steps):
            meta_bytes = files.read_bytes(meta_path)
        else:
            meta = pb.WorkerMeta()
            meta.CopyFrom(info.meta)
            del meta.steps[:]
            meta.steps.extend(keep)
            meta_bytes = meta.SerializeToString(deterministic=True)
        prefix = f"plugins/{layout.PLUGIN_NAME}/{w}/"
        yield prefix + layout.META_FILE, meta_bytes, zipfile.ZIP_DEFLATED
        for e in keep:
            name = layout.step_file_name(e.step)
            # Step columns are compressed already (Zstandard; zlib in schema 1.x): stored,
            # they read without a second inflate.
            yield prefix + name, files.read_bytes(os.path.join(wdir, name)), zipfile.ZIP_STORED
        counters = os.path.join(wdir, "kernel_counters.pb")
        if files.isfile(counters):
            yield prefix + "kernel_counters.pb", files.read_bytes(counters), zipfile.ZIP_DEFLATED
    every_worker = set(workers) == set(run.workers)
    for name in sorted(files.listdir(run.path)):
        if not name.startswith(EVENT_FILE_PREFIX):
            continue
        owner = name.rsplit(".tessera.", 1)[1] if ".tessera." in name else None
        if owner is None and not every_worker:
            continue  # scalars of no particular worker belong to the whole run
        if owner is not None and owner not in workers:
            continue
        data = files.read_bytes(os.path.join(run.path, name))
        if chosen is not None:
            data = _filter_event_file(data, chosen)
        yield name, data, zipfile.ZIP_DEFLATED


def pack_run(
    run_path: str,
    out_path: str,
    workers: Iterable[str] | None = None,
    steps: Iterable[int] | None = None,
    *,
    overwrite: bool = False,
) -> PackResult:
    """Write the run at `run_path` (a directory, a bundle or a URL) as a bundle at `out_path`:
    every worker and step, or the chosen ones. A worker's meta.pb then indexes only the chosen
    steps and its scalars keep only theirs. The zip is written to a hidden temporary file
    beside `out_path` and renamed into place.

    Raises ValueError for an unknown worker or step or an existing `out_path` (without
    `overwrite`), TraceFormatError for an unreadable run.
    """
    from tessera_tb.trace.reader import open_run

    run = open_run(run_path)
    names = sorted(run.workers) if workers is None else list(dict.fromkeys(workers))
    for w in names:
        if w not in run.workers:
            raise ValueError(f"run {run_path} has no worker {w!r}; it has {sorted(run.workers)}")
    chosen_steps = None
    if steps is not None:
        chosen_steps = sorted(set(int(s) for s in steps))
        have = {s for w in names for s in run.worker(w).steps}
        missing = [s for s in chosen_steps if s not in have]
        if missing:
            raise ValueError(f"run {run_path} has no step(s) {missing}; it has {sorted(have)}")
    if os.path.exists(out_path) and not overwrite:
        raise ValueError(f"{out_path} exists (use --overwrite to replace it)")
    run_name = os.path.basename(os.path.normpath(run_path))
    if run_name.endswith(BUNDLE_SUFFIX):
        run_name = run_name[: -len(BUNDLE_SUFFIX)]
    result = PackResult(
        path=out_path,
        run=run_name,
        workers=names,
        steps=chosen_steps or sorted({s for w in names for s in run.worker(w).steps}),
    )
    directory = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=".pack.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", allowZip64=True) as zf:
            for name, data, compression in _member_data(run, names, chosen_steps):
                zf.writestr(name, data, compress_type=compression, compresslevel=6)
                result.files.append(
                    {
                        "path": name,
                        "size_bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                    }
                )
                result.uncompressed_bytes += len(data)
            manifest = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "run": run_name,
                "tessera_version": __version__,
                "workers": names,
                "steps": result.steps,
                "files": result.files,
            }
            text = json.dumps(manifest, indent=1).encode()
            zf.writestr(MANIFEST_NAME, text, compress_type=zipfile.ZIP_DEFLATED)
        os.replace(tmp, out_path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    result.bundle_bytes = os.path.getsize(out_path)
    return result


def safe_run_name(name: object) -> str:
    """A run directory name from a manifest (untrusted): one path part of [A-Za-z0-9._-]."""
    return layout.safe_worker_name(str(name)) if name else "run"


def unpack_bundle(
    bundle_path: str,
    run_dir: str,
    *,
    overwrite: bool = False,
    limits: BundleLimits | None = None,
) -> dict:
    """Check every member of the bundle (`check_bundle`) and write them into a new run
    directory `run_dir`; returns the manifest.

    The run is assembled in a hidden directory beside `run_dir` and renamed into place, so a
    failure leaves nothing behind. An existing `run_dir` is refused (ValueError) unless
    `overwrite`, which replaces it only once the new run is complete.
    """
    run_dir = os.path.abspath(run_dir)
    if os.path.lexists(run_dir) and not overwrite:
        raise ValueError(f"{run_dir} exists (use --overwrite to replace it)")
    files = BundleFiles(bundle_path, limits or DEFAULT_LIMITS)
    parent = os.path.dirname(run_dir)
    os.makedirs(parent, exist_ok=True)
    # Assembled in a hidden directory and put in place exclusively (trace/run_placement.py):
    # of two unpacks into one run, one wins and the other leaves nothing behind.
    run_placement.remove_stale_staging(parent)
    staging = run_placement.make_staging_dir(parent, "unpack")
    try:
        for name in files.members:
            data = files.read_bytes(f"{bundle_path}/{name}")  # checks the SHA-256
            dest = os.path.join(staging, *name.split("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        os.makedirs(layout.plugin_dir(staging), exist_ok=True)
        try:
            run_placement.place_run(staging, run_dir, overwrite=overwrite)
        except run_placement.RunExists:
            raise ValueError(f"{run_dir} exists (use --overwrite to replace it)") from None
        return files.manifest
    finally:
        files.close()
        shutil.rmtree(staging, ignore_errors=True)
