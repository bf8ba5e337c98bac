"""slurm_multi.words: every rule is its regular expression's full match, over any text."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slurm_multi import words

RULES = [
    (words.is_token, r"[!-~]{1,64}"),
    (words.is_rank, r"0|[1-9][0-9]{0,8}"),
    (words.is_count, r"0|[1-9][0-9]{0,17}"),
    (words.is_image_id, r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,159}"),
    (words.is_held_id, r"sha256:[0-9a-f]{64}"),
    (words.is_cache_seen, r"cache:[0-9a-f]{16}"),
    (words.is_job_id, r"[A-Za-z0-9_.:+-]{1,64}"),
    (words.is_host, r"[A-Za-z0-9_.-]{1,253}"),
    (words.is_decimal, r"-?[0-9]{1,12}(?:\.[0-9]{1,9})?"),
]
# Texts near each rule's edges: its own characters, a few outside, and the lengths around its limits.
NEAR = st.text(alphabet="0123456789abcdefAZaz._:/@+- -\n²٣é\x00~!", max_size=20)
HEX = st.integers(0, 80).flatmap(lambda n: st.text(alphabet="0123456789abcdefg", min_size=n, max_size=n))
LONG = st.sampled_from(["a", "0", "1", "x.", "-", "9"]).flatmap(
    lambda c: st.integers(0, 260).map(lambda n: c * n)
)


def texts() -> st.SearchStrategy[str]:
    return (
        NEAR
        | st.text(max_size=30)
        | HEX.map(lambda h: "sha256:" + h)
        | HEX.map(lambda h: "cache:" + h)
        | LONG
        | st.from_regex(r"-?[0-9]{1,14}(\.[0-9]{0,11})?", fullmatch=True)
    )


@settings(max_examples=600)
@given(texts())
@example("0")
@example("00")
@example("-0.5")
@example("1.")
@example(".5")
@example("1" * 18)
@example("1" * 19)
@example("a" * 160)
@example("a" * 161)
@example("1\n")
def test_every_rule_is_its_regex(text: str) -> None:
    for rule, pattern in RULES:
        assert rule(text) == bool(re.fullmatch(pattern, text)), (rule.__name__, text)


@pytest.mark.parametrize("rule, pattern", RULES)
def test_the_table_in_the_docstring_is_the_rules(rule, pattern) -> None:
    """The module's docstring shows each rule's pattern beside its name, as the test holds it."""
    line = next(line for line in (words.__doc__ or "").splitlines() if line.strip().startswith(rule.__name__))
    assert line.split()[1].replace("\\\\", "\\") == pattern
