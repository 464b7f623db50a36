from protos.tether.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PublishChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: PublishHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[PublishHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Lineage(_message.Message):
    __slots__ = ("parent_version", "trainer_step", "data_offset", "reward_version", "trainer", "algo")
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STEP_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REWARD_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    ALGO_FIELD_NUMBER: _ClassVar[int]
    parent_version: int
    trainer_step: int
    data_offset: int
    reward_version: str
    trainer: str
    algo: str
    def __init__(self, parent_version: _Optional[int] = ..., trainer_step: _Optional[int] = ..., data_offset: _Optional[int] = ..., reward_version: _Optional[str] = ..., trainer: _Optional[str] = ..., algo: _Optional[str] = ...) -> None: ...

class PublishHeader(_message.Message):
    __slots__ = ("policy", "format", "size", "sha256", "lineage", "probe_inputs", "probe_outputs", "atol", "inputs", "outputs")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    PROBE_INPUTS_FIELD_NUMBER: _ClassVar[int]
    PROBE_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ATOL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    format: str
    size: int
    sha256: str
    lineage: Lineage
    probe_inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    probe_outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    atol: float
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    def __init__(self, policy: _Optional[str] = ..., format: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., lineage: _Optional[_Union[Lineage, _Mapping]] = ..., probe_inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., probe_outputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., atol: _Optional[float] = ..., inputs: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ("policy", "version", "sha256", "ready_versions", "max_abs_error", "load_seconds")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    READY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ABS_ERROR_FIELD_NUMBER: _ClassVar[int]
    LOAD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    version: int
    sha256: str
    ready_versions: _containers.RepeatedScalarFieldContainer[int]
    max_abs_error: float
    load_seconds: float
    def __init__(self, policy: _Optional[str] = ..., version: _Optional[int] = ..., sha256: _Optional[str] = ..., ready_versions: _Optional[_Iterable[int]] = ..., max_abs_error: _Optional[float] = ..., load_seconds: _Optional[float] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    def __init__(self, policy: _Optional[str] = ...) -> None: ...

class PolicyVersion(_message.Message):
    __slots__ = ("version", "sha256", "lineage", "published_unix_ns", "sessions", "state", "format", "gate", "stats", "updated_unix_ns")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    version: int
    sha256: str
    lineage: Lineage
    published_unix_ns: int
    sessions: int
    state: str
    format: str
    gate: _containers.RepeatedCompositeFieldContainer[GateCheck]
    stats: VersionStats
    updated_unix_ns: int
    def __init__(self, version: _Optional[int] = ..., sha256: _Optional[str] = ..., lineage: _Optional[_Union[Lineage, _Mapping]] = ..., published_unix_ns: _Optional[int] = ..., sessions: _Optional[int] = ..., state: _Optional[str] = ..., format: _Optional[str] = ..., gate: _Optional[_Iterable[_Union[GateCheck, _Mapping]]] = ..., stats: _Optional[_Union[VersionStats, _Mapping]] = ..., updated_unix_ns: _Optional[int] = ...) -> None: ...

class GateCheck(_message.Message):
    __slots__ = ("name", "passed", "figures", "detail")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    passed: bool
    figures: _containers.ScalarMap[str, float]
    detail: str
    def __init__(self, name: _Optional[str] = ..., passed: _Optional[bool] = ..., figures: _Optional[_Mapping[str, float]] = ..., detail: _Optional[str] = ...) -> None: ...

class VersionStats(_message.Message):
    __slots__ = ("steps", "episodes", "mean_return", "latency_p50_ms", "latency_p99_ms", "errors", "guard_interventions", "shadow_steps", "shadow_divergence", "shadow_errors", "intervention_steps", "intervention_rate")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P99_MS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    GUARD_INTERVENTIONS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_STEPS_FIELD_NUMBER: _ClassVar[int]
    SHADOW_DIVERGENCE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_ERRORS_FIELD_NUMBER: _ClassVar[int]
    INTERVENTION_STEPS_FIELD_NUMBER: _ClassVar[int]
    INTERVENTION_RATE_FIELD_NUMBER: _ClassVar[int]
    steps: int
    episodes: int
    mean_return: float
    latency_p50_ms: float
    latency_p99_ms: float
    errors: int
    guard_interventions: int
    shadow_steps: int
    shadow_divergence: float
    shadow_errors: int
    intervention_steps: int
    intervention_rate: float
    def __init__(self, steps: _Optional[int] = ..., episodes: _Optional[int] = ..., mean_return: _Optional[float] = ..., latency_p50_ms: _Optional[float] = ..., latency_p99_ms: _Optional[float] = ..., errors: _Optional[int] = ..., guard_interventions: _Optional[int] = ..., shadow_steps: _Optional[int] = ..., shadow_divergence: _Optional[float] = ..., shadow_errors: _Optional[int] = ..., intervention_steps: _Optional[int] = ..., intervention_rate: _Optional[float] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ("live", "previous_live", "shadow", "canary", "canary_fraction", "canary_labels", "pins", "mode")
    class CanaryLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class PinsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    LIVE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LIVE_FIELD_NUMBER: _ClassVar[int]
    SHADOW_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CANARY_LABELS_FIELD_NUMBER: _ClassVar[int]
    PINS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    live: int
    previous_live: int
    shadow: int
    canary: int
    canary_fraction: float
    canary_labels: _containers.ScalarMap[str, str]
    pins: _containers.ScalarMap[str, int]
    mode: str
    def __init__(self, live: _Optional[int] = ..., previous_live: _Optional[int] = ..., shadow: _Optional[int] = ..., canary: _Optional[int] = ..., canary_fraction: _Optional[float] = ..., canary_labels: _Optional[_Mapping[str, str]] = ..., pins: _Optional[_Mapping[str, int]] = ..., mode: _Optional[str] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("id", "t_unix_ns", "policy", "version", "kind", "from_state", "to_state", "who", "why", "figures", "detail")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    T_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: int
    t_unix_ns: int
    policy: str
    version: int
    kind: str
    from_state: str
    to_state: str
    who: str
    why: str
    figures: _containers.ScalarMap[str, float]
    detail: str
    def __init__(self, id: _Optional[int] = ..., t_unix_ns: _Optional[int] = ..., policy: _Optional[str] = ..., version: _Optional[int] = ..., kind: _Optional[str] = ..., from_state: _Optional[str] = ..., to_state: _Optional[str] = ..., who: _Optional[str] = ..., why: _Optional[str] = ..., figures: _Optional[_Mapping[str, float]] = ..., detail: _Optional[str] = ...) -> None: ...

class Freshness(_message.Message):
    __slots__ = ("newest", "sessions", "max_version_lag", "mean_version_lag", "max_time_lag_s")
    NEWEST_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_VERSION_LAG_FIELD_NUMBER: _ClassVar[int]
    MEAN_VERSION_LAG_FIELD_NUMBER: _ClassVar[int]
    MAX_TIME_LAG_S_FIELD_NUMBER: _ClassVar[int]
    newest: int
    sessions: int
    max_version_lag: int
    mean_version_lag: float
    max_time_lag_s: float
    def __init__(self, newest: _Optional[int] = ..., sessions: _Optional[int] = ..., max_version_lag: _Optional[int] = ..., mean_version_lag: _Optional[float] = ..., max_time_lag_s: _Optional[float] = ...) -> None: ...

class RolloutStatusRequest(_message.Message):
    __slots__ = ("policy", "events")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    events: int
    def __init__(self, policy: _Optional[str] = ..., events: _Optional[int] = ...) -> None: ...

class RolloutStatusReply(_message.Message):
    __slots__ = ("policy", "rollout", "versions", "events", "freshness")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    FRESHNESS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    rollout: Rollout
    versions: _containers.RepeatedCompositeFieldContainer[PolicyVersion]
    events: _containers.RepeatedCompositeFieldContainer[AuditEvent]
    freshness: Freshness
    def __init__(self, policy: _Optional[str] = ..., rollout: _Optional[_Union[Rollout, _Mapping]] = ..., versions: _Optional[_Iterable[_Union[PolicyVersion, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[AuditEvent, _Mapping]]] = ..., freshness: _Optional[_Union[Freshness, _Mapping]] = ...) -> None: ...

class PromoteRequest(_message.Message):
    __slots__ = ("policy", "version", "to", "why", "canary_fraction", "canary_labels")
    class CanaryLabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    CANARY_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CANARY_LABELS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    version: int
    to: str
    why: str
    canary_fraction: float
    canary_labels: _containers.ScalarMap[str, str]
    def __init__(self, policy: _Optional[str] = ..., version: _Optional[int] = ..., to: _Optional[str] = ..., why: _Optional[str] = ..., canary_fraction: _Optional[float] = ..., canary_labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("policy", "version", "why")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    version: int
    why: str
    def __init__(self, policy: _Optional[str] = ..., version: _Optional[int] = ..., why: _Optional[str] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("policy", "selector", "version", "why")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SELECTOR_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    selector: str
    version: int
    why: str
    def __init__(self, policy: _Optional[str] = ..., selector: _Optional[str] = ..., version: _Optional[int] = ..., why: _Optional[str] = ...) -> None: ...

class CanaryRequest(_message.Message):
    __slots__ = ("policy", "fraction", "labels", "clear_labels", "why")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_LABELS_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    policy: str
    fraction: float
    labels: _containers.ScalarMap[str, str]
    clear_labels: bool
    why: str
    def __init__(self, policy: _Optional[str] = ..., fraction: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ..., clear_labels: _Optional[bool] = ..., why: _Optional[str] = ...) -> None: ...

class PolicyList(_message.Message):
    __slots__ = ("policy", "newest", "versions", "inputs", "outputs")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    newest: int
    versions: _containers.RepeatedCompositeFieldContainer[PolicyVersion]
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    def __init__(self, policy: _Optional[str] = ..., newest: _Optional[int] = ..., versions: _Optional[_Iterable[_Union[PolicyVersion, _Mapping]]] = ..., inputs: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("policy", "version", "chunk_bytes")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    policy: str
    version: int
    chunk_bytes: int
    def __init__(self, policy: _Optional[str] = ..., version: _Optional[int] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...
