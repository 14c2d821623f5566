"""rollouts.evaluation.profile: NeMo Gym's `gym eval profile`, reproduced without pandas/scipy, plus gymweb's pass@k.

The reference output is NeMo Gym 0.7.0's own files for a known input (the profile fixture). The copy in
tests/data/profile_fixture/ is preferred so a lone clone (no ../shared) still runs these tests.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import warnings
from pathlib import Path

import pytest

from rollouts.evaluation import profile as P

HERE = Path(__file__).resolve()
BUNDLED_FIXTURE = HERE.parent / "data" / "profile_fixture"
SHARED_FIXTURE = HERE.parents[2] / "shared" / "data" / "nemo_gym" / "profile_fixture"
FIXTURE_FILES = (
    "rollouts_materialized_inputs.jsonl",
    "rollouts.jsonl",
    "rollouts_reward_profiling.jsonl",
    "rollouts_agent_metrics.json",
    "rollouts_repeat_level_metrics.json",
)


# --- helpers ------------------------------------------------------------------------------------


def assert_same(expected, actual, path="$"):
    """Same keys in the same order, same types, floats equal to 1e-9 (relative), recursively."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        assert list(actual) == list(expected), f"{path}: keys differ\nexpected {list(expected)}\nactual   {list(actual)}"
        for key in expected:
            assert_same(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{path}: expected a list, got {actual!r}"
        assert len(actual) == len(expected), f"{path}: {len(actual)} items, expected {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same(e, a, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert type(actual) is float, f"{path}: expected float {expected!r}, got {actual!r}"
        assert math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-12), f"{path}: {actual!r} != {expected!r}"
    else:
        assert type(actual) is type(expected) and actual == expected, f"{path}: {actual!r} != {expected!r}"


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def row(task, rollout, agent="remote_agent", **extra):
    out = {"responses_create_params": {"input": [{"role": "user", "content": f"task {task}"}]}, "x": task}
    out.update(extra)
    out["_ng_task_index"] = task
    out["_ng_rollout_index"] = rollout
    if agent is not None:
        out["agent_ref"] = {"name": agent}
    return out


def rollout(task, rollout_index, reward, usage=None, agent="remote_agent", **extra):
    response = {"id": "resp", "output": []}
    if usage is not None:
        response["usage"] = usage
    out = {"responses_create_params": {"input": []}, "response": response, "reward": reward}
    out.update(extra)
    out["_ng_task_index"] = task
    out["_ng_rollout_index"] = rollout_index
    if agent is not None:
        out["agent_ref"] = {"name": agent}
    return out


@pytest.fixture(scope="module")
def fixture_dir() -> Path:
    for candidate in (BUNDLED_FIXTURE, SHARED_FIXTURE):
        if all((candidate / name).is_file() for name in FIXTURE_FILES):
            return candidate
    pytest.skip("NeMo Gym's profile fixture is neither in tests/data nor in ../shared")


@pytest.fixture(scope="module")
def fixture_result(fixture_dir):
    return P.profile_files(fixture_dir / "rollouts_materialized_inputs.jsonl", fixture_dir / "rollouts.jsonl")


# --- NeMo Gym's files, for the fixture ------------------------------------------------------------


def test_it_reproduces_nemo_gyms_reward_profiling_for_the_fixture(fixture_dir, fixture_result):
    expected = read_jsonl(fixture_dir / "rollouts_reward_profiling.jsonl")
    assert_same(expected, fixture_result.reward_profiling)


def test_it_reproduces_nemo_gyms_agent_metrics_for_the_fixture(fixture_dir, fixture_result):
    expected = json.loads((fixture_dir / "rollouts_agent_metrics.json").read_text(encoding="utf-8"))
    assert_same(expected, fixture_result.agent_metrics)


def test_it_reproduces_nemo_gyms_repeat_level_metrics_for_the_fixture(fixture_dir, fixture_result):
    expected = json.loads((fixture_dir / "rollouts_repeat_level_metrics.json").read_text(encoding="utf-8"))
    assert_same(expected, fixture_result.repeat_level_metrics)


def test_the_written_files_parse_to_nemo_gyms_and_keep_its_layout(fixture_dir, fixture_result, tmp_path):
    paths = P.write_profile_files(fixture_result, tmp_path / "rollouts")
    assert [p.name for p in paths] == [
        "rollouts_reward_profiling.jsonl",
        "rollouts_agent_metrics.json",
        "rollouts_repeat_level_metrics.json",
    ]
    reward_path, agent_path, repeat_path = paths
    # Everything in the reward profiling file is exact, so its bytes are NeMo Gym's bytes.
    assert reward_path.read_bytes() == (fixture_dir / "rollouts_reward_profiling.jsonl").read_bytes()
    for written, name in ((agent_path, "rollouts_agent_metrics.json"), (repeat_path, "rollouts_repeat_level_metrics.json")):
        raw = written.read_bytes()
        assert not raw.endswith(b"\n") and b", " not in raw and b": " not in raw  # compact, no newline
        assert_same(json.loads((fixture_dir / name).read_bytes()), json.loads(raw))


def test_the_serialiser_writes_nemo_gyms_exact_bytes_for_its_own_data(fixture_dir):
    for name in ("rollouts_agent_metrics.json", "rollouts_repeat_level_metrics.json"):
        original = (fixture_dir / name).read_bytes()
        assert P.dumps_like_orjson(json.loads(original)) == original
    for line in (fixture_dir / "rollouts_reward_profiling.jsonl").read_bytes().splitlines():
        assert P.dumps_like_orjson(json.loads(line)) == line


def test_a_rollouts_jsonl_path_works_as_the_output_stem_like_in_nemo_gym(tmp_path):
    assert P.profile_file_paths(tmp_path / "rollouts.jsonl") == P.profile_file_paths(tmp_path / "rollouts")
    assert P.profile_file_paths(tmp_path / "run.v2")[0].name == "run.v2_reward_profiling.jsonl"


def test_the_bundled_fixture_copy_matches_the_shared_one():
    if not SHARED_FIXTURE.is_dir():
        pytest.skip("../shared is not beside this checkout")
    for name in FIXTURE_FILES:
        assert (BUNDLED_FIXTURE / name).read_bytes() == (SHARED_FIXTURE / name).read_bytes(), name


def test_rollout_rows_in_any_order_give_the_same_profile(fixture_dir, fixture_result):
    inputs = read_jsonl(fixture_dir / "rollouts_materialized_inputs.jsonl")
    rollouts = read_jsonl(fixture_dir / "rollouts.jsonl")
    again = P.profile_rows(reversed(inputs), sorted(rollouts, key=lambda r: -r["_ng_rollout_index"]))
    assert_same(fixture_result.reward_profiling, again.reward_profiling)
    assert_same(fixture_result.agent_metrics, again.agent_metrics)
    assert_same(fixture_result.repeat_level_metrics, again.repeat_level_metrics)


def test_the_completion_summary_counts_rollouts_and_input_tasks(fixture_result):
    assert fixture_result.completion_summary == {
        "expected_rollout_rows": 20,
        "completed_rollout_rows": 20,
        "missing_rollout_rows": 0,
        "extra_rollout_rows": 0,
        "reward_profile_completion_pct": 100.0,
        "total_input_rows": 5,
        "complete_input_rows": 5,
        "partial_input_rows": 0,
        "missing_input_rows": 0,
    }


# --- NeMo Gym's rules, on small hand-made inputs ------------------------------------------------------


def test_numeric_fields_and_usage_are_profiled_but_underscored_and_nested_fields_are_not():
    rows = [row(0, 0), row(0, 1)]
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 5}, "total_tokens": 12}
    rollouts = [
        rollout(0, 0, 1.0, usage=usage, passed=True, note="text", _ng_failure_terminal=True, total_tokens=999),
        rollout(0, 1, 0.0, usage=dict(usage, input_tokens=20, total_tokens=22), passed=False),
    ]
    task = P.profile_rows(rows, rollouts).reward_profiling[0]
    stats = [k for k in task if "/" in k]
    # result | usage: a usage field overrides the same-named top-level field but keeps its position.
    assert stats[:4] == ["mean/reward", "mean/passed", "mean/total_tokens", "mean/input_tokens"]
    assert task["mean/passed"] == 0.5  # booleans count as 0/1
    assert task["mean/total_tokens"] == 17.0  # 12 and 22, not the top-level 999
    assert not any("cached" in k or "note" in k or "_ng_" in k.split("/")[-1] for k in stats)
    assert task["rollout_infos"][0] == {
        "rollout_id": "0:0",
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "reward": 1.0,
        "input_tokens": 10,
        "total_tokens": 999,
        "passed": 1,
    }


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_std_uses_ddof_1_and_a_single_rollout_task_gets_std_zero():
    rows = [row(0, 0), row(0, 1), row(0, 2), row(1, 0)]
    rollouts = [rollout(0, 0, 1.0), rollout(0, 1, 0.0), rollout(0, 2, 1.0), rollout(1, 0, 0.5)]
    result = P.profile_rows(rows, rollouts, allow_partial_rollouts=True)
    first, second = result.reward_profiling
    assert first["std/reward"] == pytest.approx(math.sqrt(1 / 3))  # var = (2*(1/3)^2 + (2/3)^2) / 2
    assert first["median/reward"] == 1.0 and first["mean/reward"] == pytest.approx(2 / 3)
    assert second["std/reward"] == 0.0  # NeMo Gym: 0 instead of NaN for one value
    assert second["num_rollouts"] == 1 and second["expected_num_rollouts"] == 1


def test_max_and_min_stay_integers_only_when_every_profiled_field_is_an_integer():
    ints = P.profile_rows([row(0, 0), row(0, 1)], [rollout(0, 0, 1), rollout(0, 1, 0)])
    assert ints.reward_profiling[0]["max/reward"] == 1 and type(ints.reward_profiling[0]["max/reward"]) is int
    assert type(ints.reward_profiling[0]["mean/reward"]) is float
    mixed = P.profile_rows([row(0, 0), row(0, 1)], [rollout(0, 0, 1, score=0.5), rollout(0, 1, 0, score=1)])
    assert type(mixed.reward_profiling[0]["max/reward"]) is float


def test_missing_rollouts_raise_unless_partial_profiles_are_allowed():
    rows = [row(0, 0), row(0, 1), row(1, 0), row(1, 1)]
    rollouts = [rollout(0, 0, 1.0), rollout(0, 1, 0.0), rollout(1, 1, 1.0)]
    with pytest.raises(ValueError, match=r"(?s)Missing rollout results for 1 .*allow_partial_rollouts=True"):
        P.profile_rows(rows, rollouts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = P.profile_rows(rows, rollouts, allow_partial_rollouts=True)
    task1 = result.reward_profiling[1]
    assert (task1["num_rollouts"], task1["expected_num_rollouts"], task1["missing_num_rollouts"]) == (1, 2, 1)
    assert task1["reward_profile_completion_pct"] == 50.0
    assert task1["sample"] == {"responses_create_params": {"input": [{"role": "user", "content": "task 1"}]}, "x": 1, "agent_ref": {"name": "remote_agent"}}
    assert [e["missing_count"] for e in result.repeat_level_metrics] == [1, 0]
    assert result.completion_summary["partial_input_rows"] == 1


def test_extra_and_duplicate_rows_are_errors():
    with pytest.raises(ValueError, match="no matching materialized input"):
        P.profile_rows([row(0, 0)], [rollout(0, 0, 1.0), rollout(0, 1, 1.0)])
    with pytest.raises(ValueError, match="Duplicate result row"):
        P.profile_rows([row(0, 0)], [rollout(0, 0, 1.0), rollout(0, 0, 0.0)])
    with pytest.raises(ValueError, match="Duplicate materialized input row"):
        P.profile_rows([row(0, 0), row(0, 0)], [rollout(0, 0, 1.0)])
    with pytest.raises(ValueError, match="_ng_task_index"):
        P.profile_rows([row(0, 0)], [{"reward": 1.0}])


def test_masked_rollouts_leave_the_statistics_and_show_up_as_coverage():
    rows = [row(0, 0), row(0, 1), row(1, 0), row(1, 1)]
    rollouts = [
        rollout(0, 0, 1.0, mask_sample=False),
        rollout(0, 1, 0.0, mask_sample=True),
        rollout(1, 0, 0.0, mask_sample=True),
        rollout(1, 1, 0.0, mask_sample=True),
    ]
    result = P.profile_rows(rows, rollouts)
    assert [t["_ng_task_index"] for t in result.reward_profiling] == [0]
    assert result.reward_profiling[0]["mean/reward"] == 1.0
    assert "mean/mask_sample" not in result.reward_profiling[0]
    assert result.reward_profiling[0]["expected_num_rollouts"] == 1
    agent = result.agent_metrics[0]
    assert list(agent)[-4:] == [
        "coverage/measured_rollouts",
        "coverage/masked_rollouts",
        "coverage/measured_tasks",
        "coverage/fully_masked_tasks",
    ]
    assert (agent["coverage/masked_rollouts"], agent["coverage/fully_masked_tasks"]) == (3, 1)
    assert result.masked_rollouts == 3


def test_repeat_level_metrics_need_two_repeats_and_a_zero_spread_collapses_the_interval():
    single = P.profile_rows([row(0, 0), row(1, 0)], [rollout(0, 0, 1.0), rollout(1, 0, 0.0)])
    assert single.repeat_level_metrics == []
    assert not any("across_repeats" in k for k in single.agent_metrics[0])

    rows = [row(t, r) for t in range(2) for r in range(2)]
    rollouts = [rollout(t, r, 1.0) for t in range(2) for r in range(2)]
    with pytest.warns(UserWarning, match="Standard error is 0"):
        result = P.profile_rows(rows, rollouts)
    first = result.repeat_level_metrics[0]
    assert (first["ci_low_95/reward"], first["ci_high_95/reward"]) == (1.0, 1.0)
    assert result.agent_metrics[0]["ci_low_95_across_repeats/mean/reward"] == 1.0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_across_repeat_intervals_are_student_t_intervals_of_the_repeat_means():
    rows = [row(t, r) for t in range(2) for r in range(3)]
    rewards = {(0, 0): 1.0, (1, 0): 1.0, (0, 1): 1.0, (1, 1): 0.0, (0, 2): 0.0, (1, 2): 0.0}
    result = P.profile_rows(rows, [rollout(t, r, rewards[(t, r)]) for t, r in rewards])
    agent = result.agent_metrics[0]
    means = [1.0, 0.5, 0.0]  # per-repeat mean rewards
    se = 0.5 / math.sqrt(3)  # std of the repeat means (ddof=1) is 0.5
    assert agent["mean_across_repeats/mean/reward"] == pytest.approx(0.5)
    assert agent["std_across_repeats/mean/reward"] == pytest.approx(0.5)
    assert agent["se_across_repeats/mean/reward"] == pytest.approx(se)
    assert (agent["min_across_repeats/mean/reward"], agent["max_across_repeats/mean/reward"]) == (0.0, 1.0)
    t975_df2 = 4.302652729749464  # Student's t, 97.5% quantile, 2 degrees of freedom
    assert agent["ci_low_95_across_repeats/mean/reward"] == pytest.approx(0.5 - t975_df2 * se, rel=1e-12)
    assert agent["ci_high_95_across_repeats/mean/reward"] == pytest.approx(0.5 + t975_df2 * se, rel=1e-12)
    assert [e["mean/reward"] for e in result.repeat_level_metrics] == means


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_task_run_by_two_agents_is_profiled_per_agent():
    rows = [row(0, 0, agent="alpha"), row(0, 1, agent="alpha"), row(0, 2, agent="beta"), row(0, 3, agent="beta")]
    rollouts = [
        rollout(0, 0, 1.0, agent="alpha"),
        rollout(0, 1, 1.0, agent="alpha"),
        rollout(0, 2, 0.0, agent="beta"),
        rollout(0, 3, 1.0, agent="beta"),
    ]
    result = P.profile_rows(rows, rollouts)
    assert [(t["agent_ref"]["name"], t["mean/reward"]) for t in result.reward_profiling] == [("alpha", 1.0), ("beta", 0.5)]
    assert list(result.reward_profiling[0])[-8:-6] == ["std/reward", "agent_ref"]
    assert [a["agent_ref"]["name"] for a in result.agent_metrics] == ["alpha", "beta"]


# --- Student's t without scipy -------------------------------------------------------------------


@pytest.mark.parametrize(
    "df, quantile",
    [
        (1, 12.706204736174693314),
        (2, 4.3026527297494617894),
        (3, 3.1824463052837084359),
        (4, 2.7764451051977934898),
        (5, 2.5705818356363147828),
        (10, 2.2281388519862742245),
        (100, 1.9839715185235518946),
        (1000, 1.9623390808264081039),
        (1_000_000, 1.959966356814107),
    ],
)
def test_the_student_t_quantile_is_exact_to_1e_12(df, quantile):
    # Reference values: 40-digit evaluation of the inverse regularized incomplete beta function.
    assert P.student_t_ppf(0.975, df) == pytest.approx(quantile, rel=1e-12, abs=0)
    assert P.student_t_ppf((1 - 0.95) / 2, df) == pytest.approx(-quantile, rel=1e-12, abs=0)


def test_the_student_t_interval_matches_scipys_arithmetic():
    low, high = P.student_t_interval(0.95, 4, loc=0.8, scale=0.19999999999999998)
    assert (low, high) == (pytest.approx(0.24471097896044136, rel=1e-13), pytest.approx(1.3552890210395587, rel=1e-13))
    assert all(math.isnan(v) for v in P.student_t_interval(0.95, 4, loc=1.0, scale=0.0))
    with pytest.raises(ValueError, match="df must be a positive integer"):
        P.student_t_ppf(0.9, 2.5)


def test_floats_are_written_like_orjson():
    assert P.dumps_like_orjson([1e-05, 1e-06, -1.5e-05, 0.0001, 1e16, 1.2345e17, 100.0, float("nan"), float("inf")]) == (
        b"[0.00001,1e-6,-0.000015,0.0001,1e+16,1.2345e+17,100.0,null,null]"
    )
    assert P.dumps_like_orjson({"a": "é\n\"", "b": [True, None, 3]}) == '{"a":"é\\n\\"","b":[true,null,3]}'.encode()


# --- gymweb extras: pass@k -------------------------------------------------------------------------


def test_pass_at_k_for_binary_rewards_is_the_unbiased_combinatorial_estimator():
    assert P.pass_at_k([1, 0, 1, 0], 1) == pytest.approx(0.5)  # 1 - C(2,1)/C(4,1)
    assert P.pass_at_k([1, 0, 1, 0], 2) == pytest.approx(5 / 6)  # 1 - C(2,2)/C(4,2)
    assert P.pass_at_k([1, 0, 1, 0], 3) == 1.0  # fewer than 3 failures
    assert P.pass_at_k([1.0, 0.0, 0.0, 0.0], 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert P.pass_at_k([True, False, False, False], 3) == pytest.approx(0.75)  # 1 - C(3,3)/C(4,3)
    assert P.pass_at_k([0, 0, 0], 3) == 0.0 and P.pass_at_k([1, 1], 1) == 1.0


def test_pass_at_k_for_continuous_rewards_is_the_expected_max_of_k_draws():
    rewards = [0.2, 0.8, 0.5]
    assert P.pass_at_k(rewards, 1) == pytest.approx(0.5)  # mean
    assert P.pass_at_k(rewards, 2) == pytest.approx((0.8 + 0.5 + 0.8) / 3)  # the three pairs' maxima
    assert P.pass_at_k(rewards, 3) == pytest.approx(0.8)
    assert P.pass_at_k(rewards, 2, continuous="first_k") == 0.8  # NeMo Gym's convention: max of the first k
    assert P.pass_at_k(rewards, 1, continuous="first_k") == 0.2


def test_pass_at_1_avg_of_k_is_the_mean_of_the_first_k_rollouts():
    assert P.pass_at_1_avg_of_k([0.2, 0.8, 0.5], 2) == pytest.approx(0.5)
    assert P.pass_at_1_avg_of_k([1, 0, 0, 1], 4) == 0.5


def test_k_larger_than_the_number_of_rollouts_is_a_clear_error():
    with pytest.raises(ValueError, match=r"k=5 is larger than the number of rollouts n=4"):
        P.pass_at_k([1, 0, 1, 0], 5)
    with pytest.raises(ValueError, match=r"k=3 is larger than the number of rollouts n=2"):
        P.pass_at_1_avg_of_k([1, 0], 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        P.pass_at_k([1, 0], 0)
    with pytest.raises(ValueError, match="finite numbers"):
        P.pass_at_k([1, float("nan")], 1)


def test_gymweb_extras_give_pass_at_k_per_task_and_overall_for_the_fixture(fixture_result, tmp_path):
    extras = P.gymweb_extras(fixture_result)
    per_task = {t["_ng_task_index"]: t for t in extras["per_task"]}
    assert [per_task[i]["num_passed"] for i in range(5)] == [4, 3, 1, 0, 2]
    assert per_task[2]["pass@2"] == pytest.approx(0.5)
    assert per_task[4]["pass@2"] == pytest.approx(5 / 6)
    (overall,) = extras["overall"]
    assert overall["agent_ref"] == {"name": "remote_agent"} and overall["num_tasks"] == 5
    assert overall["pass@1"] == pytest.approx(0.5)
    assert overall["pass@2"] == pytest.approx((1 + 1 + 0.5 + 0 + 5 / 6) / 5)
    assert overall["pass@3"] == pytest.approx(0.75)
    assert overall["pass@4"] == pytest.approx(0.8)
    assert overall["pass@1[avg-of-4]"] == pytest.approx(0.5)
    path = P.write_gymweb_extras(fixture_result, tmp_path / "rollouts")
    assert path.name == "rollouts_gymweb_pass_at_k.json"
    assert_same(json.loads(P.dumps_like_orjson(extras)), json.loads(path.read_bytes()))


def test_gymweb_extras_from_rows_can_count_failures_as_zero():
    successes = [rollout(0, 0, 1.0), rollout(0, 2, 1.0)]
    failures = [rollout(0, 1, 0.0, error="agent unreachable")]
    only_successes = P.gymweb_extras(successes)["overall"][0]
    with_failures = P.gymweb_extras(successes + failures)["overall"][0]
    assert only_successes["pass@1"] == 1.0
    assert with_failures["pass@1"] == pytest.approx(2 / 3)
    assert with_failures["pass@1[avg-of-2]"] == 0.5  # rollouts 0 and 1, in rollout-index order
    assert "pass@4" not in with_failures and with_failures["num_tasks@3"] == 1


# --- byte for byte what it was: random inputs against digests of the first implementation ---------
#
# profile_rows/_describe/gymweb_extras were sped up (fewer calls, same arithmetic). These digests were
# taken from the implementation before that (commit 8751fe2) over NeMo Gym's three files, the
# completion summary and gymweb's extras of random inputs: any change to a byte of them, or to a
# float's last bit, shows here. Update them only for a deliberate change of the output.


def golden_case(seed):
    """A random but reproducible profiling input: fan-out, masks, env servers, partial repeats, odd fields."""
    rng = random.Random(seed)
    values = [0, 1, 7, 250, 0.5, 0.1, 1.0, -0.0, 2.25, 1e-5, 3e16, True, False, None, "x", {"a": 1}]
    fields = rng.sample(["reward", "turns", "score", "input_tokens", "mask_sample", "agent_name", "_x"], 4)
    usage_fields = rng.sample(["input_tokens", "output_tokens", "total_tokens", "reward", "score"], 3)
    int_only = rng.random() < 0.3
    servers = rng.random() < 0.2
    materialized, rows = [], []
    for task in range(rng.randint(1, 8)):
        agents = rng.choice([["a"], ["a"], ["a", "b"], ["a", None]])
        repeats = rng.choice([1, 2, 3, 4, 9, 17])
        for n, agent in enumerate(agents):
            for repeat in range(repeats):
                key = {"_ng_task_index": task, "_ng_rollout_index": repeat + 100 * n}
                ref = {"agent_ref": {"name": agent}} if agent else {}
                env = {"_ng_environment_server": rng.choice(["s1", "s2"])} if servers else {}
                materialized.append({"q": f"task {task}", **key, **ref, **env})
                if rng.random() < 0.15:
                    continue
                pick = (lambda: rng.randint(0, 40)) if int_only else (lambda: rng.choice(values) if rng.random() < 0.6 else rng.random())
                row = {f: pick() for f in fields if rng.random() < 0.85}
                if "mask_sample" in row:
                    row["mask_sample"] = rng.random() < 0.25
                if rng.random() < 0.85:
                    row["response"] = {"usage": {f: pick() for f in usage_fields if rng.random() < 0.9}}
                rows.append({**row, **key, **ref})
    rng.shuffle(rows)
    return materialized, rows, rng.random() < 0.8


def golden_digest(seed):
    materialized, rows, partial = golden_case(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = P.profile_rows(materialized, rows, allow_partial_rollouts=partial)
        except ValueError as exc:
            return "error: " + str(exc)[:60]
    parts = [P.dumps_like_orjson(x) for x in (result.reward_profiling, result.agent_metrics, result.repeat_level_metrics,
                                              result.completion_summary, [result.masked_rollouts])]
    for continuous in ("expected_max", "first_k"):
        parts.append(P.dumps_like_orjson(P.gymweb_extras(result, continuous=continuous)))
        parts.append(P.dumps_like_orjson(P.gymweb_extras(rows, continuous=continuous)))
    parts.append("|".join(str(w.message) for w in caught).encode())
    return hashlib.sha256(b"\n".join(parts)).hexdigest()[:16]


MISSING_ROLLOUTS = "error: Materialized input rows and rollout results do not have matc"  # strict mode
GOLDEN_DIGESTS = {
    0: '2f4673b208cbf906', 1: 'd28c1454c1741cb5', 2: '28e1c2458e30f870', 3: '98ae2c52b1529e1d',
    4: '3c39a3a202c78db0', 5: 'bcd1cdde96450603', 6: 'b53dbee3ec58f9fe', 7: '4eb50e8e67292bc7',
    8: '32b65fa620579ff9', 9: '956fdb31aacd1488', 10: '190cacf025dc73a7', 11: MISSING_ROLLOUTS,
    12: MISSING_ROLLOUTS, 13: 'af6a957987fd48ab', 14: '233f5ff8b04022c6', 15: '1186316e44db2ba3',
    16: 'ba094d1f5b1b6637', 17: '24e45eab197888f6', 18: '39cf8ea587ab8998', 19: '09d79981d68cdefd',
    20: 'd9f9c87850e0c35f', 21: '96291e8bd1fbcfac', 22: '566fb46ee095f4f7', 23: '26eab2c60d4ecd96',
    24: '9ec3d07fbe116f58', 25: '5c42e52015b858c6', 26: 'cdf7d3c0bb90d0e5', 27: 'b98eb81fa67f9c46',
    28: '8f1c1f9b93bccfde', 29: 'a606aba1473aeb8e', 30: 'ecf5216beca07b50', 31: 'da96942d0e4879b0',
    32: '2ed20e622f302c96', 33: 'e53a4a217e1ff352', 34: MISSING_ROLLOUTS, 35: 'a947ef6fbfdb8c5b',
    36: '9ec96848f4cd6aad', 37: '00183abd228d5261', 38: 'b92477529b6f950b', 39: '6f40cf45bc2f0826',
}


@pytest.mark.parametrize("seed", sorted(GOLDEN_DIGESTS))
def test_random_inputs_profile_to_the_same_bytes_as_the_first_implementation(seed):
    assert golden_digest(seed) == GOLDEN_DIGESTS[seed]
