"""What counts as a performance value, and how the numbers we write are spelled.

One rule, used by the picker (scoring), the rows (status) and the perf.csv history
(relative_change): a performance value is a plain decimal number, optionally signed, optionally with
an exponent, that is finite as a float. Anything else is "no value": `error`, `inf`, `1.2.3`,
`12 samples/s`, `1,234.5` (no thousands separators: `1,234` reads 1.234 in half the world, and a
factor of 1000 must not be guessed), `0x10`, `1_000`, non-ASCII digits.
"""

from __future__ import annotations

import math
import re

# How a workload says "no value here" on purpose; such a cell is empty without a warning. Any other
# text that is not a number is empty too, but is worth a warning (compared stripped, lower-cased).
EMPTY_MARKERS = frozenset({"", "-", "n/a", "na", "nan", "-nan", "none", "null", "<na>", "#n/a"})
NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def as_number(text: str) -> float | None:
    """The value of a performance cell, or None when it is not a finite decimal number."""
    text = text.strip()
    if not NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def is_result(text: str) -> bool:
    """Whether a performance cell holds a result (a finite number)."""
    return as_number(text) is not None


def is_empty_marker(text: str) -> bool:
    """Blank or a conventional "no value" spelling (`N/A`, `nan`, `-`, ...): empty, and no surprise."""
    return text.strip().lower() in EMPTY_MARKERS


def format_number(value: float) -> str:
    """A stable, short text form: 3 -> "3", 0.1+0.2 -> "0.3", 14164.25 -> "14164.25"."""
    if not math.isfinite(value):
        return ""
    rounded = round(value, 6)
    if rounded == int(rounded) and abs(rounded) < 1e15:
        return str(int(rounded))
    return repr(rounded)


def relative_change(new: str, old: str) -> str:
    """(new - old) / old * 100 with two decimals ("12.50", "-3.25"); "" when either is not a
    result or old is 0."""
    new_value, old_value = as_number(new), as_number(old)
    if new_value is None or old_value is None or old_value == 0:
        return ""
    change = (new_value - old_value) / old_value * 100
    if not math.isfinite(change):
        return ""
    text = f"{change:.2f}"
    return "0.00" if text == "-0.00" else text
