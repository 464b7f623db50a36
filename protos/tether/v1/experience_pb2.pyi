from protos.tether.v1 import bridge_pb2 as _bridge_pb2
from protos.tether.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Transition(_message.Message):
    __slots__ = ("offset", "session", "episode", "step", "step_type", "observation", "action", "applied_action", "guard", "reward", "reward_terms", "terminated", "truncated", "next_observation", "policy", "policy_version", "reward_version", "has_log_prob", "log_prob", "timing", "source", "env_reward", "owner_epoch", "intervention")
    class RewardTermsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_TYPE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_ACTION_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_TERMS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NEXT_OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_VERSION_FIELD_NUMBER: _ClassVar[int]
    HAS_LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ENV_REWARD_FIELD_NUMBER: _ClassVar[int]
    OWNER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    INTERVENTION_FIELD_NUMBER: _ClassVar[int]
    offset: int
    session: str
    episode: int
    step: int
    step_type: _bridge_pb2.StepType
    observation: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    action: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    applied_action: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    guard: _bridge_pb2.GuardReport
    reward: float
    reward_terms: _containers.ScalarMap[str, float]
    terminated: bool
    truncated: bool
    next_observation: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    policy: str
    policy_version: int
    reward_version: str
    has_log_prob: bool
    log_prob: float
    timing: _bridge_pb2.Timing
    source: str
    env_reward: float
    owner_epoch: int
    intervention: bool
    def __init__(self, offset: _Optional[int] = ..., session: _Optional[str] = ..., episode: _Optional[int] = ..., step: _Optional[int] = ..., step_type: _Optional[_Union[_bridge_pb2.StepType, str]] = ..., observation: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., action: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., applied_action: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., guard: _Optional[_Union[_bridge_pb2.GuardReport, _Mapping]] = ..., reward: _Optional[float] = ..., reward_terms: _Optional[_Mapping[str, float]] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., next_observation: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., policy: _Optional[str] = ..., policy_version: _Optional[int] = ..., reward_version: _Optional[str] = ..., has_log_prob: _Optional[bool] = ..., log_prob: _Optional[float] = ..., timing: _Optional[_Union[_bridge_pb2.Timing, _Mapping]] = ..., source: _Optional[str] = ..., env_reward: _Optional[float] = ..., owner_epoch: _Optional[int] = ..., intervention: _Optional[bool] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("start", "ack")
    START_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    start: SubscribeStart
    ack: SubscribeAck
    def __init__(self, start: _Optional[_Union[SubscribeStart, _Mapping]] = ..., ack: _Optional[_Union[SubscribeAck, _Mapping]] = ...) -> None: ...

class SubscribeStart(_message.Message):
    __slots__ = ("from_offset", "window", "max_batch", "shard", "num_shards", "policy")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    window: int
    max_batch: int
    shard: int
    num_shards: int
    policy: str
    def __init__(self, from_offset: _Optional[int] = ..., window: _Optional[int] = ..., max_batch: _Optional[int] = ..., shard: _Optional[int] = ..., num_shards: _Optional[int] = ..., policy: _Optional[str] = ...) -> None: ...

class SubscribeAck(_message.Message):
    __slots__ = ("through_offset",)
    THROUGH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    through_offset: int
    def __init__(self, through_offset: _Optional[int] = ...) -> None: ...

class ExperienceBatch(_message.Message):
    __slots__ = ("transitions", "next_offset", "log_end")
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    transitions: _containers.RepeatedCompositeFieldContainer[Transition]
    next_offset: int
    log_end: int
    def __init__(self, transitions: _Optional[_Iterable[_Union[Transition, _Mapping]]] = ..., next_offset: _Optional[int] = ..., log_end: _Optional[int] = ...) -> None: ...
