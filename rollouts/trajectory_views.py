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
from typing import Any, Mapping, Optional
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, F, Max, OrderBy, Q, QuerySet, Window
from django.db.models.functions import Lag, Lead, RowNumber
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from . import export
from .datasets import DatasetError
from .forms import filtered_rollouts
from .importer import import_rollouts as run_import
from .models import AgentCall, Rollout, Run, TrajectoryItem
from .templatetags.gymweb_tags import ms, pretty_json_text

# -- the run page's filter, in SQL ---------------------------------------------------------------
# The run page's own reader of its querystring (``forms.filtered_rollouts``) decides the list, so
# previous/next walk exactly the rows the user saw; invalid values are ignored there.
FILTER_PARAMS = ("status", "kind", "reward_min", "reward_max", "task", "sort")


def filter_querystring(params: Mapping[str, Any]) -> str:
    """The run-page filter part of a querystring (known parameters with values only; anything
    else dropped), ``""`` when there is none; safe to append after ``?``."""
    pairs = []
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
        total=Count("id"), here=Count("id", filter=Q(pk=rollout.pk)), before=Count("id", filter=_after(order, values, False))
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


# -- view models of trajectory items ----------------------------------------------------------
def _content_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content as display parts: ``{"kind": "text"|"refusal"|"json", "text": ...}``."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"kind": "text", "label": "", "text": content}]
    if not isinstance(content, list):
        return [{"kind": "json", "label": "content", "text": pretty_json_text(content)[0]}]
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append({"kind": "text", "label": "", "text": part})
            continue
        if not isinstance(part, dict):
            parts.append({"kind": "json", "label": "", "text": pretty_json_text(part)[0]})
            continue
        ptype = part.get("type")
        if ptype == "refusal" or (ptype is None and isinstance(part.get("refusal"), str)):
            parts.append({"kind": "refusal", "label": "refusal", "text": str(part.get("refusal") or "")})
        elif isinstance(part.get("text"), str):
            label = "" if ptype in ("output_text", "input_text", "text", None) else str(ptype)
            parts.append({"kind": "text", "label": label, "text": part["text"]})
        else:
            parts.append({"kind": "json", "label": str(ptype or "part"), "text": pretty_json_text(part)[0]})
    return parts


def _badge(cls: str, text: str, title: str = "") -> dict[str, str]:
    return {"cls": cls, "text": text, "title": title}


def item_view(payload: Any, *, seq: Optional[int] = None, origin: str = "", asked: bool = False, paired: bool = False,
              refused: bool = False, latency_ms: Optional[float] = None, tool_status: Optional[int] = None,
              call_names: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """One item (a reply item, a gym output or a task input item) as a dict for its partial.

    Display strings (``seq``, badges, latency) are computed here rather than in the template: a
    500-item trajectory must render fast, and Python is much cheaper than template logic."""
    item = payload if isinstance(payload, dict) else {"type": None, "value": payload}
    kind = item.get("type")
    if kind is None and "role" in item and "content" in item:
        kind = "message"  # EasyInputMessage: type is optional on input messages
    call_id = item.get("call_id") if isinstance(item.get("call_id"), str) else ""
    view: dict[str, Any] = {
        "seq": "" if seq is None else str(seq),
        "n": seq,
        "kind": kind if isinstance(kind, str) else "",
        "origin": origin,
        "asked": asked,
        "paired": paired,
        "refused": refused,
        "call_id": call_id,
        "name": str(item.get("name") or ""),
        "badges": [],
        "imported": origin == TrajectoryItem.Origin.IMPORTED,
    }
    if kind == "message":
        view["template"] = "rollouts/partials/item_message.html"
        role = str(item.get("role") or "")
        view["role"] = role
        view["role_cls"] = role if role in ("assistant", "user", "system", "developer", "instructions") else "other"
        view["parts"] = _content_parts(item.get("content"))
    elif kind == "reasoning":
        view["template"] = "rollouts/partials/item_reasoning.html"
        texts = []
        summary = item.get("summary")
        for part in summary if isinstance(summary, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        content = item.get("content")
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        view["texts"] = texts
        view["empty_note"] = "(no summary; content encrypted)" if item.get("encrypted_content") else "(no summary)"
    elif kind == "function_call":
        view["template"] = "rollouts/partials/item_function_call.html"
        arguments = item.get("arguments")
        text, is_json = pretty_json_text(arguments)
        view["arguments"] = text
        view["arguments_note"] = ""
        if not isinstance(arguments, str):
            view["arguments_note"] = f"arguments are a {type(arguments).__name__}, not a JSON string: shown as they came"
        elif not is_json:
            view["arguments_note"] = "arguments are not valid JSON: shown raw"
        view["answered_by"] = None
        view["unanswered"] = False
    elif kind == "function_call_output":
        view["template"] = "rollouts/partials/item_function_call_output.html"
        view["name"] = (call_names or {}).get(call_id, "")
        view["answers"] = ""
        output = item.get("output")
        if isinstance(output, list):
            view["parts"] = _content_parts(output)
            view["text"] = None
        else:
            view["parts"] = None
            view["text"], view["is_json"] = pretty_json_text(output)
        if origin == TrajectoryItem.Origin.GYM:
            if refused:
                view["badges"].append(_badge("failed", "refused · not sent", "gymweb did not send this call to the env"))
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
    else:
        view["template"] = "rollouts/partials/item_generic.html"
        view["json"] = pretty_json_text(item)[0]
    return view


def _call_badges(view: dict[str, Any]) -> None:
    """Badges of a function_call, once we know whether an output answered it."""
    answered = view["answered_by"]
    origin = view["origin"]
    if origin == "input":
        return
    if origin == TrajectoryItem.Origin.IMPORTED:
        if view["paired"]:
            where = f" at #{answered}" if answered is not None else ""
            view["badges"].append(_badge("paired", f"answered{where}",
                                         "an output with this call_id follows; an imported file does not record who ran it"))
        else:
            view["unanswered"] = True
            view["badges"].append(_badge("unpaired", "never answered", "no function_call_output with this call_id in the trajectory"))
    elif view["asked"]:
        view["badges"].append(_badge("asked", "asked · run by gymweb", "an unpaired call: gymweb ran it against the env"))
        if answered is None:
            view["unanswered"] = True
            view["badges"].append(_badge("unpaired", "no output (the rollout stopped first)"))
    elif view["paired"]:
        view["badges"].append(_badge("paired", "agent-internal (paired in the same reply)",
                                     "the reply carried its own output for this call"))
    else:
        view["unanswered"] = answered is None
        view["badges"].append(_badge("unpaired", "never answered" if answered is None else "not run",
                                     "a later ask with the same call_id replaced it, or it was never answered"))


def _task_input(task_row: dict[str, Any]) -> list[dict[str, Any]]:
    params = task_row.get("responses_create_params") or {}
    views = []
    instructions = params.get("instructions")
    if isinstance(instructions, str) and instructions:
        views.append(item_view({"type": "message", "role": "instructions", "content": instructions}, origin="input"))
    first = params.get("input")
    if isinstance(first, str):
        first = [{"type": "message", "role": "user", "content": first}]
    call_names: dict[str, str] = {}
    for item in first if isinstance(first, list) else []:
        if isinstance(item, dict) and item.get("type") == "function_call" and isinstance(item.get("call_id"), str):
            call_names[item["call_id"]] = str(item.get("name") or "")
        views.append(item_view(item, origin="input", call_names=call_names))
    return views


def _verify_view(verify_json: str) -> Optional[dict[str, Any]]:
    if not verify_json:
        return None
    try:
        data = json.loads(verify_json)
    except ValueError:
        return {"reward": None, "numbers": [], "components": None, "others": [], "invalid": verify_json}
    if not isinstance(data, dict):
        return None
    numbers, others = [], []
    for key, value in data.items():
        if key in ("reward", "response", "responses_create_params", "reward_components") or key.startswith("_ng_"):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numbers.append((key, value))
        else:
            others.append((key, pretty_json_text(value)[0]))
    components = data.get("reward_components")
    if isinstance(components, dict):
        components = [(k, v, isinstance(v, (int, float)) and not isinstance(v, bool)) for k, v in components.items()]
    elif components is not None:
        components = [("reward_components", pretty_json_text(components)[0], False)]
    return {"reward": data.get("reward"), "numbers": numbers, "components": components, "others": others, "invalid": None}


def _timeline(rollout: Rollout) -> tuple[list[dict[str, Any]], int]:
    """Steps in order: ``{"call": AgentCall|None, "index": n, "items": [view, ...]}``. One query
    for the items and one for the agent calls."""
    calls = list(AgentCall.objects.filter(rollout=rollout).order_by("index"))
    rows = TrajectoryItem.objects.filter(rollout=rollout).order_by("seq").values_list(
        "seq", "step", "kind", "call_id", "origin", "asked", "paired", "refused", "latency_ms", "tool_status", "payload"
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
        if kind == "function_call" and call_id and isinstance(payload, dict):
            call_names[call_id] = str(payload.get("name") or "")
        view = item_view(payload, seq=seq, origin=origin, asked=asked, paired=paired, refused=refused,
                         latency_ms=latency_ms, tool_status=tool_status, call_names=call_names)
        if kind == "function_call":
            calls_by_id.setdefault(call_id, []).append(view)
            call_views.append(view)
        elif kind == "function_call_output" and call_id:
            for call_view in reversed(calls_by_id.get(call_id, ())):  # a repeated call_id: the last ask ran
                if call_view["answered_by"] is None:
                    call_view["answered_by"] = seq
                    view["answers"] = str(call_view["n"])
                    break
        if step not in steps:
            steps[step] = {"call": None, "index": step, "title": f"Step {step + 1}", "items": []}
        steps[step]["items"].append(view)
    for view in call_views:
        _call_badges(view)
    return [steps[k] for k in sorted(steps)], count


@login_required
def rollout_detail(request, run_id, rollout_id):
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id, run_id=run_id)
    run = rollout.run
    try:
        task_row = json.loads(rollout.task.row_json)
    except ValueError:
        task_row = {}
    steps, num_items = _timeline(rollout)
    attempts = list(
        Rollout.objects.filter(run_id=run.pk, task_index=rollout.task_index, rollout_index=rollout.rollout_index)
        .order_by("attempt", "id")
        .values("id", "attempt", "status", "reward", "failure_kind", "terminal")
    )
    qs = filter_querystring(request.GET)
    nav = neighbours(rollout, request.GET)
    suffix = f"?{qs}" if qs else ""
    context = {
        "run": run,
        "rollout": rollout,
        "imported": run.status == Run.Status.IMPORTED,
        "task_input": _task_input(task_row),
        "tools": [t.get("name") for t in (task_row.get("responses_create_params") or {}).get("tools") or [] if isinstance(t, dict)],
        "steps": steps,
        "num_items": num_items,
        "verify": _verify_view(rollout.verify_json) if rollout.status == Rollout.Status.SUCCEEDED else None,
        "attempts": attempts,
        "nav": nav,
        "filter_qs": qs,
        "run_url": reverse("run", args=[run.pk]) + suffix,
        "prev_url": reverse("rollout", args=[run.pk, nav["prev_id"]]) + suffix if nav["prev_id"] else "",
        "next_url": reverse("rollout", args=[run.pk, nav["next_id"]]) + suffix if nav["next_id"] else "",
        "raw_url": reverse("rollout_raw", args=[run.pk, rollout.pk]),
        "kill_shaped": rollout.status in Rollout.KILL_SHAPED,
    }
    return render(request, "rollouts/rollout_detail.html", context)


def raw_row(rollout: Rollout) -> Optional[dict[str, Any]]:
    """The output-file row of an attempt, built exactly as the exports build it: a success's
    ``rollouts.jsonl`` row, a failure's sidecar row; None for attempts written to no file."""
    task_row = json.loads(rollout.task.row_json)
    if rollout.status == Rollout.Status.SUCCEEDED:
        agent_ref = task_row.get("agent_ref") or {"name": rollout.run.agent_name}
        return export.success_row(rollout.verify_json, rollout.task_index, rollout.rollout_index, agent_ref)
    if rollout.status == Rollout.Status.FAILED:
        return export.failure_row(task_row, rollout.rollout_index, rollout.error, rollout.terminal, rollout.failure_kind)
    return None


@login_required
def rollout_raw(request, run_id, rollout_id):
    rollout = get_object_or_404(Rollout.objects.select_related("run", "task"), pk=rollout_id, run_id=run_id)
    row = raw_row(rollout)
    if row is None:
        body = {"error": f"this attempt is {rollout.status}: it is written to no output file, so it has no row"}
        return HttpResponse(json.dumps(body, indent=2), status=404, content_type="application/json; charset=utf-8")
    return HttpResponse(json.dumps(row, indent=2, ensure_ascii=False), content_type="application/json; charset=utf-8")


# -- import ------------------------------------------------------------------------------------
class ImportForm(forms.Form):
    rollouts = forms.FileField(label="rollouts.jsonl", help_text="NeMo Gym's (or gymweb's) rollouts.jsonl: one result row per line")
    failures = forms.FileField(
        label="failures sidecar", required=False, help_text="optional: its rollouts_failures.jsonl (one failed attempt per line)"
    )
    name = forms.CharField(max_length=200, required=False, help_text="default: the file names")

    def clean(self):
        data = super().clean()
        limit = settings.GYMWEB_MAX_UPLOAD_BYTES
        for field in ("rollouts", "failures"):
            upload = data.get(field)
            if upload is not None and upload.size > limit:
                shown = f"{limit / (1024 * 1024):g} MB" if limit >= 1024 * 1024 else f"{limit} bytes"
                self.add_error(field, f"the file is larger than the upload limit ({shown}, GYMWEB_MAX_UPLOAD_BYTES)")
        return data


@login_required
def import_rollouts(request):
    if request.method == "POST":
        form = ImportForm(request.POST, request.FILES)
        if form.is_valid():
            upload = form.cleaned_data["rollouts"]
            sidecar = form.cleaned_data.get("failures")
            source = upload.name or "rollouts.jsonl"
            failures_source = ""
            if sidecar is not None:
                failures_source = sidecar.name or "failures sidecar"
                if failures_source == source:
                    failures_source += " (failures sidecar)"
            try:
                summary = run_import(
                    upload,
                    name=form.cleaned_data.get("name") or "",
                    source=source,
                    failures=sidecar,
                    failures_source=failures_source,
                    user=request.user,
                )
            except DatasetError as exc:
                form.add_error("failures" if sidecar is not None and exc.source == failures_source else "rollouts", str(exc))
            else:
                parts = [f"{summary.succeeded} succeeded", f"{summary.failed} failed"]
                if summary.not_run:
                    parts.append(f"{summary.not_run} never run")
                messages.success(request, f"Imported {summary.rows} rollout(s) into “{summary.run.name}”: {', '.join(parts)}.")
                return redirect(reverse("run", args=[summary.run.pk]))
    else:
        form = ImportForm()
    return render(request, "rollouts/import.html", {"form": form}, status=400 if form.errors else 200)
