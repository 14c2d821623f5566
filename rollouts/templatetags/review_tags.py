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
