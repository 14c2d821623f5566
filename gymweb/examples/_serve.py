"""Small serving helpers shared by the example services (no Django).

- `serve_forever(app, host, port, label)`: the `python -m examples.X` entry point. Binds, prints
  one line "<label> listening on http://HOST:PORT" (flushed) once the socket accepts connections,
  then runs until SIGINT/SIGTERM.
- `BackgroundServer(app)`: runs an app on 127.0.0.1 on a free port in a daemon thread with its own
  event loop; for tests and benchmarks that want a real HTTP server in-process.
- `json_response` / `json_error` / `not_found`: lean JSON replies in FastAPI's compact style.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from typing import Any

from aiohttp import web

# FastAPI/Starlette render JSON compactly; NeMo Gym's tool outputs look like '{"success":true}'.
# `default=str` so an odd value in an error report (bytes, an exception) can never turn a 4xx into a 500.
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode

# Large enough for thousands of simultaneous rollouts connecting at once.
LISTEN_BACKLOG = 4096


def json_response(data: Any, status: int = 200) -> web.Response:
    """A JSON reply rendered compactly (`{"a":1}`), content type application/json."""
    return web.Response(body=_dumps(data).encode(), status=status, content_type="application/json")


def json_error(status: int, detail: Any) -> web.Response:
    """An error reply in FastAPI's shape: `{"detail": <detail>}` with the given status."""
    return json_response({"detail": detail}, status=status)


def add_fallback_routes(app: web.Application) -> None:
    """Answer unknown paths like FastAPI: 404 `{"detail":"Not Found"}`; a known path with the
    wrong method: 405 `{"detail":"Method Not Allowed"}`. Call after all real routes are added.

    A catch-all route (rather than a middleware) keeps the per-request cost of real routes at zero.
    """
    known = {resource.canonical for resource in app.router.resources() if isinstance(resource, web.PlainResource)}

    async def fallback(request: web.Request) -> web.Response:
        if request.path in known:
            return json_error(405, "Method Not Allowed")
        return json_error(404, "Not Found")

    app.router.add_route("*", "/{tail:.*}", fallback)


async def read_json(request: web.Request) -> tuple[Any, str | None]:
    """Parse the request body as JSON. Returns (value, None) or (None, error text)."""
    raw = await request.read()
    try:
        return json.loads(raw or b"null"), None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return None, f"JSON decode error: {exc}"


async def _start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)  # no per-request logging: these serve benchmarks
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
    await site.start()
    bound_port = runner.addresses[0][1]  # the real port when `port` was 0
    return runner, bound_port


def serve_forever(app: web.Application, host: str, port: int, label: str) -> None:
    """Serve `app` on host:port until SIGINT/SIGTERM.

    Prints exactly one line "<label> listening on http://HOST:PORT" (the bound port, so `--port 0`
    works) after the socket is listening, and flushes it, so a parent process can wait for it.
    """

    async def main() -> None:
        runner, bound_port = await _start(app, host, port)
        print(f"{label} listening on http://{host}:{bound_port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # not the main thread / platform
                pass
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass


class BackgroundServer:
    """Run an aiohttp app on 127.0.0.1:<free port> in a daemon thread.

    Use as a context manager: `with BackgroundServer(make_app()) as srv: httpx.post(srv.url + "/x")`.
    `url` is "http://127.0.0.1:PORT" (no trailing slash). Startup errors are re-raised in the
    caller; `stop()` shuts the app down cleanly (on_cleanup handlers run).
    """

    def __init__(self, app: web.Application, host: str = "127.0.0.1") -> None:
        self.app = app
        self.host = host
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="example-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._runner, self.port = loop.run_until_complete(_start(self.app, self.host, 0))
        except BaseException as exc:  # surfaced to the caller of start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def start(self) -> BackgroundServer:
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error
        if self.port is None:
            raise RuntimeError("example server did not start within 30 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
