from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionStatus(_message.Message):
    __slots__ = ("session_id", "source", "labels", "policy", "policy_version", "num_envs", "steps", "episodes", "steps_per_s", "latency_p50_ms", "latency_p99_ms", "guard_interventions", "estopped", "edge_estopped", "last_error", "connected_s", "mean_return", "hop_p50_ms")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class HopP50MsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P50_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_P99_MS_FIELD_NUMBER: _ClassVar[int]
    GUARD_INTERVENTIONS_FIELD_NUMBER: _ClassVar[int]
    ESTOPPED_FIELD_NUMBER: _ClassVar[int]
    EDGE_ESTOPPED_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    HOP_P50_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    source: str
    labels: _containers.ScalarMap[str, str]
    policy: str
    policy_version: int
    num_envs: int
    steps: int
    episodes: int
    steps_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    guard_interventions: int
    estopped: bool
    edge_estopped: bool
    last_error: str
    connected_s: float
    mean_return: float
    hop_p50_ms: _containers.ScalarMap[str, float]
    def __init__(self, session_id: _Optional[str] = ..., source: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., policy: _Optional[str] = ..., policy_version: _Optional[int] = ..., num_envs: _Optional[int] = ..., steps: _Optional[int] = ..., episodes: _Optional[int] = ..., steps_per_s: _Optional[float] = ..., latency_p50_ms: _Optional[float] = ..., latency_p99_ms: _Optional[float] = ..., guard_interventions: _Optional[int] = ..., estopped: _Optional[bool] = ..., edge_estopped: _Optional[bool] = ..., last_error: _Optional[str] = ..., connected_s: _Optional[float] = ..., mean_return: _Optional[float] = ..., hop_p50_ms: _Optional[_Mapping[str, float]] = ...) -> None: ...

class VersionStatus(_message.Message):
    __slots__ = ("policy", "version", "state", "sessions")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    version: int
    state: str
    sessions: int
    def __init__(self, policy: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[str] = ..., sessions: _Optional[int] = ...) -> None: ...

class EStopSelector(_message.Message):
    __slots__ = ("session_id", "robot", "all", "who", "why", "t_ns", "id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ROBOT_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    T_NS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    robot: str
    all: bool
    who: str
    why: str
    t_ns: int
    id: str
    def __init__(self, session_id: _Optional[str] = ..., robot: _Optional[str] = ..., all: _Optional[bool] = ..., who: _Optional[str] = ..., why: _Optional[str] = ..., t_ns: _Optional[int] = ..., id: _Optional[str] = ...) -> None: ...

class FleetStatus(_message.Message):
    __slots__ = ("sessions", "versions", "estops", "server_version", "console_url", "logging")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ESTOPS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONSOLE_URL_FIELD_NUMBER: _ClassVar[int]
    LOGGING_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionStatus]
    versions: _containers.RepeatedCompositeFieldContainer[VersionStatus]
    estops: _containers.RepeatedCompositeFieldContainer[EStopSelector]
    server_version: str
    console_url: str
    logging: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionStatus, _Mapping]]] = ..., versions: _Optional[_Iterable[_Union[VersionStatus, _Mapping]]] = ..., estops: _Optional[_Iterable[_Union[EStopSelector, _Mapping]]] = ..., server_version: _Optional[str] = ..., console_url: _Optional[str] = ..., logging: _Optional[str] = ...) -> None: ...

class EStopRequest(_message.Message):
    __slots__ = ("session_id", "robot", "all", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ROBOT_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    robot: str
    all: bool
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., robot: _Optional[str] = ..., all: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class EStopReply(_message.Message):
    __slots__ = ("sessions", "who", "changed")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    WHO_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedScalarFieldContainer[str]
    who: str
    changed: bool
    def __init__(self, sessions: _Optional[_Iterable[str]] = ..., who: _Optional[str] = ..., changed: _Optional[bool] = ...) -> None: ...
