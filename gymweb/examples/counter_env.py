"""A NeMo Gym-compatible resources server for the stateful counter tasks (aiohttp, no Django).

Behaves like NeMo Gym's `resources_servers/example_session_state_mgmt` ("add 1 then add 2 then
get the count"; data in `gymweb/examples/data/counter_tasks.jsonl`):

    POST /seed_session       body: the task row; reads `initial_count` (default 0).
                             Starts a fresh session, sets cookie `counter_session`. Reply `{}`.
    POST /increment_counter  {"count": int}  -> {"success":true}
    POST /get_counter_value  {}              -> {"count":N}
    POST /verify             row + "response" -> the body echoed + "reward": 1.0 iff the session's
                             counter equals the row's `expected_count`, else 0.0 (NeMo Gym compares
                             the counter held in the session, not the answer text).
    POST /aggregate_metrics  {"verify_responses": [rows]} -> NeMo Gym's default answer (what its
                             resources servers serve): {"group_level_metrics", "agent_metrics",
                             "key_metrics", "perf_summary", "repeat_level_metrics"}
                             (left out with --no-aggregate-metrics: then 404, like an env
                             without the route)
    GET  /                   {"status":"ok"} (liveness, as NeMo Gym's servers answer)
    anything else            404 {"detail":"Not Found"} (FastAPI's text)

Cookies: like NeMo Gym's envs (Starlette's SessionMiddleware re-signs its cookie on every reply),
every reply to a request that carries a valid session, tool calls and /verify included, sets
`counter_session` again with a fresh value; all values issued for a session stay valid.

Errors: a tool call without a `counter_session` cookie, or with one this process never issued
(e.g. after a restart), is HTTP 400 `{"detail": "..."}` naming the problem. Arguments that do not
validate are HTTP 422 in FastAPI's shape `{"detail": [{"type","loc","msg","input"}...]}`.
/verify without a known session is not an error: reward 0.0, as in NeMo Gym (there the counter is
simply absent), with a `failure_reason` saying why.

Run:  python -m gymweb.examples.counter_env --host 127.0.0.1 --port 9101 [--no-aggregate-metrics]
                                     [--verify-reply echo|nemo_gym]
      (prints "counter env listening on http://127.0.0.1:9101" when ready)
In-process: `make_app()` returns the aiohttp Application.
"""

from __future__ import annotations

import argparse
import itertools
import secrets
from typing import Any

from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError

from gymweb.examples._serve import add_fallback_routes, json_error, json_response, read_json, serve_forever
from rollouts.evaluation.aggregate_metrics import compute_aggregate_metrics

COOKIE_NAME = "counter_session"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9101
# Oldest sessions are dropped past this many, so a long benchmark cannot grow memory without bound
# (~150 bytes each; far above any realistic number of rollouts in flight at once).
DEFAULT_MAX_SESSIONS = 200_000


class _IncrementArgs(BaseModel):
    # Extra keys are ignored, like NeMo Gym's pydantic request model.
    count: int


class _VerifyBody(BaseModel):
    # Only checks the body; the reply echoes the raw body, so extra fields need not be kept here.
    responses_create_params: dict[str, Any]
    response: dict[str, Any]
    expected_count: int


class _AggregateBody(BaseModel):
    verify_responses: list[dict[str, Any]]


_int = TypeAdapter(int)


def _validation_error(exc: ValidationError) -> web.Response:
    """422 in FastAPI's shape: each error's `loc` starts with "body"."""
    detail = [
        {
            "type": e["type"],
            "loc": ["body", *e["loc"]],
            "msg": e["msg"],
            # invalid JSON reports the raw bytes as input; FastAPI shows {} there
            "input": {} if e["type"] == "json_invalid" else e.get("input"),
        }
        for e in exc.errors(include_url=False, include_context=False)
    ]
    return json_error(422, detail)


def _bad_json(message: str) -> web.Response:
    return json_error(422, [{"type": "json_invalid", "loc": ["body"], "msg": message, "input": {}}])


class _Sessions:
    """In-memory session store: session id -> counter value (int).

    Cookie values are "<session id>.<serial>"; the serial changes on every reply (the re-signing of
    NeMo Gym's envs), the id is what is looked up. Ids are 128-bit random, so unguessable.
    """

    def __init__(self, max_sessions: int) -> None:
        self.counters: dict[str, int] = {}
        self.max_sessions = max_sessions
        self._serial = itertools.count(1)

    def create(self, initial_count: int) -> str:
        sid = secrets.token_hex(16)
        self.counters[sid] = initial_count
        if len(self.counters) > self.max_sessions:
            del self.counters[next(iter(self.counters))]  # dicts keep insertion order: oldest
        return sid

    def cookie_header(self, sid: str) -> str:
        return f"{COOKIE_NAME}={sid}.{next(self._serial)}; HttpOnly; Path=/; SameSite=lax"

    def lookup(self, request: web.Request) -> tuple[str | None, str | None]:
        """(session id, None) for a known session, else (None, error text)."""
        value = request.cookies.get(COOKIE_NAME)
        if not value:
            return None, f"no session: missing cookie {COOKIE_NAME!r}; call /seed_session first"
        sid = value.partition(".")[0]
        if sid not in self.counters:
            return None, (
                f"unknown session: cookie {COOKIE_NAME!r} does not name a live session "
                "(expired, from another server process, or forged); call /seed_session first"
            )
        return sid, None


SESSIONS_KEY = web.AppKey("counter_sessions", _Sessions)
VERIFY_REPLY_KEY = web.AppKey("counter_verify_reply", str)  # "echo" (default) or "nemo_gym"


def _with_cookie(response: web.Response, sessions: _Sessions, sid: str) -> web.Response:
    response.headers["Set-Cookie"] = sessions.cookie_header(sid)
    return response


async def seed_session(request: web.Request) -> web.Response:
    """Start a fresh session from the task row; its `initial_count` (default 0) seeds the counter."""
    sessions: _Sessions = request.app[SESSIONS_KEY]
    body, error = await read_json(request)
    if error:
        return _bad_json(error)
    if not isinstance(body, dict):
        return json_error(
            422, [{"type": "model_type", "loc": ["body"], "msg": "Input should be a valid dictionary", "input": body}]
        )
    try:
        initial_count = _int.validate_python(body.get("initial_count", 0))
    except ValidationError as exc:
        return json_error(
            422,
            [
                {"type": e["type"], "loc": ["body", "initial_count"], "msg": e["msg"], "input": e.get("input")}
                for e in exc.errors(include_url=False, include_context=False)
            ],
        )
    sid = sessions.create(initial_count)
    return _with_cookie(json_response({}), sessions, sid)


async def increment_counter(request: web.Request) -> web.Response:
    """Add `count` to the session's counter. -> {"success":true}."""
    sessions: _Sessions = request.app[SESSIONS_KEY]
    sid, error = sessions.lookup(request)
    if error:
        return json_error(400, error)
    try:
        args = _IncrementArgs.model_validate_json(await request.read() or b"null")
    except ValidationError as exc:
        return _with_cookie(_validation_error(exc), sessions, sid)
    sessions.counters[sid] += args.count
    return _with_cookie(json_response({"success": True}), sessions, sid)


async def get_counter_value(request: web.Request) -> web.Response:
    """The session's counter. -> {"count":N}. The body is ignored (the tool takes no arguments)."""
    sessions: _Sessions = request.app[SESSIONS_KEY]
    sid, error = sessions.lookup(request)
    if error:
        return json_error(400, error)
    return _with_cookie(json_response({"count": sessions.counters[sid]}), sessions, sid)


async def verify(request: web.Request) -> web.Response:
    """Echo the body with `reward` = 1.0 iff the session's counter == `expected_count`.

    Unlike NeMo Gym (whose pydantic response model drops unknown task fields), every field of the
    request is echoed, so a rollouts.jsonl line keeps the whole task row. With the app made by
    ``make_app(verify_reply="nemo_gym")`` the reply is NeMo Gym's ``BaseVerifyResponse`` instead:
    ``responses_create_params``, ``response``, ``reward``, ``mask_sample`` (false), ``failure_kind``
    and ``failure_reason`` (null unless there is no session), nothing else.
    """
    sessions: _Sessions = request.app[SESSIONS_KEY]
    body, error = await read_json(request)
    if error:
        return _bad_json(error)
    try:
        parsed = _VerifyBody.model_validate(body)
    except ValidationError as exc:
        return _validation_error(exc)
    sid, session_error = sessions.lookup(request)
    nemo_gym_reply = request.app[VERIFY_REPLY_KEY] == "nemo_gym"
    reply = (
        {"responses_create_params": body["responses_create_params"], "response": body["response"]}
        if nemo_gym_reply
        else dict(body)
    )
    reply.pop("reward", None)  # a stale reward in the row must not survive verification
    reward = 0.0 if sid is None else (1.0 if sessions.counters[sid] == parsed.expected_count else 0.0)
    reply["reward"] = reward
    if nemo_gym_reply:
        reply.update(mask_sample=False, failure_kind=None, failure_reason=None)
    if sid is None:
        reply["failure_reason"] = session_error
        return json_response(reply)
    return _with_cookie(json_response(reply), sessions, sid)


def aggregate(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """NeMo Gym's default ``/aggregate_metrics`` answer (``reward_profile.compute_aggregate_metrics``,
    which NeMo Gym's ``example_session_state_mgmt`` server serves unchanged), computed by gymweb's
    ``rollouts.evaluation.aggregate_metrics``: per-task and overall mean/max/min/median/std of
    ``reward`` and the other numbers (``response.usage`` included), per-repeat statistics with
    Student-t intervals, ``key_metrics`` = the ``mean/*`` entries. Rows without indices count as 0."""
    return compute_aggregate_metrics(verify_responses)


async def aggregate_metrics(request: web.Request) -> web.Response:
    """POST {"verify_responses": [rows]} -> see `aggregate`."""
    body, error = await read_json(request)
    if error:
        return _bad_json(error)
    try:
        parsed = _AggregateBody.model_validate(body)
    except ValidationError as exc:
        return _validation_error(exc)
    try:
        return json_response(aggregate(parsed.verify_responses))
    except (ValueError, TypeError) as exc:  # duplicate keys, indices of mixed types: NeMo Gym's env fails too
        return json_error(500, str(exc))


async def reverify_mode(request: web.Request) -> web.Response:
    """GET /reverify_mode: "unknown", NeMo Gym's default for a resources server that does not declare
    one (its counter env does not). The reward depends on the session's count, which a reverify
    without the rollout's session cannot see, so `reverify` refuses this env unless forced."""
    return json_response("unknown")


async def liveness(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def openapi(request: web.Request) -> web.Response:
    """GET /openapi.json: the routes, as the FastAPI app of a NeMo Gym resources server lists them
    (gymweb's Environments page reads the tools from it)."""
    paths = {
        resource.canonical: {route.method.lower(): {} for route in resource if route.method != "HEAD"}
        for resource in request.app.router.resources()
        if isinstance(resource, web.PlainResource) and resource.canonical != "/openapi.json"
    }
    return json_response({"openapi": "3.1.0", "info": {"title": "counter env", "version": "0"}, "paths": paths})


MAX_BODY_BYTES = 1 << 30


def make_app(
    max_sessions: int = DEFAULT_MAX_SESSIONS, aggregate_metrics_route: bool = True, verify_reply: str = "echo"
) -> web.Application:
    """The counter env as an aiohttp Application (sessions live in this app object's memory).
    ``aggregate_metrics_route=False`` leaves ``/aggregate_metrics`` out (it answers 404);
    ``verify_reply="nemo_gym"`` makes ``/verify`` answer exactly NeMo Gym's reply fields (``verify``)."""
    if verify_reply not in ("echo", "nemo_gym"):
        raise ValueError(f"verify_reply must be 'echo' or 'nemo_gym', got {verify_reply!r}")
    # /aggregate_metrics gets every verify reply of a run (each with its whole response): a NeMo Gym
    # resources server (uvicorn) takes a body of any size, where aiohttp's default refuses past 1 MiB.
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SESSIONS_KEY] = _Sessions(max_sessions)
    app[VERIFY_REPLY_KEY] = verify_reply
    app.router.add_post("/seed_session", seed_session)
    app.router.add_post("/increment_counter", increment_counter)
    app.router.add_post("/get_counter_value", get_counter_value)
    app.router.add_post("/verify", verify)
    if aggregate_metrics_route:
        app.router.add_post("/aggregate_metrics", aggregate_metrics)
    app.router.add_get("/reverify_mode", reverify_mode)
    app.router.add_get("/", liveness)
    app.router.add_get("/health", liveness)
    app.router.add_get("/openapi.json", openapi)
    add_fallback_routes(app)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="NeMo Gym-compatible counter resources server")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    parser.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS)
    parser.add_argument(
        "--no-aggregate-metrics", action="store_true", help="serve no /aggregate_metrics (404), like an env without it"
    )
    parser.add_argument(
        "--verify-reply",
        choices=("echo", "nemo_gym"),
        default="echo",
        help="/verify echoes the whole body (default) or answers NeMo Gym's reply fields only",
    )
    args = parser.parse_args(argv)
    app = make_app(args.max_sessions, not args.no_aggregate_metrics, args.verify_reply)
    serve_forever(app, args.host, args.port, "counter env")


if __name__ == "__main__":
    main()
