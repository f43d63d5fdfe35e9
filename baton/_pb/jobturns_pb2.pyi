from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JoinRequest(_message.Message):
    __slots__ = ("namespace", "job", "group", "pod", "timeout_s")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    job: str
    group: str
    pod: str
    timeout_s: float
    def __init__(self, namespace: _Optional[str] = ..., job: _Optional[str] = ..., group: _Optional[str] = ..., pod: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("turn_id", "waited_ms", "join_id")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    JOIN_ID_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    waited_ms: int
    join_id: str
    def __init__(self, turn_id: _Optional[str] = ..., waited_ms: _Optional[int] = ..., join_id: _Optional[str] = ...) -> None: ...

class LeaveRequest(_message.Message):
    __slots__ = ("namespace", "job", "group", "pod", "turn_id", "join_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    JOIN_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    job: str
    group: str
    pod: str
    turn_id: str
    join_id: str
    def __init__(self, namespace: _Optional[str] = ..., job: _Optional[str] = ..., group: _Optional[str] = ..., pod: _Optional[str] = ..., turn_id: _Optional[str] = ..., join_id: _Optional[str] = ...) -> None: ...

class LeaveResponse(_message.Message):
    __slots__ = ("ended",)
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ended: bool
    def __init__(self, ended: _Optional[bool] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("epoch", "turn_id", "namespace", "job", "timeout_s", "pods", "group", "nodes")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    turn_id: str
    namespace: str
    job: str
    timeout_s: float
    pods: _containers.RepeatedScalarFieldContainer[str]
    group: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epoch: _Optional[int] = ..., turn_id: _Optional[str] = ..., namespace: _Optional[str] = ..., job: _Optional[str] = ..., timeout_s: _Optional[float] = ..., pods: _Optional[_Iterable[str]] = ..., group: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("epoch", "turn_id")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    turn_id: str
    def __init__(self, epoch: _Optional[int] = ..., turn_id: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("epoch", "turn_id", "reason")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    turn_id: str
    reason: str
    def __init__(self, epoch: _Optional[int] = ..., turn_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class NodeTurn(_message.Message):
    __slots__ = ("turn_id", "namespace", "job", "epoch", "state", "members", "gpus", "fencing_tokens", "prepared_at", "committed_at", "group", "restored", "joined", "nodes")
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREPARED_AT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    turn_id: str
    namespace: str
    job: str
    epoch: int
    state: str
    members: _containers.RepeatedScalarFieldContainer[str]
    gpus: _containers.RepeatedScalarFieldContainer[str]
    fencing_tokens: _containers.RepeatedScalarFieldContainer[int]
    prepared_at: float
    committed_at: float
    group: str
    restored: bool
    joined: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, turn_id: _Optional[str] = ..., namespace: _Optional[str] = ..., job: _Optional[str] = ..., epoch: _Optional[int] = ..., state: _Optional[str] = ..., members: _Optional[_Iterable[str]] = ..., gpus: _Optional[_Iterable[str]] = ..., fencing_tokens: _Optional[_Iterable[int]] = ..., prepared_at: _Optional[float] = ..., committed_at: _Optional[float] = ..., group: _Optional[str] = ..., restored: _Optional[bool] = ..., joined: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("node", "epoch", "turns", "holder", "now")
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    node: str
    epoch: int
    turns: _containers.RepeatedCompositeFieldContainer[NodeTurn]
    holder: str
    now: float
    def __init__(self, node: _Optional[str] = ..., epoch: _Optional[int] = ..., turns: _Optional[_Iterable[_Union[NodeTurn, _Mapping]]] = ..., holder: _Optional[str] = ..., now: _Optional[float] = ...) -> None: ...

class JobTurnsCall(_message.Message):
    __slots__ = ("id", "hello", "prepare", "commit", "release", "report", "cancel")
    ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    id: int
    hello: Hello
    prepare: PrepareRequest
    commit: CommitRequest
    release: ReleaseRequest
    report: ReportRequest
    cancel: Cancel
    def __init__(self, id: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., prepare: _Optional[_Union[PrepareRequest, _Mapping]] = ..., commit: _Optional[_Union[CommitRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., report: _Optional[_Union[ReportRequest, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("token", "holder")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    token: str
    holder: str
    def __init__(self, token: _Optional[str] = ..., holder: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobTurnsAnswer(_message.Message):
    __slots__ = ("id", "hello", "turn", "released", "report", "refused")
    ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    id: int
    hello: HelloAnswer
    turn: NodeTurn
    released: ReleaseResponse
    report: ReportResponse
    refused: Refusal
    def __init__(self, id: _Optional[int] = ..., hello: _Optional[_Union[HelloAnswer, _Mapping]] = ..., turn: _Optional[_Union[NodeTurn, _Mapping]] = ..., released: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., report: _Optional[_Union[ReportResponse, _Mapping]] = ..., refused: _Optional[_Union[Refusal, _Mapping]] = ...) -> None: ...

class HelloAnswer(_message.Message):
    __slots__ = ("node", "epoch")
    NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    node: str
    epoch: int
    def __init__(self, node: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class Refusal(_message.Message):
    __slots__ = ("code", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: str
    details: str
    def __init__(self, code: _Optional[str] = ..., details: _Optional[str] = ...) -> None: ...
