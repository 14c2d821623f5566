"""A rollout that fails because gymweb's own process ran out of file descriptors says so, instead
of asking whether the agent service is running (with many rollouts in flight the open-file limit is
the first wall a user meets)."""

from __future__ import annotations

import asyncio
import errno
import json
from types import SimpleNamespace

import aiohttp
import httpx

from rollouts import targets
from rollouts.engine import http, loop

_KEY = SimpleNamespace(host="127.0.0.1", port=9, ssl=True, is_ssl=False)  # what the error's text reads


def _chain(os_error: OSError) -> httpx.ConnectError:
    """The chain the loop's client raises: httpx's error from aiohttp's from the socket's."""
    try:
        try:
            raise os_error
        except OSError as exc:
            raise aiohttp.ClientConnectorError(connection_key=_KEY, os_error=exc) from exc
    except aiohttp.ClientConnectorError as exc:
        try:
            raise httpx.ConnectError("Cannot connect to host") from exc
        except httpx.ConnectError as outer:
            return outer


def test_it_recognises_running_out_of_files_anywhere_in_the_chain():
    assert http.out_of_files(_chain(OSError(errno.EMFILE, "Too many open files")))
    assert http.out_of_files(_chain(OSError(errno.ENFILE, "Too many open files in system")))
    assert not http.out_of_files(_chain(ConnectionRefusedError(errno.ECONNREFUSED, "refused")))
    assert not http.out_of_files(None)


def _rollout_short_of_descriptors(monkeypatch, agent_url, env_url, tasks_path, failing_tries):
    """One rollout whose first ``failing_tries`` connection tries fail as the socket layer fails
    when the process has no descriptor left (EMFILE, through aiohttp and httpx as the client raises
    it); None: every try fails. Returns (outcome, tries made)."""
    tries = {"n": 0}
    real = http.LoopClient.post_bytes

    async def post_bytes(self, url, body, headers):
        tries["n"] += 1
        if failing_tries is None or tries["n"] <= failing_tries:
            raise _chain(OSError(errno.EMFILE, "Too many open files"))
        return await real(self, url, body, headers)

    monkeypatch.setattr(http.LoopClient, "post_bytes", post_bytes)
    settings = loop.LoopSettings(
        agent_base_url=agent_url, env_base_url=env_url, connect_attempts=2, retry_pause_s=0.001
    )
    row = json.loads(tasks_path.read_text().splitlines()[0])

    async def go():
        client = targets.async_client(4)
        try:
            return await loop.run_rollout(client, row, settings)
        finally:
            await client.aclose()

    return asyncio.run(go()), tries["n"]


def test_a_rollout_waits_for_a_descriptor_to_free_up(
    monkeypatch, counter_agent_url, counter_env_url, counter_tasks_path
):
    """A moment without descriptors (thousands in flight) costs no attempt and no failure: more
    failed tries than the two attempts allowed, and the rollout still succeeds."""
    outcome, tries = _rollout_short_of_descriptors(
        monkeypatch, counter_agent_url, counter_env_url, counter_tasks_path, 5
    )
    assert outcome.ok, outcome.error
    assert tries > 5


def test_a_rollout_out_of_files_blames_gymweb_not_the_agent(
    monkeypatch, counter_agent_url, counter_env_url, counter_tasks_path
):
    """When none frees up, the failure names the open-file limit, not the agent, after the waits
    and the attempts."""
    outcome, tries = _rollout_short_of_descriptors(
        monkeypatch, counter_agent_url, counter_env_url, counter_tasks_path, None
    )
    assert not outcome.ok
    assert tries == http.OUT_OF_FILES_WAITS + 2
    assert "ran out of open files" in outcome.error and "ulimit -n" in outcome.error, outcome.error
    assert "Is your" not in outcome.error
