"""The compare page says in words which interval of the reward difference is narrower, the paired
one or Welch's unpaired one, and what two intervals of width 0 mean (never "equal is tighter")."""

from __future__ import annotations

from rollouts.web.compare_views import interval_verdict


def test_equal_zero_width_intervals_are_explained():
    text = interval_verdict({"tighter": "equal", "width": 0.0, "welch_width": 0.0})
    assert text.startswith("Both intervals are a single point (width 0)") and "tighter" not in text


def test_the_narrower_interval_is_named_with_both_widths():
    paired = interval_verdict({"tighter": "paired", "width": 0.1, "welch_width": 0.3})
    assert paired.startswith("The paired interval is narrower (width 0.1") and "Welch interval (width 0.3" in paired
    welch = interval_verdict({"tighter": "welch", "width": 0.3, "welch_width": 0.1})
    assert welch.startswith("The unpaired Welch interval is narrower (width 0.1")
    same = interval_verdict({"tighter": "equal", "width": 0.2, "welch_width": 0.2})
    assert same.startswith("Both intervals have the same width (0.2")


def test_nothing_is_said_without_both_intervals():
    assert interval_verdict({"tighter": None, "width": None, "welch_width": 0.1}) == ""
