"""slurm_multi.events: a node's events written and read in one place (lib/timeline.sh writes the
same lines from bash); the watch and sm-demo learn each node's stage from its last stage_start,
never from node.log; an older job directory's events.jsonl (JSON lines) still reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from slurm_multi import events, hangwatch, watch

T0 = 1_764_500_000.0


def event(name: str, **extra: object) -> str:
    return events.format_event(name, T0, rank=0, host="node1", **extra) + "\n"


def json_event(name: str, **extra: object) -> str:
    return json.dumps({"t": T0, "event": name, "rank": 0, "host": "node1", **extra}) + "\n"


def test_the_stage_is_the_last_stage_start_whatever_follows_it(tmp_path: Path):
    node = tmp_path / "node_0"
    node.mkdir()
    assert events.node_stage(str(tmp_path), 0) == "starting"  # no events yet
    lines = [event("stage_start", stage="prepare"), event("stage_end", stage="prepare", status="ok"),
             event("stage_start", stage="image"), event("image_load_start")]  # fmt: skip
    (node / "events.log").write_text("".join(lines) + event("stage_start", stage="run")[:-12])  # torn
    assert events.current_stage(str(node)) == "image"
    assert events.node_stage(str(tmp_path), 0) == "image"
    # The log says something else: it is not read.
    (node / "node.log").write_text("node1 r0 run: stage run (alone)\n")
    assert events.node_stage(str(tmp_path), 0) == "image"
    (node / "status.json").write_text("{}")
    assert events.node_stage(str(tmp_path), 0) == "finished"


def test_an_old_events_jsonl_is_read_when_there_is_no_events_log(tmp_path: Path):
    node = tmp_path / "node_0"
    node.mkdir()
    (node / "events.jsonl").write_text(json_event("stage_start", stage="barrier") + '{"t": 17645')
    assert events.events_path(str(node)) == str(node / "events.jsonl")
    assert events.current_stage(str(node)) == "barrier"
    (node / "events.log").write_text(event("stage_start", stage="run"))
    assert events.events_path(str(node)) == str(node / "events.log")
    assert events.current_stage(str(node)) == "run"


def test_a_long_events_file_is_read_from_its_tail(tmp_path: Path):
    node = tmp_path / "node_0"
    node.mkdir()
    noise = event("first_output") * (2 * events.TAIL_BYTES // len(event("first_output")))
    (node / "events.log").write_text(
        event("stage_start", stage="prepare") + noise + event("stage_start", stage="run")
    )
    assert os.path.getsize(node / "events.log") > events.TAIL_BYTES
    assert events.current_stage(str(node)) == "run"


def test_the_watch_and_the_demo_read_the_same_stages(tmp_path: Path):
    for rank, stage in ((0, "barrier"), (1, "image")):
        (tmp_path / f"node_{rank}").mkdir()
        (tmp_path / f"node_{rank}" / "events.log").write_text(event("stage_start", stage=stage))
    assert watch.node_stage is events.node_stage
    env = dict(os.environ, PYTHONPATH=str(Path(events.__file__).parents[1]))
    stages = [sys.executable, "-m", "slurm_multi", "job", "stages"]
    done = subprocess.run([*stages, str(tmp_path), "3"], capture_output=True, text=True, env=env, check=False)
    assert (done.returncode, done.stdout) == (0, "node_0=barrier node_1=image node_2=starting\n")
    bad = subprocess.run([*stages, str(tmp_path)], capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 2 and "Missing argument 'NRANKS'" in bad.stderr


def test_job_stages_refuses_a_job_dir_not_there_and_more_ranks_than_a_job_has(tmp_path: Path):
    # A mistyped dir printed every rank `starting`, exit 0; NRANKS 10**7 ran for minutes on a GiB.
    env = dict(os.environ, PYTHONPATH=str(Path(events.__file__).parents[1]))
    stages = [sys.executable, "-m", "slurm_multi", "job", "stages"]
    for argv, said in (
        ([str(tmp_path / "typo"), "2"], f"Directory '{tmp_path / 'typo'}' does not exist"),
        ([str(tmp_path), "99999999999"], "NRANKS 99999999999 is more than a job has (at most 100000)"),
    ):
        done = subprocess.run([*stages, *argv], capture_output=True, text=True, env=env, check=False)
        assert (done.returncode, done.stdout) == (2, "") and len(done.stderr.splitlines()) == 1
        assert said in done.stderr, done.stderr


# ---- the line format -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["plain", "a b", "tab\there", "line\nbreak", "cr\rlf", "50%", "%20 is not a space", "k=v=w", "", "größe",
     "\x01\x1b[31mred\x7f", 'say "hi" \\'],
)  # fmt: skip
def test_a_value_comes_back_as_it_was_written_and_stays_on_its_line_and_field(value: str):
    line = events.format_event("odd name", T0, rank=0, host="node 1", v=value, after="x")
    assert "\n" not in line and "\r" not in line and line.count(" ") == 5
    assert events.parse_line(line.encode()) == {
        "t": T0, "event": "odd name", "rank": 0, "host": "node 1", "v": value, "after": "x"
    }  # fmt: skip


@settings(max_examples=300)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_a_token_is_encoded_as_the_rule_says(text: str):
    """`%`, space, the C0 controls and DEL as %XX (the rule, as a regex); nothing else changes."""
    want = re.sub(r"[%\x00-\x20\x7f]", lambda m: f"%{ord(m.group()):02X}", text)
    assert events.encode(text) == want


def test_a_key_may_hold_anything_too():
    line = events.format_event("x", T0, **{"a=b c": "v=w"})
    assert line.endswith(" a%3Db%20c=v=w")
    assert events.parse_line(line.encode()) == {"t": T0, "event": "x", "a=b c": "v=w"}


def test_plain_json_numbers_are_numbers_and_the_rest_strings():
    line = b"1764500000.5 exit rank=r1 host=12 code=137 neg=-3 frac=0.25 sci=1e9 lead=007 plus=+1 word=nan"
    assert events.parse_line(line) == {
        "t": 1764500000.5, "event": "exit", "rank": "r1", "host": "12", "code": 137, "neg": -3,
        "frac": 0.25, "sci": 1e9, "lead": "007", "plus": "+1", "word": "nan",
    }  # fmt: skip


def test_lines_of_either_form_give_the_same_event():
    new = events.format_event("stage_end", T0, rank=0, host="node1", stage="image", status="ok", bytes=12)
    old = json.dumps({"t": T0, "event": "stage_end", "rank": 0, "host": "node1", "stage": "image",
                      "status": "ok", "bytes": 12})  # fmt: skip
    assert events.parse_event(new.encode()) == events.parse_event(old.encode())
    assert events.parse_event(new.encode()) == {
        "t": T0, "event": "stage_end", "stage": "image", "status": "ok", "bytes": 12
    }  # fmt: skip


def test_parse_events_skips_what_is_not_an_event_and_names_a_torn_last_line():
    whole = event("go") + "garbage here\n\n" + event("exit", code=0)
    assert events.parse_events(whole.encode()) == (
        [{"t": T0, "event": "go"}, {"t": T0, "event": "exit", "code": 0}], 1, False
    )  # fmt: skip
    torn = whole + event("stage_end", stage="run", status="ok")[:-5]  # `status=o`, no line end
    found, skipped, is_torn = events.parse_events(torn.encode())
    assert (len(found), skipped, is_torn) == (2, 2, True)
    # An old JSON line is whole or not by itself: without a line end it still counts.
    assert events.parse_events(json_event("go").rstrip("\n").encode()) == (
        [{"t": T0, "event": "go"}],
        0,
        False,
    )


def test_write_event_appends_one_line_and_never_raises(tmp_path: Path):
    assert events.write_event(str(tmp_path), "first_output", T0, rank=1, host="node2")
    assert events.write_event(str(tmp_path), "note", T0 + 1, rank=1, host="node2", text="two\nlines")
    assert (tmp_path / "events.log").read_text() == (
        "1764500000.000000 first_output rank=1 host=node2\n"
        "1764500001.000000 note rank=1 host=node2 text=two%0Alines\n"
    )
    assert events.write_event(str(tmp_path / "missing"), "x") is False
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "events.log").mkdir()  # a directory where the file should be
    assert events.write_event(str(tmp_path / "ro"), "x") is False


def test_the_hang_watch_writes_its_events_through_events_py():
    source = Path(hangwatch.__file__).read_text()
    assert hangwatch.write_event is events.write_event
    assert "events.log" not in source and "events.jsonl" not in source


def test_no_module_but_events_names_an_events_file():
    import ast

    package = Path(events.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path == Path(events.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value.strip()
                if text.rsplit("/", 1)[-1] in ("events.log", "events.jsonl") and " " not in text:
                    offenders.append(f"{path.name}:{node.lineno}: {text!r}")
    assert offenders == [], "read and write the events through slurm_multi.events"


def _slow_typed(token: bytes):
    """events._typed as its docstring says it, without the caches and fast paths."""
    import re

    if re.fullmatch(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", token):
        try:
            return float(token) if any(c in token for c in b".eE") else int(token)
        except ValueError:
            pass
    if b"%" in token:
        token = re.sub(rb"%([0-9A-Fa-f]{2})", lambda m: bytes((int(m.group(1), 16),)), token)
    return token.decode("utf-8", errors="replace")


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=12) | st.text(alphabet="-0123456789.eE+%aF", max_size=10).map(str.encode))
@example(b"007")  # not a JSON number: the text "007"
@example(b"0")
@example(b"-0")
@example(b"1" * 4300)  # past int()'s digit limit: the text
@example(b"%41b")
@example(b"")
def test_the_value_fast_paths_and_caches_read_every_token_as_the_rule_does(token: bytes):
    for _ in range(2):  # the second read comes from the cache
        got, want = events._typed(token), _slow_typed(token)
        assert (type(got), got) == (type(want), want) or (got != got and want != want)


def test_the_caches_stay_bounded(monkeypatch):
    monkeypatch.setattr(events, "MAX_DECODED", 3)
    monkeypatch.setattr(events, "_DECODED", {})
    for n in range(10):
        assert events._typed(f"host{n}".encode()) == f"host{n}"
    assert len(events._DECODED) == 3
    monkeypatch.setattr(events, "_TEXT_VALUES", {})
    for n in range(10):
        line = f"1796354204.5 stage_start rank=0 host=node1 stage=s{n}".encode()
        assert events.parse_event(line) == {"t": 1796354204.5, "event": "stage_start", "stage": f"s{n}"}
    assert len(events._TEXT_VALUES) == 3


TOKENS = st.sampled_from([
    b"1796354204.32", b"0", b"-1", b"007", b"inf", b"1e999", b"stage_start", b"exit", b"%20x",
    b"rank=1", b"host=node1", b"stage=run", b"status=ok", b"code=0", b"code=1e999", b"code=",
    b"=x", b"t=5", b"event=x", b"note=a%25b", b"stage=image", b"x", b"\xff", b"", b"1" * 4301, b"-0.5",
    b"253402300799.5", b"1e3", b"note=" + b"v" * 300, b"stage=007",
])  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(TOKENS, max_size=7))
@example([b"1796354204.32", b"stage_end", b"rank=0", b"note=" + b"v" * 300, b"status=ok", b"code=1e999"])
@example([b"1" * 4301, b"exit", b"code=0"])  # a time too large for a float: no event
def test_a_plain_line_is_judged_in_one_pass_as_its_fields_are(words: list[bytes]):
    raw = b" ".join(words)
    if raw.strip().startswith(b"{"):
        return
    for _ in range(2):  # the second read comes from the caches
        assert events.parse_event(raw) == events.event_of_fields(events.parse_line(raw))


@pytest.mark.parametrize(
    "lines, started",
    [
        ([], False),
        ([("stage_start", {"stage": "barrier"})], False),
        ([("stage_start", {"stage": "run"}), ("container_start", {})], False),
        ([("stage_start", {"stage": "run"}), ("container_start", {}), ("first_output", {})], True),
        # A first output of an earlier run stage (a re-run in the same dir) is not this one's.
        ([("stage_start", {"stage": "run"}), ("first_output", {}), ("stage_start", {"stage": "run"})], False),
        ([("stage_start", {"stage": "run"}), ("stage_start", {"stage": "save-outputs"})], True),
        ([("stage_start", {"stage": "reap"})], False),
    ],
)
def test_a_workload_has_started_once_it_printed_in_its_run_stage_or_is_past_it(
    tmp_path: Path, lines: list, started: bool
):
    node = tmp_path / "node_0"
    node.mkdir()
    (node / "events.log").write_text("".join(event(name, **extra) for name, extra in lines))
    assert events.workload_started(str(tmp_path), 0) is started


def test_a_rank_that_staged_has_started_whatever_its_events_say(tmp_path: Path):
    node = tmp_path / "node_0"
    node.mkdir()
    (node / "events.log").write_text(event("stage_start", stage="prepare"))
    assert events.workload_started(str(tmp_path), 0) is False
    (node / "status.json").write_text('{"rank": 0, "exit_code": 1}\n')
    assert events.workload_started(str(tmp_path), 0) is True
