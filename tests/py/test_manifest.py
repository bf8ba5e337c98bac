"""manifest restore: precedence, ${VAR} resolution, injection safety, secrets, malformed manifests."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_multi.cli import group
from slurm_multi.common import HelperError
from slurm_multi.manifest import (
    HOST_RESERVED_NAMES,
    expand_references,
    load_manifest,
    render_bash,
    render_json,
    restore_context,
)

# The example from FORMATS.md, as madengine writes it.
EXAMPLE: dict[str, Any] = {
    "built_images": {
        "toy-2node": {
            "docker_image": "toy/model:local",
            "dockerfile": "examples/toy/Dockerfile",
            "base_docker": "scratch",
            "local_image": True,
            "registry_image": None,
            "build_duration": 0,
        }
    },
    "built_models": {
        "toy-2node": {
            "name": "toy_model",
            "dockerfile": "examples/toy/Dockerfile",
            "dockercontext": "examples/toy",
            "scripts": "run.sh",
            "args": "--steps 20",
            "n_gpus": "-1",
            "timeout": 600,
            "multiple_results": "perf_toy.csv",
            "tags": ["toy", "demo"],
            "additional_docker_run_options": "--shm-size 1G -v /dev/shm:/dev/shm",
        }
    },
    "context": {
        "docker_env_vars": {"NCCL_SOCKET_IFNAME": "eth0", "HF_TOKEN": "${HF_TOKEN}"},
        "docker_mounts": {"/data": "/shared/data"},
        "docker_build_arg": {"GREETING": "hi"},
        "docker_gpus": "0,1,2,3,4,5,6,7",
        "gpu_vendor": "AMD",
        "guest_os": "UBUNTU",
    },
    "credentials_required": [],
    "deployment_config": {
        "target": "slurm",
        "slurm": {"nodes": 2, "gpus_per_node": 8},
        "distributed": {"launcher": "torchrun", "port": 29500, "nnodes": 2},
    },
}

EXPECTED_EXAMPLE_BASH = """\
export SM_MODEL_KEY=toy-2node
export SM_MODEL_NAME=toy_model
export SM_IMAGE=toy/model:local
export SM_DOCKERFILE=examples/toy/Dockerfile
export SM_DOCKER_CONTEXT=examples/toy
export SM_BASE_DOCKER=scratch
export SM_LOCAL_IMAGE=true
export SM_MODEL_SCRIPTS=run.sh
export SM_MODEL_ARGS='--steps 20'
export SM_N_GPUS=-1
export SM_MODEL_TIMEOUT=600
export SM_MODEL_TAGS=toy,demo
export SM_RESULTS_CSV=perf_toy.csv
export SM_DOCKER_GPUS=0,1,2,3,4,5,6,7
export SM_GPU_VENDOR=AMD
export SM_GUEST_OS=UBUNTU
export SM_BUILD_DURATION=0
export SM_LAUNCHER=torchrun
export SM_GPUS_PER_NODE=8
export SM_DIST_NNODES=2
export SM_DIST_PORT=29500
export SM_SLURM_NODES=2
SM_BUILD_ARGS=(GREETING=hi)
SM_MOUNTS=(/shared/data:/data)
SM_DOCKER_OPTS=(--shm-size 1G -v /dev/shm:/dev/shm)
SM_DOCKER_ENV_NAMES=(NCCL_SOCKET_IFNAME)
export NCCL_SOCKET_IFNAME=eth0
"""

SECRET = "hf_s3cr3tV4lue_never_in_logs"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SM_* or test variables leak in from the developer's shell."""
    for name in list(os.environ):
        if name.startswith(("SM_", "FAKE_", "T_")) or name in (
            "HF_TOKEN",
            "MAD_SECRETS_HFTOKEN",
            "NCCL_SOCKET_IFNAME",
            "GREETING",
        ):
            monkeypatch.delenv(name, raising=False)


def manifest_with(**context_updates: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["context"].update(context_updates)
    return manifest


def write_manifest(tmp_path: Path, manifest: Any, name: str = "build_manifest.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(manifest))
    return str(path)


def restore(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(group, ["manifest", "restore", *args], env=env)


def body(stdout: str) -> str:
    """stdout without the leading comment line."""
    first, _, rest = stdout.partition("\n")
    assert first.startswith("# slurm-multi manifest restore: ")
    return rest


def source_and_dump(
    script: str, names: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> list[str]:
    """Source `script` in a clean bash and return the named variables (arrays joined by NUL-less \\x1f)."""
    script_file = tmp_path / "restore.sh"
    script_file.write_bytes(script.encode("utf-8", "surrogateescape"))
    dump = (
        'set -eu; source "$1"; shift; '
        'for n in "$@"; do declare -n ref="$n"; '
        'if [[ $(declare -p "$n") == "declare -a"* ]]; then printf "%s\\x1f" "${ref[@]}"; printf "\\0"; '
        'else printf "%s\\0" "$ref"; fi; unset -n ref; done'
    )
    run_env = {"PATH": os.environ["PATH"], "LC_ALL": "C", **(env or {})}
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", dump, "bash", str(script_file), *names],
        capture_output=True,
        env=run_env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    return done.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


# ---------------------------------------------------------------------------------------------
# The whole output


def test_restore_prints_every_variable_of_the_example_manifest(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, EXAMPLE)
    result = restore([path])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"# slurm-multi manifest restore: {path} model toy-2node"
    assert body(result.stdout) == EXPECTED_EXAMPLE_BASH
    assert "dropped docker_env_vars HF_TOKEN: it references HF_TOKEN, which is not set" in result.stderr


def test_restored_example_sources_to_the_manifest_values(tmp_path: Path) -> None:
    result = restore([write_manifest(tmp_path, EXAMPLE)])
    values = source_and_dump(
        result.stdout,
        ["SM_MODEL_ARGS", "SM_LOCAL_IMAGE", "SM_MODEL_TAGS", "SM_MOUNTS", "SM_DOCKER_OPTS", "SM_BUILD_ARGS"],
        tmp_path,
    )
    assert values == [
        "--steps 20",
        "true",
        "toy,demo",
        "/shared/data:/data\x1f",
        "--shm-size\x1f1G\x1f-v\x1f/dev/shm:/dev/shm\x1f",
        "GREETING=hi\x1f",
    ]


def test_docker_mounts_map_container_to_host_and_come_out_host_first() -> None:
    manifest = manifest_with(docker_mounts={"/data": "/shared/data", "/ckpt": "/scratch/ckpt"})
    resolved = restore_context(manifest, None, {})
    assert resolved["arrays"]["SM_MOUNTS"] == ["/shared/data:/data", "/scratch/ckpt:/ckpt"]


def test_dockerfile_falls_back_to_the_image_entry() -> None:
    manifest = copy.deepcopy(EXAMPLE)
    del manifest["built_models"]["toy-2node"]["dockerfile"]
    manifest["built_images"]["toy-2node"]["dockerfile"] = "docker/other.Dockerfile"
    assert restore_context(manifest, None, {})["exports"]["SM_DOCKERFILE"] == "docker/other.Dockerfile"


def test_optional_sections_missing_emit_nothing_for_them() -> None:
    manifest = {"built_models": {"m": {"name": "m"}}}
    resolved = restore_context(manifest, None, {})
    assert resolved["exports"] == {"SM_MODEL_KEY": "m", "SM_MODEL_NAME": "m"}
    assert resolved["arrays"] == {
        "SM_BUILD_ARGS": [],
        "SM_MOUNTS": [],
        "SM_DOCKER_OPTS": [],
        "SM_DOCKER_ENV_NAMES": [],
    }
    assert resolved["warnings"] == ["built_images has no entry m; SM_IMAGE and build details not restored"]
    assert render_bash(resolved, "x.json").splitlines()[-4:] == [
        "SM_BUILD_ARGS=()",
        "SM_MOUNTS=()",
        "SM_DOCKER_OPTS=()",
        "SM_DOCKER_ENV_NAMES=()",
    ]


# ---------------------------------------------------------------------------------------------
# Precedence: the environment always wins


def test_environment_values_are_never_overwritten_by_the_manifest(tmp_path: Path) -> None:
    result = restore([write_manifest(tmp_path, EXAMPLE)], env={"SM_IMAGE": "mine:1", "SM_MODEL_TIMEOUT": "5"})
    assert result.exit_code == 0
    assert "SM_IMAGE" not in result.stdout
    assert "SM_MODEL_TIMEOUT" not in result.stdout
    assert "export SM_MODEL_NAME=toy_model\n" in result.stdout


def test_runtime_detected_gpu_vendor_and_gpus_win_over_the_manifest(tmp_path: Path) -> None:
    path = write_manifest(tmp_path, EXAMPLE)
    result = restore([path], env={"SM_GPU_VENDOR": "NVIDIA", "SM_DOCKER_GPUS": "0,1"})
    assert "SM_GPU_VENDOR" not in result.stdout
    assert "SM_DOCKER_GPUS" not in result.stdout
    values = source_and_dump(
        result.stdout,
        ["SM_GPU_VENDOR", "SM_DOCKER_GPUS"],
        tmp_path,
        {"SM_GPU_VENDOR": "NVIDIA", "SM_DOCKER_GPUS": "0,1"},
    )
    assert values == ["NVIDIA", "0,1"]


def test_array_already_set_is_left_alone() -> None:
    resolved = restore_context(EXAMPLE, None, {"SM_MOUNTS": "/x:/y"})
    assert "SM_MOUNTS" not in resolved["arrays"]
    assert resolved["skipped_set"] == ["SM_MOUNTS"]


def test_docker_env_var_in_environment_keeps_its_value_and_is_still_passed(tmp_path: Path) -> None:
    manifest = manifest_with(docker_env_vars={"NCCL_SOCKET_IFNAME": "eth0", "HF_TOKEN": "${HF_TOKEN}"})
    env = {"NCCL_SOCKET_IFNAME": "ib0", "HF_TOKEN": SECRET}
    result = restore([write_manifest(tmp_path, manifest)], env=env)
    assert result.exit_code == 0
    assert "SM_DOCKER_ENV_NAMES=(NCCL_SOCKET_IFNAME HF_TOKEN)\n" in result.stdout
    assert "export NCCL_SOCKET_IFNAME" not in result.stdout
    assert "export HF_TOKEN" not in result.stdout
    assert result.stderr == ""
    assert source_and_dump(result.stdout, ["NCCL_SOCKET_IFNAME", "HF_TOKEN"], tmp_path, env) == [
        "ib0",
        SECRET,
    ]


def test_hf_token_literal_from_an_old_manifest_never_reaches_the_container(tmp_path: Path) -> None:
    """The madengine 401/403 bug: `${HF_TOKEN}` must not be passed on as the literal text."""
    result = restore([write_manifest(tmp_path, EXAMPLE)])
    assert "${HF_TOKEN}" not in result.stdout
    assert "HF_TOKEN" not in result.stdout.split("SM_DOCKER_ENV_NAMES=")[1]


# ---------------------------------------------------------------------------------------------
# ${VAR} / $VAR references


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        ("${T_A}", {"T_A": "one"}, "one"),
        ("$T_A", {"T_A": "one"}, "one"),
        ("pre-${T_A}-post", {"T_A": "mid"}, "pre-mid-post"),
        ("$T_A/$T_B", {"T_A": "x", "T_B": "y"}, "x/y"),
        ("${T_A}${T_B}", {"T_A": "x", "T_B": "y"}, "xy"),
        ("$T_A-suffix", {"T_A": "x"}, "x-suffix"),
        ("costs $5 and $$", {}, "costs $5 and $$"),
        ("trailing $", {}, "trailing $"),
        ("${T_A}", {"T_A": ""}, ""),
        ("${T_A}", {"T_A": "$(touch /tmp/x) ${T_B}"}, "$(touch /tmp/x) ${T_B}"),
    ],
)
def test_references_are_substituted_from_the_environment(
    value: str, env: dict[str, str], expected: str
) -> None:
    assert expand_references(value, env)[0] == expected


def test_partial_reference_is_resolved_in_docker_env_vars(tmp_path: Path) -> None:
    manifest = manifest_with(docker_env_vars={"T_URL": "https://${T_HOST}:$T_PORT/v1"})
    result = restore([write_manifest(tmp_path, manifest)], env={"T_HOST": "hub.local", "T_PORT": "8443"})
    assert "export T_URL=https://hub.local:8443/v1\n" in result.stdout
    assert "SM_DOCKER_ENV_NAMES=(T_URL)\n" in result.stdout


@pytest.mark.parametrize(
    "value", ["${T_MISSING}", "$T_MISSING", "pre-${T_MISSING}-post", "${T_SET}/$T_MISSING"]
)
def test_reference_to_an_unset_variable_drops_it_with_a_warning(tmp_path: Path, value: str) -> None:
    manifest = manifest_with(docker_env_vars={"T_VAR": value, "T_OK": "ok"})
    result = restore([write_manifest(tmp_path, manifest)], env={"T_SET": "s"})
    assert result.exit_code == 0
    assert "T_VAR" not in result.stdout
    assert "T_MISSING" not in result.stdout
    assert "export T_OK=ok\n" in result.stdout
    assert "SM_DOCKER_ENV_NAMES=(T_OK)\n" in result.stdout
    assert (
        "manifest: dropped docker_env_vars T_VAR: it references T_MISSING, which is not set" in result.stderr
    )


def test_unsupported_reference_form_is_dropped_not_passed_literally() -> None:
    resolved = restore_context(manifest_with(docker_env_vars={"T_V": "${T_A:-default}"}), None, {"T_A": "a"})
    assert resolved["docker_env"] == {}
    assert resolved["warnings"] == [
        "dropped docker_env_vars T_V: it references ${…} (only ${VAR} and $VAR are supported), "
        "which is not set (export it before the run to pass it on)"
    ]


def test_references_in_build_args_mounts_and_docker_options_are_resolved() -> None:
    manifest = manifest_with(docker_build_arg={"T_REV": "${T_GIT}"}, docker_mounts={"/data": "$T_ROOT/data"})
    manifest["built_models"]["toy-2node"]["additional_docker_run_options"] = "-v ${T_ROOT}/ds:/ds --ipc host"
    resolved = restore_context(manifest, None, {"T_GIT": "abc123", "T_ROOT": "/lustre"})
    assert resolved["arrays"]["SM_BUILD_ARGS"] == ["T_REV=abc123"]
    assert resolved["arrays"]["SM_MOUNTS"] == ["/lustre/data:/data"]
    assert resolved["arrays"]["SM_DOCKER_OPTS"] == ["-v", "/lustre/ds:/ds", "--ipc", "host"]


def test_unset_reference_in_build_args_and_mounts_drops_the_entry() -> None:
    manifest = manifest_with(
        docker_build_arg={"T_REV": "${T_GIT}", "K": "v"}, docker_mounts={"/data": "$T_ROOT/d"}
    )
    resolved = restore_context(manifest, None, {})
    assert resolved["arrays"]["SM_BUILD_ARGS"] == ["K=v"]
    assert resolved["arrays"]["SM_MOUNTS"] == []
    assert "dropped docker_build_arg T_REV: it references T_GIT, which is not set" in resolved["warnings"]
    assert "dropped docker_mounts /data: it references T_ROOT, which is not set" in resolved["warnings"]


def test_unset_reference_in_docker_options_is_an_error(tmp_path: Path) -> None:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["built_models"]["toy-2node"]["additional_docker_run_options"] = "-v $T_NOPE/x:/x"
    result = restore([write_manifest(tmp_path, manifest)])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "slurm-multi: manifest: additional_docker_run_options references T_NOPE, which is not set; "
        "export it or edit the manifest"
    )


# ---------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize("name", ["BAD-NAME", "1ST", "A B", "", "X;touch", "É"])
def test_invalid_variable_names_are_dropped_with_a_warning(name: str) -> None:
    resolved = restore_context(manifest_with(docker_env_vars={name: "v", "GOOD": "g"}), None, {})
    assert resolved["docker_env"] == {"GOOD": "g"}
    assert resolved["arrays"]["SM_DOCKER_ENV_NAMES"] == ["GOOD"]
    assert resolved["warnings"] == [f"dropped docker_env_vars {name}: not a valid variable name"]


@pytest.mark.parametrize("name", ["PATH", "LD_PRELOAD", "BASH_ENV", "UID", "SM_IMAGE", "IFS"])
def test_names_that_would_change_the_host_shell_are_refused(name: str) -> None:
    resolved = restore_context(manifest_with(docker_env_vars={name: "/evil"}), None, {})
    assert resolved["docker_env"] == {}
    assert resolved["warnings"] == [f"dropped docker_env_vars {name}: reserved name on the host shell"]


def test_reserved_names_include_bash_readonly_variables() -> None:
    assert {"UID", "EUID", "PPID", "BASHOPTS", "SHELLOPTS"} <= HOST_RESERVED_NAMES


def test_invalid_build_arg_name_is_dropped() -> None:
    resolved = restore_context(
        manifest_with(docker_build_arg={"A=B": "x", "OK": "1"}), None, {"HF_TOKEN": "t"}
    )
    assert resolved["arrays"]["SM_BUILD_ARGS"] == ["OK=1"]
    assert resolved["warnings"] == ["dropped docker_build_arg A=B: not a valid build-arg name"]


def test_warning_names_are_printable_on_one_line(tmp_path: Path) -> None:
    manifest = manifest_with(docker_env_vars={"BAD\nNAME": "v"})
    result = restore([write_manifest(tmp_path, manifest)])
    assert result.exit_code == 0
    warning_lines = [line for line in result.stderr.splitlines() if "dropped" in line]
    assert len(warning_lines) == 1
    assert warning_lines[0].endswith(
        "manifest: dropped docker_env_vars BAD\\nNAME: not a valid variable name"
    )


# ---------------------------------------------------------------------------------------------
# Injection


INJECTIONS = [
    "$(touch {marker})",
    "`touch {marker}`",
    "'; touch {marker}; '",
    '"; touch {marker}; "',
    "x\ntouch {marker}\n",
    "a'b\"c\\d$e`f",
    "${{IFS}}$(touch {marker})",
    "); touch {marker}; (",
]


@pytest.mark.parametrize("template", INJECTIONS)
def test_hostile_values_stay_inert_when_sourced(tmp_path: Path, template: str) -> None:
    """Literal manifest values and values substituted from the environment both round-trip exactly."""
    marker = tmp_path / "pwned"
    value = template.format(marker=marker)
    manifest = copy.deepcopy(EXAMPLE)
    manifest["built_models"]["toy-2node"]["args"] = value
    manifest["built_models"]["toy-2node"]["name"] = value
    manifest["context"]["docker_env_vars"] = {"T_EVIL": "${T_SRC}", "T_WRAPPED": "<$T_SRC>"}
    manifest["context"]["docker_build_arg"] = {"T_ARG": "${T_SRC}"}
    manifest["context"]["docker_mounts"] = {"/data": "/host/${T_PATH}"}
    result = restore(
        [write_manifest(tmp_path, manifest)], env={"T_SRC": value, "T_PATH": value.replace(":", "")}
    )
    assert result.exit_code == 0, result.stderr
    got = source_and_dump(
        result.stdout,
        ["SM_MODEL_ARGS", "SM_MODEL_NAME", "T_EVIL", "T_WRAPPED", "SM_BUILD_ARGS", "SM_MOUNTS"],
        tmp_path,
    )
    assert not marker.exists()
    assert got == [
        value,
        value,
        value,
        f"<{value}>",
        f"T_ARG={value}\x1f",
        "/host/" + value.replace(":", "") + ":/data\x1f",
    ]


@pytest.mark.parametrize("template", [t for t in INJECTIONS if "$" not in t])
def test_hostile_literal_docker_env_values_stay_inert(tmp_path: Path, template: str) -> None:
    marker = tmp_path / "pwned"
    value = template.format(marker=marker)
    manifest = manifest_with(docker_env_vars={"T_EVIL": value})
    result = restore([write_manifest(tmp_path, manifest)])
    assert source_and_dump(result.stdout, ["T_EVIL", "SM_DOCKER_ENV_NAMES"], tmp_path) == [
        value,
        "T_EVIL\x1f",
    ]
    assert not marker.exists()


def test_hostile_docker_options_become_single_inert_words(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    manifest = copy.deepcopy(EXAMPLE)
    manifest["built_models"]["toy-2node"]["additional_docker_run_options"] = (
        f"--label 'x=$(touch {marker})' -e \"A=;touch {marker}\" --name `id`"
    )
    result = restore([write_manifest(tmp_path, manifest)])
    got = source_and_dump(result.stdout, ["SM_DOCKER_OPTS"], tmp_path)
    assert not marker.exists()
    assert got == [f"--label\x1fx=$(touch {marker})\x1f-e\x1fA=;touch {marker}\x1f--name\x1f`id`\x1f"]


def test_hostile_model_key_and_file_name_do_not_escape_the_comment(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"  # `touch pwned` runs in tmp_path if anything escapes
    key = "k\ntouch pwned\n"
    manifest = {"built_models": {key: {"name": "n"}}, "built_images": {key: {"docker_image": "i"}}}
    path = write_manifest(tmp_path, manifest, name="m\ntouch pwned\n.json")
    result = restore([path])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        f"# slurm-multi manifest restore: {tmp_path}/m\\ntouch pwned\\n.json model k\\ntouch pwned\\n"
    )
    assert source_and_dump(result.stdout, ["SM_MODEL_KEY"], tmp_path) == [key]
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# Secrets


def test_secret_values_never_reach_stderr_and_are_masked_in_json(tmp_path: Path) -> None:
    manifest = manifest_with(
        docker_env_vars={
            "HF_TOKEN": "${MAD_SECRETS_HFTOKEN}",
            "T_PLAIN": "p",
            "T_COPY": "${MAD_SECRETS_HFTOKEN}",
        },
        docker_build_arg={"GITHUB_TOKEN": "${MAD_SECRETS_HFTOKEN}"},
    )
    path = write_manifest(tmp_path, manifest)
    env = {"MAD_SECRETS_HFTOKEN": SECRET}
    bash = restore([path], env=env)
    assert bash.exit_code == 0
    assert f"export HF_TOKEN={SECRET}\n" in bash.stdout  # stdout is sourced data: it must carry it
    assert f"export T_COPY={SECRET}\n" in bash.stdout
    assert SECRET not in bash.stderr
    shown = restore([path, "--format", "json"], env=env)
    assert shown.exit_code == 0
    assert SECRET not in shown.stdout
    assert SECRET not in shown.stderr
    document = json.loads(shown.stdout)
    assert document["docker_env"] == {"HF_TOKEN": "***", "T_PLAIN": "p", "T_COPY": "***"}
    assert document["arrays"]["SM_BUILD_ARGS"] == ["GITHUB_TOKEN=***"]


def test_secret_embedded_in_other_values_is_redacted_in_json() -> None:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["built_models"]["toy-2node"]["args"] = f"--token {SECRET}"
    resolved = restore_context(manifest, None, {"HF_TOKEN": SECRET})
    document = json.loads(render_json(resolved, "m.json", {"HF_TOKEN": SECRET}))
    assert document["exports"]["SM_MODEL_ARGS"] == "--token ***"
    assert document["kept_from_env"] == ["HF_TOKEN"]


def test_dropped_secret_warning_names_the_variables_but_not_the_value(tmp_path: Path) -> None:
    manifest = manifest_with(docker_env_vars={"HF_TOKEN": f"{SECRET}-${{T_UNSET}}"})
    result = restore([write_manifest(tmp_path, manifest)])
    assert "dropped docker_env_vars HF_TOKEN: it references T_UNSET, which is not set" in result.stderr
    assert SECRET not in result.stderr


def test_json_format_shows_the_resolved_context(tmp_path: Path) -> None:
    result = restore([write_manifest(tmp_path, EXAMPLE), "--format", "json"], env={"SM_GPU_VENDOR": "AMD"})
    document = json.loads(result.stdout)
    assert document["model_key"] == "toy-2node"
    assert document["skipped_set"] == ["SM_GPU_VENDOR"]
    assert document["arrays"]["SM_DOCKER_ENV_NAMES"] == ["NCCL_SOCKET_IFNAME"]
    assert document["warnings"] == [
        "dropped docker_env_vars HF_TOKEN: it references HF_TOKEN, which is not set "
        "(export HF_TOKEN before the run to pass it on)"
    ]
    assert "SM_GPU_VENDOR" not in document["exports"]


# ---------------------------------------------------------------------------------------------
# Model selection


def two_models() -> dict[str, Any]:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["built_models"]["llama-8b"] = {"name": "pyt_llama", "scripts": "llama.sh"}
    manifest["built_images"]["llama-8b"] = {"docker_image": "ci-llama:latest"}
    return manifest


def test_several_models_without_model_is_a_usage_error_listing_the_keys(tmp_path: Path) -> None:
    result = restore([write_manifest(tmp_path, two_models())])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "slurm-multi: manifest: several models in built_models (toy-2node, llama-8b); "
        "choose one with --model KEY\n"
    )


@pytest.mark.parametrize("model", ["llama-8b", "pyt_llama"])
def test_model_is_chosen_by_key_or_by_name(tmp_path: Path, model: str) -> None:
    result = restore([write_manifest(tmp_path, two_models()), "--model", model])
    assert result.exit_code == 0
    assert "export SM_MODEL_KEY=llama-8b\n" in result.stdout
    assert "export SM_IMAGE=ci-llama:latest\n" in result.stdout


def test_unknown_model_lists_the_keys(tmp_path: Path) -> None:
    result = restore([write_manifest(tmp_path, two_models()), "--model", "nope"])
    assert result.exit_code == 2
    assert (
        result.stderr == "slurm-multi: manifest: no model nope in built_models (keys: toy-2node, llama-8b)\n"
    )


def test_model_name_shared_by_two_keys_is_ambiguous() -> None:
    manifest = two_models()
    manifest["built_models"]["llama-8b"]["name"] = "toy_model"
    with pytest.raises(HelperError) as err:
        restore_context(manifest, "toy_model", {})
    assert err.value.exit_code == 2
    assert err.value.format_message() == (
        "manifest: model name toy_model matches several keys (toy-2node, llama-8b); use a key"
    )


def test_empty_built_models_is_an_error() -> None:
    with pytest.raises(HelperError, match="built_models is empty"):
        restore_context({"built_models": {}}, None, {})


# ---------------------------------------------------------------------------------------------
# Malformed files


def run_bad(tmp_path: Path, content: bytes | None, name: str = "m.json") -> tuple[int, str, str]:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    result = restore([str(path)])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read (No such file or directory)"),
        (b"", "not JSON (line 1 column 1: Expecting value)"),
        (
            b'{\n  "built_models": {\n    "a": 1\n    "b": 2}}',
            "not JSON (line 4 column 5: Expecting ',' delimiter)",
        ),
        (b"[1, 2]", "not a build manifest (top level must be an object, got array)"),
        (b'{"built_images": {}}', "not a build manifest (built_models is missing)"),
        (b'{"built_models": []}', "not a build manifest (built_models must be an object, got array)"),
        (
            b'{"built_models": {"m": "x"}}',
            "not a build manifest (built_models.m must be an object, got string)",
        ),
        (
            b'{"built_models": {"m": {"args": ["a"]}}}',
            "not a build manifest (built_models.m.args must be a string, number or boolean, got array)",
        ),
        (
            b'{"built_models": {"m": {"tags": {"a": 1}}}}',
            "not a build manifest (built_models.m.tags must be a string, number or boolean, got object)",
        ),
        (
            b'{"built_models": {"m": {}}, "context": {"docker_env_vars": ["A=1"]}}',
            "not a build manifest (context.docker_env_vars must be an object, got array)",
        ),
        (
            b'{"built_models": {"m": {}}, "context": {"docker_env_vars": {"A": {"x": 1}}}}',
            "not a build manifest "
            "(context.docker_env_vars.A must be a string, number or boolean, got object)",
        ),
        (
            b'{"built_models": {"m": {}}, "context": 3}',
            "not a build manifest (context must be an object, got number)",
        ),
        (
            b'{"built_models": {"m": {}}, "deployment_config": {"slurm": []}}',
            "not a build manifest (deployment_config.slurm must be an object, got array)",
        ),
        (
            b'{"built_models": {"m": {"args": "a\\u0000b"}}}',
            "not a build manifest (built_models.m.args contains a NUL character)",
        ),
        (
            b'{"built_models": {"m": {"args": "\\ud800"}}}',
            "not a build manifest (built_models.m.args contains an unpaired surrogate (\\ud800-\\udfff))",
        ),
        (
            b'{"built_models": {"m": {}}, "built_models": {}}',
            "not a build manifest (duplicate key built_models)",
        ),
        (b'{"built_models": {"m": {"args": "\xff"}}}', "not UTF-8 text (byte 0xff at offset 33)"),
        (b"[" * 100000, "not JSON (nested too deeply)"),
    ],
)
def test_malformed_manifest_is_a_one_line_usage_error(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    code, stdout, stderr = run_bad(tmp_path, content)
    assert code == 2
    assert stdout == ""
    assert stderr == f"slurm-multi: manifest: {tmp_path}/m.json: {problem}\n"


def test_directory_instead_of_file_is_a_usage_error(tmp_path: Path) -> None:
    result = restore([str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr == f"slurm-multi: manifest: {tmp_path}: cannot read (Is a directory)\n"


def test_unbalanced_quotes_in_docker_options_are_a_usage_error(tmp_path: Path) -> None:
    manifest = copy.deepcopy(EXAMPLE)
    manifest["built_models"]["toy-2node"]["additional_docker_run_options"] = "--label 'x=1"
    result = restore([write_manifest(tmp_path, manifest)])
    assert result.exit_code == 2
    assert result.stderr == (
        "slurm-multi: manifest: additional_docker_run_options cannot be split into words "
        "(No closing quotation)\n"
    )


def test_manifest_from_stdin() -> None:
    result = CliRunner().invoke(group, ["manifest", "restore", "-"], input=json.dumps(EXAMPLE))
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "# slurm-multi manifest restore: <stdin> model toy-2node"
    assert body(result.stdout) == EXPECTED_EXAMPLE_BASH


def test_load_manifest_returns_the_document(tmp_path: Path) -> None:
    assert load_manifest(write_manifest(tmp_path, EXAMPLE)) == EXAMPLE


def test_restore_context_rejects_a_wrong_shape_without_a_traceback() -> None:
    with pytest.raises(HelperError) as err:
        restore_context({"built_models": {"m": []}}, None, {})  # type: ignore[dict-item]
    assert err.value.exit_code == 2
    assert (
        err.value.format_message()
        == "manifest: not a build manifest (built_models.m must be an object, got array)"
    )


def test_scalars_are_spelled_like_json() -> None:
    manifest = {
        "built_models": {"m": {"timeout": 7200.0, "n_gpus": 8, "tags": "single"}},
        "built_images": {"m": {"local_image": False, "build_duration": 12.5}},
        "context": {"docker_env_vars": {"T_FLAG": True, "T_NUM": 3}},
    }
    resolved = restore_context(manifest, None, {})
    assert resolved["exports"]["SM_MODEL_TIMEOUT"] == "7200"
    assert resolved["exports"]["SM_N_GPUS"] == "8"
    assert resolved["exports"]["SM_MODEL_TAGS"] == "single"
    assert resolved["exports"]["SM_LOCAL_IMAGE"] == "false"
    assert resolved["exports"]["SM_BUILD_DURATION"] == "12.5"
    assert resolved["docker_env"] == {"T_FLAG": "true", "T_NUM": "3"}


# ---------------------------------------------------------------------------------------------
# Properties


def bash_text(max_size: int = 40) -> st.SearchStrategy[str]:
    """Any text a bash variable can hold (no NUL, no lone surrogates), biased towards shell syntax."""
    shellish = st.sampled_from(
        ["$(", ")", "`", "'", '"', "\\", "$", "{", "}", ";", "\n", " ", "*", "~", "!", "#"]
    )
    plain = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
    return st.lists(st.one_of(shellish, plain), max_size=max_size // 4).map("".join)


NAMES = st.from_regex(r"T_[A-Z0-9_]{1,8}", fullmatch=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    literal=st.dictionaries(NAMES, bash_text(), max_size=4),
    referenced=st.dictionaries(NAMES, bash_text(), max_size=4),
    args=bash_text(),
)
def test_property_values_round_trip_exactly_through_bash(
    tmp_path: Path, literal: dict[str, str], referenced: dict[str, str], args: str
) -> None:
    env = {f"E{name}": value for name, value in referenced.items()}
    docker_env: dict[str, str] = dict(literal)
    docker_env.update({name: "${E" + name + "}" for name in referenced})
    manifest = {"built_models": {"m": {"args": args}}, "context": {"docker_env_vars": docker_env}}
    resolved = restore_context(manifest, None, env)
    expected = {**{k: v for k, v in literal.items() if k not in referenced}, **referenced}
    literal_without_refs = {
        k: v for k, v in literal.items() if k not in referenced and "$" not in v
    }  # literals with $ may legitimately be resolved or dropped
    names = ["SM_MODEL_ARGS", *literal_without_refs, *referenced]
    marker = tmp_path / "pwned"
    got = source_and_dump(render_bash(resolved, "m.json"), names, tmp_path)
    assert not marker.exists()
    assert got == [args] + [expected[name] for name in names[1:]]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)
MANIFEST_LIKE = st.fixed_dictionaries(
    {"built_models": st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=2)},
    optional={
        "built_images": st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=2) | JSON_VALUES,
        "context": st.fixed_dictionaries(
            {},
            optional={
                "docker_env_vars": st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3)
                | JSON_VALUES,
                "docker_mounts": st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3),
                "docker_build_arg": st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3),
                "docker_gpus": JSON_VALUES,
            },
        )
        | JSON_VALUES,
        "deployment_config": JSON_VALUES,
    },
)


@settings(max_examples=200, deadline=None)
@given(manifest=JSON_VALUES | MANIFEST_LIKE, model=st.none() | st.text(max_size=4))
def test_property_random_documents_resolve_or_fail_with_one_line(manifest: Any, model: str | None) -> None:
    try:
        resolved = restore_context(manifest, model, {})
    except HelperError as err:
        assert err.exit_code == 2
        assert "\n" not in err.format_message()
        return
    assert render_bash(resolved, "m.json").startswith("# slurm-multi manifest restore: m.json model ")
    json.loads(render_json(resolved, "m.json", {}))
    for warning in resolved["warnings"]:
        assert "\n" not in warning


@settings(max_examples=200, deadline=None)
@given(variables=st.dictionaries(st.text(max_size=6), st.text(max_size=10) | st.integers(), max_size=4))
def test_property_no_reference_is_ever_passed_on_unresolved(variables: dict[str, Any]) -> None:
    """With an empty environment every variable is either passed verbatim (no reference) or dropped."""
    manifest = {"built_models": {"m": {}}, "context": {"docker_env_vars": variables}}
    try:
        resolved = restore_context(manifest, None, {})
    except HelperError:
        return  # e.g. a NUL or surrogate in a value
    for name, value in resolved["docker_env"].items():
        assert value == str(variables[name])
        assert expand_references(value, {})[1] == []
