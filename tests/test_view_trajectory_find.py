"""Find on the trajectory page past the display cut: the server searches every item's whole
stored text (the find endpoint) and the page loads the full body where a hit is."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.web.find import find_in
from tests.test_view_rollout_detail import call, make_rollout, make_run, make_task, msg, out

pytestmark = pytest.mark.django_db

NEEDLE = "NeedleBeyondTheCut"


def long_rollout():
    run = make_run()
    text = "x" * 30_000 + f" {NEEDLE} " + "y" * 100
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}],
        items=[
            (0, msg("Looking."), {}),
            (0, call("c1", "bash", json.dumps({"command": "cat big.log"})), {}),
            (0, out("c1", text), {}),
        ],
    )
    return run, rollout


def _find(client, rollout, q):
    response = client.get(reverse("rollout_find", args=[rollout.run_id, rollout.pk]), {"q": q})
    assert response.status_code == 200
    return response.json()


def test_the_find_endpoint_reports_a_hit_past_the_display_cut(signed_in, settings):
    settings.GYMWEB_DISPLAY_MAX_CHARS = 20_000
    run, rollout = long_rollout()
    page = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
    assert NEEDLE not in page  # cut: the page alone cannot find it
    assert f'data-find="{reverse("rollout_find", args=[run.pk, rollout.pk])}"' in page
    found = _find(signed_in, rollout, NEEDLE.lower())
    assert found["hits"] == 1
    assert found["items"] == [{"key": "2", "hits": 1, "offsets": [30_001]}]
    # the item endpoint's full body holds it, under the id the page's body has
    full = signed_in.get(reverse("rollout_item", args=[run.pk, rollout.pk, "2"]), {"full": "1"}, HTTP_HX_REQUEST="true")
    assert NEEDLE in full.content.decode() and 'id="body-2"' in full.content.decode()


def test_find_searches_decoded_arguments_and_the_task_input(signed_in):
    run, rollout = long_rollout()
    assert _find(signed_in, rollout, "cat big.log")["items"][0]["key"] == "1"  # inside the arguments' JSON
    assert _find(signed_in, rollout, "")["items"] == []
    assert [i["key"] for i in _find(signed_in, rollout, "then GET the count")["items"]] == ["input-0"]


def test_find_searches_the_verify_replys_own_fields(signed_in, settings):
    settings.GYMWEB_DISPLAY_MAX_CHARS = 1_000
    run = make_run()
    patch = "diff --git a/x b/x\n" + "+line\n" * 2_000 + "+PatchTailWord\n"
    rollout = make_rollout(run, make_task(run), verify={"reward": 0.0, "metadata": {"model_patch": patch}})
    page = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
    assert "PatchTailWord" not in page
    assert _find(signed_in, rollout, "patchtailword")["items"] == [{"key": "verify", "hits": 1, "offsets": [12_020]}]


def test_find_needs_a_signed_in_user_and_the_rollouts_run(client, signed_in):
    run, rollout = long_rollout()
    other = make_run()
    assert signed_in.get(reverse("rollout_find", args=[other.pk, rollout.pk]), {"q": "x"}).status_code == 404
    client.logout()
    assert client.get(reverse("rollout_find", args=[run.pk, rollout.pk]), {"q": "x"}).status_code == 302


def test_find_in_counts_every_hit_case_insensitively_with_offsets():
    assert find_in({"output": "abc ABC abc"}, "abc") == (3, [0, 4, 8])
    assert find_in({"arguments": json.dumps({"path": "/a/é.py"})}, "é.PY")[0] == 1  # decoded: \u00e9 is é
    assert find_in({"type": "message"}, "message") == (0, [])  # the item's type is not its text
