"""Template helpers of the review partials."""

from django import template
from django.utils.html import format_html_join

register = template.Library()


@register.simple_tag
def filter_inputs(form, exclude: str = ""):
    """Hidden inputs carrying a ``RolloutFilterForm``'s valid values (sort included), except the
    comma-separated names in ``exclude``: a POST form or another GET form then acts on the same list."""
    if form is None:
        return ""
    skip = {n.strip() for n in exclude.split(",") if n.strip()}
    pairs = [(k, v) for k, v in form.params().items() if k not in skip]
    return format_html_join("", '<input type="hidden" name="{}" value="{}">', pairs)


@register.simple_tag(takes_context=True)
def notes_on_item(context, seq) -> list:
    """The notes on trajectory item ``seq`` (its number, int or str) of the page's rollout, from
    the page's ``item_notes`` (``{seq: [Note]}``, read once per page); ``[]`` when there are none."""
    by_item = context.get("item_notes") or {}
    try:
        return by_item.get(int(seq), [])
    except (TypeError, ValueError):
        return []


@register.filter
def may_delete_note(note, user) -> bool:
    """True when ``user`` may delete ``note``: its author, or a staff user."""
    return bool(getattr(user, "is_authenticated", False)) and (
        note.created_by_id == user.pk or bool(getattr(user, "is_staff", False))
    )
