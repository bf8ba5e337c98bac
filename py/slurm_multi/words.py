"""The words the barrier's, the relay's and the fitness check's protocols carry, and the rule each
one must pass before it is believed: one owner for each rule, written as plain string tests.

Each rule is a regular expression's full match (tests/py/test_words.py holds every function equal to
its pattern, over any text); no `re` here, whose import and compiles cost every helper that starts
beside a rank ~9 ms of CPU. ASCII only throughout: str.isdigit alone takes `²` and `٣`.

    is_token       [!-~]{1,64}                            the job's token (no space, no control)
    is_rank        0|[1-9][0-9]{0,8}                      a rank on the wire
    is_count       0|[1-9][0-9]{0,17}                     byte counts and rates
    is_image_id    [A-Za-z0-9][A-Za-z0-9._:/@+-]{0,159}   what rank 0 releases
    is_held_id     sha256:[0-9a-f]{64}                    the image ID a worker says it holds
    is_cache_seen  cache:[0-9a-f]{16}                     the cache tar's image ID a worker sees
    is_job_id      [A-Za-z0-9_.:+-]{1,64}                 a Slurm job ID (array and het forms)
    is_host        [A-Za-z0-9_.-]{1,253}                  a host name
    is_decimal     -?[0-9]{1,12}(?:\\.[0-9]{1,9})?         a time or a rate as text
"""

from __future__ import annotations

from slurm_multi.auth import is_hex

DIGITS = "0123456789"
_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" + DIGITS
_IMAGE_ID_CHARS = _ALNUM + "._:/@+-"
_JOB_ID_CHARS = _ALNUM + "_.:+-"
_HOST_CHARS = _ALNUM + "_.-"
CACHE_SEEN_HEX = 16  # the first 16 hex digits of the cache tar's image ID


def only(text: str, chars: str, low: int, high: int) -> bool:
    """`[chars]{low,high}`: between low and high characters, every one of them in `chars`."""
    return low <= len(text) <= high and not text.strip(chars)


def is_token(text: str) -> bool:
    return 1 <= len(text) <= 64 and text.isascii() and text.isprintable() and " " not in text


def _number(text: str, most: int) -> bool:
    """`0|[1-9][0-9]{0,most-1}`."""
    return text == "0" or (text[:1] != "0" and only(text, DIGITS, 1, most))


def is_rank(text: str) -> bool:
    return _number(text, 9)


def is_count(text: str) -> bool:
    return _number(text, 18)


def is_image_id(text: str) -> bool:
    return only(text, _IMAGE_ID_CHARS, 1, 160) and text[0] in _ALNUM


def is_held_id(text: str) -> bool:
    return text.startswith("sha256:") and is_hex(text[7:], 64)


def is_cache_seen(text: str) -> bool:
    return text.startswith("cache:") and is_hex(text[6:], CACHE_SEEN_HEX)


def is_job_id(text: str) -> bool:
    return only(text, _JOB_ID_CHARS, 1, 64)


def is_host(text: str) -> bool:
    return only(text, _HOST_CHARS, 1, 253)


def is_decimal(text: str) -> bool:
    whole, dot, fraction = text.removeprefix("-").partition(".")
    return only(whole, DIGITS, 1, 12) and (not dot or only(fraction, DIGITS, 1, 9))
