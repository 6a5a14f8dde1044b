from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    INT8: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    UINT8: _ClassVar[DType]

class Codec(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODEC_NONE: _ClassVar[Codec]
    CODEC_ZLIB: _ClassVar[Codec]
    CODEC_ZSTD: _ClassVar[Codec]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KIND_OTHER: _ClassVar[EventKind]
    CPU_OP: _ClassVar[EventKind]
    PYTHON: _ClassVar[EventKind]
    ANNOTATION: _ClassVar[EventKind]
    RUNTIME: _ClassVar[EventKind]
    DRIVER: _ClassVar[EventKind]
    KERNEL: _ClassVar[EventKind]
    MEMCPY: _ClassVar[EventKind]
    MEMSET: _ClassVar[EventKind]
    COLLECTIVE: _ClassVar[EventKind]
    SYNC: _ClassVar[EventKind]
    MARK: _ClassVar[EventKind]
    REGION: _ClassVar[EventKind]
    GPU_ANNOTATION: _ClassVar[EventKind]
    MEMORY: _ClassVar[EventKind]
    PROFILER_RANGE: _ClassVar[EventKind]
    TRACE_SPAN: _ClassVar[EventKind]
    OVERHEAD: _ClassVar[EventKind]

class TrackKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRACK_OTHER: _ClassVar[TrackKind]
    HOST_THREAD: _ClassVar[TrackKind]
    DEVICE_STREAM: _ClassVar[TrackKind]

class AttrType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTR_UNSPECIFIED: _ClassVar[AttrType]
    ATTR_INT64: _ClassVar[AttrType]
    ATTR_FLOAT64: _ClassVar[AttrType]
    ATTR_STRING: _ClassVar[AttrType]
    ATTR_JSON: _ClassVar[AttrType]
    ATTR_BOOL: _ClassVar[AttrType]
DTYPE_UNSPECIFIED: DType
INT8: DType
INT32: DType
INT64: DType
FLOAT64: DType
UINT8: DType
CODEC_NONE: Codec
CODEC_ZLIB: Codec
CODEC_ZSTD: Codec
KIND_OTHER: EventKind
CPU_OP: EventKind
PYTHON: EventKind
ANNOTATION: EventKind
RUNTIME: EventKind
DRIVER: EventKind
KERNEL: EventKind
MEMCPY: EventKind
MEMSET: EventKind
COLLECTIVE: EventKind
SYNC: EventKind
MARK: EventKind
REGION: EventKind
GPU_ANNOTATION: EventKind
MEMORY: EventKind
PROFILER_RANGE: EventKind
TRACE_SPAN: EventKind
OVERHEAD: EventKind
TRACK_OTHER: TrackKind
HOST_THREAD: TrackKind
DEVICE_STREAM: TrackKind
ATTR_UNSPECIFIED: AttrType
ATTR_INT64: AttrType
ATTR_FLOAT64: AttrType
ATTR_STRING: AttrType
ATTR_JSON: AttrType
ATTR_BOOL: AttrType

class Column(_message.Message):
    __slots__ = ("dtype", "codec", "count", "delta", "shuffle", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    codec: Codec
    count: int
    delta: bool
    shuffle: bool
    data: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., codec: _Optional[_Union[Codec, str]] = ..., count: _Optional[int] = ..., delta: bool = ..., shuffle: bool = ..., data: _Optional[bytes] = ...) -> None: ...

class Track(_message.Message):
    __slots__ = ("id", "kind", "pid", "tid", "device", "stream", "name", "sort_index")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SORT_INDEX_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: TrackKind
    pid: str
    tid: str
    device: int
    stream: int
    name: str
    sort_index: int
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[_Union[TrackKind, str]] = ..., pid: _Optional[str] = ..., tid: _Optional[str] = ..., device: _Optional[int] = ..., stream: _Optional[int] = ..., name: _Optional[str] = ..., sort_index: _Optional[int] = ...) -> None: ...

class Events(_message.Message):
    __slots__ = ("count", "start_ns", "dur_ns", "name_id", "track_id", "kind", "cat_id", "correlation", "external_id", "parent", "launch")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    DUR_NS_FIELD_NUMBER: _ClassVar[int]
    NAME_ID_FIELD_NUMBER: _ClassVar[int]
    TRACK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CAT_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    count: int
    start_ns: Column
    dur_ns: Column
    name_id: Column
    track_id: Column
    kind: Column
    cat_id: Column
    correlation: Column
    external_id: Column
    parent: Column
    launch: Column
    def __init__(self, count: _Optional[int] = ..., start_ns: _Optional[_Union[Column, _Mapping]] = ..., dur_ns: _Optional[_Union[Column, _Mapping]] = ..., name_id: _Optional[_Union[Column, _Mapping]] = ..., track_id: _Optional[_Union[Column, _Mapping]] = ..., kind: _Optional[_Union[Column, _Mapping]] = ..., cat_id: _Optional[_Union[Column, _Mapping]] = ..., correlation: _Optional[_Union[Column, _Mapping]] = ..., external_id: _Optional[_Union[Column, _Mapping]] = ..., parent: _Optional[_Union[Column, _Mapping]] = ..., launch: _Optional[_Union[Column, _Mapping]] = ...) -> None: ...

class AttrColumn(_message.Message):
    __slots__ = ("key", "type", "rows", "values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    type: AttrType
    rows: Column
    values: Column
    def __init__(self, key: _Optional[str] = ..., type: _Optional[_Union[AttrType, str]] = ..., rows: _Optional[_Union[Column, _Mapping]] = ..., values: _Optional[_Union[Column, _Mapping]] = ...) -> None: ...

class Flows(_message.Message):
    __slots__ = ("count", "flow_id", "cat_id", "phase", "track_id", "ts_ns", "row")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FLOW_ID_FIELD_NUMBER: _ClassVar[int]
    CAT_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    TRACK_ID_FIELD_NUMBER: _ClassVar[int]
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    count: int
    flow_id: Column
    cat_id: Column
    phase: Column
    track_id: Column
    ts_ns: Column
    row: Column
    def __init__(self, count: _Optional[int] = ..., flow_id: _Optional[_Union[Column, _Mapping]] = ..., cat_id: _Optional[_Union[Column, _Mapping]] = ..., phase: _Optional[_Union[Column, _Mapping]] = ..., track_id: _Optional[_Union[Column, _Mapping]] = ..., ts_ns: _Optional[_Union[Column, _Mapping]] = ..., row: _Optional[_Union[Column, _Mapping]] = ...) -> None: ...

class CounterTrack(_message.Message):
    __slots__ = ("name", "unit", "source", "device", "ts_ns", "values")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    name: str
    unit: str
    source: str
    device: int
    ts_ns: Column
    values: Column
    def __init__(self, name: _Optional[str] = ..., unit: _Optional[str] = ..., source: _Optional[str] = ..., device: _Optional[int] = ..., ts_ns: _Optional[_Union[Column, _Mapping]] = ..., values: _Optional[_Union[Column, _Mapping]] = ...) -> None: ...

class Capability(_message.Message):
    __slots__ = ("name", "status", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    status: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class StringTable(_message.Message):
    __slots__ = ("codec", "count", "data")
    CODEC_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    codec: Codec
    count: int
    data: bytes
    def __init__(self, codec: _Optional[_Union[Codec, str]] = ..., count: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("schema_major", "schema_minor", "step", "base_ns", "start_ns", "end_ns", "strings", "tracks", "events", "attrs", "flows", "counters", "capabilities", "span_index")
    SCHEMA_MAJOR_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_MINOR_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BASE_NS_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    TRACKS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ATTRS_FIELD_NUMBER: _ClassVar[int]
    FLOWS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SPAN_INDEX_FIELD_NUMBER: _ClassVar[int]
    schema_major: int
    schema_minor: int
    step: int
    base_ns: int
    start_ns: int
    end_ns: int
    strings: StringTable
    tracks: _containers.RepeatedCompositeFieldContainer[Track]
    events: Events
    attrs: _containers.RepeatedCompositeFieldContainer[AttrColumn]
    flows: Flows
    counters: _containers.RepeatedCompositeFieldContainer[CounterTrack]
    capabilities: _containers.RepeatedCompositeFieldContainer[Capability]
    span_index: int
    def __init__(self, schema_major: _Optional[int] = ..., schema_minor: _Optional[int] = ..., step: _Optional[int] = ..., base_ns: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., strings: _Optional[_Union[StringTable, _Mapping]] = ..., tracks: _Optional[_Iterable[_Union[Track, _Mapping]]] = ..., events: _Optional[_Union[Events, _Mapping]] = ..., attrs: _Optional[_Iterable[_Union[AttrColumn, _Mapping]]] = ..., flows: _Optional[_Union[Flows, _Mapping]] = ..., counters: _Optional[_Iterable[_Union[CounterTrack, _Mapping]]] = ..., capabilities: _Optional[_Iterable[_Union[Capability, _Mapping]]] = ..., span_index: _Optional[int] = ...) -> None: ...

class DeviceProperties(_message.Message):
    __slots__ = ("id", "name", "total_global_mem_bytes", "compute_major", "compute_minor", "num_sms", "extra_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_GLOBAL_MEM_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MAJOR_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MINOR_FIELD_NUMBER: _ClassVar[int]
    NUM_SMS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_JSON_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    total_global_mem_bytes: int
    compute_major: int
    compute_minor: int
    num_sms: int
    extra_json: str
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., total_global_mem_bytes: _Optional[int] = ..., compute_major: _Optional[int] = ..., compute_minor: _Optional[int] = ..., num_sms: _Optional[int] = ..., extra_json: _Optional[str] = ...) -> None: ...

class ProcessGroup(_message.Message):
    __slots__ = ("name", "desc", "backend_config", "size", "ranks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESC_FIELD_NUMBER: _ClassVar[int]
    BACKEND_CONFIG_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    desc: str
    backend_config: str
    size: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., desc: _Optional[str] = ..., backend_config: _Optional[str] = ..., size: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class StepIndexEntry(_message.Message):
    __slots__ = ("step", "start_ns", "end_ns", "event_count")
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    step: int
    start_ns: int
    end_ns: int
    event_count: int
    def __init__(self, step: _Optional[int] = ..., start_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., event_count: _Optional[int] = ...) -> None: ...

class WorkerMeta(_message.Message):
    __slots__ = ("schema_major", "schema_minor", "worker", "host", "pid", "rank", "world_size", "devices", "clock_base_ns", "versions", "process_groups", "backend", "sources", "source_format", "trace_meta_json", "steps", "capabilities", "origin")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SCHEMA_MAJOR_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_MINOR_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_BASE_NS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    TRACE_META_JSON_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    schema_major: int
    schema_minor: int
    worker: str
    host: str
    pid: int
    rank: int
    world_size: int
    devices: _containers.RepeatedCompositeFieldContainer[DeviceProperties]
    clock_base_ns: int
    versions: _containers.ScalarMap[str, str]
    process_groups: _containers.RepeatedCompositeFieldContainer[ProcessGroup]
    backend: str
    sources: _containers.RepeatedScalarFieldContainer[str]
    source_format: str
    trace_meta_json: str
    steps: _containers.RepeatedCompositeFieldContainer[StepIndexEntry]
    capabilities: _containers.RepeatedCompositeFieldContainer[Capability]
    origin: str
    def __init__(self, schema_major: _Optional[int] = ..., schema_minor: _Optional[int] = ..., worker: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., devices: _Optional[_Iterable[_Union[DeviceProperties, _Mapping]]] = ..., clock_base_ns: _Optional[int] = ..., versions: _Optional[_Mapping[str, str]] = ..., process_groups: _Optional[_Iterable[_Union[ProcessGroup, _Mapping]]] = ..., backend: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ..., source_format: _Optional[str] = ..., trace_meta_json: _Optional[str] = ..., steps: _Optional[_Iterable[_Union[StepIndexEntry, _Mapping]]] = ..., capabilities: _Optional[_Iterable[_Union[Capability, _Mapping]]] = ..., origin: _Optional[str] = ...) -> None: ...

class KernelCounterMetric(_message.Message):
    __slots__ = ("name", "unit", "source_unit", "source", "capability", "values")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_UNIT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    name: str
    unit: str
    source_unit: str
    source: str
    capability: str
    values: Column
    def __init__(self, name: _Optional[str] = ..., unit: _Optional[str] = ..., source_unit: _Optional[str] = ..., source: _Optional[str] = ..., capability: _Optional[str] = ..., values: _Optional[_Union[Column, _Mapping]] = ...) -> None: ...

class KernelMatchReport(_message.Message):
    __slots__ = ("profiled_kernels", "run_kernels", "matched", "matched_base_name", "mismatched", "outside", "offset", "tied_offsets", "first_mismatches")
    PROFILED_KERNELS_FIELD_NUMBER: _ClassVar[int]
    RUN_KERNELS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    MATCHED_BASE_NAME_FIELD_NUMBER: _ClassVar[int]
    MISMATCHED_FIELD_NUMBER: _ClassVar[int]
    OUTSIDE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIED_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    FIRST_MISMATCHES_FIELD_NUMBER: _ClassVar[int]
    profiled_kernels: int
    run_kernels: int
    matched: int
    matched_base_name: int
    mismatched: int
    outside: int
    offset: int
    tied_offsets: int
    first_mismatches: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, profiled_kernels: _Optional[int] = ..., run_kernels: _Optional[int] = ..., matched: _Optional[int] = ..., matched_base_name: _Optional[int] = ..., mismatched: _Optional[int] = ..., outside: _Optional[int] = ..., offset: _Optional[int] = ..., tied_offsets: _Optional[int] = ..., first_mismatches: _Optional[_Iterable[str]] = ...) -> None: ...

class KernelCounters(_message.Message):
    __slots__ = ("schema_major", "schema_minor", "worker", "source", "source_format", "match_method", "match_note", "compute_capability", "count", "profiled_id", "name_id", "step", "row", "match", "strings", "metrics", "report", "device_name")
    SCHEMA_MAJOR_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_MINOR_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MATCH_METHOD_FIELD_NUMBER: _ClassVar[int]
    MATCH_NOTE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PROFILED_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    schema_major: int
    schema_minor: int
    worker: str
    source: str
    source_format: str
    match_method: str
    match_note: str
    compute_capability: str
    count: int
    profiled_id: Column
    name_id: Column
    step: Column
    row: Column
    match: Column
    strings: StringTable
    metrics: _containers.RepeatedCompositeFieldContainer[KernelCounterMetric]
    report: KernelMatchReport
    device_name: str
    def __init__(self, schema_major: _Optional[int] = ..., schema_minor: _Optional[int] = ..., worker: _Optional[str] = ..., source: _Optional[str] = ..., source_format: _Optional[str] = ..., match_method: _Optional[str] = ..., match_note: _Optional[str] = ..., compute_capability: _Optional[str] = ..., count: _Optional[int] = ..., profiled_id: _Optional[_Union[Column, _Mapping]] = ..., name_id: _Optional[_Union[Column, _Mapping]] = ..., step: _Optional[_Union[Column, _Mapping]] = ..., row: _Optional[_Union[Column, _Mapping]] = ..., match: _Optional[_Union[Column, _Mapping]] = ..., strings: _Optional[_Union[StringTable, _Mapping]] = ..., metrics: _Optional[_Iterable[_Union[KernelCounterMetric, _Mapping]]] = ..., report: _Optional[_Union[KernelMatchReport, _Mapping]] = ..., device_name: _Optional[str] = ...) -> None: ...
