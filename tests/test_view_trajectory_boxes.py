"""Bounding boxes in a tool call's arguments: read in the known forms (pixels or normalised,
x1,y1,x2,y2 or x,y,w,h) and handed to the page to draw over the last image."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from rollouts.web.boxes import boxes_in
from tests.test_view_images import png, user_with_images
from tests.test_view_rollout_detail import call, make_rollout, make_run, make_task


def test_boxes_are_read_in_every_known_form():
    assert boxes_in(json.dumps({"bbox": [10, 20, 110, 220]})) == [
        {"x1": 10.0, "y1": 20.0, "x2": 110.0, "y2": 220.0, "label": "", "norm": False}
    ]
    (box,) = boxes_in({"boxes": [{"x": 0.1, "y": 0.2, "w": 0.3, "h": 0.4, "label": "cat"}]})
    assert box["norm"] and box["label"] == "cat" and box["x2"] == pytest.approx(0.4) and box["y2"] == pytest.approx(0.6)
    assert boxes_in({"bbox_xywh": [10, 10, 5, 5]})[0]["x2"] == 15.0  # named xywh
    assert boxes_in({"box": [50, 60, 20, 10]})[0]["x2"] == 70.0  # x2 <= x1: a width
    assert boxes_in({"region": {"left": 1, "top": 2, "right": 3, "bottom": 4}})[0]["y2"] == 4.0
    assert boxes_in({"box": {"x1": 5, "y1": 5, "x2": 9, "y2": 9}})[0]["norm"] is False
    assert boxes_in({"query": "a box"}) == [] and boxes_in("not json") == [] and boxes_in({"bbox": [1, 2]}) == []
    assert boxes_in({"bbox": [-5, 0, 10, 10]}) == []  # not on the image


@pytest.mark.django_db
def test_a_call_with_boxes_carries_them_for_the_page_escaped(signed_in):
    run = make_run()
    args = json.dumps({"bbox": [4, 3, 20, 15], "label": '"><script>x</script>'})
    rollout = make_rollout(
        run,
        make_task(run),
        calls=[{}],
        items=[
            (0, user_with_images(png(40, 30)), {}),
            (0, call("c1", "crop", args), {}),
            (0, call("c2", "ls", "{}"), {}),
        ],
    )
    html = signed_in.get(reverse("rollout", args=[run.pk, rollout.pk])).content.decode()
    assert html.count("data-boxes=") == 1
    assert 'data-boxes="[{&quot;x1&quot;: 4.0, &quot;y1&quot;: 3.0, &quot;x2&quot;: 20.0' in html
    assert "<script>x" not in html
