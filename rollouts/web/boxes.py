"""Bounding boxes a tool call's arguments carry, in the forms agents write them, for drawing over
the image the agent last saw. Pure functions; no Django here.

Known forms, under a key named ``bbox``, ``box``, ``bounding_box``, ``boxes``, ``bboxes``,
``region`` or ``coordinates`` (one box, or a list of boxes):
- an object ``{"x", "y", "w"|"width", "h"|"height"}`` or ``{"x1", "y1", "x2", "y2"}``
  (also ``left/top/right/bottom``), optionally with a ``label``;
- a list of four numbers: ``[x1, y1, x2, y2]`` (``[x, y, w, h]`` when the key ends in ``xywh``,
  or when x2 <= x1 or y2 <= y1 could only be a width and height).
Numbers all within [0, 1] are normalised (fractions of the image's width and height); otherwise
pixels.
"""

from __future__ import annotations

import json
from typing import Any

BOX_KEYS = ("bbox", "box", "bounding_box", "boxes", "bboxes", "region", "coordinates", "bbox_xywh", "xywh")
MAX_BOXES = 200


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _one(value: Any, xywh: bool) -> dict[str, Any] | None:
    label = ""
    if isinstance(value, dict):
        label = str(value.get("label") or value.get("name") or "")[:80]
        get = {k.lower(): _num(v) for k, v in value.items()}
        if all(get.get(k) is not None for k in ("x1", "y1", "x2", "y2")):
            x1, y1, x2, y2 = get["x1"], get["y1"], get["x2"], get["y2"]
        elif all(get.get(k) is not None for k in ("left", "top", "right", "bottom")):
            x1, y1, x2, y2 = get["left"], get["top"], get["right"], get["bottom"]
        else:
            x, y = get.get("x"), get.get("y")
            w = get.get("w") if get.get("w") is not None else get.get("width")
            h = get.get("h") if get.get("h") is not None else get.get("height")
            if x is None or y is None or w is None or h is None:
                inner = value.get("bbox") or value.get("box")
                return {**found, "label": label or found["label"]} if (found := _one(inner, xywh)) else None
            x1, y1, x2, y2 = x, y, x + w, y + h
    elif isinstance(value, list) and len(value) == 4 and all(_num(v) is not None for v in value):
        a, b, c, d = (float(v) for v in value)
        if xywh or c <= a or d <= b:
            x1, y1, x2, y2 = a, b, a + c, b + d
        else:
            x1, y1, x2, y2 = a, b, c, d
    else:
        return None
    assert x1 is not None and y1 is not None and x2 is not None and y2 is not None
    if x2 <= x1 or y2 <= y1 or min(x1, y1) < 0:
        return None
    return {"x1": x1, "y1": y1, "x2": x2, "y2": y2, "label": label}


def boxes_in(arguments: Any) -> list[dict[str, Any]]:
    """The boxes in a call's arguments (a JSON string or an object): ``[{"x1", "y1", "x2", "y2",
    "label", "norm"}]`` in the image's pixels, or fractions of it when ``norm`` is True; ``[]``
    when the arguments carry none in a known form."""
    if isinstance(arguments, str):
        if len(arguments) > 1_000_000:
            return []
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return []
    if not isinstance(arguments, dict):
        return []
    out: list[dict[str, Any]] = []
    for key, value in arguments.items():
        name = str(key).lower()
        if name not in BOX_KEYS:
            continue
        xywh = name.endswith("xywh")
        many = value if isinstance(value, list) and value and isinstance(value[0], (list, dict)) else [value]
        for item in many[:MAX_BOXES]:
            box = _one(item, xywh)
            if box is not None:
                out.append(box)
    if out:
        norm = all(max(b["x2"], b["y2"]) <= 1.0 for b in out)
        for b in out:
            b["norm"] = norm
    return out
