"""Scoring of a generated answer against a sample's answers (exact, no model judge)."""

from __future__ import annotations

import re

METRICS = ("first_number", "all_contained", "first_word")


def score(metric: str, prediction: str, answers: list[str]) -> float:
    """1.0 / 0.0 (`first_number`: the first number generated is the answer; `first_word`: the first word, case and
    punctuation aside, is the answer), or the fraction of answers contained in the prediction (`all_contained`,
    RULER's `string_match_all`, case-insensitive)."""
    if metric == "first_number":
        found = re.search(r"\d+", prediction)
        return float(found is not None and found.group() == answers[0])
    if metric == "first_word":
        found = re.search(r"[A-Za-z]+", prediction)
        return float(found is not None and found.group().lower() == answers[0].lower())
    if metric == "all_contained":
        return sum(a.lower() in prediction.lower() for a in answers) / len(answers)
    raise ValueError(f"Unknown metric {metric!r}; choose one of {METRICS}.")
