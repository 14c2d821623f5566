"""NeMo Gym's ``<stem>_aggregate_metrics.json`` (``rollouts.evaluation.aggregate_metrics``): the local
computation against NeMo Gym's own files, the request the env gets, the fallback when it has none,
one entry per environment server, and the stamps that decide the servers."""

from __future__ import annotations

import json
import math

import pytest
from aiohttp import web

from gymweb.examples._serve import BackgroundServer
from rollouts.collection.stamps import environment_server_name, stamp
from rollouts.evaluation.aggregate_metrics import (
    aggregate_metrics_bytes,
    aggregate_metrics_path,
    build_aggregate_metrics,
    compute_aggregate_metrics,
    compute_perf_summary,
    strip_row,
)
from tests.servers import LOCAL

RUNS = ("eval_0.7.0/runA", "eval_0.7.0/runB", "collect_outputs/mixed")


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def row(task, rollout, reward, agent="remote_agent", **extra):
    return {
        "responses_create_params": {"input": "x"},
        "response": {"output": [], "usage": {"input_tokens": 3}},
        "reward": reward,
        **extra,
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": agent},
    }


class FakeEnv:
    """An env whose /aggregate_metrics answers what the test says, and records what it got."""

    def __init__(self, status=200, reply=None):
        self.status, self.reply, self.bodies = status, reply, []
        app = web.Application()
        app.router.add_post("/aggregate_metrics", self.handle)
        self.server = BackgroundServer(app)

    async def handle(self, request):
        self.bodies.append(await request.json())
        if isinstance(self.reply, (dict, list)):
            return web.json_response(self.reply, status=self.status)
        return web.Response(text=self.reply or "", status=self.status)

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop()

    @property
    def url(self):
        return self.server.url


# --- NeMo Gym's own files ----------------------------------------------------------------------------


@pytest.mark.parametrize("run", RUNS)
def test_the_local_computation_gives_nemo_gyms_file_byte_for_byte(shared_data, run):
    """NeMo Gym's counter server answers /aggregate_metrics with the default computation, so the same
    rows computed locally must give its file exactly (runB has failures; rows come in any order)."""
    folder = shared_data / run
    rows = read_rows(folder / "rollouts.jsonl")
    outcome = build_aggregate_metrics(list(reversed(rows)))
    assert aggregate_metrics_bytes(outcome.entries) == (folder / "rollouts_aggregate_metrics.json").read_bytes()
    assert outcome.sources == {"remote_agent_environment_server": "local"}
    assert "computed by gymweb" in outcome.notes[0]


def test_the_file_is_named_as_nemo_gym_names_it_beside_the_rollouts(tmp_path):
    assert aggregate_metrics_path(tmp_path / "rollouts.jsonl") == tmp_path / "rollouts_aggregate_metrics.json"
    assert aggregate_metrics_path(tmp_path / "merged.v2.jsonl").name == "merged.v2_aggregate_metrics.json"


# --- what the env gets and what it answers -------------------------------------------------------


def test_rows_are_stripped_as_nemo_gym_strips_them():
    full = {
        "responses_create_params": {"input": "big"},
        "response": {
            "output": ["huge"],
            "usage": {"input_tokens": 5},
            "incomplete_details": {"reason": "max_output_tokens"},
        },
        "reward": 1.0,
        "ng_trajectory": {"turns": []},
        "ng_model_call_capture": [1],
        "ng_agent_observations": {},
        "judge": "kept",
        "_ng_task_index": 2,
    }
    assert strip_row(full) == {
        "reward": 1.0,
        "judge": "kept",
        "_ng_task_index": 2,
        "response": {"usage": {"input_tokens": 5}, "incomplete_details": {"reason": "max_output_tokens"}},
    }
    assert "response" not in strip_row({"response": {"output": [], "usage": None}, "reward": 0.0})


def test_the_env_gets_stripped_rows_in_task_then_repeat_order_and_its_reply_fills_the_entry():
    reply = {
        "agent_metrics": {"mean/reward": 0.5, "pass@1/accuracy": 50.0},
        "key_metrics": {"pass@1/accuracy": 50.0},
        "group_level_metrics": [{"_ng_task_index": 0}],
        "perf_summary": {"mean_num_turns": 2.0},
        "extra": "ignored",
    }
    rows = [row(1, 0, 1.0), row(0, 1, 0.0), row(0, 0, 1.0)]
    with FakeEnv(reply=reply) as env:
        outcome = build_aggregate_metrics(rows, env_url=env.url, policy=LOCAL)
    (body,) = env.bodies
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in body["verify_responses"]] == [(0, 0), (0, 1), (1, 0)]
    assert body["verify_responses"][0] == {
        "reward": 1.0,
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "agent_ref": {"name": "remote_agent"},
        "response": {"usage": {"input_tokens": 3}},
    }
    (entry,) = outcome.entries
    assert list(entry) == [
        "agent_ref",
        "_ng_environment_server",
        "agent_metrics",
        "key_metrics",
        "group_level_metrics",
        "repeat_level_metrics",
        "perf_summary",
    ]
    assert entry["agent_ref"] == {"name": "remote_agent"}
    assert entry["_ng_environment_server"] == "remote_agent_environment_server"
    assert entry["agent_metrics"] == reply["agent_metrics"] and entry["key_metrics"] == reply["key_metrics"]
    assert entry["repeat_level_metrics"] == [] and entry["perf_summary"] == {"mean_num_turns": 2.0}
    assert outcome.notes == [] and outcome.all_from_env


@pytest.mark.parametrize(
    "status, reply, says",
    [
        (404, '{"detail":"Not Found"}', "does not serve /aggregate_metrics"),
        (405, "", "does not serve /aggregate_metrics"),
        (500, "boom", "answered HTTP 500: boom"),
        (200, "not json", "not JSON"),
        (200, [1, 2], "not an object"),
        (200, {"group_level_metrics": {"a": 1}}, "'group_level_metrics' that is not a list of objects"),
        # Another shape: NeMo Gym's model would take it as empty metrics, which its compare refuses.
        (200, {"mean/reward": 0.8}, "not NeMo Gym's AggregateMetrics (none of group_level_metrics"),
        (200, {}, "its keys: none"),
    ],
)
def test_without_a_usable_env_reply_the_entry_is_computed_locally_and_says_why(status, reply, says):
    rows = [row(0, r, float(r % 2)) for r in range(4)]
    with FakeEnv(status, reply) as env:
        outcome = build_aggregate_metrics(rows, env_url=env.url, policy=LOCAL)
    assert outcome.sources == {"remote_agent_environment_server": "local"}
    assert says in outcome.notes[0] and "computed by gymweb" in outcome.notes[0]
    assert (
        outcome.entries[0]["agent_metrics"] == compute_aggregate_metrics([strip_row(r) for r in rows])["agent_metrics"]
    )


def test_an_env_that_is_down_is_a_note_not_a_crash():
    outcome = build_aggregate_metrics([row(0, 0, 1.0)], env_url="http://127.0.0.1:9", timeout_s=5)
    assert "could not call http://127.0.0.1:9/aggregate_metrics" in outcome.notes[0]
    assert outcome.entries[0]["key_metrics"]["mean/reward"] == 1.0


def test_no_rows_give_no_entries_as_nemo_gym_writes_no_file():
    assert build_aggregate_metrics([]).entries == []


# --- one entry per environment server -------------------------------------------------------------


def test_rows_of_two_agents_get_one_entry_per_environment_server_labelled_by_agent():
    rows = [row(0, 0, 1.0, agent="alpha_agent"), row(0, 0, 0.0, agent="beta"), row(1, 0, 1.0, agent="alpha_agent")]
    outcome = build_aggregate_metrics(rows)
    assert [(e["agent_ref"]["name"], e["_ng_environment_server"]) for e in outcome.entries] == [
        ("alpha_agent", "alpha_environment_server"),
        ("beta", "beta_environment_server"),
    ]
    alpha, beta = outcome.entries
    assert alpha["agent_metrics"]["mean/reward"] == 1.0 and len(alpha["group_level_metrics"]) == 2
    assert beta["agent_metrics"]["mean/reward"] == 0.0


def test_a_row_keeps_the_server_it_is_stamped_with():
    rows = [row(0, 0, 1.0, _ng_environment_server="math_environment_server"), row(0, 0, 0.0)]
    names = [e["_ng_environment_server"] for e in build_aggregate_metrics(rows).entries]
    assert names == ["math_environment_server", "remote_agent_environment_server"]  # in order of first appearance


def test_two_servers_fronting_one_agent_are_labelled_by_server():
    rows = [row(0, 0, 1.0, _ng_environment_server="s1"), row(0, 0, 0.0, _ng_environment_server="s2")]
    assert [e["agent_ref"]["name"] for e in build_aggregate_metrics(rows).entries] == ["s1", "s2"]


@pytest.mark.parametrize(
    "agent, server",
    [
        ("remote_agent", "remote_agent_environment_server"),
        ("my_agent", "my_environment_server"),
        ("counter_remote_agent", "counter_environment_server"),
        ("policy", "policy_environment_server"),
    ],
)
def test_the_environment_server_name_is_nemo_gyms_legacy_name(agent, server):
    assert environment_server_name(agent) == server


def test_stamps_go_last_and_an_imported_rows_own_stamps_are_kept():
    fresh = stamp({"reward": 1.0, "agent_ref": {"name": "x_agent"}}, {"name": "x_agent"}, add=True)
    assert list(fresh)[-2:] == ["_ng_environment_server", "_ng_result_type"]
    assert (fresh["_ng_environment_server"], fresh["_ng_result_type"]) == ("x_environment_server", "legacy_agent")
    carried = {"_ng_environment_server": "theirs", "_ng_result_type": "episode", "reward": 0.0, "agent_ref": {}}
    assert list(stamp(dict(carried), {}, add=True).items())[-2:] == [
        ("_ng_environment_server", "theirs"),
        ("_ng_result_type", "episode"),
    ]
    assert "_ng_environment_server" not in stamp({"reward": 0.0}, {"name": "a"}, add=False)
    assert list(stamp(dict(carried), {}, add=False)) == list(carried), "an imported row stays as it came"


# --- the default computation's rules -------------------------------------------------------------


def test_masked_rows_leave_the_figures_and_show_as_coverage():
    rows = [
        strip_row(row(0, 0, 1.0)),
        strip_row(row(0, 1, 0.0, mask_sample=True)),
        strip_row(row(1, 0, 0.0, mask_sample=True)),
    ]
    result = compute_aggregate_metrics(rows)
    agent = result["agent_metrics"]
    assert agent["mean/reward"] == 1.0 and "mean/mask_sample" not in agent
    assert (agent["coverage/masked_rollouts"], agent["coverage/fully_masked_tasks"]) == (2, 1)
    assert result["key_metrics"]["coverage/measured_rollouts"] == 1
    assert agent["num_repeats"] == 2  # counted over every row, masked ones included


def test_every_row_masked_gives_only_coverage():
    result = compute_aggregate_metrics([{"reward": 0.0, "mask_sample": True, "_ng_task_index": 0}])
    assert (
        result["agent_metrics"]
        == result["key_metrics"]
        == {
            "coverage/measured_rollouts": 0,
            "coverage/masked_rollouts": 1,
            "coverage/measured_tasks": 0,
            "coverage/fully_masked_tasks": 1,
        }
    )
    assert result["group_level_metrics"] == []


def test_duplicate_keys_are_an_error_as_in_nemo_gyms_env():
    with pytest.raises(ValueError, match="Duplicate"):
        compute_aggregate_metrics([strip_row(row(0, 0, 1.0)), strip_row(row(0, 0, 0.0))])


def test_ng_perf_gives_nemo_gyms_perf_summary():
    perf = [
        {"num_turns": 2, "completion_tokens": 10, "total_latency_ms": 100.0, "token_observability_coverage": 1.0},
        {"num_turns": 4, "completion_tokens": 30, "total_latency_ms": 300.0},
    ]
    summary = compute_perf_summary(perf, total_rollouts=4)
    assert summary["overall_observability_coverage"] == 0.5 and summary["token_observability_coverage"] == 0.25
    assert summary["mean_num_turns"] == 3.0 and summary["std_num_turns"] == 1.0  # population std, as NeMo Gym's
    assert summary["total_completion_tokens"] == 40 and summary["mean_tokens_per_turn"] == 6.25
    assert summary["total_latency_p50_ms"] == 200.0 and math.isclose(summary["total_latency_p90_ms"], 280.0)
    assert compute_perf_summary([], total_rollouts=3) is None
    entry = build_aggregate_metrics([row(0, 0, 1.0, ng_perf=perf[0])]).entries[0]
    assert entry["perf_summary"]["overall_observability_coverage"] == 1.0
