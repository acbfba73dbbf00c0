"""The Prometheus endpoint: GET /metrics over HTTP, served by prometheus-client's own thread."""

from __future__ import annotations

import asyncio
import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from memsvc.config import ConfigError

log = logging.getLogger(__name__)


class MetricsEndpoint:
    """Serves the process's default registry on ``host:port`` until stopped."""

    def __init__(self) -> None:
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self, host: str, port: int, *, any_port_if_taken: bool = False) -> int:
        """Listen (port 0: any free one) and return the bound port. ``any_port_if_taken``
        (memsvc dev, where two instances run side by side) moves to a free port instead of
        failing when ``port`` is in use."""
        try:
            self._server, self._thread = start_http_server(port, addr=host)
        except OSError as exc:
            if not any_port_if_taken or port == 0:
                raise ConfigError(
                    f"MEMSVC_METRICS_PORT: cannot listen on {host}:{port} ({exc.strerror}); "
                    "choose another port, 0 for any free one, or off"
                ) from None
            self._server, self._thread = start_http_server(0, addr=host)
            log.warning(
                "metrics port %d is taken; serving /metrics on port %d instead",
                port,
                self._server.server_port,
            )
        self.port = self._server.server_port
        return self.port

    async def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        # shutdown() waits for the serving loop's next poll (up to half a second): off the loop.
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        if thread is not None:
            await asyncio.to_thread(thread.join, 5)
