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
    __slots__ = ("parent_version", "trainer_step", "data_offset", "reward_version", "trainer")
    PARENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINER_STEP_FIELD_NUMBER: _ClassVar[int]
    DATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REWARD_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    parent_version: int
    trainer_step: int
    data_offset: int
    reward_version: str
    trainer: str
    def __init__(self, parent_version: _Optional[int] = ..., trainer_step: _Optional[int] = ..., data_offset: _Optional[int] = ..., reward_version: _Optional[str] = ..., trainer: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("version", "sha256", "lineage", "published_unix_ns", "sessions")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    version: int
    sha256: str
    lineage: Lineage
    published_unix_ns: int
    sessions: int
    def __init__(self, version: _Optional[int] = ..., sha256: _Optional[str] = ..., lineage: _Optional[_Union[Lineage, _Mapping]] = ..., published_unix_ns: _Optional[int] = ..., sessions: _Optional[int] = ...) -> None: ...

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
