"""slurm_multi.jsontext reads and writes JSON as the json module does: the same value, the same text,
the same error, for any document (hypothesis) and for the edge cases json itself has."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi import jsontext

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
KEYS = st.text() | st.integers() | st.floats() | st.booleans() | st.none()
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(KEYS, inner, max_size=4)
    ),
    max_leaves=20,
)


def same(value: object, other: object) -> bool:
    """Equal, NaN included (json reads NaN as a float that equals nothing)."""
    return json.dumps(value) == json.dumps(other) and type(value) is type(other)


@settings(max_examples=400)
@given(DOCUMENTS, st.sampled_from([None, 0, 1, 2, 4]), st.booleans())
def test_a_document_is_written_as_json_writes_it(value: object, indent: int | None, ascii_only: bool) -> None:
    assert jsontext.dumps(value, indent=indent, ensure_ascii=ascii_only) == json.dumps(
        value, indent=indent, ensure_ascii=ascii_only
    )


@settings(max_examples=400)
@given(DOCUMENTS, st.sampled_from([None, 2]), st.booleans(), st.sampled_from(["", " ", "\n", " \t\r\n "]))
def test_a_document_is_read_as_json_reads_it(
    value: object, indent: int | None, ascii_only: bool, pad: str
) -> None:
    text = pad + json.dumps(value, indent=indent, ensure_ascii=ascii_only) + pad
    assert same(jsontext.loads(text), json.loads(text))
    assert same(
        jsontext.loads(text.encode("utf-8", "surrogatepass")),
        json.loads(text.encode("utf-8", "surrogatepass")),
    )


@settings(max_examples=400)
@given(st.text(max_size=30) | st.text(alphabet='{}[]",:0123456789.eE+-tfnulrsa \n\\', max_size=30))
def test_any_text_gives_json_s_value_or_json_s_error_word_for_word(text: str) -> None:
    try:
        expected: object = json.loads(text)
    except ValueError as exc:
        with pytest.raises(type(exc)) as raised:
            jsontext.loads(text)
        assert str(raised.value) == str(exc)
        assert isinstance(raised.value, jsontext.JSONDecodeError) == isinstance(exc, json.JSONDecodeError)
    else:
        assert same(jsontext.loads(text), expected)


@pytest.mark.parametrize(
    "raw",
    [b"", b"   ", b"{} x", b"\xef\xbb\xbf{}", "{}".encode("utf-16"), "[1]".encode("utf-32"),
     "[1]".encode("utf-16-le"), b"\x00[", b"[1, NaN, Infinity, -Infinity]", b'{"a": 1, "a": 2}',
     "\ufeff{}".encode(), b'["\xff"]', b"[1e400, -0.0, 1E5]", b'"\\ud800"'],
)  # fmt: skip
def test_json_s_edge_cases(raw: bytes) -> None:
    for document in (raw, raw.decode("latin-1")):
        try:
            expected: object = json.loads(document)
        except (ValueError, UnicodeDecodeError) as exc:
            with pytest.raises(type(exc)) as raised:
                jsontext.loads(document)
            assert str(raised.value) == str(exc)
        else:
            assert same(jsontext.loads(document), expected)


def test_a_pairs_hook_sees_what_it_sees_under_json() -> None:
    seen: list[object] = []

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        seen.append(pairs)
        if len({key for key, _ in pairs}) != len(pairs):
            raise ValueError("duplicate key")
        return dict(pairs)

    text = '{"a": {"b": 1, "c": [2]}, "d": null}'
    assert jsontext.loads(text, object_pairs_hook=hook) == json.loads(text)
    assert seen == [[("b", 1), ("c", [2])], [("a", {"b": 1, "c": [2]}), ("d", None)]]
    with pytest.raises(ValueError, match="duplicate key"):
        jsontext.loads('{"a": 1, "a": 2}', object_pairs_hook=hook)


class Other(str):
    pass


@pytest.mark.parametrize(
    "value",
    [{"a": {1, 2}}, [object()], {(1, 2): 3}, Other("x"), {"k": Other("v")}, float("nan"),
     [math.inf, -math.inf], {1: "a", 2.5: "b", False: "c", None: "d"}, {"": [[], {}]}, "\u2028\x00\"\\"],
)  # fmt: skip
def test_what_json_writes_otherwise_or_refuses(value: object) -> None:
    for indent in (None, 2):
        try:
            expected = json.dumps(value, indent=indent)
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)) as raised:
                jsontext.dumps(value, indent=indent)
            assert str(raised.value) == str(exc)
        else:
            assert jsontext.dumps(value, indent=indent) == expected


def test_a_circular_document_is_refused_as_json_refuses_it() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference detected"):
        jsontext.dumps(loop, indent=2)


@pytest.mark.parametrize("text", ['{"a" 1}', '{"a": }', "[1, 2", '"\x01"', "[1] x", "", '{"a": 1,}'])
def test_a_bad_document_gets_json_s_error_where_json_was_never_imported(text: str) -> None:
    code = (
        "import sys; from slurm_multi import jsontext as j\n"
        "try: j.loads(sys.argv[1])\n"
        "except ValueError as exc: print(type(exc).__name__, exc)\n"
    )
    env = {"PYTHONPATH": str(jsontext.__file__).rsplit("/slurm_multi/", 1)[0]}
    done = subprocess.run([sys.executable, "-S", "-c", code, text], capture_output=True, text=True, env=env)
    with pytest.raises(json.JSONDecodeError) as want:
        json.loads(text)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"JSONDecodeError {want.value}\n", "")


def test_reading_and_writing_import_no_json() -> None:
    code = (
        "import sys; from slurm_multi import jsontext as j; "
        "assert j.loads(j.dumps({'a': [1, 2.5, None, 'x']}, indent=2)) == {'a': [1, 2.5, None, 'x']}; "
        "print(sorted({'json', 're'} & set(sys.modules)))"
    )
    env = {"PYTHONPATH": str(jsontext.__file__).rsplit("/slurm_multi/", 1)[0]}
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert done.stdout == "[]\n"
