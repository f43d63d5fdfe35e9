from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("name", "gpus", "gpu_memory_mib", "gpu_duty", "memory_limit_bytes", "priority")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_DUTY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpus: _containers.RepeatedScalarFieldContainer[str]
    gpu_memory_mib: int
    gpu_duty: int
    memory_limit_bytes: int
    priority: int
    def __init__(self, name: _Optional[str] = ..., gpus: _Optional[_Iterable[str]] = ..., gpu_memory_mib: _Optional[int] = ..., gpu_duty: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("tenant_id", "name", "gpus", "gpu_memory_mib", "gpu_duty", "memory_limit_bytes", "source")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_MIB_FIELD_NUMBER: _ClassVar[int]
    GPU_DUTY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    name: str
    gpus: _containers.RepeatedScalarFieldContainer[str]
    gpu_memory_mib: int
    gpu_duty: int
    memory_limit_bytes: int
    source: str
    def __init__(self, tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., gpus: _Optional[_Iterable[str]] = ..., gpu_memory_mib: _Optional[int] = ..., gpu_duty: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("gpus", "timeout_ms", "job", "restores_with_grant", "revoked_lease_id")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RESTORES_WITH_GRANT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    job: str
    restores_with_grant: bool
    revoked_lease_id: str
    def __init__(self, gpus: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ..., job: _Optional[str] = ..., restores_with_grant: _Optional[bool] = ..., revoked_lease_id: _Optional[str] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "tenant_id", "gpus", "fencing_tokens", "granted_at", "hold_until", "contended")
    class FencingTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_FIELD_NUMBER: _ClassVar[int]
    HOLD_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CONTENDED_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    tenant_id: str
    gpus: _containers.RepeatedScalarFieldContainer[str]
    fencing_tokens: _containers.ScalarMap[str, int]
    granted_at: float
    hold_until: float
    contended: bool
    def __init__(self, lease_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., gpus: _Optional[_Iterable[str]] = ..., fencing_tokens: _Optional[_Mapping[str, int]] = ..., granted_at: _Optional[float] = ..., hold_until: _Optional[float] = ..., contended: _Optional[bool] = ...) -> None: ...

class YieldRequest(_message.Message):
    __slots__ = ("lease_id", "still_parked", "parked", "kept_s")
    class StillParkedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ParkedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    STILL_PARKED_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    KEPT_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    still_parked: _containers.ScalarMap[str, int]
    parked: _containers.ScalarMap[str, int]
    kept_s: float
    def __init__(self, lease_id: _Optional[str] = ..., still_parked: _Optional[_Mapping[str, int]] = ..., parked: _Optional[_Mapping[str, int]] = ..., kept_s: _Optional[float] = ...) -> None: ...

class YieldResponse(_message.Message):
    __slots__ = ("held_seconds",)
    HELD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    held_seconds: float
    def __init__(self, held_seconds: _Optional[float] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class GetLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("hello", "callback_result", "request")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_RESULT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    callback_result: CallbackResult
    request: Request
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., callback_result: _Optional[_Union[CallbackResult, _Mapping]] = ..., request: _Optional[_Union[Request, _Mapping]] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("request_id", "acquire", "release", "renew", "cancel")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    acquire: AcquireRequest
    release: YieldRequest
    renew: RenewRequest
    cancel: CancelRequest
    def __init__(self, request_id: _Optional[int] = ..., acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., release: _Optional[_Union[YieldRequest, _Mapping]] = ..., renew: _Optional[_Union[RenewRequest, _Mapping]] = ..., cancel: _Optional[_Union[CancelRequest, _Mapping]] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Reply(_message.Message):
    __slots__ = ("request_id", "lease", "released", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    lease: Lease
    released: YieldResponse
    error: ErrorStatus
    def __init__(self, request_id: _Optional[int] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., released: _Optional[_Union[YieldResponse, _Mapping]] = ..., error: _Optional[_Union[ErrorStatus, _Mapping]] = ...) -> None: ...

class ErrorStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("client_version", "callbacks", "register", "session_token", "keeps_turns")
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CALLBACKS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KEEPS_TURNS_FIELD_NUMBER: _ClassVar[int]
    client_version: str
    callbacks: _containers.RepeatedScalarFieldContainer[str]
    register: RegisterRequest
    session_token: str
    keeps_turns: bool
    def __init__(self, client_version: _Optional[str] = ..., callbacks: _Optional[_Iterable[str]] = ..., register: _Optional[_Union[RegisterRequest, _Mapping]] = ..., session_token: _Optional[str] = ..., keeps_turns: _Optional[bool] = ...) -> None: ...

class CallbackResult(_message.Message):
    __slots__ = ("call_id", "bytes", "error")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    bytes: int
    error: str
    def __init__(self, call_id: _Optional[str] = ..., bytes: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("welcome", "callback", "granted", "revoked", "reply", "refused", "park_at_yield", "keep_turn", "waiting")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    PARK_AT_YIELD_FIELD_NUMBER: _ClassVar[int]
    KEEP_TURN_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    callback: Callback
    granted: Lease
    revoked: Revoked
    reply: Reply
    refused: ErrorStatus
    park_at_yield: ParkAtYield
    keep_turn: KeepTurn
    waiting: Waiting
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., callback: _Optional[_Union[Callback, _Mapping]] = ..., granted: _Optional[_Union[Lease, _Mapping]] = ..., revoked: _Optional[_Union[Revoked, _Mapping]] = ..., reply: _Optional[_Union[Reply, _Mapping]] = ..., refused: _Optional[_Union[ErrorStatus, _Mapping]] = ..., park_at_yield: _Optional[_Union[ParkAtYield, _Mapping]] = ..., keep_turn: _Optional[_Union[KeepTurn, _Mapping]] = ..., waiting: _Optional[_Union[Waiting, _Mapping]] = ...) -> None: ...

class Waiting(_message.Message):
    __slots__ = ("gpus", "reason")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, gpus: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ParkAtYield(_message.Message):
    __slots__ = ("lease_id", "gpus")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    gpus: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_id: _Optional[str] = ..., gpus: _Optional[_Iterable[str]] = ...) -> None: ...

class KeepTurn(_message.Message):
    __slots__ = ("lease_id", "until_s", "window_s")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    UNTIL_S_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    until_s: float
    window_s: float
    def __init__(self, lease_id: _Optional[str] = ..., until_s: _Optional[float] = ..., window_s: _Optional[float] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ...) -> None: ...

class Callback(_message.Message):
    __slots__ = ("call_id", "action", "gpu")
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    action: str
    gpu: str
    def __init__(self, call_id: _Optional[str] = ..., action: _Optional[str] = ..., gpu: _Optional[str] = ...) -> None: ...

class Revoked(_message.Message):
    __slots__ = ("lease_id", "reason", "withdrawn")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WITHDRAWN_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    reason: str
    withdrawn: bool
    def __init__(self, lease_id: _Optional[str] = ..., reason: _Optional[str] = ..., withdrawn: _Optional[bool] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Event(_message.Message):
    __slots__ = ("kind", "tenant_id", "gpus", "lease_id", "fencing_tokens", "at", "detail")
    class FencingTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    kind: str
    tenant_id: str
    gpus: _containers.RepeatedScalarFieldContainer[str]
    lease_id: str
    fencing_tokens: _containers.ScalarMap[str, int]
    at: float
    detail: str
    def __init__(self, kind: _Optional[str] = ..., tenant_id: _Optional[str] = ..., gpus: _Optional[_Iterable[str]] = ..., lease_id: _Optional[str] = ..., fencing_tokens: _Optional[_Mapping[str, int]] = ..., at: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...
