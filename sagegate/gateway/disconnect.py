"""The client's disconnect, seen while the gateway works on its request: the handler is cancelled
(and with it whatever it awaits: the queue, the backend), rather than finishing work nobody reads."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive


class DisconnectGuard:
    """Cancels the task that entered it when the client disconnects; the ``async with`` block then
    ends quietly with ``disconnected`` set. Leave ``done`` set before the last send so the server's
    own end-of-response signal is not mistaken for a disconnect."""

    __slots__ = ("disconnected", "done", "listener", "receive", "task")

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.disconnected = False
        self.done = False
        self.task: asyncio.Task[Any] | None = None
        self.listener: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DisconnectGuard:
        self.task = asyncio.current_task()
        self.listener = asyncio.get_running_loop().create_task(self._listen())
        return self

    async def _listen(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                if not self.done and self.task is not None:
                    self.disconnected = True
                    self.task.cancel()
                return

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.listener is not None:
            self.listener.cancel()
        if self.disconnected and exc_type is asyncio.CancelledError and self.task is not None:
            self.task.uncancel()
            return True
        return False
