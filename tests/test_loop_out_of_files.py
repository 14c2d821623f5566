"""A rollout that fails because gymweb's own process ran out of file descriptors says so, instead
of asking whether the agent service is running (issue 14: at 10,000 in flight the open-file limit
is the first wall a user meets)."""
from __future__ import annotations

import asyncio
import errno
import json
import os
import resource

import aiohttp
import httpx

from rollouts import targets
from rollouts.engine import loop


def _chain(os_error: OSError) -> httpx.ConnectError:
    """The chain the loop's client raises: httpx's error from aiohttp's from the socket's."""
    try:
        try:
            raise os_error
        except OSError as exc:
            raise aiohttp.ClientConnectorError(connection_key=None, os_error=exc) from exc
    except aiohttp.ClientConnectorError as exc:
        try:
            raise httpx.ConnectError("Cannot connect to host") from exc
        except httpx.ConnectError as outer:
            return outer


def test_it_recognises_running_out_of_files_anywhere_in_the_chain():
    assert loop._out_of_files(_chain(OSError(errno.EMFILE, "Too many open files")))
    assert loop._out_of_files(_chain(OSError(errno.ENFILE, "Too many open files in system")))
    assert not loop._out_of_files(_chain(ConnectionRefusedError(errno.ECONNREFUSED, "refused")))
    assert not loop._out_of_files(None)


def _rollout_with_no_descriptors(agent_url, env_url, tasks_path, free_after_s=None):
    """One rollout run while the process's open-file limit equals what it already has open (no
    connection can be made), the limit put back after ``free_after_s`` (None: at the end)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    settings = loop.LoopSettings(agent_base_url=agent_url, env_base_url=env_url, connect_attempts=2, retry_pause_s=0.01)
    row = json.loads(tasks_path.read_text().splitlines()[0])

    def restore():
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    async def go():
        client = targets.async_client(4)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")), hard))
            if free_after_s is not None:
                asyncio.get_running_loop().call_later(free_after_s, restore)
            try:
                return await loop.run_rollout(client, row, settings)
            finally:
                restore()
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_a_rollout_waits_for_a_descriptor_to_free_up(counter_agent_url, counter_env_url, counter_tasks_path):
    """A moment without descriptors (thousands in flight) costs no attempt and no failure."""
    outcome = _rollout_with_no_descriptors(counter_agent_url, counter_env_url, counter_tasks_path, free_after_s=0.1)
    assert outcome.ok, outcome.error


def test_a_rollout_out_of_files_blames_gymweb_not_the_agent(counter_agent_url, counter_env_url, counter_tasks_path):
    """When none frees up, the failure names the open-file limit, not the agent."""
    outcome = _rollout_with_no_descriptors(counter_agent_url, counter_env_url, counter_tasks_path)
    assert not outcome.ok
    assert "ran out of open files" in outcome.error and "ulimit -n" in outcome.error, outcome.error
    assert "Is your" not in outcome.error
