"""The display formats (``rollouts.display``): the texts the pages, forms and template filters show."""

from __future__ import annotations

from django.template import Context, Template

from rollouts import display


def test_numbers():
    assert [display.number(v) for v in (3, 1.0, 0.123456, 0.5, True, None, "x")] == [
        "3",
        "1.0",
        "0.1235",
        "0.5",
        "True",
        "",
        "x",
    ]
    assert [display.signed_number(v) for v in (0.25, -1.0, 0.0, None)] == ["+0.25", "-1", "0", "—"]


def test_durations_coordinates_and_sizes():
    assert [display.duration_ms(v) for v in (12.34, 250, 1240, None, "", "x")] == [
        "12.3 ms",
        "250 ms",
        "1.24 s",
        "",
        "",
        "",
    ]
    assert [display.svg_number(v) for v in (12.5, 0.0, 1000.0, 3.14159)] == ["12.5", "0", "1000", "3.14"]
    assert [display.binary_size(v) for v in (512, 1536, 200 * 1024**2, 3 * 1024**4)] == [
        "512 bytes",
        "1.5 KB",
        "200 MB",
        "3072 GB",
    ]


def test_template_filters_are_the_display_formats():
    text = Template("{% load gymweb_tags %}{{ a|num }} {{ b|ms }}").render(Context({"a": 0.5, "b": 1240}))
    assert text == "0.5 1.24 s"
