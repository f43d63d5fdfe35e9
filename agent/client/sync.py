"""`Baton`: the blocking client, an `AsyncBaton` driven on a private event-loop thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from agent.client.aio import AsyncBaton
from agent.client.errors import BatonError
from agent.client.types import Callback, LeaseInfo
from baton._pb import agent_pb2 as pb

T = TypeVar("T")


class Baton:
    """Takes turns on this tenant's GPUs: `acquire()`, `yield_()`, `with baton.turn(): ...`.

    Arguments default to `BATON_AGENT_SOCKET`, `BATON_GPUS` and `BATON_TENANT_NAME`.
    """

    def __init__(
        self,
        socket: str | None = None,
        gpus: Sequence[str] | str | None = None,
        *,
        name: str | None = None,
        gpu_memory_mib: int = 0,
        gpu_duty: int = 0,
        memory_limit_bytes: int = 0,
        on_park: Callback | None = None,
        on_restore: Callback | None = None,
        connect_timeout: float = 5.0,
        renew_interval: float = 2.0,
        reconnect: bool = True,
    ) -> None:
        self._async = AsyncBaton(
            socket,
            gpus,
            name=name,
            gpu_memory_mib=gpu_memory_mib,
            gpu_duty=gpu_duty,
            memory_limit_bytes=memory_limit_bytes,
            on_park=on_park,
            on_restore=on_restore,
            connect_timeout=connect_timeout,
            renew_interval=renew_interval,
            reconnect=reconnect,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="baton-client", daemon=True
        )
        self._thread.start()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise BatonError("this Baton client is closed; create a new one")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:  # KeyboardInterrupt included: take the request off the queue
            future.cancel()
            with contextlib.suppress(concurrent.futures.CancelledError, Exception):
                future.result(timeout=1)
            raise

    @property
    def socket(self) -> str:
        """The agent socket this client talks to."""
        return self._async.socket

    @property
    def lease(self) -> LeaseInfo | None:
        """The turn held now, if any."""
        return self._async.lease

    @property
    def tenant(self) -> pb.Tenant | None:
        """This tenant as the agent knows it (after connecting)."""
        return self._async.tenant

    def register_callbacks(
        self, on_park: Callback | None = None, on_restore: Callback | None = None
    ) -> None:
        """See `AsyncBaton.register_callbacks`."""
        self._async.register_callbacks(on_park=on_park, on_restore=on_restore)

    def connect(self) -> None:
        """Open the session now (the first `acquire` does it otherwise)."""
        self._run(self._async.connect())

    def acquire(self, timeout: float | None = None, gpus: Sequence[str] | None = None) -> LeaseInfo:
        """Block until this tenant's turn; `AcquireTimeout` after `timeout` seconds."""
        return self._run(self._async.acquire(timeout, gpus))

    def yield_(self) -> None:
        """End the turn."""
        self._run(self._async.yield_())

    @contextlib.contextmanager
    def turn(self, timeout: float | None = None) -> Iterator[LeaseInfo]:
        """`with baton.turn(): ...`, or as a decorator, `@baton.turn()`."""
        lease = self.acquire(timeout)
        try:
            yield lease
        finally:
            if self._async.lease is not None or self._async.resuming:
                self.yield_()

    def close(self) -> None:
        """End the session and stop the client's thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close())
            self._run(_finish_pending())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> Baton:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _finish_pending() -> None:
    """Let what is left on the client's loop (gRPC's own call bookkeeping) end before it stops."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
