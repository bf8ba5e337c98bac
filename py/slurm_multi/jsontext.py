"""JSON read and written exactly as the json module does, without importing it on the way that works.

`import json` costs every helper ~9 ms of CPU at start (it imports re and compiles six patterns), on
cores that a job's own start shares; the helpers that start beside every rank read and write small
documents only. What json itself runs for a read is CPython's C scanner (`_json.make_scanner`): it
is called here the same way. A write walks the few types a document of ours holds (dict, list,
tuple, str, int, float, bool, None) as json.dumps writes them. Anything else, and every document that
fails, goes to the json module itself, so an error is json's own error, word for word (that import
is then paid, on a path that stops anyway). Held equal to json by property tests
(tests/py/test_jsontext.py).

    loads(text, object_pairs_hook=None)          = json.loads
    dumps(value, indent=None, ensure_ascii=True)  = json.dumps (with its default separators)
    JSONDecodeError                               = json.JSONDecodeError (imported when asked for)
"""

from __future__ import annotations

try:
    from _json import encode_basestring, encode_basestring_ascii, make_scanner
except ImportError:  # an interpreter without the accelerator: json's own pure-Python paths
    make_scanner = None

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """The attributes the C scanner reads off json.JSONDecoder, with json.loads's defaults."""

    strict = True
    object_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__

    def __init__(self, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None) -> None:
        self.object_pairs_hook = object_pairs_hook


_PLAIN_SCAN = make_scanner(_Context(None)) if make_scanner is not None else None


def __getattr__(name: str) -> Any:
    if name == "JSONDecodeError":  # `except jsontext.JSONDecodeError`: looked up only on an error
        import json

        return json.JSONDecodeError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _skip(text: str, at: int) -> int:
    end = len(text)
    while at < end and text[at] in _WHITESPACE:
        at += 1
    return at


def loads(text: str | bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """json.loads(text, object_pairs_hook=...): the same value, or json's own error."""
    if (
        isinstance(text, (bytes, bytearray))
        and not text[:4].count(0)
        and text[:1] not in (b"\xef", b"\xff", b"\xfe")
    ):
        text = text.decode("utf-8", "surrogatepass")  # what json.detect_encoding says for such bytes
    if make_scanner is not None and isinstance(text, str):
        scan = _PLAIN_SCAN if object_pairs_hook is None else make_scanner(_Context(object_pairs_hook))
        try:
            value, end = scan(text, _skip(text, 0))
        except (StopIteration, ValueError, SystemError):
            # json's own error, below. (SystemError: before 3.12 the scanner words its error with
            # json.decoder's class, looked up in sys.modules only: not there yet, it has none.)
            pass
        else:
            if _skip(text, end) == len(text):
                return value
    import json

    return json.loads(text, object_pairs_hook=object_pairs_hook)


class _Other(Exception):
    """A value the walk below does not write: json.dumps writes (or refuses) it."""


def dumps(value: Any, indent: int | None = None, ensure_ascii: bool = True) -> str:
    """json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)."""
    if make_scanner is not None:
        out: list[str] = []
        encode = encode_basestring_ascii if ensure_ascii else encode_basestring
        newline = None if indent is None else "\n" + " " * indent
        try:
            _write(value, out, encode, newline, "\n")
        except (_Other, RecursionError):
            pass
        else:
            return "".join(out)
    import json

    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _write(value: Any, out: list[str], encode: Callable[[str], str], step: str | None, here: str) -> None:
    kind = type(value)
    if kind is str:
        out.append(encode(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is float:
        out.append(_float(value))
    elif kind is list or kind is tuple:
        if not value:
            out.append("[]")
            return
        inner = None if step is None else here + step[1:]
        out.append("[" if inner is None else "[" + inner)
        for at, item in enumerate(value):
            if at:
                out.append(", " if inner is None else "," + inner)
            _write(item, out, encode, step, inner or here)
        out.append("]" if inner is None else here + "]")
    elif kind is dict:
        if not value:
            out.append("{}")
            return
        inner = None if step is None else here + step[1:]
        out.append("{" if inner is None else "{" + inner)
        for at, (key, item) in enumerate(value.items()):
            if at:
                out.append(", " if inner is None else "," + inner)
            out.append(encode(_key(key)))
            out.append(": ")
            _write(item, out, encode, step, inner or here)
        out.append("}" if inner is None else here + "}")
    else:
        raise _Other


def _key(key: Any) -> str:
    """A dict key as json writes it (a str as is; a number or a constant as its JSON text)."""
    kind = type(key)
    if kind is str:
        return key
    if kind is float:
        return _float(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if kind is int:
        return int.__repr__(key)
    raise _Other


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == float("-inf"):
        return "-Infinity"
    return float.__repr__(value)
