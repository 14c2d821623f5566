"""Trajectory pages and import: one rollout's timeline, its raw output row, and the import form.

Everything in a trajectory is untrusted text (agents and envs write it): templates only ever
autoescape it; nothing here marks data safe.

The run page links to a rollout with its filter querystring (``status``, ``kind``, ``reward_min``,
``reward_max``, ``task``, ``sort``); ``neighbours`` turns that querystring into the run page's own
SQL filter and order (``forms.filtered_rollouts``) so previous/next walk the list the user was
looking at. Unknown parameters and unusable values are ignored.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, F, Max, OrderBy, Q, QuerySet, Window
from django.db.models.functions import Lag, Lead, RowNumber
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from rollouts.collection import export
from rollouts.collection.datasets import DatasetError
from rollouts.collection.importer import LooksLikeDatasetError, WrongFileError, import_shards
from rollouts.evaluation import health
from rollouts.lossless import dumps
from rollouts.models import AgentCall, RefusedReply, Rollout, Run, TrajectoryItem
from rollouts.review.query import FILTER_FIELDS, filtered_rollouts
from rollouts.templatetags.gymweb_tags import ms, pretty_json_text
from rollouts.web import rendering
from rollouts.web.archive_views import archived_rollout_response
from rollouts.web.evaluation_views import rollout_findings
from rollouts.web.forms import MultipleFileField
from rollouts.web.outline import fold_summary as item_summary
from rollouts.web.outline import outline
from rollouts.web.refused import refused_data, refused_view
from rollouts.web.review_views import review_context
from rollouts.web.uploads import too_large_uploads, upload_limit_message
from rollouts.web.verdict import verdict_view

# -- the run page's filter, in SQL ---------------------------------------------------------------
# The run page's own reader of its querystring (``forms.filtered_rollouts``) decides the list, so
# previous/next walk exactly the rows the user saw; invalid values are ignored there.
FILTER_PARAMS = FILTER_FIELDS


def filter_querystring(params: Mapping[str, Any]) -> str:
    """The run-page filter part of a querystring (known parameters with values only; anything
    else dropped), ``""`` when there is none; safe to append after ``?``."""
    pairs: list[tuple[str, Any]] = []
    getlist = getattr(params, "getlist", None)
    for name in FILTER_PARAMS:
        values = getlist(name) if getlist else ([params[name]] if name in params else [])
        pairs.extend((name, v) for v in values[:1] if str(v).strip())
    return urlencode(pairs)


def filter_rollouts(run: Run, params: Mapping[str, Any]) -> QuerySet:
    """The run's rollouts filtered and sorted like the run page does for querystring ``params``
    (unknown parameters and invalid values ignored)."""
    qs, _form = filtered_rollouts(run, params)
    return qs


def _after(order: list[str], values: dict[str, Any], forward: bool) -> Q:
    """Rows strictly after (or before) ``values`` in ``order`` (keyset comparison, no NULLs)."""
    result, equal = Q(), Q()
    for key in order:
        field = key.lstrip("-")
        ascending = not key.startswith("-")
        op = "gt" if ascending == forward else "lt"
        result |= equal & Q(**{f"{field}__{op}": values[field]})
        equal &= Q(**{field: values[field]})
    return result


def _order_key(term: Any) -> str:
    """An order_by term (``"-reward"``, ``F("reward")``, ``F("reward").desc()``) as ``"-reward"``."""
    if isinstance(term, str):
        return term
    if isinstance(term, OrderBy):
        return ("-" if term.descending else "") + term.expression.name
    return term.name


def neighbours(rollout: Rollout, params: Mapping[str, Any]) -> dict[str, Any]:
    """Previous/next rollout ids of ``rollout`` in its run's filtered, sorted list, its 1-based
    position and the list's length. ``position`` is None when the rollout is not in the list.

    Keyset queries on the run's indexes (a handful of small queries), so a run of 50,000 rollouts
    costs what a run of 50 does; a window-function query over the whole list is the fallback when
    a sort key of this rollout is NULL (keyset comparisons cannot order NULLs).
    """
    qs = filter_rollouts(rollout.run, params)
    order = [_order_key(o) for o in (qs.query.order_by or ["task_index", "rollout_index", "attempt", "id"])]
    if not any(o.lstrip("-") == "id" for o in order):
        order.append("id")
    values = {o.lstrip("-"): getattr(rollout, o.lstrip("-")) for o in order}
    if any(v is None for v in values.values()):
        return _neighbours_by_window(qs, list(qs.query.order_by) or order, rollout.pk)
    counts = qs.order_by().aggregate(
        total=Count("id"),
        here=Count("id", filter=Q(pk=rollout.pk)),
        before=Count("id", filter=_after(order, values, False)),
    )
    if not counts["here"]:
        return {"prev_id": None, "next_id": None, "position": None, "total": counts["total"]}
    reverse_order = [o[1:] if o.startswith("-") else f"-{o}" for o in order]
    next_id = qs.filter(_after(order, values, True)).order_by(*order).values_list("id", flat=True).first()
    prev_id = qs.filter(_after(order, values, False)).order_by(*reverse_order).values_list("id", flat=True).first()
    return {"prev_id": prev_id, "next_id": next_id, "position": counts["before"] + 1, "total": counts["total"]}


def _neighbours_by_window(qs: QuerySet, order: list[str], rollout_id: int) -> dict[str, Any]:
    row = (
        qs.order_by()
        .annotate(
            prev_id=Window(Lag("id"), order_by=order),
            next_id=Window(Lead("id"), order_by=order),
            position=Window(RowNumber(), order_by=order),
            total=Window(Count("id")),
            # A filter on a plain column would apply before the windows are computed; this
            # window (equal to id) makes Django filter the windowed rows instead.
            this_id=Window(Max("id"), partition_by=[F("id")]),
        )
        .filter(this_id=rollout_id)
        .values("prev_id", "next_id", "position", "total")
        .first()
    )
    if row is None:
        return {"prev_id": None, "next_id": None, "position": None, "total": None}
    return row


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


_more_text = rendering.more_text
_Budget = rendering.Budget


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
                    view["badges"].append(_badge("plain", ms(latency_ms), "tool call latency"))
        elif origin == TrajectoryItem.Origin.AGENT:
            view["badges"].append(_badge("paired", "agent's own tool record", "the reply carried this output itself"))
        elif view["imported"] and not paired:
            view["badges"].append(_badge("unpaired", "orphan output", "no earlier function_call with this call_id"))
    return view


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
    note = f"… {hidden:,} more item{'' if hidden == 1 else 's'} of this step not shown{f' ({span})' if span else ''}, at most {max_items:,} per step"
    return head, tail, note


def _task_input(
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


def _verify_view(
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
        text, cut = _Budget(max_chars).clip(verify_json)
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


def _verdict(rollout: Rollout, imported: bool, payloads: list[tuple[int, Any]]) -> dict[str, Any] | None:
    """The verdict panel (``verdict.verdict_view``) of a succeeded attempt; None without a verify
    reply the env added anything to."""
    try:
        verify_data = json.loads(rollout.verify_json) if rollout.verify_json else None
        task_row = json.loads(rollout.task.row_json)
    except ValueError:
        return None
    return verdict_view(verify_data, task_row, imported=imported, items=payloads, max_chars=display_max_chars())


def item_url_base(rollout: Rollout) -> str:
    """The item endpoint's URL for ``rollout`` without the item's key (``…/items/``)."""
    return reverse("rollout_item", args=[rollout.run_id, rollout.pk, "input"])[: -len("input/")]


def _timeline(rollout: Rollout, prefix: str = "", payloads: list | None = None) -> tuple[list[dict[str, Any]], int]:
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
        step["items"], step["tail"], step["hidden"] = _cap_items(step["items"], max_items)
        details = step["call"].incomplete_details if step["call"] is not None else None
        step["incomplete"] = _short(_json_text(details)[0], 500) if details else ""
    return [steps[k] for k in sorted(steps)], count


ACTIVE_STATUSES = (Rollout.Status.PENDING, Rollout.Status.RUNNING)


def _attempt_views(rollout: Rollout) -> list[dict[str, Any]]:
    """Every row of ``rollout``'s key in order, numbered ``#1``, ``#2``… by position: a cancelled or
    interrupted row does not count as an attempt (the next one keeps its ``attempt`` number), so
    the stored number alone would show two ``#1``. ``label`` is the position,
    ``counted`` False for kill-shaped rows."""
    rows = list(
        Rollout.objects.filter(
            run_id=rollout.run_id, task_index=rollout.task_index, rollout_index=rollout.rollout_index
        )
        .order_by("attempt", "id")
        .values("id", "attempt", "status", "reward", "failure_kind", "terminal")
    )
    for n, row in enumerate(rows, 1):
        row["label"] = f"#{n}"
        row["counted"] = row["status"] not in Rollout.KILL_SHAPED
    return rows


def _live_counts(rollout: Rollout, steps: list[dict[str, Any]], num_items: int) -> dict[str, int]:
    """The header's counts: a running attempt's stored rows (its row's counters are written when
    it ends), a finished one's own counters."""
    if rollout.status in ACTIVE_STATUSES:
        views = [v for s in steps for v in s["items"] + s["tail"]]
        return {
            "calls": sum(1 for s in steps if s["call"] is not None),
            "items": num_items,
            "tools": sum(
                1
                for v in views
                if v.get("origin") == TrajectoryItem.Origin.GYM and v.get("template", "").endswith("output.html")
            ),
        }
    return {"calls": rollout.num_agent_calls, "items": num_items, "tools": rollout.num_tool_calls}


def _trajectory_context(request, rollout: Rollout) -> dict[str, Any]:
    """What the trajectory page and its live tail (``rollout_live``) render: the timeline, its
    outline, the header's counts, the failure and verify panels, health findings."""
    run = rollout.run
    imported = run.status == Run.Status.IMPORTED
    payloads: list[tuple[int, Any]] = []
    steps, num_items = _timeline(rollout, payloads=payloads)
    context = {
        "run": run,
        "rollout": rollout,
        "imported": imported,
        "steps": steps,
        "num_items": num_items,
        "counts": _live_counts(rollout, steps, num_items),
        "outline": outline(steps, imported=imported, started=None),
        "live": rollout.status in ACTIVE_STATUSES and not imported,
        "verify": _verify_view(rollout.verify_json, item_url_base(rollout))
        if rollout.status == Rollout.Status.SUCCEEDED
        else None,
        "verdict": _verdict(rollout, imported, payloads) if rollout.status == Rollout.Status.SUCCEEDED else None,
        "raw_url": reverse("rollout_raw", args=[run.pk, rollout.pk]),
        "live_url": reverse("rollout_live", args=[run.pk, rollout.pk]),
        "kill_shaped": rollout.status in Rollout.KILL_SHAPED,
    }
    context["live_seen"] = _live_signature(rollout.status, num_items, sum(1 for s in steps if s["call"] is not None))
    context["error_text"], context["error_cut"] = _Budget(display_max_chars()).clip(rollout.error or "")
    refused = RefusedReply.objects.filter(rollout=rollout).first() if rollout.status == Rollout.Status.FAILED else None
    context["refused"] = refused_view(refused, display_max_chars())
    context.update(rollout_findings(rollout, steps))  # health findings, each on its step
    return context


def _live_signature(status: str, items: int, calls: int) -> str:
    """What a live tail last showed: changes with every stored item or agent call and with the status."""
    return f"{status}.{items}.{calls}"


@login_required
def rollout_detail(request, run_id, rollout_id):
    """One rollout's trajectory: outline, foldable steps and items, search (``?q=``, client side),
    and while the attempt runs, a tail that polls ``rollout_live`` for new steps."""
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id, run_id=run_id)
    run = rollout.run
    if run.is_archived:
        return archived_rollout_response(request, rollout)
    try:
        task_row = json.loads(rollout.task.row_json)
    except ValueError:
        task_row = {}
    context = _trajectory_context(request, rollout)
    steps = context["steps"]
    qs = filter_querystring(request.GET)
    nav = neighbours(rollout, request.GET)
    suffix = f"?{qs}" if qs else ""
    # j/k keep the in-page search, so the next rollout opens with its hits highlighted too
    search_q = request.GET.get("q", "")[:500]
    nav_qs = "&".join(p for p in (qs, urlencode({"q": search_q}) if search_q else "") if p)
    nav_suffix = f"?{nav_qs}" if nav_qs else ""
    context.update(
        {
            "task_input": _task_input(task_row, item_url_base(rollout)),
            "tools": [
                t.get("name")
                for t in (task_row.get("responses_create_params") or {}).get("tools") or []
                if isinstance(t, dict)
            ],
            # every step but the last is fixed; the last one (the tail) is re-read while the attempt runs
            "head_steps": steps[:-1] if context["live"] else steps,
            "tail_steps": steps[-1:] if context["live"] else [],
            "tail_from": steps[-1]["index"] if steps else 0,
            "attempts": _attempt_views(rollout),
            "nav": nav,
            "filter_qs": qs,
            "search_q": search_q,
            "run_url": reverse("run", args=[run.pk]) + suffix,
            "prev_url": reverse("rollout", args=[run.pk, nav["prev_id"]]) + nav_suffix if nav["prev_id"] else "",
            "next_url": reverse("rollout", args=[run.pk, nav["next_id"]]) + nav_suffix if nav["next_id"] else "",
        }
    )
    context.update(review_context(request, rollout, nav=nav))  # labels, notes, review mode
    return render(request, "rollouts/rollout_detail.html", context)


@login_required
@require_safe
@never_cache
def rollout_live(request, run_id, rollout_id):
    """The live tail of a running attempt's page (polled every 2 s by the page): the steps from
    ``?from=N`` on (the step the page last showed as its tail, re-read whole: its tool outputs may
    have arrived), a new tail element that polls from the newest step, and out-of-band the header
    counts, the outline and, once the attempt is final, its failure and verify panels. The tail of
    a final attempt carries no trigger, so polling stops."""
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id, run_id=run_id)
    if rollout.run.is_archived:
        return archived_rollout_response(request, rollout, page=False)
    try:
        start = max(0, int(request.GET.get("from", "0")))
    except ValueError:
        start = 0
    seen = request.GET.get("seen")
    if seen and seen == _live_signature(
        rollout.status,
        TrajectoryItem.objects.filter(rollout=rollout).count(),
        AgentCall.objects.filter(rollout=rollout).count(),
    ):
        return HttpResponse(status=204)  # nothing new: htmx swaps nothing and the tail polls on
    context = _trajectory_context(request, rollout)
    steps = [s for s in context["steps"] if s["index"] >= start]
    context.update(
        {
            "head_steps": steps[:-1] if context["live"] else steps,
            "tail_steps": steps[-1:] if context["live"] else [],
            "tail_from": steps[-1]["index"] if steps else start,
            "oob": True,
        }
    )
    return render(request, "rollouts/partials/rollout_live.html", context)


_ITEM_KEY_RE = re.compile(r"^(?:\d{1,9}|input-\d{1,9}|instructions|verify)$")


@login_required
@require_safe
def rollout_item(request, run_id, rollout_id, key):
    """One item's body for the trajectory page, loaded in place by HTMX (``request.htmx``: the
    ``item_body.html`` partial alone; otherwise a page with the item, the links' fallback).

    ``key``: the item's seq (``#N``), ``input-K`` (the K-th task input item), ``instructions``,
    or ``verify`` (the verify panel). ``?full=1``: the whole text, without the display limit
    (texts over ``rendering.RICH_MAX_CHARS`` as plain text); ``?view=plain``: texts and JSON as
    they came. 404 for a rollout not of this run, an item it does not have, an unknown key, and
    ``verify`` of an attempt that did not succeed."""
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id, run_id=run_id)
    if rollout.run.is_archived:
        return archived_rollout_response(request, rollout, page=False)
    if not _ITEM_KEY_RE.match(key):
        raise Http404("no such item")
    plain = request.GET.get("view") == "plain"
    full = request.GET.get("full") == "1"
    max_chars = sys.maxsize if full else display_max_chars()
    item_url = item_url_base(rollout)
    raw_url = reverse("rollout_raw", args=[rollout.run_id, rollout.pk])
    context: dict[str, Any] = {
        "run": rollout.run,
        "rollout": rollout,
        "raw_url": raw_url,
        "rollout_url": reverse("rollout", args=[rollout.run_id, rollout.pk]),
    }
    if key == "verify":
        if rollout.status != Rollout.Status.SUCCEEDED:
            raise Http404("only a succeeded attempt has a verify result")
        context["verify"] = _verify_view(rollout.verify_json, item_url, max_chars, full)
        if context["verify"] is None:
            raise Http404("no verify result")
        if request.htmx:
            return render(request, "rollouts/partials/rollout_verify.html", context)
        return render(request, "rollouts/rollout_item.html", context)
    if key == "instructions" or key.startswith("input-"):
        try:
            task_row = json.loads(rollout.task.row_json)
        except ValueError:
            task_row = {}
        views = _task_input(task_row if isinstance(task_row, dict) else {}, item_url, max_chars, plain, full)
        view = next((v for v in views if v.get("key") == key), None)
    else:
        row = (
            TrajectoryItem.objects.filter(rollout=rollout, seq=int(key))
            .values("seq", "origin", "asked", "paired", "refused", "latency_ms", "tool_status", "payload")
            .first()
        )
        view = (
            None
            if row is None
            else item_view(
                row["payload"],
                seq=row["seq"],
                origin=row["origin"],
                asked=row["asked"],
                paired=row["paired"],
                refused=row["refused"],
                latency_ms=row["latency_ms"],
                tool_status=row["tool_status"],
                max_chars=max_chars,
                item_url=item_url,
                plain=plain,
                full=full,
            )
        )
    if view is None:
        raise Http404("this attempt has no such item")
    context["item"] = view
    if request.htmx:
        return render(request, "rollouts/partials/item_body.html", context)
    return render(request, "rollouts/rollout_item.html", context)


def raw_row(rollout: Rollout) -> dict[str, Any] | None:
    """The output-file row of an attempt, built exactly as the exports build it: a success's
    ``rollouts.jsonl`` row, a failure's sidecar row (an imported line kept as it came, as it came);
    None for attempts written to no file."""
    if rollout.source_text and rollout.status in (Rollout.Status.SUCCEEDED, Rollout.Status.FAILED):
        return json.loads(rollout.source_text)
    task_row = json.loads(rollout.task.row_json)
    stamp = export.stamps_rows(rollout.run)
    if rollout.status == Rollout.Status.SUCCEEDED:
        agent_ref = task_row.get("agent_ref") or {"name": rollout.run.agent_name}
        return export.success_row(rollout.verify_json, rollout.task_index, rollout.rollout_index, agent_ref, stamp)
    if rollout.status == Rollout.Status.FAILED:
        return export.failure_row(task_row, rollout.rollout_index, rollout.error, rollout.terminal, stamp)
    return None


@login_required
def rollout_raw(request, run_id, rollout_id):
    """The attempt's output-file row (``raw_row``) as JSON. ``?item=N`` gives trajectory item N
    whole instead, ``?item=input`` the task's materialised row (what the trajectory page links
    to when it cuts a long text), for attempts of any status, and ``?item=refused`` the agent reply
    gymweb refused (``refused.refused_data``; 404 when there is none)."""
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id, run_id=run_id)
    if rollout.run.is_archived:
        return archived_rollout_response(request, rollout, page=False)
    which = request.GET.get("item")
    if which is not None:
        return _raw_item(rollout, which)
    row = raw_row(rollout)
    if row is None:
        body = {"error": f"this attempt is {rollout.status}: it is written to no output file, so it has no row"}
        return _json_response(body, status=404)
    return _json_response(row)


def _json_response(body: Any, status: int = 200) -> HttpResponse:
    """``body`` as indented JSON (non-ASCII kept, U+0000 escaped as JSON escapes it); compact when
    it nests deeper than the indenting encoder can go."""
    try:
        text = json.dumps(body, indent=2, ensure_ascii=False)
    except RecursionError:
        text = dumps(body)
    return HttpResponse(text, status=status, content_type="application/json; charset=utf-8")


def _raw_item(rollout: Rollout, which: str) -> HttpResponse:
    if which == "refused":
        data = refused_data(RefusedReply.objects.filter(rollout=rollout).first())
        if data is None:
            return _json_response({"error": "gymweb refused no agent reply in this attempt"}, status=404)
        return _json_response(data)
    if which == "input":
        try:
            return _json_response(json.loads(rollout.task.row_json))
        except ValueError:
            return HttpResponse(rollout.task.row_json, content_type="text/plain; charset=utf-8")
    try:
        seq = int(which)
    except ValueError:
        return _json_response({"error": "item must be an item number (#N on the page) or 'input'"}, status=404)
    row = TrajectoryItem.objects.filter(rollout=rollout, seq=seq).values("seq", "step", "origin", "payload").first()
    if row is None:
        return _json_response({"error": f"this attempt has no item #{seq}"}, status=404)
    return _json_response(row["payload"])


# -- import ------------------------------------------------------------------------------------
class ImportForm(forms.Form):
    rollouts = MultipleFileField(
        label="rollouts.jsonl",
        required=False,
        help_text="NeMo Gym's (or gymweb's) rollouts.jsonl: one result row per line (optional when a failures sidecar "
        "is given). Several files = shards of one run (gym eval aggregate's shards), imported as one run.",
        allow_empty_file=True,  # one empty shard among others is fine; no rows at all is the importer's error
    )
    failures = MultipleFileField(
        label="failures sidecars",
        required=False,
        help_text="optional: the rollouts_failures.jsonl of each file above (one failed attempt per line)",
        allow_empty_file=True,  # NeMo Gym writes an empty sidecar when nothing failed
    )
    materialized = MultipleFileField(
        label="materialised inputs",
        required=False,
        help_text="optional: the rollouts_materialized_inputs.jsonl beside them (the task rows, with the task fields "
        "NeMo Gym's envs leave out of their results; needed to re-verify the run)",
    )
    name = forms.CharField(max_length=200, required=False, help_text="default: the file names")

    def __init__(self, *args, too_large_uploads: set | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.too_large_uploads = too_large_uploads or set()

    def clean(self):
        data = super().clean()
        limit = int(settings.GYMWEB_MAX_UPLOAD_BYTES)
        for field in ("rollouts", "failures", "materialized"):
            uploads = data.get(field) or []
            too_large = [u.name for u in uploads if u.size > limit]
            if field in self.too_large_uploads or too_large:
                if field in self.errors:  # e.g. "required": the handler dropped the file, say why instead
                    del self.errors[field]
                message = upload_limit_message(limit)
                self.add_error(field, f"{', '.join(too_large)}: {message}" if too_large else message)
        if not self.errors and not data.get("rollouts") and not data.get("failures"):
            self.add_error("rollouts", "Choose a rollouts.jsonl, a failures sidecar, or both.")
        return data


def _upload_sources(uploads, fallback: str, taken: set) -> list[tuple[Any, str]]:
    """``(upload, name for error messages)`` of each upload; a name already used gets a suffix, so
    an error always points at one file."""
    named = []
    for n, upload in enumerate(uploads, 1):
        base = upload.name or (fallback if len(uploads) == 1 else f"{fallback} #{n}")
        source = base
        if source in taken:  # two "rollouts.jsonl" from different folders: say which by position
            source = f"{base} (file {n} of the {fallback} files)" if len(uploads) > 1 else f"{base} (the {fallback})"
        while source in taken:
            source = f"{source}'"
        taken.add(source)
        named.append((upload, source))
    return named


def _dataset_offer(upload, user) -> dict[str, Any]:
    """A rollouts upload that is a dataset: keep it as a dataset (an identical earlier upload is
    reused) and offer the new-run form with it chosen. ``{"dataset": Dataset, "url": ...}``, or
    ``{"error": why}`` when it is not a usable dataset either."""
    from pathlib import PurePath

    from rollouts.collection import runs
    from rollouts.collection.datasets import read_jsonl

    try:
        upload.seek(0)
        parsed = read_jsonl(upload, source=upload.name, max_line_bytes=int(settings.GYMWEB_MAX_LINE_BYTES))
    except DatasetError as exc:
        return {"error": str(exc)}
    dataset, reused = runs.store_or_reuse_dataset(parsed, PurePath(upload.name or "dataset.jsonl").name, user)
    return {"dataset": dataset, "reused": reused, "url": reverse("run_new") + f"?dataset={dataset.pk}"}


@login_required
def import_rollouts(request):
    """The import page: one ``rollouts.jsonl`` (and its sidecar, or the sidecar alone, and optionally
    its materialised inputs), or several shards of one run with their sidecars, into one new
    imported run (``importer.import_shards``)."""
    offer = None
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES, too_large_uploads=too_large_uploads(request))
        if form.is_valid():
            taken: set = set()
            shards = _upload_sources(form.cleaned_data.get("rollouts") or [], "rollouts.jsonl", taken)
            sidecars = _upload_sources(form.cleaned_data.get("failures") or [], "failures sidecar", taken)
            inputs = _upload_sources(form.cleaned_data.get("materialized") or [], "materialised inputs", taken)
            sidecar_sources = {src for _, src in sidecars}
            input_sources = {src for _, src in inputs}
            try:
                summary = import_shards(
                    shards, sidecars, inputs, name=form.cleaned_data.get("name") or "", user=request.user
                )
            except LooksLikeDatasetError as exc:
                form.add_error("rollouts", str(exc))
                if len(shards) == 1:
                    offer = _dataset_offer(shards[0][0], request.user)
            except WrongFileError as exc:
                form.add_error(
                    None if exc.swapped else ("failures" if exc.source in sidecar_sources else "rollouts"), str(exc)
                )
            except DatasetError as exc:
                field = (
                    "failures"
                    if exc.source in sidecar_sources
                    else "materialized"
                    if exc.source in input_sources
                    else "rollouts"
                )
                form.add_error(field, str(exc))
            else:
                parts = [f"{summary.succeeded} succeeded", f"{summary.failed} failed"]
                if summary.not_run:
                    parts.append(f"{summary.not_run} never run (rows without a result)")
                files = f" from {len(shards)} shards" if len(shards) > 1 else ""
                messages.success(
                    request, f"Imported {summary.rows} rollout(s){files} into “{summary.run.name}”: {', '.join(parts)}."
                )
                health.auto_check(summary.run)  # the verdicts show on the run page
                return redirect(reverse("run", args=[summary.run.pk]))
    else:
        form = ImportForm()
    return render(request, "rollouts/import.html", {"form": form, "offer": offer}, status=400 if form.errors else 200)
