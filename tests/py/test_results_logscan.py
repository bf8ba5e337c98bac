"""results.logscan and results.logmetrics: error patterns and tracebacks in node logs, the chunked
fast path (same answers as line by line), and the `performance: <value> <metric>` fallback lines."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi.results import logscan
from slurm_multi.results.logmetrics import combine_metric, parse_perf_lines
from slurm_multi.results.logscan import scan_log_errors

LOGS = Path(__file__).parent / "data" / "results" / "logs"


# ----------------------------------------------------------------------------- scan_log_errors


@pytest.mark.parametrize("name", ["torchrun_sigterm_cleanup.log", "torchrun_sigterm_cleanup_torch1.log"])
def test_the_traceback_torchrun_prints_when_it_sigterms_its_workers_is_not_an_error(name: str):
    text = (LOGS / name).read_text()
    assert "SignalException" in text and "death signal, shutting down workers" in text
    assert scan_log_errors(text) == []
    assert scan_log_errors(text, [*logscan.DEFAULT_ERROR_PATTERNS, "Exception", "signal"]) == []


def test_a_real_traceback_counts_once_at_its_exception_line_despite_interleaved_ranks():
    hits = scan_log_errors((LOGS / "real_traceback_rank_prefixed.log").read_text())
    assert [(h.line, h.pattern) for h in hits] == [(10, "RuntimeError"), (17, "Traceback")]
    assert hits[0].text == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert hits[1].text == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"


def test_a_traceback_with_any_exception_counts_as_traceback():
    hits = scan_log_errors((LOGS / "plain_traceback.log").read_text())
    assert [(h.line, h.pattern, h.text) for h in hits] == [
        (7, "Traceback", "KeyError: 'libero_object_no_noops_id'")
    ]


def test_a_traceback_cut_off_by_the_end_of_the_log_has_no_error_line_so_it_does_not_count():
    text = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    main()\n'
    assert scan_log_errors(text) == []


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("RuntimeError: NCCL communicator was aborted", "RuntimeError"),
        ("CUDA error: device-side assert triggered", "CUDA error"),
        ("HIP error: invalid device function", "HIP error"),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", "NCCL error"),
        ("Segmentation fault (core dumped)", "Segmentation fault"),
        ("Memory cgroup out of memory: Killed process 4242 (python3)", "out of memory"),
        ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB", "out of memory"),
        ("container killed: OOM", "out of memory"),
        ("ModuleNotFoundError: No module named 'apex'", "ModuleNotFoundError"),
        ("Aborted (core dumped)", "core dumped"),
    ],
)
def test_each_default_error_pattern_catches_its_line(line: str, pattern: str):
    hits = scan_log_errors(f"ok\n{line}\n")
    assert [(h.line, h.pattern) for h in hits] == [(2, pattern)]


@pytest.mark.parametrize(
    "line", ["BLOOM-176B loaded", "zoom=2 room=3", "NCCL INFO Channel 00/0", "no errors"]
)
def test_ordinary_lines_are_not_errors(line: str):
    assert scan_log_errors(line) == []


def test_user_patterns_are_named_by_their_regex():
    hits = scan_log_errors("a\nFATAL: disk full\n", ["FATAL|PANIC"])
    assert [(h.line, h.pattern) for h in hits] == [(2, "FATAL|PANIC")]


# ----------------------------------------------------------------------------- log metrics


def test_perf_lines_are_parsed_with_prefixes_node_ids_and_trailing_commas():
    lines = parse_perf_lines(
        "performance: 14164.2 samples_per_second\n"
        "[rank0] performance: 7082.1 samples_per_second node_id: 2\n"
        "performance: 1.5e3 tokens/s, node_id: 1\n"
        "throughput performance: fast things\n"
        "my_performance: 3 x\n"
    )
    assert [(p.line, p.value, p.metric, p.node_id) for p in lines] == [
        (1, 14164.2, "samples_per_second", None),
        (2, 7082.1, "samples_per_second", 2),
        (3, 1500.0, "tokens/s", 1),
        (5, 3.0, "x", None),  # madengine's regex has no word boundary before `performance:` either
    ]


@pytest.mark.parametrize(
    ("metric", "values", "expected", "rule"),
    [
        ("samples_per_second", [7082.1, 7082.1], 14164.2, "sum (throughput)"),
        ("tokens/s", [10.0, 20.0], 30.0, "sum (throughput)"),
        ("TFLOPS", [100.0, 110.0], 210.0, "sum (throughput)"),
        ("GB/s", [1.0, 2.0], 3.0, "sum (throughput)"),
        ("ttft_ms", [12.0, 14.0], 13.0, "mean (latency)"),
        ("step_time", [1.0, 3.0], 2.0, "mean (latency)"),
        ("p99_latency", [5.0, 7.0], 6.0, "mean (latency)"),
        ("peak_memory_GB", [30.5, 41.25], 41.25, "max (memory)"),
        ("vram_MiB", [100.0, 50.0], 100.0, "max (memory)"),
        ("accuracy", [0.91, 0.93], 0.92, "mean (unknown metric kind)"),
        ("tok_per_s_per_gpu", [500.0, 520.0], 510.0, "mean (per-device throughput)"),
        ("TFLOPS_per_gpu", [500.0, 520.0], 510.0, "mean (per-device throughput)"),
    ],
)
def test_metrics_combine_across_nodes_by_meaning(metric, values, expected, rule):
    value, used = combine_metric(metric, values)
    assert used == rule
    assert value == pytest.approx(expected)


# ----------------------------------------------------------------------------- fast paths (same answers)

LOG_PIECES = [
    "step 3/20 | loss 2.31",
    "no errors here",
    "room zoom bloom",
    "hiperror and ncclsystemerror in lower case",
    "RuntimeError: boom",
    "xRuntimeErrorx",
    "xOOMx",
    "container killed: OOM",
    "Out Of Memory",
    "CUDA error: bad",
    "[rank0]: Traceback (most recent call last):",
    "Traceback (most recent call last):",
    '  File "x.py", line 3, in <module>',
    "    raise KeyError(1)",
    "KeyError: 1",
    "[rank0]: ValueError: bad",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15",
    "FATAL: disk full",
    "end of line",
    "",
    "   ",
    "İſK ünïcode \x00 \x1b[31m",
]
LOG_LINE_ENDS = ["\n", "\r\n", "\r"]
USER_PATTERN_SETS = [(), ("FATAL",), (r"^FATAL", r"line$"), (r"(?<=x)OOM",), (r"(?i)end of",)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(LOG_PIECES), st.sampled_from(LOG_LINE_ENDS)), max_size=60),
    st.booleans(),
    st.sampled_from(USER_PATTERN_SETS),
    st.booleans(),
    st.sampled_from([(1 << 20, 64 * 1024), (1, 1), (7, 16), (64, 100)]),
    st.binary(max_size=3),
)
def test_scan_log_file_gives_what_scanning_the_files_lines_gives(
    lines, final_end, extra, defaults, sizes, junk
):
    """scan_log_file reads in chunks and skips chunks without a possible hit; the reference is
    scan_log_errors over the lines of the file opened as text with newline=""."""
    data = "".join(text + end for text, end in lines)
    data = data if final_end else data.rstrip("\r\n")
    patterns = logscan.compile_patterns(list(extra), defaults=defaults)
    chunk_chars, read_block = sizes
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.log"
        path.write_bytes(data.encode() + junk)
        with open(path, encoding="utf-8", errors="replace", newline="") as handle:
            expected = scan_log_errors(handle, patterns)
        saved = logscan.SCAN_CHUNK_CHARS, logscan.READ_BLOCK
        logscan.SCAN_CHUNK_CHARS, logscan.READ_BLOCK = chunk_chars, read_block
        try:
            assert logscan.scan_log_file(path, patterns) == expected
        finally:
            logscan.SCAN_CHUNK_CHARS, logscan.READ_BLOCK = saved


def test_a_hit_deep_in_a_log_larger_than_a_chunk_keeps_its_line_number(tmp_path: Path):
    lines = [f"iteration {n} | loss 2.0\r\n" if n % 3 else f"iteration {n}\r" for n in range(1, 150001)]
    lines[120000] = "RuntimeError: late\n"
    path = tmp_path / "node.log"
    path.write_text("".join(lines), newline="")
    assert path.stat().st_size > 2 * logscan.SCAN_CHUNK_CHARS
    hits = logscan.scan_log_file(path, logscan.DEFAULT_ERROR_PATTERNS)
    assert [(h.line, h.pattern, h.text) for h in hits] == [(120001, "RuntimeError", "RuntimeError: late")]


LITERAL_ALPHABET = st.sampled_from(
    ["RuntimeError", "CUDA error", "HIP error", "hipErrorX", "NCCL error", "RCCL error", "ncclSystemError",
     "ncclInternalError", "Segmentation fault", "SIGSEGV", "OOM", "oUT oF MeMoRy", "OutOfMemoryError",
     "ModuleNotFoundError", "core dumped", "x", "_", " ", "-", "é", "İ", "ſ", "K", "Runtime", "Error",
     "error"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(LITERAL_ALPHABET, max_size=6).map("".join))
def test_the_chunk_prefilter_never_rules_out_a_line_a_default_pattern_matches(line: str):
    prefilter = logscan._prefilter(tuple(p.regex for p in logscan.DEFAULT_ERROR_PATTERNS))
    if any(p.regex is not None and p.regex.search(line) for p in logscan.DEFAULT_ERROR_PATTERNS):
        assert prefilter.may_hit(line)
        assert prefilter.may_hit(f"before\n{line}\r\nafter")


ASCII_ALPHABET = st.sampled_from(
    ["RuntimeError", "CUDA error", "HIP error", "hipErrorX", "NCCL error", "ncclSystemError",
     "Segmentation fault", "SIGSEGV", "OOM", "oom", "oUT oF MeMoRy", "OutOfMemoryError",
     "ModuleNotFoundError", "core dumped", "CORE DUMPED", "Traceback (most recent call last):", "TRACEBACK",
     "ERROR", "Error", "rror", "x", " ", "\n", "\r", "my_marker", "MY_MARKER"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(ASCII_ALPHABET, max_size=8).map("".join))
def test_the_prefilter_over_ascii_bytes_says_what_it_says_over_the_text(text: str):
    """scan_log_file asks may_hit_ascii of an all-ASCII file, without decoding it: it must answer as
    may_hit over the decoded text does, for the default patterns, a user's literal pattern (matched
    as given or lower-cased) and a user's regex (every text a possible hit)."""
    sets = [
        logscan.DEFAULT_ERROR_PATTERNS,
        logscan.compile_patterns(["my_marker"], defaults=logscan.DEFAULT_ERROR_PATTERNS),
        logscan.compile_patterns([r"^fatal\b"], defaults=()),
    ]
    for patterns in sets:
        prefilter = logscan._prefilter(tuple(p.regex for p in patterns))
        assert prefilter.may_hit_ascii(text.encode()) == prefilter.may_hit(text), (text, patterns)


def test_every_default_pattern_has_literals_so_clean_logs_skip_the_regexes():
    for pattern in logscan.DEFAULT_ERROR_PATTERNS:
        if pattern.regex is not None:
            assert (pattern.regex.pattern, pattern.regex.flags) in logscan._REQUIRED_LITERALS, pattern.name
    prefilter = logscan._prefilter(tuple(p.regex for p in logscan.DEFAULT_ERROR_PATTERNS))
    assert not prefilter.always and not prefilter.regexes
    assert not prefilter.may_hit("iteration 10 | lm loss 2.3 | no errors, room to zoom\n" * 50)


def test_out_of_memory_matches_no_character_whose_lower_case_is_not_in_the_phrase():
    """The prefilter looks for 'out of memory' in text.lower(): true only if every character the
    case-insensitive regex accepts for a letter of it lower-cases to that letter."""
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    for letter in set("out of memory"):
        assert {c.lower() for c in re.findall(f"(?i:{letter})", every)} == {letter}


@pytest.mark.parametrize(
    "line",
    [
        "performance: inf samples_per_second",
        "performance: nan samples_per_second",
        "performance: 1e999 samples_per_second",
        "performance: \u0661\u0662\u0663 samples_per_second",  # Arabic-Indic digits: float() reads them
        "performance: 1,234.5 samples_per_second",
        "performance: error samples_per_second",
    ],
)
def test_a_perf_line_counts_only_with_a_finite_ascii_number_like_a_csv_cell(line: str):
    assert parse_perf_lines(f"{line}\n") == []
