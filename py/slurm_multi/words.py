"""The words the barrier's, the relay's and the fitness check's protocols carry, and the rule each
one must pass before it is believed: one owner for each rule, each its regular expression's full
match (ASCII only throughout: the classes are spelled out, never \\d or \\w).

    is_token       [!-~]{1,64}                            the job's token (no space, no control)
    is_rank        0|[1-9][0-9]{0,8}                      a rank on the wire
    is_count       0|[1-9][0-9]{0,17}                     byte counts and rates
    is_image_id    [A-Za-z0-9][A-Za-z0-9._:/@+-]{0,159}   what rank 0 releases
    is_held_id     sha256:[0-9a-f]{64}                    the image ID a worker says it holds
    is_cache_seen  cache:[0-9a-f]{16}                     the cache tar's image ID a worker sees
    is_job_id      [A-Za-z0-9_.:+-]{1,64}                 a Slurm job ID (array and het forms)
    is_host        [A-Za-z0-9_.-]{1,253}                  a host name
    is_address     [A-Za-z0-9_.:%-]{1,253}                a host name or an IP address (v6, %zone)
    is_decimal     -?[0-9]{1,12}(?:\\.[0-9]{1,9})?         a time or a rate as text
"""

from __future__ import annotations

import re
from collections.abc import Callable

CACHE_SEEN_HEX = 16  # the first 16 hex digits of the cache tar's image ID


def _rule(name: str, pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern)

    def matches(text: str) -> bool:
        return compiled.fullmatch(text) is not None

    matches.__name__ = matches.__qualname__ = name
    matches.__doc__ = f"Whether the text is `{pattern}` (a full match)."
    return matches


is_token = _rule("is_token", r"[!-~]{1,64}")
is_rank = _rule("is_rank", r"0|[1-9][0-9]{0,8}")
is_count = _rule("is_count", r"0|[1-9][0-9]{0,17}")
is_image_id = _rule("is_image_id", r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,159}")
is_held_id = _rule("is_held_id", r"sha256:[0-9a-f]{64}")
is_cache_seen = _rule("is_cache_seen", rf"cache:[0-9a-f]{{{CACHE_SEEN_HEX}}}")
is_job_id = _rule("is_job_id", r"[A-Za-z0-9_.:+-]{1,64}")
is_host = _rule("is_host", r"[A-Za-z0-9_.-]{1,253}")
is_address = _rule("is_address", r"[A-Za-z0-9_.:%-]{1,253}")
is_decimal = _rule("is_decimal", r"-?[0-9]{1,12}(?:\.[0-9]{1,9})?")
