"""gpus: noisy amd-smi parsing, nvidia-smi parsing, detection through the fakes, docker GPU args."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi.cli import group
from slurm_multi.common import HelperError
from slurm_multi.gpus import (
    MAX_NESTING,
    decodable_blocks,
    detect_gpus,
    docker_gpu_args,
    find_gpu_list,
    format_indexes,
    parse_amdsmi,
    parse_docker_gpus,
    parse_nvidia_smi,
)

DATA = Path(__file__).parent / "data" / "amdsmi"
FAKES = Path(__file__).resolve().parents[1] / "fakes"
PY_SRC = Path(__file__).resolve().parents[2] / "py"


def amd_gpu(index: int) -> dict[str, Any]:
    """What the fake (and the fixtures made from it) report for GPU `index`."""
    return {
        "index": index,
        "bdf": f"0000:{0x0C + 0x10 * index:02x}:00.0",
        "render": f"renderD{128 + 8 * index}",
        "uuid": f"1fff74a1-0000-1000-80{index:02x}-4f4b3e2a1d{index:02x}",
    }


FOUR_AMD = {"vendor": "AMD", "count": 4, "gpus": [amd_gpu(i) for i in range(4)]}


def cli(args: list[str], **kwargs: Any):
    return CliRunner().invoke(group, ["gpus", *args], **kwargs)


@pytest.fixture()
def fake_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """PATH = a dir holding only the chosen fakes, plus the system dirs the fakes need (bash, sleep)."""

    def use(*tools: str) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        for tool in tools:
            (bin_dir / tool).symlink_to(FAKES / tool)
        monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    for name in list(os.environ):
        if name.startswith(("FAKE_AMDSMI_", "FAKE_NVIDIA_")):
            monkeypatch.delenv(name)
    return use


# ---------------------------------------------------------------------------------------------
# gpus parse over real fixture files


@pytest.mark.parametrize(
    "fixture",
    [
        "list_e_clean.json",
        "list_e_warning.txt",
        "list_e_bracket_preamble.txt",
        "list_e_banner.txt",
        "list_e_double.txt",
        "list_e_watch.txt",
        "list_e_all_noise.txt",
    ],
)
def test_parse_reads_four_gpus_through_every_kind_of_noise(fixture: str) -> None:
    result = cli(["parse", str(DATA / fixture)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == FOUR_AMD


def test_bracket_preamble_fixture_really_starts_with_a_bracket() -> None:
    assert (DATA / "list_e_bracket_preamble.txt").read_text().startswith("[WARN] ")


def test_duplicated_block_is_not_double_counted() -> None:
    text = (DATA / "list_e_double.txt").read_text()
    assert text.count('"gpu": 0') == 2
    assert parse_amdsmi(text)["count"] == 4


def test_json_like_preamble_lines_are_skipped() -> None:
    """`[0] retrying`, a JSON log object and an empty `[]` before the real list do not win."""
    gpus = parse_amdsmi((DATA / "list_e_json_like_preamble.txt").read_text())["gpus"]
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    assert [gpu["render"] for gpu in gpus] == ["renderD128", "renderD136"]


@pytest.mark.parametrize(("before", "after"), [("[\n", "\n]"), ('{"log": ', "}"), ("[[WARN]]\n[", "]")])
def test_noise_that_wraps_the_block_into_bigger_json_does_not_hide_it(before: str, after: str) -> None:
    text = before + (DATA / "list_e_clean.json").read_text() + after
    assert parse_amdsmi(text) == FOUR_AMD


def test_wrapped_static_output_with_value_unit_objects() -> None:
    result = cli(["parse", str(DATA / "static_wrapped.json")])
    assert json.loads(result.stdout) == {
        "vendor": "AMD",
        "count": 4,
        "gpus": [{**amd_gpu(i), "render": None, "uuid": None} for i in range(4)],
    }


def test_static_list_output_reads_the_bus_bdf() -> None:
    gpus = parse_amdsmi((DATA / "static_list.json").read_text())["gpus"]
    assert [gpu["bdf"] for gpu in gpus] == [amd_gpu(i)["bdf"] for i in range(4)]


def test_wrapped_metric_output_after_a_warning() -> None:
    assert parse_amdsmi((DATA / "metric_wrapped_warning.txt").read_text())["count"] == 4


def test_na_values_become_null() -> None:
    result = cli(["parse", str(DATA / "list_e_na_values.json")])
    assert json.loads(result.stdout)["gpus"] == [
        {"index": 0, "bdf": "0000:0c:00.0", "render": None, "uuid": None},
        {"index": 1, "bdf": None, "render": "renderD136", "uuid": "1fff74a1-0000-1000-8001-4f4b3e2a1d01"},
    ]


def test_value_unit_objects_are_unwrapped() -> None:
    text = (
        '[{"gpu": {"value": 3, "unit": ""}, "bdf": {"value": "0000:0c:00.0", "unit": ""}, '
        '"render": "renderD9"}]'
    )
    assert parse_amdsmi(text)["gpus"] == [
        {"index": 3, "bdf": "0000:0c:00.0", "render": "renderD9", "uuid": None}
    ]


def test_stdin_is_the_default_input() -> None:
    result = cli(["parse"], input=(DATA / "list_e_warning.txt").read_text())
    assert json.loads(result.stdout) == FOUR_AMD


@pytest.mark.parametrize(
    ("fixture", "shown"),
    [
        ("empty.txt", "empty input"),
        ("blank_lines.txt", "empty input"),
        ("version.json", '[{"tool": "AMDSMI Tool", "version": "25.5.1", "amdsmi_librar'),
        ("garbage.txt", "AMDSMI_STATUS_INIT_ERROR: amdgpu driver not loaded\\n[ERROR] c"),
        ("stderr_merged_truncated.txt", "WARNING: User is missing the following required groups: rend"),
    ],
)
def test_output_without_a_gpu_list_is_a_one_line_error(fixture: str, shown: str) -> None:
    result = cli(["parse", str(DATA / fixture)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == f"slurm-multi: gpus: no GPU list in amd-smi output ({shown})\n"


def test_missing_input_file_is_a_usage_error(tmp_path: Path) -> None:
    result = cli(["parse", str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert (
        result.stderr == f"slurm-multi: gpus: {tmp_path}/nope.json: cannot read (No such file or directory)\n"
    )


def test_empty_gpu_list_means_no_gpus() -> None:
    assert parse_amdsmi("[]\n") == {"vendor": "AMD", "count": 0, "gpus": []}
    assert parse_amdsmi('{"cpu_data": [], "gpu_data": []}') == {"vendor": "AMD", "count": 0, "gpus": []}


def test_a_later_non_empty_list_beats_an_empty_one() -> None:
    assert parse_amdsmi('WARNING: groups []\n[{"gpu": 0}]')["count"] == 1


def test_deep_nesting_is_not_a_crash() -> None:
    assert find_gpu_list("[" * 50000) is None


@pytest.fixture()
def decode_attempts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the start of every raw_decode call (the old search tried one at every `[`/`{`)."""
    starts: list[int] = []
    real = json.JSONDecoder.raw_decode

    def counting(self: json.JSONDecoder, text: str, idx: int = 0) -> Any:
        starts.append(idx)
        return real(self, text, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    return starts


HOSTILE = {
    "brackets": "[",
    "braces": "{",
    "bracket-brace": "[{",
    "gpu-key-list": '{"gpu": [',
    "quoted-bracket": '"[',
    "spaced-brackets": "[ ",
}


@pytest.mark.parametrize("unit", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_output_costs_no_decode_attempts(unit: str, decode_attempts: list[int]) -> None:
    """raw_decode runs only where it succeeds, so 100 kB of openers is not 100 000 tries."""
    assert find_gpu_list(unit * (100_000 // len(unit))) is None
    assert decode_attempts == []


def test_a_line_of_digits_is_no_gpu_list(decode_attempts: list[int]) -> None:
    assert find_gpu_list("1" * 1_000_000) is None
    assert find_gpu_list("[" + "1" * 1_000_000 + "]") is None
    assert decode_attempts == []


def test_noisy_output_is_decoded_once(decode_attempts: list[int]) -> None:
    text = (DATA / "list_e_double.txt").read_text()
    assert parse_amdsmi(text) == FOUR_AMD
    assert decode_attempts == [text.index("[{")]


def test_a_gpu_list_after_a_megabyte_of_brackets_is_found(decode_attempts: list[int]) -> None:
    text = "[" * 1_000_000 + "\n" + VALID_BLOCK
    assert parse_amdsmi(text) == FOUR_AMD
    assert len(decode_attempts) == 1


def test_parse_of_a_megabyte_of_brackets_finishes(tmp_path: Path) -> None:
    """The old search took 78 s here; 30 s is far more than the linear one needs on any machine."""
    hostile = tmp_path / "brackets.txt"
    hostile.write_text("[" * 1_000_000)
    done = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "gpus", "parse", str(hostile)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": str(PY_SRC)},
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr == "slurm-multi: gpus: no GPU list in amd-smi output (" + "[" * 60 + ")\n"


def test_nesting_deeper_than_the_limit_does_not_decode_but_its_inside_does() -> None:
    scan_once = json.JSONDecoder().scan_once
    at_limit = "[" * MAX_NESTING + "]" * MAX_NESTING
    assert decodable_blocks(at_limit, scan_once)[0] == (0, len(at_limit))
    too_deep = "[" + at_limit + "]"
    assert decodable_blocks(too_deep, scan_once)[0] == (1, len(too_deep) - 1)
    assert parse_amdsmi("[" * 100 + VALID_BLOCK + "]" * 100) == FOUR_AMD


def test_bool_or_negative_gpu_index_is_not_a_gpu_list() -> None:
    assert find_gpu_list('[{"gpu": true}]') is None
    assert find_gpu_list('[{"gpu": -1}]') is None


def test_render_that_is_not_a_render_node_name_is_ignored() -> None:
    gpus = parse_amdsmi('[{"gpu": 0, "render": "../../etc/passwd"}]')["gpus"]
    assert gpus[0]["render"] is None


# ---------------------------------------------------------------------------------------------
# nvidia-smi


def test_parse_nvidia_smi_query_output() -> None:
    text = "0, 00000000:18:00.0, GPU-aaaa\n1, 00000000:28:00.0, GPU-bbbb\n"
    assert parse_nvidia_smi(text) == {
        "vendor": "NVIDIA",
        "count": 2,
        "gpus": [
            {"index": 0, "bdf": "00000000:18:00.0", "render": None, "uuid": "GPU-aaaa"},
            {"index": 1, "bdf": "00000000:28:00.0", "render": None, "uuid": "GPU-bbbb"},
        ],
    }


def test_unexpected_nvidia_smi_line_is_an_error() -> None:
    with pytest.raises(HelperError) as err:
        parse_nvidia_smi("No devices were found\n")
    assert err.value.format_message() == (
        "gpus: unexpected nvidia-smi line (No devices were found); expected 'index, bus id, uuid'"
    )


# ---------------------------------------------------------------------------------------------
# gpus detect through the fakes


def test_detect_uses_amd_smi_and_tolerates_its_noise(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("amd-smi", "nvidia-smi")
    monkeypatch.setenv("FAKE_AMDSMI_GPUS", "4")
    monkeypatch.setenv("FAKE_AMDSMI_NOISE", "bracket,warning,double,banner")
    result = cli(["detect", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == FOUR_AMD


def test_detect_without_json_prints_shell_assignments(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_GPUS", "3")
    result = cli(["detect"])
    assert result.stdout == "SM_GPU_VENDOR=AMD\nSM_GPU_COUNT=3\nSM_GPU_INDEXES=0,1,2\n"


def test_detect_falls_back_to_nvidia_smi(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_GPUS", "2")
    result = cli(["detect", "--json"])
    assert json.loads(result.stdout) == {
        "vendor": "NVIDIA",
        "count": 2,
        "gpus": [
            {
                "index": 0,
                "bdf": "00000000:18:00.0",
                "render": None,
                "uuid": "GPU-5f1c7a2e-0d3b-4c1a-9e8f-000000000000",
            },
            {
                "index": 1,
                "bdf": "00000000:28:00.0",
                "render": None,
                "uuid": "GPU-5f1c7a2e-0d3b-4c1a-9e8f-000000000001",
            },
        ],
    }


def test_detect_without_any_tool_reports_none(fake_path) -> None:
    fake_path()
    result = cli(["detect", "--json"])
    assert json.loads(result.stdout) == {"vendor": "none", "count": 0, "gpus": []}


def test_detect_amd_smi_failure_is_a_one_line_error(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_FAIL", "7")
    result = cli(["detect", "--json"])
    assert result.exit_code == 1
    assert result.stderr == (
        "slurm-multi: gpus: amd-smi list -e --json failed "
        "(exit 7: AMDSMI_STATUS_INIT_ERROR: amdgpu driver not loaded)\n"
    )


def test_detect_amd_smi_empty_output_is_an_error(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_NOISE", "empty")
    result = cli(["detect"])
    assert result.exit_code == 1
    assert result.stderr == "slurm-multi: gpus: no GPU list in amd-smi output (empty input)\n"


def test_detect_nvidia_smi_without_devices_is_an_error(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_GPUS", "0")
    result = cli(["detect"])
    assert result.exit_code == 1
    assert result.stderr == (
        "slurm-multi: gpus: nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader failed "
        "(exit 6: No devices were found)\n"
    )


def test_detect_hung_amd_smi_times_out(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_SLEEP", "5")
    with pytest.raises(HelperError) as err:
        detect_gpus(timeout_s=0.3)
    assert err.value.exit_code == 3
    assert err.value.format_message() == (
        "gpus: amd-smi list -e --json did not finish within 0.3 s; is the GPU driver hung?"
    )


@pytest.mark.parametrize("noise", ["warning", "bracket", "banner", "double", "watch", "wrapped"])
def test_fake_amd_smi_noise_knobs_all_parse(fake_path, monkeypatch: pytest.MonkeyPatch, noise: str) -> None:
    fake_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_GPUS", "2")
    monkeypatch.setenv("FAKE_AMDSMI_NOISE", noise)
    assert detect_gpus() == {"vendor": "AMD", "count": 2, "gpus": [amd_gpu(0), amd_gpu(1)]}


# ---------------------------------------------------------------------------------------------
# docker-args


def write_detected(tmp_path: Path, document: dict[str, Any]) -> str:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(document))
    return str(path)


def test_amd_docker_args_for_all_gpus(tmp_path: Path) -> None:
    result = cli(["docker-args", "--detected", write_detected(tmp_path, FOUR_AMD)])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "--device",
        "/dev/kfd",
        "--device",
        "/dev/dri/renderD128",
        "--device",
        "/dev/dri/renderD136",
        "--device",
        "/dev/dri/renderD144",
        "--device",
        "/dev/dri/renderD152",
        "--group-add",
        "video",
    ]


@pytest.mark.parametrize("docker_gpus", ["", "all", "-1", "0-3", "0,1,2,3"])
def test_all_spellings_of_every_gpu_select_every_gpu(tmp_path: Path, docker_gpus: str) -> None:
    result = cli(
        ["docker-args", "--detected", write_detected(tmp_path, FOUR_AMD), "--docker-gpus", docker_gpus]
    )
    assert result.stdout.count("renderD") == 4


def test_amd_docker_args_for_selected_gpus_nul_terminated(tmp_path: Path) -> None:
    result = cli(
        ["docker-args", "--detected", write_detected(tmp_path, FOUR_AMD), "--docker-gpus", "2, 0", "-0"]
    )
    assert result.stdout.split("\0") == [
        "--device",
        "/dev/kfd",
        "--device",
        "/dev/dri/renderD144",
        "--device",
        "/dev/dri/renderD128",
        "--group-add",
        "video",
        "",
    ]


def test_nvidia_docker_args_are_one_quoted_device_word(tmp_path: Path) -> None:
    detected = {"vendor": "NVIDIA", "count": 4, "gpus": [{"index": i} for i in range(4)]}
    result = cli(["docker-args", "--detected", write_detected(tmp_path, detected), "--docker-gpus", "0,1"])
    assert result.stdout == '--gpus\n"device=0,1"\n'


@pytest.mark.parametrize(
    ("docker_gpus", "indexes"),
    [
        ("0-7", list(range(8))),
        ("0,1,2", [0, 1, 2]),
        ("0-3,6", [0, 1, 2, 3, 6]),
        (" 0 - 3 , 6 ", [0, 1, 2, 3, 6]),
    ],
)
def test_docker_gpus_forms_select_those_gpus(tmp_path: Path, docker_gpus: str, indexes: list[int]) -> None:
    detected = {"vendor": "NVIDIA", "count": 8, "gpus": [{"index": i} for i in range(8)]}
    result = cli(
        ["docker-args", "--detected", write_detected(tmp_path, detected), "--docker-gpus", docker_gpus]
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == '--gpus\n"device=' + ",".join(map(str, indexes)) + '"\n'


def test_amd_manifest_on_an_8_gpu_node_gives_all_8_render_nodes(
    fake_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_NOISE", "warning,double,banner")
    result = cli(["docker-args", "-0", "--vendor", "AMD", "--docker-gpus", "0-7"])
    assert result.exit_code == 0, result.stderr
    renders = [f"/dev/dri/renderD{128 + 8 * i}" for i in range(8)]
    assert result.stdout.split("\0") == [
        "--device",
        "/dev/kfd",
        *[word for render in renders for word in ("--device", render)],
        "--group-add",
        "video",
        "",
    ]


def test_asking_for_gpus_0_7_on_a_4_gpu_node_is_an_error_naming_both_lists(tmp_path: Path) -> None:
    result = cli(
        [
            "docker-args",
            "-0",
            "--detected",
            write_detected(tmp_path, FOUR_AMD),
            "--vendor",
            "AMD",
            "--docker-gpus",
            "0-7",
            "--node",
            "node2",
        ]
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "slurm-multi: gpus: GPUs 4-7 were asked for (docker_gpus 0-7) but node2 has only 0-3 (amd-smi); "
        "fix docker_gpus or run on nodes with those GPUs\n"
    )


def test_one_undetected_gpu_among_detected_ones_is_an_error(tmp_path: Path) -> None:
    result = cli(
        [
            "docker-args",
            "--detected",
            write_detected(tmp_path, FOUR_AMD),
            "--docker-gpus",
            "0,7",
            "--node",
            "n1",
        ]
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "slurm-multi: gpus: GPU 7 was asked for (docker_gpus 0,7) but n1 has only 0-3 (amd-smi); "
        "fix docker_gpus or run on nodes with those GPUs\n"
    )


def test_the_node_name_defaults_to_slurmd_nodename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    result = cli(["docker-args", "--detected", write_detected(tmp_path, FOUR_AMD), "--docker-gpus", "4"])
    assert "but node7 has only 0-3 (amd-smi)" in result.stderr


def test_render_node_na_is_an_error() -> None:
    result = cli(
        [
            "docker-args",
            "--detected",
            str(DATA / "list_e_render_na.txt"),
            "--vendor",
            "AMD",
            "--node",
            "node2",
        ]
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "slurm-multi: gpus: GPU 2 on node2 has an unknown render node (N/A or missing in amd-smi list -e) "
        "and docker needs /dev/dri/renderD<N> for each GPU; check `amd-smi list -e` and the user's "
        "render/video groups on node2, or leave it out of docker_gpus\n"
    )


def test_gpus_with_known_render_nodes_run_when_the_unknown_one_is_not_asked_for() -> None:
    result = cli(["docker-args", "--detected", str(DATA / "list_e_render_na.txt"), "--docker-gpus", "0,1,3"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("renderD") == 3 and "renderD144" not in result.stdout


def test_amd_manifest_on_a_node_with_no_gpus_is_an_error(fake_path) -> None:
    fake_path()  # neither amd-smi nor nvidia-smi
    result = cli(["docker-args", "--vendor", "AMD", "--docker-gpus", "0-7", "--node", "node2"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "slurm-multi: gpus: gpu_vendor AMD was asked for but node2 has no GPUs (neither amd-smi nor "
        "nvidia-smi found); what the node detects wins: fix gpu_vendor or run on nodes with AMD GPUs\n"
    )


def test_amd_manifest_on_an_nvidia_node_is_an_error_because_detection_wins(fake_path, monkeypatch) -> None:
    fake_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_GPUS", "8")
    result = cli(["docker-args", "--vendor", "AMD", "--node", "node2"])
    assert result.exit_code == 2
    assert result.stderr == (
        "slurm-multi: gpus: gpu_vendor AMD was asked for but node2 has NVIDIA GPUs 0-7 (nvidia-smi); "
        "what the node detects wins: fix gpu_vendor or run on nodes with AMD GPUs\n"
    )


def test_nvidia_manifest_on_an_amd_node_is_an_error(tmp_path: Path) -> None:
    result = cli(["docker-args", "--detected", write_detected(tmp_path, FOUR_AMD), "--vendor", "nvidia"])
    assert result.exit_code == 2
    assert "gpus: gpu_vendor NVIDIA was asked for but" in result.stderr
    assert "has AMD GPUs 0-3 (amd-smi)" in result.stderr


def test_vendor_none_on_a_node_with_gpus_is_an_error(tmp_path: Path) -> None:
    result = cli(["docker-args", "--detected", write_detected(tmp_path, FOUR_AMD), "--vendor", "none"])
    assert result.exit_code == 2
    assert result.stderr.endswith("fix gpu_vendor or run on nodes without GPUs\n")


@pytest.mark.parametrize("vendor", [["--vendor", "none"], []])
def test_no_gpus_asked_for_and_none_detected_gives_no_gpu_args(fake_path, vendor: list[str]) -> None:
    fake_path()
    result = cli(["docker-args", "-0", *vendor])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""


def test_gpus_asked_for_on_a_node_with_none_is_an_error(tmp_path: Path) -> None:
    none = {"vendor": "none", "count": 0, "gpus": []}
    result = cli(
        ["docker-args", "--detected", write_detected(tmp_path, none), "--docker-gpus", "0", "--node", "n"]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        "slurm-multi: gpus: GPU 0 was asked for (docker_gpus 0) but n has no GPUs (neither amd-smi nor "
        "nvidia-smi found); fix docker_gpus or run on nodes with those GPUs\n"
    )


@pytest.mark.parametrize("bad", ["0,,1", "x", "1-0", "0;rm -rf /", "-2"])
def test_bad_gpu_list_is_a_usage_error(tmp_path: Path, bad: str) -> None:
    result = cli(["docker-args", "--detected", write_detected(tmp_path, FOUR_AMD), "--docker-gpus", bad])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1


def test_unknown_vendor_is_a_usage_error() -> None:
    result = cli(["docker-args", "--vendor", "intel"])
    assert result.exit_code == 2
    assert result.stderr == "slurm-multi: gpus: unknown GPU vendor intel; use AMD, NVIDIA or none\n"


def test_detected_file_may_be_raw_amd_smi_output() -> None:
    result = cli(
        ["docker-args", "--detected", "-", "--docker-gpus", "1"],
        input=(DATA / "list_e_all_noise.txt").read_text(),
    )
    assert result.stdout.splitlines() == [
        "--device",
        "/dev/kfd",
        "--device",
        "/dev/dri/renderD136",
        "--group-add",
        "video",
    ]


def test_malformed_detected_document_is_a_usage_error(tmp_path: Path) -> None:
    result = cli(
        ["docker-args", "--detected", write_detected(tmp_path, {"vendor": "AMD", "gpus": [{"index": "0"}]})]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        f"slurm-multi: gpus: {tmp_path}/gpus.json: 'gpus' must be a list of objects with an integer 'index'\n"
    )


def test_docker_args_detects_when_no_file_is_given(fake_path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_GPUS", "8")
    result = cli(["docker-args", "--docker-gpus", "4-6"])
    assert result.stdout == '--gpus\n"device=4,5,6"\n'


def test_amd_smi_listing_no_gpus_is_an_error() -> None:
    with pytest.raises(HelperError) as err:
        docker_gpu_args({"vendor": "AMD", "gpus": []}, "AMD", None, "node2")
    assert err.value.exit_code == 2
    assert err.value.format_message() == (
        "gpus: node2 has no AMD GPUs (amd-smi lists none) to give the container; "
        "check `amd-smi` on node2 or run on nodes with AMD GPUs"
    )


def test_importable_docker_gpu_args_raises_one_line_with_exit_code_2() -> None:
    with pytest.raises(HelperError) as err:
        docker_gpu_args(FOUR_AMD, "AMD", "0-7", "node2")
    assert err.value.exit_code == 2
    assert err.value.format_message() == (
        "gpus: GPUs 4-7 were asked for (docker_gpus 0-7) but node2 has only 0-3 (amd-smi); "
        "fix docker_gpus or run on nodes with those GPUs"
    )


def test_importable_docker_gpu_args_returns_the_complete_argv() -> None:
    assert docker_gpu_args(FOUR_AMD, "amd", "3, 1", "node2") == [
        "--device",
        "/dev/kfd",
        "--device",
        "/dev/dri/renderD152",
        "--device",
        "/dev/dri/renderD136",
        "--group-add",
        "video",
    ]
    assert docker_gpu_args({"vendor": "none", "gpus": []}, None, "all", "node2") == []


def test_parse_docker_gpus_keeps_order_and_drops_repeats() -> None:
    assert parse_docker_gpus("3,1,3,0-1") == [3, 1, 0]
    assert parse_docker_gpus(" all ") is None
    assert parse_docker_gpus(None) is None


def test_format_indexes_writes_runs_as_ranges() -> None:
    assert format_indexes([6, 0, 1, 2, 3, 3]) == "0-3,6"
    assert format_indexes([4, 5]) == "4,5"
    assert format_indexes([]) == ""


# ---------------------------------------------------------------------------------------------
# Properties

NOISE_LINE = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.sampled_from(
        [
            "[WARN] something",
            "WARNING: User is missing the following required groups: render, video.",
            "[0] retry",
            '{"level": "warn"}',
            "[",
            "{",
            "]}",
            '[{"gpu": ',
            "DeprecationWarning: use amd-smi list --json",
            '{"gpu": 0}',
            "[1, 2, 3]",
        ]
    ),
)
VALID_BLOCK = (DATA / "list_e_clean.json").read_text()


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")))
def test_property_garbage_never_crashes(text: str) -> None:
    try:
        result = parse_amdsmi(text)
    except HelperError as err:
        assert err.exit_code == 1
        assert "\n" not in err.format_message()
        return
    assert result["count"] == len(result["gpus"])
    assert all(isinstance(gpu["index"], int) for gpu in result["gpus"])


def _without_gpu_lists(lines: list[str]) -> list[str]:
    """Noise lines that cannot themselves hold a non-empty GPU list, not even together."""
    kept = [line for line in lines if not find_gpu_list(line)]
    while kept and find_gpu_list("\n".join(kept)):
        kept.pop()
    return kept


@settings(max_examples=300, deadline=None)
@given(before=st.lists(NOISE_LINE, max_size=5), after=st.lists(NOISE_LINE, max_size=5), twice=st.booleans())
def test_property_valid_block_inside_noise_always_parses_to_the_same_gpus(
    before: list[str], after: list[str], twice: bool
) -> None:
    text = "\n".join([*_without_gpu_lists(before), VALID_BLOCK, *([VALID_BLOCK] if twice else []), *after])
    assert parse_amdsmi(text) == FOUR_AMD


@settings(max_examples=300, deadline=None)
@given(prefix=st.text(max_size=30), suffix=st.text(max_size=30))
def test_property_block_glued_to_random_characters_still_parses(prefix: str, suffix: str) -> None:
    """No line breaks at all: noise glued straight onto both ends of the JSON."""
    if find_gpu_list(prefix):
        return
    assert parse_amdsmi(prefix + VALID_BLOCK.strip() + suffix) == FOUR_AMD


JSONISH = st.sampled_from(
    ["[", "]", "{", "}", ",", ":", '"', '"gpu"', "0", "-1", " ", "\n", "x", '"a"', "[]", "{}", "true", '"a":']
    + ["[[", "]]", '{"a":', '"[', '\\"', "1e5", "NaN", "-Infinity", '{"gpu": 0}', '[{"gpu": 1}]']
)


def raw_decode_everywhere(text: str) -> list[tuple[int, int]]:
    """The old search: raw_decode tried at every `[`/`{`."""
    decoder = json.JSONDecoder()
    found = []
    for start, char in enumerate(text):
        if char in "[{":
            try:
                found.append((start, decoder.raw_decode(text, start)[1]))
            except (ValueError, RecursionError):
                pass
    return found


@settings(max_examples=500, deadline=None)
@given(pieces=st.lists(JSONISH, max_size=40))
def test_property_the_linear_pass_finds_exactly_where_raw_decode_succeeds(pieces: list[str]) -> None:
    text = "".join(pieces)
    if text.count("[") + text.count("{") > MAX_NESTING:  # the one documented difference: deep nesting
        return
    assert decodable_blocks(text, json.JSONDecoder().scan_once) == raw_decode_everywhere(text)


@pytest.mark.parametrize("vendor", ["AMD", "NVIDIA"])
def test_a_gpu_asked_for_in_a_gap_of_the_detected_list_is_one_line_exit_2(vendor: str) -> None:
    gpus = [amd_gpu(i) if vendor == "AMD" else {**amd_gpu(i), "render": None} for i in (0, 1, 3)]
    detected = {"vendor": vendor, "count": 3, "gpus": gpus}
    with pytest.raises(HelperError) as caught:
        docker_gpu_args(detected, vendor, "2", "node2")
    assert caught.value.exit_code == 2
    assert "node2" in str(caught.value) and "2" in str(caught.value) and "\n" not in str(caught.value)
    # The ones that are there are fine.
    assert docker_gpu_args(detected, vendor, "0,3", "node2")


def test_an_inner_empty_list_is_not_no_gpus_when_the_gpu_list_follows() -> None:
    text = (
        '{"cpu_data": [], "core_data": [], "gpu_data": '
        + json.dumps([{"gpu": 0, "bdf": "0000:0c:00.0"}])
        + "}"
    )
    assert parse_amdsmi(text)["count"] == 1
    assert parse_amdsmi('note: [] empty\n[{"gpu": 0, "bdf": "0000:0c:00.0"}]')["count"] == 1
    # A document whose only lists are inner empty ones has no GPU list at all: an error, not "no GPUs".
    with pytest.raises(HelperError, match="no GPU list in amd-smi output"):
        parse_amdsmi('{"cpu_data": [], "core_data": [], "version": 2}')


def _renders(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("/dev/dri/renderD")]


def test_the_models_n_gpus_gives_the_container_the_first_n_gpus() -> None:
    everything = _renders(docker_gpu_args(FOUR_AMD, "AMD", None, "node2"))
    assert len(everything) == 4
    assert _renders(docker_gpu_args(FOUR_AMD, "AMD", None, "node2", 2)) == everything[:2]
    assert _renders(docker_gpu_args(FOUR_AMD, "AMD", "3,1,2", "node2", 1)) == _renders(
        docker_gpu_args(FOUR_AMD, "AMD", "3", "node2")
    )
    assert _renders(docker_gpu_args(FOUR_AMD, "AMD", None, "node2", None)) == everything  # -1: all
    nvidia = {"vendor": "NVIDIA", "count": 4, "gpus": [{"index": i} for i in range(4)]}
    assert docker_gpu_args(nvidia, None, None, "node2", 3) == ["--gpus", '"device=0,1,2"']


def test_more_n_gpus_than_the_container_can_have_is_one_line_naming_both() -> None:
    with pytest.raises(
        HelperError, match=r"the model's n_gpus is 8 but node2 has 2 GPU\(s\) for its container \(0, 1\)"
    ):
        docker_gpu_args(FOUR_AMD, "AMD", "0-1", "node2", 8)
