"""mounts dedup: every docker mount syntax, trailing slashes, options, duplicates in both places."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi.cli import group
from slurm_multi.common import HelperError
from slurm_multi.mounts import dedup_mounts, find_targets, normalise_path


def dedup(args: list[str], **kwargs: Any):
    return CliRunner().invoke(group, ["mounts", "dedup", *args], **kwargs)


def dropped_lines(stderr: str) -> list[str]:
    """stderr talk lines without their `<time> <host> r<rank> ` prefix."""
    return [line.split(" ", 3)[3] for line in stderr.splitlines()]


def test_free_mounts_are_appended_after_the_options_unchanged() -> None:
    result = dedup(
        ["--mount", "/scratch:/data", "--mount", "/ckpt:/ckpt:ro", "--", "--shm-size", "1G", "--ipc", "host"]
    )
    assert result.exit_code == 0
    assert result.stdout == "--shm-size\n1G\n--ipc\nhost\n-v\n/scratch:/data\n-v\n/ckpt:/ckpt:ro\n"
    assert result.stderr == ""


def test_nul_terminated_output() -> None:
    result = dedup(["-0", "--mount", "/a:/b", "--", "-e", "X=1"])
    assert result.stdout == "-e\0X=1\0-v\0/a:/b\0"


def test_no_options_and_no_mounts_prints_nothing() -> None:
    result = dedup([])
    assert result.exit_code == 0
    assert result.stdout == ""


@pytest.mark.parametrize(
    "docker_opts",
    [
        ["-v", "/dev/shm:/data"],
        ["-v/dev/shm:/data"],
        ["-itv", "/dev/shm:/data"],
        ["--volume", "/dev/shm:/data"],
        ["--volume=/dev/shm:/data"],
        ["-v", "/dev/shm:/data:ro"],
        ["-v", "/dev/shm:/data/:rw"],
        ["-v", "named_volume:/data"],
        ["-v", "/data"],
        ["--mount", "type=bind,source=/dev/shm,target=/data"],
        ["--mount", "target=/data,type=bind,source=/dev/shm"],
        ["--mount", "type=bind,src=/dev/shm,dst=/data"],
        ["--mount", "type=bind,src=/dev/shm,destination=/data/,readonly"],
        ["--mount=type=volume,dst=/data"],
        ["--mount", '"type=bind","source=/a,b","target=/data"'],
        ["--tmpfs", "/data:rw,size=1g"],
        ["--tmpfs=/data"],
    ],
)
def test_every_docker_mount_syntax_is_recognised_as_a_target(docker_opts: list[str]) -> None:
    result = dedup(["--mount", "/scratch:/data", "--", "--ipc", "host", *docker_opts])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ["--ipc", "host", *docker_opts]
    assert dropped_lines(result.stderr) == [
        "mounts: dropped -v /scratch:/data (container path /data already mounted)"
    ]


@pytest.mark.parametrize(
    ("mount", "existing"),
    [
        ("/a:/data/", "/data"),
        ("/a:/data", "/data/"),
        ("/a:/data//", "//data"),
        ("/a:/x/../data", "/data/."),
    ],
)
def test_trailing_slashes_and_dots_are_the_same_container_path(mount: str, existing: str) -> None:
    args, dropped = dedup_mounts(["-v", f"/h:{existing}"], [mount])
    assert args == ["-v", f"/h:{existing}"]
    assert dropped == [f"dropped -v {mount} (container path /data already mounted)"]


def test_read_only_option_is_kept_and_does_not_change_the_target() -> None:
    args, dropped = dedup_mounts([], ["/models:/models:ro", "/other:/models:rw"])
    assert args == ["-v", "/models:/models:ro"]
    assert dropped == ["dropped -v /other:/models:rw (container path /models already mounted)"]


def test_duplicates_among_the_mounts_first_wins() -> None:
    result = dedup(["--mount", "/a:/data", "--mount", "/b:/data/", "--mount", "/c:/other", "--"])
    assert result.stdout == "-v\n/a:/data\n-v\n/c:/other\n"
    assert dropped_lines(result.stderr) == [
        "mounts: dropped -v /b:/data/ (container path /data already mounted)"
    ]


def test_duplicates_inside_the_docker_options_first_wins() -> None:
    args, dropped = dedup_mounts(
        ["-v", "/a:/data", "--ipc", "host", "--volume=/b:/data/", "-itv", "/c:/data", "--rm"], ["/d:/data"]
    )
    assert args == ["-v", "/a:/data", "--ipc", "host", "-it", "--rm"]
    assert dropped == [
        "dropped --volume /b:/data/ (container path /data already mounted)",
        "dropped -v /c:/data (container path /data already mounted)",
        "dropped -v /d:/data (container path /data already mounted)",
    ]


def test_values_of_other_options_are_not_read_as_mounts() -> None:
    args, dropped = dedup_mounts(["-e", "-v", "--name", "--volume", "-w", "/data"], ["/a:/data"])
    assert dropped == []
    assert args == ["-e", "-v", "--name", "--volume", "-w", "/data", "-v", "/a:/data"]


def test_find_targets_reports_positions_and_widths() -> None:
    assert find_targets(["--rm", "-v", "/a:/b/", "--mount=type=bind,target=/c", "-v/d:/e"]) == [
        (1, 2, "/b", "-v /a:/b/"),
        (3, 1, "/c", "--mount type=bind,target=/c"),
        (4, 1, "/e", "-v /d:/e"),
    ]


@pytest.mark.parametrize(
    ("mount", "message"),
    [
        ("nocolon", "mounts: --mount 'nocolon' is not HOST:CONTAINER[:ro|rw]"),
        ("/a:data", "mounts: --mount '/a:data': the container path must be absolute"),
        ("/a:", "mounts: --mount '/a:': the container path must be absolute"),
        (":/data", "mounts: --mount ':/data' has an empty host path"),
        ("/a:/b:c:d", "mounts: --mount '/a:/b:c:d' is not HOST:CONTAINER[:ro|rw]"),
        ("/a:/b:rx", "mounts: --mount '/a:/b:rx': unknown mount option 'rx' (use ro or rw)"),
    ],
)
def test_malformed_mount_is_a_one_line_usage_error(mount: str, message: str) -> None:
    result = dedup(["--mount", mount, "--", "--rm"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"slurm-multi: {message}\n"


def test_malformed_mount_raises_from_the_function() -> None:
    with pytest.raises(HelperError) as err:
        dedup_mounts([], ["relative"])
    assert err.value.exit_code == 2


def test_newline_in_an_argument_needs_nul_output() -> None:
    result = dedup(["--", "--label", "a\nb"])
    assert result.exit_code == 2
    assert (
        result.stderr
        == "slurm-multi: mounts: an argument contains a newline; use -0 for NUL-terminated output\n"
    )
    assert dedup(["-0", "--", "--label", "a\nb"]).stdout == "--label\0a\nb\0"


@pytest.mark.parametrize(
    ("path", "normal"),
    [("/data/", "/data"), ("//data", "/data"), ("/a/./b/../c", "/a/c"), ("/", "/"), ("///", "/")],
)
def test_normalise_path(path: str, normal: str) -> None:
    assert normalise_path(path) == normal


# ---------------------------------------------------------------------------------------------
# Properties

SEGMENTS = st.sampled_from(["data", "ckpt", "x", "models", ".", ".."])
CONTAINER_PATHS = st.lists(SEGMENTS, min_size=1, max_size=3).map(
    lambda parts: "/" + "/".join(parts)
) | st.sampled_from(["/data/", "//data", "/data//", "/"])
HOSTS = st.sampled_from(["/scratch", "/dev/shm", "vol", "/a b"])
SUFFIXES = st.sampled_from(["", ":ro", ":rw", ":ro,z"])


@st.composite
def docker_mount(draw: st.DrawFn) -> list[str]:
    host, target, suffix = draw(HOSTS), draw(CONTAINER_PATHS), draw(SUFFIXES)
    form = draw(st.integers(0, 8))
    return [
        ["-v", f"{host}:{target}{suffix}"],
        [f"-v{host}:{target}{suffix}"],
        ["--volume", f"{host}:{target}{suffix}"],
        [f"--volume={host}:{target}{suffix}"],
        ["--mount", f"type=bind,source={host},target={target}"],
        ["--mount", f"dst={target},type=volume"],
        [f"--mount=type=bind,src={host},destination={target}"],
        ["--tmpfs", target],
        ["-itv", f"{host}:{target}"],
    ][form]


OTHER_OPTS = st.sampled_from([["--rm"], ["--ipc", "host"], ["-e", "A=1"], ["--shm-size", "1G"], ["-it"]])


@settings(max_examples=400, deadline=None)
@given(
    opts=st.lists(docker_mount() | OTHER_OPTS, max_size=6).map(lambda groups: [w for g in groups for w in g]),
    mounts=st.lists(
        st.tuples(HOSTS, CONTAINER_PATHS, SUFFIXES).map(lambda t: f"{t[0]}:{t[1]}{t[2]}"), max_size=6
    ),
)
def test_property_output_never_mounts_one_container_path_twice(opts: list[str], mounts: list[str]) -> None:
    args, dropped = dedup_mounts(opts, mounts)
    targets = [target for _, _, target, _ in find_targets(args)]
    assert len(targets) == len(set(targets))
    # Nothing silently lost: every target of the input is still mounted, every drop is reported.
    wanted = {target for _, _, target, _ in find_targets(opts)} | {
        normalise_path(m.split(":")[1]) for m in mounts
    }
    assert set(targets) == wanted
    input_count = len(find_targets(opts)) + len(mounts)
    assert len(targets) + len(dropped) == input_count
    # The non-mount options survive in order (`-itv X` whose mount is dropped leaves `-it`).
    keep = ("--rm", "--ipc", "host", "-e", "A=1", "--shm-size", "1G", "-it", "-itv")

    def flags(words: list[str]) -> list[str]:
        return ["-it" if w == "-itv" else w for w in words if w in keep]

    assert flags(args) == flags(opts)


@settings(max_examples=200, deadline=None)
@given(opts=st.lists(st.text(max_size=12), max_size=8), mounts=st.lists(st.text(max_size=12), max_size=4))
def test_property_random_words_never_crash(opts: list[str], mounts: list[str]) -> None:
    try:
        args, _ = dedup_mounts(opts, mounts)
    except HelperError as err:
        assert err.exit_code == 2
        assert "\n" not in err.format_message()
        return
    targets = [target for _, _, target, _ in find_targets(args)]
    assert len(targets) == len(set(targets))
