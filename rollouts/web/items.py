"""The trajectory's item view models: one item as a dict for its partial (``item_view``), the task
input, the verify panel, and a rollout's timeline of steps, with the display limits applied.

Everything in a trajectory is untrusted text (agents and envs write it): item bodies come from
``rendering`` (which sanitises), templates autoescape the rest; nothing here marks data safe.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.urls import reverse

from rollouts.display import duration_ms
from rollouts.models import AgentCall, Rollout, TrajectoryItem
from rollouts.templatetags.gymweb_tags import pretty_json_text
from rollouts.web import rendering
from rollouts.web.boxes import boxes_in
from rollouts.web.markup import Budget
from rollouts.web.outline import GROUP_FOLD_ITEMS, GROUP_MIN_ITEMS, message_gist, output_failure, step_gist, sub_groups
from rollouts.web.outline import fold_summary as item_summary

# -- display limits -------------------------------------------------------------------------------
# One agent can write a 30 MB message or 5,000 tool calls in one reply: the page shows at most
# ``GYMWEB_DISPLAY_MAX_CHARS`` characters of each item's text (a note links to the item's raw JSON)
# and at most ``GYMWEB_DISPLAY_MAX_ITEMS_PER_STEP`` items of a step (defaults: gymweb/conf.py).
# Pretty-printing millions of small JSON values is slow (the indenting encoder is pure Python):
# longer JSON is shown as it came (compact), cut like any other text.
PRETTY_MAX_CHARS = 1_000_000
SHORT_MAX_CHARS = 300  # names, call ids, roles, labels


def display_max_chars() -> int:
    return max(1, int(settings.GYMWEB_DISPLAY_MAX_CHARS))


def display_max_items() -> int:
    return max(1, int(settings.GYMWEB_DISPLAY_MAX_ITEMS_PER_STEP))


def _short(value: Any, limit: int = SHORT_MAX_CHARS) -> str:
    """A name, call id or label for display, at most ``limit`` characters."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json_text(value: Any) -> tuple[str, bool]:
    """``pretty_json_text``, except that JSON longer than ``PRETTY_MAX_CHARS`` comes back compact
    (as it came, for a string) instead of being pretty-printed."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        if len(value) <= PRETTY_MAX_CHARS:
            return pretty_json_text(value)
        try:
            json.loads(value)
        except ValueError:
            return value, False
        return value, True
    try:
        compact = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value), False
    return (compact, True) if len(compact) > PRETTY_MAX_CHARS else pretty_json_text(value)


def _badge(cls: str, text: str, title: str = "") -> dict[str, str]:
    return {"cls": cls, "text": text, "title": title}


_TOGGLE_LABELS = {"message": "plain text"}


def item_view(
    payload: Any,
    *,
    seq: int | None = None,
    origin: str = "",
    asked: bool = False,
    paired: bool = False,
    refused: bool = False,
    latency_ms: float | None = None,
    tool_status: int | None = None,
    call_names: dict[str, str] | None = None,
    max_chars: int | None = None,
    key: str = "",
    item_url: str = "",
    plain: bool = False,
    full: bool = False,
    prefix: str = "",
) -> dict[str, Any]:
    """One item (a reply item, a gym output or a task input item) as a dict for its partial.

    Display strings (``seq``, badges, latency) are computed here rather than in the template: a
    500-item trajectory must render fast, and Python is much cheaper than template logic. The
    body is rendered by content (``rendering.item_body``: Markdown, folded thinking, argument
    fields, diffs, JSON trees), at most ``max_chars`` characters of the item's texts
    (``GYMWEB_DISPLAY_MAX_CHARS``). ``key`` names the item for the item endpoint (its seq, or
    ``input-K`` for the K-th task input item) and ``item_url`` is that endpoint's URL without the
    key: a cut body gets a "show all N characters" link that loads the whole body in place (no
    ``item_url``: a link to the item's raw JSON). ``plain`` renders texts and JSON as they came;
    ``full`` marks a body rendered without the display limit; ``prefix`` is the page's id prefix
    (the compare page shows two trajectories)."""
    item = payload if isinstance(payload, dict) else {"type": None, "value": payload}
    kind = item.get("type")
    if kind is None and "role" in item and "content" in item:
        kind = "message"  # EasyInputMessage: type is optional on input messages
    call_id = item.get("call_id") if isinstance(item.get("call_id"), str) else ""
    key = key or ("input" if seq is None else str(seq))
    view: dict[str, Any] = {
        "seq": "" if seq is None else str(seq),
        "n": seq,
        "key": key,
        "raw_q": "item=input" if seq is None else f"item={seq}",
        "kind": _short(kind) if isinstance(kind, str) else "",
        "origin": origin,
        "asked": asked,
        "paired": paired,
        "refused": refused,
        "call_id": _short(call_id),
        "name": _short(item.get("name") or ""),
        "badges": [],
        "imported": origin == TrajectoryItem.Origin.IMPORTED,
    }
    render_kind = kind if kind in ("message", "reasoning", "function_call", "function_call_output") else "generic"
    body = rendering.item_body(item, render_kind, max_chars=max_chars or display_max_chars(), plain=plain)
    view["body"], view["notes"], view["cut"] = body.html, body.notes, body.cut
    view["total"] = f"{body.total:,}"
    view["template"] = f"rollouts/partials/item_{render_kind}.html"
    _body_links(view, render_kind, body, item_url, plain, full, prefix)
    if kind == "message":
        role = str(item.get("role") or "")
        view["role"] = _short(role)
        view["role_cls"] = role if role in ("assistant", "user", "system", "developer", "instructions") else "other"
    elif kind == "function_call":
        args = item.get("arguments")
        boxes = boxes_in(args) if isinstance(args, (str, dict)) and _may_hold_boxes(args) else []
        view["boxes"] = json.dumps(boxes) if boxes else ""  # drawn over the last image before the call
        view["answered_by"] = None
        view["answer_refused"] = False
        view["unanswered"] = False
    elif kind == "function_call_output":
        view["name"] = _short((call_names or {}).get(call_id, ""))
        view["answers"] = ""
        if origin == TrajectoryItem.Origin.GYM:
            if refused:
                view["badges"].append(
                    _badge("failed", "refused · not sent", "gymweb did not send this call to the env")
                )
            else:
                view["badges"].append(_badge("gym", "run by gymweb", "gymweb executed this call against the env"))
                if tool_status is not None:
                    view["badges"].append(_badge("bad" if tool_status >= 400 else "plain", f"HTTP {tool_status}"))
                if latency_ms is not None:
                    view["badges"].append(_badge("plain", duration_ms(latency_ms), "tool call latency"))
        elif origin == TrajectoryItem.Origin.AGENT:
            view["badges"].append(_badge("paired", "agent's own tool record", "the reply carried this output itself"))
        elif view["imported"] and not paired:
            view["badges"].append(_badge("unpaired", "orphan output", "no earlier function_call with this call_id"))
    return view


def _may_hold_boxes(arguments: str | dict) -> bool:
    """A cheap test before parsing: do the arguments name a key a box may sit under?"""
    text = arguments if isinstance(arguments, str) else " ".join(map(str, arguments))
    return any(word in text[:100_000].lower() for word in ("box", "region", "coordinates", "xywh"))


def _body_links(
    view: dict[str, Any], kind: str, body: rendering.Body, item_url: str, plain: bool, full: bool, prefix: str
) -> None:
    """The links under an item's body: "show all N characters" (a cut body), the plain text /
    raw toggle (a body rendered by content), each an ``href`` to the item endpoint that HTMX
    loads into the page in place of the body."""
    view["body_id"] = f"{prefix}body-{view['key']}"
    view["show_all_href"] = view["toggle_href"] = ""
    view["toggle_label"] = ""
    if not item_url:
        return
    base = f"{item_url}{view['key']}/"
    extra = ""
    if body.cut:
        view["show_all_href"] = f"{base}?full=1{'&view=plain' if plain else ''}{extra}"
    if plain or kind == "message" or body.rich:
        view["toggle_label"] = "rendered" if plain else _TOGGLE_LABELS.get(kind, "raw")
        view["toggle_href"] = f"{base}?view={'rendered' if plain else 'plain'}{'&full=1' if full else ''}{extra}"


def _call_badges(view: dict[str, Any]) -> None:
    """Badges of a function_call, once we know whether an output answered it (and whether that
    output is gymweb's refusal: a call it never sent)."""
    answered = view["answered_by"]
    origin = view["origin"]
    if origin == "input":
        return
    if origin == TrajectoryItem.Origin.IMPORTED:
        if view["paired"]:
            where = f" at #{answered}" if answered is not None else ""
            view["badges"].append(
                _badge(
                    "paired",
                    f"answered{where}",
                    "an output with this call_id follows; an imported file does not record who ran it",
                )
            )
        else:
            view["unanswered"] = True
            view["badges"].append(
                _badge("unpaired", "never answered", "no function_call_output with this call_id in the trajectory")
            )
    elif view["asked"]:
        if view["answer_refused"]:
            view["badges"].append(
                _badge(
                    "failed",
                    "asked · refused, not sent",
                    "an unpaired call gymweb refused to send to the env (a tool name it may not call, "
                    "or arguments that are not JSON): its output says why",
                )
            )
        else:
            view["badges"].append(
                _badge("asked", "asked · run by gymweb", "an unpaired call: gymweb ran it against the env")
            )
        if answered is None:
            view["unanswered"] = True
            view["badges"].append(_badge("unpaired", "no output (the rollout stopped first)"))
    elif view["paired"]:
        view["badges"].append(
            _badge(
                "paired", "agent-internal (paired in the same reply)", "the reply carried its own output for this call"
            )
        )
    else:
        view["unanswered"] = answered is None
        view["badges"].append(
            _badge(
                "unpaired",
                "never answered" if answered is None else "not run",
                "a later ask with the same call_id replaced it, or it was never answered",
            )
        )


def _cap_items(views: list[dict[str, Any]], max_items: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """At most ``max_items`` of ``views``: ``(head, tail, note)``: the first ones, the last few (a
    step usually ends with what matters) and a note on how many were left out between them."""
    if len(views) <= max_items:
        return views, [], ""
    tail_n = max(1, max_items // 10) if max_items > 1 else 0
    hidden = len(views) - max_items
    head = views[: max_items - tail_n]
    tail = views[len(views) - tail_n :] if tail_n else []
    left_out = views[len(head) : len(views) - len(tail)]
    span = f"#{left_out[0]['seq']}–#{left_out[-1]['seq']}" if left_out[0]["seq"] and left_out[-1]["seq"] else ""
    note = (
        f"… {hidden:,} more item{'' if hidden == 1 else 's'} of this step not shown"
        f"{f' ({span})' if span else ''}, at most {max_items:,} per step"
    )
    return head, tail, note


def task_input(
    task_row: dict[str, Any],
    item_url: str = "",
    max_chars: int | None = None,
    plain: bool = False,
    full: bool = False,
    prefix: str = "",
) -> list[dict[str, Any]]:
    """The task input's items as views: the instructions (key ``instructions``) then each input
    item (key ``input-K``), at most ``GYMWEB_DISPLAY_MAX_ITEMS_PER_STEP`` of them."""
    params = task_row.get("responses_create_params") or {}
    max_chars, max_items = max_chars or display_max_chars(), display_max_items()
    opts: dict[str, Any] = {
        "origin": "input",
        "max_chars": max_chars,
        "item_url": item_url,
        "plain": plain,
        "full": full,
        "prefix": prefix,
    }
    views = []
    instructions = params.get("instructions")
    if isinstance(instructions, str) and instructions:
        views.append(
            item_view({"type": "message", "role": "instructions", "content": instructions}, key="instructions", **opts)
        )
        views[-1]["summary"] = item_summary({"type": "message", "role": "instructions", "content": instructions})
    first = params.get("input")
    if isinstance(first, str):
        first = [{"type": "message", "role": "user", "content": first}]
    first = first if isinstance(first, list) else []
    call_names: dict[str, str] = {}
    for k, item in enumerate(first[:max_items]):
        if isinstance(item, dict) and item.get("type") == "function_call" and isinstance(item.get("call_id"), str):
            call_names[item["call_id"]] = str(item.get("name") or "")
        views.append(item_view(item, call_names=call_names, key=f"input-{k}", **opts))
        views[-1]["summary"] = item_summary(item)
    if len(first) > max_items:
        hidden = len(first) - max_items
        views.append(
            {
                "template": "rollouts/partials/item_note.html",
                "note": f"… {hidden:,} more input item{'' if hidden == 1 else 's'} not shown (at most {max_items:,})",
            }
        )
    return views


def verify_view(
    verify_json: str, item_url: str = "", max_chars: int | None = None, full: bool = False
) -> dict[str, Any] | None:
    """The verify panel: reward, the other numeric fields, reward components and the rest, each
    rendered by content (``rendering.value_body``: a diff such as SWE-bench's ``model_patch``,
    JSON trees, code) with at most ``GYMWEB_DISPLAY_MAX_CHARS`` characters of each; when any is
    cut, ``show_all_href`` loads the whole panel (``item_url`` + ``verify/``)."""
    if not verify_json:
        return None
    max_chars = max_chars or display_max_chars()
    show_all = f"{item_url}verify/?full=1" if item_url else ""
    try:
        data = json.loads(verify_json)
    except ValueError:
        text, cut = Budget(max_chars).clip(verify_json)
        return {
            "reward": None,
            "numbers": [],
            "components": None,
            "others": [],
            "invalid": text,
            "invalid_cut": cut,
            "show_all_href": show_all if cut else "",
        }
    if not isinstance(data, dict):
        return None
    numbers, others = [], []
    any_cut = False
    for key, value in data.items():
        if key in ("reward", "response", "responses_create_params", "reward_components") or key.startswith("_ng_"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers.append((_short(key), value))
        else:
            body = rendering.value_body(key, value, max_chars=max_chars)
            any_cut = any_cut or body.cut
            others.append((_short(key), body.html))
    components = data.get("reward_components")
    # (key, number or rendered body, numeric)
    if isinstance(components, dict):
        rows = []
        for k, v in components.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rows.append((_short(k), v, True))
            else:
                body = rendering.value_body(k, v, max_chars=max_chars)
                any_cut = any_cut or body.cut
                rows.append((_short(k), body.html, False))
        components = rows
    elif components is not None:
        body = rendering.value_body("reward_components", components, max_chars=max_chars)
        any_cut = any_cut or body.cut
        components = [("reward_components", body.html, False)]
    return {
        "reward": data.get("reward"),
        "numbers": numbers,
        "components": components,
        "others": others,
        "invalid": None,
        "show_all_href": show_all if any_cut else "",
        "full": full,
    }


def item_url_base(rollout: Rollout) -> str:
    """The item endpoint's URL for ``rollout`` without the item's key (``…/items/``)."""
    return reverse("rollout_item", args=[rollout.run_id, rollout.pk, "input"])[: -len("input/")]


def _mark_gist_and_failure(view: dict[str, Any], kind: str, payload: Any, tool_status: int | None) -> None:
    """A message's first line (``gist``); an output's failure (``failed``, and its badge)."""
    if kind == "message":
        view["gist"] = message_gist(payload)
    elif kind == "function_call_output":
        view["failed"] = output_failure(payload, tool_status)
        if view["failed"] and not view["failed"].startswith("HTTP"):  # the HTTP badge says it already
            view["badges"].append(_badge("bad", view["failed"], "the tool call failed"))


def _shape_step(step: dict[str, Any], max_items: int) -> None:
    """A step's summary (``gist``), its items capped (``items``, ``tail``, ``hidden``) and, for a
    long reply of several calls, its sub-groups (``groups``, ``tail_groups``, ``groups_open``)."""
    step["gist"] = step_gist(step["items"])
    step["items"], step["tail"], step["hidden"] = _cap_items(step["items"], max_items)
    calls = sum(1 for v in step["items"] if v["template"].endswith("_call.html"))
    if step["count"] > GROUP_MIN_ITEMS and calls > 1:
        step["groups"] = sub_groups(step["items"])
        step["tail_groups"] = sub_groups(step["tail"]) if step["tail"] else []
        step["groups_open"] = step["count"] <= GROUP_FOLD_ITEMS


def timeline(rollout: Rollout, prefix: str = "", payloads: list | None = None) -> tuple[list[dict[str, Any]], int]:
    """Steps in order: ``{"call": AgentCall|None, "index": n, "items": [view, ...], "tail": [view, ...],
    "hidden": note}``: at most ``GYMWEB_DISPLAY_MAX_ITEMS_PER_STEP`` items of a step are shown (its
    first ones and its last few; ``hidden`` says how many are left out between them). One query
    for the items and one for the agent calls. ``payloads``, when given, gets every item's
    ``(seq, payload)`` appended."""
    max_chars, max_items = display_max_chars(), display_max_items()
    item_url = item_url_base(rollout)
    calls = list(AgentCall.objects.filter(rollout=rollout).order_by("index"))
    rows = (
        TrajectoryItem.objects.filter(rollout=rollout)
        .order_by("seq")
        .values_list(
            "seq",
            "step",
            "kind",
            "call_id",
            "origin",
            "asked",
            "paired",
            "refused",
            "latency_ms",
            "tool_status",
            "payload",
        )
    )
    steps: dict[int, dict[str, Any]] = {}
    for c in calls:
        steps[c.index] = {"call": c, "index": c.index, "title": f"Step {c.index + 1}", "items": []}
    call_names: dict[str, str] = {}
    calls_by_id: dict[str, list[dict[str, Any]]] = {}
    call_views = []
    count = 0
    for seq, step, kind, call_id, origin, asked, paired, refused, latency_ms, tool_status, payload in rows:
        count += 1
        if payloads is not None:
            payloads.append((seq, payload))
        if kind == "function_call" and call_id and isinstance(payload, dict):
            call_names[call_id] = str(payload.get("name") or "")
        view = item_view(
            payload,
            seq=seq,
            origin=origin,
            asked=asked,
            paired=paired,
            refused=refused,
            latency_ms=latency_ms,
            tool_status=tool_status,
            call_names=call_names,
            max_chars=max_chars,
            item_url=item_url,
            prefix=prefix,
        )
        view["summary"] = item_summary(payload)  # the line a folded item shows
        _mark_gist_and_failure(view, kind, payload, tool_status)
        if origin == TrajectoryItem.Origin.GYM:  # the outline's tool time and failed outputs
            view["tool_status"], view["tool_latency_ms"] = tool_status, latency_ms
        if kind == "function_call":
            calls_by_id.setdefault(call_id, []).append(view)
            call_views.append(view)
        elif kind == "function_call_output" and call_id:
            for call_view in reversed(calls_by_id.get(call_id, ())):  # a repeated call_id: the last ask ran
                if call_view["answered_by"] is None:
                    call_view["answered_by"] = seq
                    # gymweb's own output saying it did not send the call (rules 5, 6)
                    call_view["answer_refused"] = bool(refused) and origin == TrajectoryItem.Origin.GYM
                    view["answers"] = str(call_view["n"])
                    break
        if step not in steps:
            steps[step] = {"call": None, "index": step, "title": f"Step {step + 1}", "items": []}
        steps[step]["items"].append(view)
    for view in call_views:
        _call_badges(view)
    for step in steps.values():
        step["count"] = len(step["items"])
        step["count_text"] = f"{step['count']:,} item{'' if step['count'] == 1 else 's'}"
        _shape_step(step, max_items)
        details = step["call"].incomplete_details if step["call"] is not None else None
        step["incomplete"] = _short(_json_text(details)[0], 500) if details else ""
    return [steps[k] for k in sorted(steps)], count
