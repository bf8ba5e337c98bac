"""slurm_multi.statusfile: a node's status.json has one owner, which writes it (the node's helper at
the end of every task, the watch's "lost" status of a dead node) and reads it (collect, the watch,
the hang watch, the events' progress line, node from-job); no other module opens the file."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_multi import statusfile
from slurm_multi.statusfile import Status, read_status, status_document, status_path, write_status

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "py" / "slurm_multi"


def test_the_document_keeps_its_keys_and_their_meaning(tmp_path: Path):
    path = status_path(str(tmp_path / "node_1"))
    assert path == str(tmp_path / "node_1" / "status.json")
    document = status_document(1, "node2", 0, "", "sha256:ab", ["prepare:0.12:ok", "run:30.1:ok:0"], False)
    write_status(path, document)  # creates the node dir
    assert json.loads(Path(path).read_text()) == {
        "rank": 1, "node": "node2", "exit_code": 0, "status": "ok", "reason": "", "image_id": "sha256:ab",
        "stages": {"prepare": {"seconds": 0.12, "status": "ok"},
                   "run": {"seconds": 30.1, "status": "ok", "exit_code": 0}},
    }  # fmt: skip
    assert list(json.loads(Path(path).read_text())) == [
        "rank", "node", "exit_code", "status", "reason", "image_id", "stages"
    ]  # fmt: skip
    status = read_status(path)
    assert status is not None and status.readable and status.error == ""
    assert (status.node, status.exit_code, status.status, status.reason, status.image_id) == (
        "node2", 0, "ok", "", "sha256:ab"
    )  # fmt: skip
    assert status.stages["run"] == {"seconds": 30.1, "status": "ok", "exit_code": 0}
    assert statusfile.has_status(str(tmp_path / "node_1")) and not statusfile.has_status(str(tmp_path))


@pytest.mark.parametrize(
    ("exit_code", "terminated", "status"),
    [(0, False, "ok"), (0, True, "terminated"), (124, False, "timeout"), (124, True, "timeout"),
     (1, False, "failed"), (137, True, "failed")],
)  # fmt: skip
def test_the_status_word_comes_from_the_exit_code_and_the_signal(
    exit_code: int, terminated: bool, status: str
):
    assert status_document(0, "n", exit_code, "", "", [], terminated)["status"] == status


def test_a_missing_file_is_none_and_never_an_error(tmp_path: Path):
    assert read_status(str(tmp_path / "status.json")) is None
    assert read_status(str(tmp_path / "no-dir" / "status.json")) is None
    (tmp_path / "a-file").write_text("x")
    assert read_status(str(tmp_path / "a-file" / "status.json")) is None  # the node dir is a file
    assert read_status(str(tmp_path / "nul\0" / "status.json")) is None
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere")
    assert read_status(str(tmp_path / "dangling.json")) is None


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b'{"rank": 0, "exit', "Unterminated string starting at: line 1 column 13 (char 12)"),
        (b"", "Expecting value: line 1 column 1 (char 0)"),
        (b"[1, 2]", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'{"a": "\xff"}', "'utf-8' codec can't decode byte 0xff in position 7: invalid start byte"),
        (b"[" * 100_000 + b"]" * 100_000, None),  # too deep: RecursionError, worded by Python
    ],
)
def test_garbage_is_a_status_with_an_error_and_never_raises(tmp_path: Path, content: bytes, error: Any):
    path = tmp_path / "status.json"
    path.write_bytes(content)
    status = read_status(str(path))
    assert status is not None and not status.readable and status.document == {}
    assert status.error == error if error else status.error
    assert "\n" not in status.error


def test_an_unreadable_file_is_a_status_with_the_os_error(tmp_path: Path):
    (tmp_path / "status.json").mkdir()
    assert read_status(str(tmp_path / "status.json")) == Status({}, "Is a directory")


@pytest.mark.parametrize(
    "data",
    [b'{"a": 1,\r\n "b": [1,\r 2]}', b'{\r\n"a": "x\ty"}', b'{"a": "x\r\ny"}', b"\xef\xbb\xbf{}", b"{} x"],
)
def test_the_file_reads_as_it_reads_in_text_mode(tmp_path: Path, data: bytes):
    path = tmp_path / "status.json"
    path.write_bytes(data)
    try:
        with open(path, encoding="utf-8") as handle:
            expected = Status(json.load(handle))
    except ValueError as exc:
        expected = Status({}, str(exc).splitlines()[0])
    assert read_status(str(path)) == expected


def test_values_of_any_type_are_handed_over_as_they_are(tmp_path: Path):
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"exit_code": "1", "node": None, "stages": [1], "extra": {"a": 1}}))
    status = read_status(str(path))
    assert status is not None and status.readable
    assert (status.exit_code, status.node, status.stages, status.get("extra")) == ("1", None, {}, {"a": 1})


def test_the_node_status_command_writes_it_and_says_what_is_wrong_in_one_line(tmp_path: Path):
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    path = tmp_path / "node_0" / "status.json"
    args = ["--file", str(path), "--rank", "0", "--node", "node1", "--exit-code", "0", "--reason", "",
            "--image-id", "sha256:ab", "--stage", "run:1.5:ok:0"]  # fmt: skip
    node_status = [sys.executable, "-m", "slurm_multi", "node", "status"]
    proc = subprocess.run([*node_status, *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert read_status(str(path)) == Status(
        status_document(0, "node1", 0, "", "sha256:ab", ["run:1.5:ok:0"], False)
    )
    proc = subprocess.run([*node_status, "x"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1
    assert (
        proc.stderr.startswith("slurm-multi: node status: ")
        and "Usage: slurm-multi node status" in proc.stderr
    )


@pytest.mark.parametrize("seconds", ["nan", "inf", "-inf", "1e999", "-1", "-0.5"])
def test_a_stage_time_that_is_not_finite_or_is_negative_is_refused_in_one_line(tmp_path: Path, seconds: str):
    # json.dump wrote "seconds": NaN (no JSON reader takes it); inf and negatives are no stage time.
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    path = tmp_path / "status.json"
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "node", "status", "--file", str(path), "--rank", "1", "--node",
         "node2", "--exit-code", "0", "--stage", f"run:{seconds}:ok:0"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and not path.exists()
    assert proc.stderr.splitlines() == [
        f"slurm-multi: node status: --stage 'run:{seconds}:ok:0': seconds must be a finite number 0 or more"
    ]


def test_a_dead_nodes_lost_status_is_written_here_and_judged_failed(tmp_path: Path):
    from slurm_multi import watch

    watch.write_lost_status(str(tmp_path), 1, "node2", "DOWN*")
    status = read_status(status_path(str(tmp_path / "node_1")))
    assert status is not None and status.document == {
        "rank": 1, "node": "node2", "exit_code": 137, "status": "failed",
        "reason": "Slurm reports node2 DOWN*: the node (or its slurmd) died during the job",
        "image_id": "", "stages": {},
    }  # fmt: skip
    # A rank that staged keeps what it wrote.
    write_status(status_path(str(tmp_path / "node_0")), status_document(0, "node1", 0, "", "", [], False))
    watch.write_lost_status(str(tmp_path), 0, "node1", "DOWN")
    status0 = read_status(status_path(str(tmp_path / "node_0")))
    assert status0 is not None and status0.status == "ok"


# ---- one owner -----------------------------------------------------------------------------------


def _path_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant (an f-string's literal parts too) that names the file: `status.json`
    or `…/status.json`, without spaces (a message or a docstring that mentions it is not a path)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if text == "status.json" or (
                text.endswith("/status.json") and not any(c.isspace() for c in text)
            ):
                found.append((node.lineno, node.value))
    return found


def test_no_module_but_statusfile_names_the_file_it_opens():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "statusfile.py" and path.parent == PACKAGE:
            continue
        for line, text in _path_literals(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert offenders == [], "open status.json through slurm_multi.statusfile (status_path, read_status)"
    # The scan sees what it looks for.
    sample = (
        'open(os.path.join(d, "status.json"))\nPath(f"{d}/status.json").read_text()\nprint("no status.json")'
    )
    assert [text for _, text in _path_literals(ast.parse(sample))] == ["status.json", "/status.json"]
    assert _path_literals(ast.parse((PACKAGE / "statusfile.py").read_text())) != []
