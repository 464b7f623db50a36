from protos.tether.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StepType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_TYPE_UNSPECIFIED: _ClassVar[StepType]
    FIRST: _ClassVar[StepType]
    MID: _ClassVar[StepType]
    LAST: _ClassVar[StepType]
STEP_TYPE_UNSPECIFIED: StepType
FIRST: StepType
MID: StepType
LAST: StepType

class ClientMessage(_message.Message):
    __slots__ = ("hello", "observation", "replay")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    observation: Observation
    replay: Replay
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., observation: _Optional[_Union[Observation, _Mapping]] = ..., replay: _Optional[_Union[Replay, _Mapping]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("welcome", "action", "error", "episode_end", "replayed", "durable_through")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPISODE_END_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    DURABLE_THROUGH_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    action: Action
    error: StepError
    episode_end: EpisodeEnd
    replayed: Replayed
    durable_through: int
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., action: _Optional[_Union[Action, _Mapping]] = ..., error: _Optional[_Union[StepError, _Mapping]] = ..., episode_end: _Optional[_Union[EpisodeEnd, _Mapping]] = ..., replayed: _Optional[_Union[Replayed, _Mapping]] = ..., durable_through: _Optional[int] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("session_id", "policy", "observation_spec", "action_spec", "source", "labels", "num_envs", "batched", "t_sent_ns")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPEC_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPEC_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    BATCHED_FIELD_NUMBER: _ClassVar[int]
    T_SENT_NS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    policy: str
    observation_spec: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    action_spec: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    source: str
    labels: _containers.ScalarMap[str, str]
    num_envs: int
    batched: bool
    t_sent_ns: int
    def __init__(self, session_id: _Optional[str] = ..., policy: _Optional[str] = ..., observation_spec: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ..., action_spec: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ..., source: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., num_envs: _Optional[int] = ..., batched: _Optional[bool] = ..., t_sent_ns: _Optional[int] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "policy", "policy_version", "deadline_ms", "server_version", "durable_through", "reward_version", "logging", "next_step", "owner_epoch", "gateway_id", "hello_recv_ns", "welcome_send_ns")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DURABLE_THROUGH_FIELD_NUMBER: _ClassVar[int]
    REWARD_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOGGING_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_FIELD_NUMBER: _ClassVar[int]
    OWNER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_RECV_NS_FIELD_NUMBER: _ClassVar[int]
    WELCOME_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    policy: str
    policy_version: int
    deadline_ms: int
    server_version: str
    durable_through: int
    reward_version: str
    logging: bool
    next_step: int
    owner_epoch: int
    gateway_id: str
    hello_recv_ns: int
    welcome_send_ns: int
    def __init__(self, session_id: _Optional[str] = ..., policy: _Optional[str] = ..., policy_version: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., server_version: _Optional[str] = ..., durable_through: _Optional[int] = ..., reward_version: _Optional[str] = ..., logging: _Optional[bool] = ..., next_step: _Optional[int] = ..., owner_epoch: _Optional[int] = ..., gateway_id: _Optional[str] = ..., hello_recv_ns: _Optional[int] = ..., welcome_send_ns: _Optional[int] = ...) -> None: ...

class Observation(_message.Message):
    __slots__ = ("step", "t_sent_ns", "step_type", "tensors", "reward", "terminated", "applied_action", "guard", "episode", "env_step_types", "env_rewards", "env_terminated", "env_truncated", "final_observation", "intervention", "env_interventions", "clock_offset_ns", "deadline_ns", "client_hops")
    STEP_FIELD_NUMBER: _ClassVar[int]
    T_SENT_NS_FIELD_NUMBER: _ClassVar[int]
    STEP_TYPE_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_ACTION_FIELD_NUMBER: _ClassVar[int]
    GUARD_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    ENV_STEP_TYPES_FIELD_NUMBER: _ClassVar[int]
    ENV_REWARDS_FIELD_NUMBER: _ClassVar[int]
    ENV_TERMINATED_FIELD_NUMBER: _ClassVar[int]
    ENV_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    INTERVENTION_FIELD_NUMBER: _ClassVar[int]
    ENV_INTERVENTIONS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_NS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOPS_FIELD_NUMBER: _ClassVar[int]
    step: int
    t_sent_ns: int
    step_type: StepType
    tensors: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    reward: float
    terminated: bool
    applied_action: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    guard: GuardReport
    episode: int
    env_step_types: _containers.RepeatedScalarFieldContainer[StepType]
    env_rewards: _containers.RepeatedScalarFieldContainer[float]
    env_terminated: _containers.RepeatedScalarFieldContainer[bool]
    env_truncated: _containers.RepeatedScalarFieldContainer[bool]
    final_observation: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    intervention: bool
    env_interventions: _containers.RepeatedScalarFieldContainer[bool]
    clock_offset_ns: int
    deadline_ns: int
    client_hops: ClientHops
    def __init__(self, step: _Optional[int] = ..., t_sent_ns: _Optional[int] = ..., step_type: _Optional[_Union[StepType, str]] = ..., tensors: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., applied_action: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., guard: _Optional[_Union[GuardReport, _Mapping]] = ..., episode: _Optional[int] = ..., env_step_types: _Optional[_Iterable[_Union[StepType, str]]] = ..., env_rewards: _Optional[_Iterable[float]] = ..., env_terminated: _Optional[_Iterable[bool]] = ..., env_truncated: _Optional[_Iterable[bool]] = ..., final_observation: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., intervention: _Optional[bool] = ..., env_interventions: _Optional[_Iterable[bool]] = ..., clock_offset_ns: _Optional[int] = ..., deadline_ns: _Optional[int] = ..., client_hops: _Optional[_Union[ClientHops, _Mapping]] = ...) -> None: ...

class ClientHops(_message.Message):
    __slots__ = ("step", "reply_ns", "execution_ns", "delay_ticks")
    STEP_FIELD_NUMBER: _ClassVar[int]
    REPLY_NS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_NS_FIELD_NUMBER: _ClassVar[int]
    DELAY_TICKS_FIELD_NUMBER: _ClassVar[int]
    step: int
    reply_ns: int
    execution_ns: int
    delay_ticks: int
    def __init__(self, step: _Optional[int] = ..., reply_ns: _Optional[int] = ..., execution_ns: _Optional[int] = ..., delay_ticks: _Optional[int] = ...) -> None: ...

class Replay(_message.Message):
    __slots__ = ("observation", "action", "next")
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    observation: Observation
    action: Action
    next: Observation
    def __init__(self, observation: _Optional[_Union[Observation, _Mapping]] = ..., action: _Optional[_Union[Action, _Mapping]] = ..., next: _Optional[_Union[Observation, _Mapping]] = ...) -> None: ...

class Replayed(_message.Message):
    __slots__ = ("step", "duplicate")
    STEP_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    duplicate: bool
    def __init__(self, step: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class GuardReport(_message.Message):
    __slots__ = ("clamped", "rate_limited", "watchdog", "estop", "estopped", "gateway_estop", "interventions")
    CLAMPED_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITED_FIELD_NUMBER: _ClassVar[int]
    WATCHDOG_FIELD_NUMBER: _ClassVar[int]
    ESTOP_FIELD_NUMBER: _ClassVar[int]
    ESTOPPED_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ESTOP_FIELD_NUMBER: _ClassVar[int]
    INTERVENTIONS_FIELD_NUMBER: _ClassVar[int]
    clamped: int
    rate_limited: int
    watchdog: int
    estop: int
    estopped: bool
    gateway_estop: str
    interventions: int
    def __init__(self, clamped: _Optional[int] = ..., rate_limited: _Optional[int] = ..., watchdog: _Optional[int] = ..., estop: _Optional[int] = ..., estopped: _Optional[bool] = ..., gateway_estop: _Optional[str] = ..., interventions: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("t_sent_ns", "gateway_recv_ns", "infer_start_ns", "infer_end_ns", "gateway_send_ns", "batch_start_ns", "triton_start_ns", "triton_end_ns", "clock_offset_ns")
    T_SENT_NS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_RECV_NS_FIELD_NUMBER: _ClassVar[int]
    INFER_START_NS_FIELD_NUMBER: _ClassVar[int]
    INFER_END_NS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    BATCH_START_NS_FIELD_NUMBER: _ClassVar[int]
    TRITON_START_NS_FIELD_NUMBER: _ClassVar[int]
    TRITON_END_NS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    t_sent_ns: int
    gateway_recv_ns: int
    infer_start_ns: int
    infer_end_ns: int
    gateway_send_ns: int
    batch_start_ns: int
    triton_start_ns: int
    triton_end_ns: int
    clock_offset_ns: int
    def __init__(self, t_sent_ns: _Optional[int] = ..., gateway_recv_ns: _Optional[int] = ..., infer_start_ns: _Optional[int] = ..., infer_end_ns: _Optional[int] = ..., gateway_send_ns: _Optional[int] = ..., batch_start_ns: _Optional[int] = ..., triton_start_ns: _Optional[int] = ..., triton_end_ns: _Optional[int] = ..., clock_offset_ns: _Optional[int] = ...) -> None: ...

class Action(_message.Message):
    __slots__ = ("step", "tensors", "policy", "policy_version", "timing", "episode", "env_errors", "episode_ends", "estop", "estop_id", "released_estop", "log_prob")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    ENV_ERRORS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ENDS_FIELD_NUMBER: _ClassVar[int]
    ESTOP_FIELD_NUMBER: _ClassVar[int]
    ESTOP_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASED_ESTOP_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    step: int
    tensors: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    policy: str
    policy_version: int
    timing: Timing
    episode: int
    env_errors: _containers.RepeatedCompositeFieldContainer[EnvError]
    episode_ends: _containers.RepeatedCompositeFieldContainer[EpisodeEnd]
    estop: bool
    estop_id: str
    released_estop: str
    log_prob: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, step: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., policy: _Optional[str] = ..., policy_version: _Optional[int] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., episode: _Optional[int] = ..., env_errors: _Optional[_Iterable[_Union[EnvError, _Mapping]]] = ..., episode_ends: _Optional[_Iterable[_Union[EpisodeEnd, _Mapping]]] = ..., estop: _Optional[bool] = ..., estop_id: _Optional[str] = ..., released_estop: _Optional[str] = ..., log_prob: _Optional[_Iterable[float]] = ...) -> None: ...

class EnvError(_message.Message):
    __slots__ = ("env", "code", "field", "message")
    ENV_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    env: int
    code: StepError.Code
    field: str
    message: str
    def __init__(self, env: _Optional[int] = ..., code: _Optional[_Union[StepError.Code, str]] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class StepError(_message.Message):
    __slots__ = ("step", "code", "field", "message")
    class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        CODE_UNSPECIFIED: _ClassVar[StepError.Code]
        INVALID_OBSERVATION: _ClassVar[StepError.Code]
        OUT_OF_ORDER: _ClassVar[StepError.Code]
        DEADLINE_EXCEEDED: _ClassVar[StepError.Code]
        INFERENCE_FAILED: _ClassVar[StepError.Code]
    CODE_UNSPECIFIED: StepError.Code
    INVALID_OBSERVATION: StepError.Code
    OUT_OF_ORDER: StepError.Code
    DEADLINE_EXCEEDED: StepError.Code
    INFERENCE_FAILED: StepError.Code
    STEP_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    step: int
    code: StepError.Code
    field: str
    message: str
    def __init__(self, step: _Optional[int] = ..., code: _Optional[_Union[StepError.Code, str]] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class EpisodeEnd(_message.Message):
    __slots__ = ("step", "episode", "length", "episode_return", "reason", "env")
    STEP_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    step: int
    episode: int
    length: int
    episode_return: float
    reason: str
    env: int
    def __init__(self, step: _Optional[int] = ..., episode: _Optional[int] = ..., length: _Optional[int] = ..., episode_return: _Optional[float] = ..., reason: _Optional[str] = ..., env: _Optional[int] = ...) -> None: ...
