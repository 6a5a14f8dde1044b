"""TensorBoard event files for a run: per-step scalars, tagged per worker.

Tags are `tessera/step_time_ms/<worker>` and `tessera/gpu_busy_pct/<worker>`, so ranks
do not interleave in TensorBoard's Scalars tab. Each worker writes its own event file.

The file is written here, not through TensorBoard's EventFileWriter: that one imports
TensorBoard's TensorFlow stub (and boto3 with it) and runs a writer thread, which cost an
import several times more than writing a small run (bench/ingest.py). The records are the
TFRecord framing of `Event` messages whose bytes equal what
`tensorboard.plugins.scalar.summary_v2.scalar_pb` makes (a test checks them byte for byte).
"""

from __future__ import annotations

import os
import socket
import struct
import time

from tessera_tb.backend.utilization import gpu_busy_pct
from tessera_tb.trace.step import StepData

FILE_VERSION = "brain.Event:2"


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord frames use it."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 as protobuf writes it: negatives take ten bytes
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int = 0, *, summary: bytes = b"", version: str = "") -> bytes:
    """A serialized tensorboard Event (proto3: default values are left out)."""
    out = b""
    if wall_time:
        out += b"\x09" + struct.pack("<d", wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if version:
        out += _field(3, version.encode())
    if summary:
        out += _field(5, summary)
    return out


def scalar_summary(tag: str, value: float) -> bytes:
    """A serialized Summary holding one scalar, as summary_v2.scalar_pb builds it: a float
    tensor of shape [] with the scalars plugin's metadata."""
    tensor = b"\x08\x01" + b"\x12\x00" + _field(5, struct.pack("<f", value))
    metadata = _field(1, _field(1, b"scalars"))
    return _field(1, _field(1, tag.encode()) + _field(8, tensor) + _field(9, metadata))


class ScalarWriter:
    def __init__(self, run_dir: str, worker: str):
        self.worker = worker
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.0.tessera.{worker}"
        )
        self.path = os.path.join(run_dir, name)
        self._file = open(self.path, "ab")
        self._file.write(tfrecord(_event(time.time(), version=FILE_VERSION)))
        self._file.flush()

    def _add(self, tag: str, value: float, step: int, wall_time: float) -> None:
        event = _event(wall_time, int(step), summary=scalar_summary(tag, float(value)))
        self._file.write(tfrecord(event))

    def write_step(self, step: StepData) -> None:
        wall_time = step.end_ns / 1e9
        self._add(f"tessera/step_time_ms/{self.worker}", step.span_ns / 1e6, step.step, wall_time)
        busy = gpu_busy_pct(step)
        if busy is not None:
            self._add(f"tessera/gpu_busy_pct/{self.worker}", busy, step.step, wall_time)
        self._file.flush()  # TensorBoard shows a live session's steps as they land

    def close(self) -> None:
        self._file.close()
