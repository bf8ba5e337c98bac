"""madengine's run around a model's script (slurm_multi.madrun): tools, pre/post scripts,
encapsulate_script, scripts/common, data providers, and the bash that runs them, run for real."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_multi import madrun
from slurm_multi.common import HelperError

TOOLS = {
    "tools": {
        "A": {"pre_scripts": [{"path": "scripts/common/echo.sh", "args": "pre A"}], "cmd": "echo cmd_A &&",
              "env_vars": {"TOOL_A": "a", "SHARED": "from A"},
              "post_scripts": [{"path": "scripts/common/echo.sh", "args": "post A"}]},
        "B": {"pre_scripts": [{"path": "scripts/common/echo.sh", "args": "pre B"}], "cmd": "echo cmd_B &&",
              "env_vars": {"TOOL_B": "b"}, "post_scripts": [{"path": "scripts/common/echo.sh", "args": "post B"}]},  # noqa: E501
        "trace": {"cmd": "echo trace &&", "env_vars": {"ROCBLAS_TRACE": "1"}},
        "trace2": {"cmd": "echo trace &&", "env_vars": {"MIOPEN_TRACE": "1"}},
        "rocprof": {"cmd": "echo rocprof &&", "post_scripts": []},
        "rocprofv3": {"cmd": "echo rocprofv3 &&", "post_scripts": []},
    }
}  # fmt: skip


def checkout(tmp_path: Path, tools: dict | None = None) -> Path:
    root = tmp_path / "mad"
    (root / "scripts" / "common").mkdir(parents=True)
    (root / "scripts" / "common" / "tools.json").write_text(json.dumps(tools or TOOLS))
    echo = root / "scripts" / "common" / "echo.sh"
    echo.write_text('#!/bin/bash\necho "$@"\n[ "$1" != fail ] || exit 7\n')
    (root / "scripts" / "m").mkdir()
    (root / "scripts" / "m" / "run.sh").write_text('echo "model [$*]"; exit "${MODEL_EXIT:-0}"\n')
    return root


def manifest(context: dict | None = None, model: dict | None = None) -> dict:
    return {"built_models": {"k": {"name": "m", "scripts": "scripts/m/run.sh", **(model or {})}},
            "context": context or {}}  # fmt: skip


def plan(root: Path, context: dict | None = None, model: dict | None = None, nnodes: int = 2, **values: str):
    parts = madrun.read_parts(manifest(context, model), "k")
    return madrun.plan_run(parts, str(root), values, nnodes)


# ---- tools ---------------------------------------------------------------------------------------


def test_tools_stack_as_madengine_stacks_them(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    run = plan(root, {"tools": [{"name": "A"}, {"name": "B", "env_vars": {"TOOL_B": "mine"}}],
                      "pre_scripts": [{"path": "scripts/common/echo.sh", "args": "pre ctx"}],
                      "post_scripts": [{"path": "scripts/common/echo.sh", "args": "post ctx"}],
                      "encapsulate_script": "echo enc &&"})  # fmt: skip
    assert [s.args for s in run.pre] == ["pre B", "pre A", "pre ctx"]
    assert [s.args for s in run.post] == ["post ctx", "post A", "post B"]
    assert run.prefix == "echo cmd_B && echo cmd_A && echo enc &&"  # the last tool outermost
    assert run.env == {"TOOL_A": "a", "SHARED": "from A", "TOOL_B": "mine"}  # the context's override wins
    assert run.tools == ["A", "B"] and run.common == str(root / "scripts" / "common")
    assert [s.origin for s in run.pre] == ["tool B", "tool A", "context"]


def test_the_same_tool_command_is_added_once(tmp_path: Path) -> None:
    run = plan(checkout(tmp_path), {"tools": [{"name": "trace"}, {"name": "trace2"}]})
    assert run.prefix == "echo trace &&" and run.env == {"ROCBLAS_TRACE": "1", "MIOPEN_TRACE": "1"}


def test_a_cmd_override_replaces_the_tools_command(tmp_path: Path) -> None:
    run = plan(checkout(tmp_path), {"tools": [{"name": "A", "cmd": "time"}]})
    assert run.prefix == "time"


@pytest.mark.parametrize(("nnodes", "name"), [(1, "rocprof"), (2, "rocprofv3"), (8, "rocprofv3")])
def test_rocprof_becomes_rocprofv3_on_more_than_one_node(tmp_path: Path, nnodes: int, name: str) -> None:
    run = plan(checkout(tmp_path), {"tools": [{"name": "rocprof"}]}, nnodes=nnodes)
    assert run.tools == [name] and run.prefix == f"echo {name} &&"
    assert run.profilers == [name]
    assert bool(run.notes) == (nnodes > 1)


def test_an_unknown_tool_is_one_line_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(
        HelperError, match=r"context.tools names 'rocprofx', which tools.json does not have \(A, B,"
    ):
        plan(checkout(tmp_path), {"tools": [{"name": "rocprofx"}]})


def test_tools_without_any_scripts_common_name_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "madengine" not in p])
    (tmp_path / "bare").mkdir()
    with pytest.raises(HelperError, match="give --mad-common DIR"):
        plan(tmp_path / "bare", {"tools": [{"name": "A"}]})


def test_scripts_common_comes_from_the_option_the_checkout_then_the_madengine_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = checkout(tmp_path)
    package = tmp_path / "site" / "madengine" / "scripts" / "common"
    package.mkdir(parents=True)
    (tmp_path / "site" / "madengine" / "__init__.py").write_text("raise SystemExit('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    other = tmp_path / "other"
    other.mkdir()
    assert madrun.find_common(str(root), str(other)) == str(other)
    assert madrun.find_common(str(root)) == str(root / "scripts" / "common")
    assert madrun.find_common(str(tmp_path / "nothing")) == str(package)
    with pytest.raises(HelperError, match="--mad-common /nonexistent: no such directory"):
        madrun.find_common(str(root), "/nonexistent")


@pytest.mark.parametrize(
    ("context", "says"),
    [
        ({"tools": "rocprof"}, "context.tools must be a list"),
        ({"tools": [{"cmd": "x"}]}, r"context.tools\[0\] must be an object with a name"),
        ({"tools": [{"name": "A", "env_vars": ["X=1"]}]}, r"context.tools\[0\].env_vars must be an object"),
        ({"pre_scripts": [{"args": "x"}]}, r"context.pre_scripts\[0\] must be an object with a path"),
        ({"post_scripts": [{"path": "../../etc/passwd"}]}, "must be relative to the checkout"),
        (
            {"pre_scripts": [{"path": "scripts/common/nope.sh"}]},
            "context script scripts/common/nope.sh is not in",
        ),
        ({"pre_scripts": [{"path": "scripts/x/nope.sh"}]}, "is not in the checkout"),
        ({"encapsulate_script": ["x"]}, "encapsulate_script must be a string"),
    ],
)
def test_malformed_fields_are_one_line_naming_the_field(tmp_path: Path, context: dict, says: str) -> None:
    with pytest.raises(HelperError, match=says):
        plan(checkout(tmp_path), context)


def test_a_script_outside_scripts_common_is_seen_at_its_checkout_path(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    run = plan(root, {"pre_scripts": [{"path": "scripts/m/run.sh", "args": ""}]})
    assert run.files == [(str(root / "scripts" / "m" / "run.sh"), "scripts/m/run.sh")]


# ---- data ----------------------------------------------------------------------------------------


def data_checkout(tmp_path: Path, table: dict) -> Path:
    root = checkout(tmp_path)
    (root / "data.json").write_text(json.dumps(table))
    (root / "ds").mkdir()
    return root


def test_a_local_provider_is_mounted_read_only_at_madengines_datahome(tmp_path: Path) -> None:
    root = data_checkout(tmp_path, {"d1": {"local": {"path": "ds"}}, "d2": {"local": {"path": str(tmp_path), "home": "/data", "readwrite": "true"}}})  # fmt: skip # noqa: E501
    run = plan(root, model={"data": "d1, d2"})
    assert [(d.name, d.provider, d.path, d.home, d.writable) for d in run.data] == [
        ("d1", "local", str(root / "ds"), "/data_dlm_0", False),
        ("d2", "local", str(tmp_path), "/data", True),
    ]
    assert run.env == {"MAD_DATAHOME": "/data_dlm_0,/data", "MAD_DATANAME": "d1,d2"}
    assert [d.mount for d in run.data] == [f"{root / 'ds'}:/data_dlm_0:ro", f"{tmp_path}:/data"]
    assert run.data_columns() == {"dataname": "d1,d2", "data_provider_type": "local,local", "data_size": "",
                                  "data_download_duration": "0"}  # fmt: skip


def test_providers_are_tried_in_madengines_order(tmp_path: Path) -> None:
    root = data_checkout(tmp_path, {"d": {"nas": {"path": "ds"}, "local": {"path": "/nonexistent"}}})
    assert [d.provider for d in plan(root, model={"data": "d"}).data] == ["nas"]


@pytest.mark.parametrize(
    ("table", "name", "says"),
    [
        ({"d": {"aws": {"path": "s3://b/x"}}}, "d", "no data provider of 'd' .* aws: slurm-multi cannot run madengine's aws downloader"),  # noqa: E501
        ({"d": {"local": {"path": "/nonexistent/x"}}}, "d", "local: path /nonexistent/x is not a directory on this node"),  # noqa: E501
        ({"d": {"local": {"path": "ds"}}}, "other", "data name 'other' is not in .*data.json"),
    ],
)  # fmt: skip
def test_a_data_name_no_provider_can_serve_is_one_line(
    tmp_path: Path, table: dict, name: str, says: str
) -> None:
    with pytest.raises(HelperError, match=says):
        plan(data_checkout(tmp_path, table), model={"data": name})


def test_a_model_with_data_and_no_data_json_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(HelperError, match=r"needs data \(d\) but .*data.json cannot be read"):
        plan(checkout(tmp_path), model={"data": "d"})


# ---- the wrapper, run by bash --------------------------------------------------------------------


def run_wrapper(tmp_path: Path, root: Path, context: dict, args: str = "", missing=None, **env: str):
    run = plan(root, context)
    work = tmp_path / "ws" / "run_directory"
    work.mkdir(parents=True)
    (tmp_path / "ws" / "scripts").mkdir()
    os.symlink(root / "scripts" / "common", tmp_path / "ws" / "scripts" / "common")
    (work / "run.sh").write_text((root / "scripts" / "m" / "run.sh").read_text())
    out = tmp_path / "out"
    out.mkdir()
    line = madrun.model_line(run, ["bash", "run.sh"], args)
    text = madrun.wrapper(run, line, missing)
    done = subprocess.run(["bash", "-c", text, "sm-mad"], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "SM_OUTPUT_DIR": str(out), **env}, check=False)  # fmt: skip
    return done, [line for line in done.stdout.splitlines() if not line.startswith("mad: ")]


CONTEXT = {"tools": [{"name": "A"}, {"name": "B"}], "post_scripts": [{"path": "scripts/common/echo.sh", "args": "post ctx"}]}  # fmt: skip # noqa: E501


def test_the_wrapper_runs_everything_in_madengines_order(tmp_path: Path) -> None:
    done, said = run_wrapper(tmp_path, checkout(tmp_path), CONTEXT, "--x \"$GREETING\" 'a b'", GREETING="hi")
    assert done.returncode == 0, done.stderr
    assert said == ["pre B", "pre A", "cmd_B", "cmd_A", "model [--x hi a b]", "post ctx", "post A", "post B"]


def test_a_failed_model_still_runs_the_post_scripts_and_keeps_its_exit(tmp_path: Path) -> None:
    done, said = run_wrapper(tmp_path, checkout(tmp_path), CONTEXT, MODEL_EXIT="3")
    assert done.returncode == 3
    assert said[-3:] == ["post ctx", "post A", "post B"]


def test_a_failed_pre_script_stops_the_model_but_not_the_post_scripts(tmp_path: Path) -> None:
    context = {**CONTEXT, "pre_scripts": [{"path": "scripts/common/echo.sh", "args": "fail"}]}
    done, said = run_wrapper(tmp_path, checkout(tmp_path), context)
    assert done.returncode == 7
    assert "model" not in " ".join(said) and said[-3:] == ["post ctx", "post A", "post B"]
    assert "pre-script scripts/common/echo.sh failed (exit 7): the model does not run" in done.stderr


def test_a_failed_post_script_fails_a_model_that_succeeded(tmp_path: Path) -> None:
    context = {"post_scripts": [{"path": "scripts/common/echo.sh", "args": "fail"}]}
    done, _ = run_wrapper(tmp_path, checkout(tmp_path), context)
    assert done.returncode == 7 and "post-script scripts/common/echo.sh failed (exit 7)" in done.stderr


def test_a_script_missing_from_the_image_leaves_its_reason_and_exits_127(tmp_path: Path) -> None:
    reason = (
        "model script scripts/x/run.sh is neither in the model dir /m nor in the image's working directory"
    )
    run = madrun.MadRun()
    out = tmp_path / "out"
    out.mkdir()
    text = madrun.wrapper(run, "bash scripts/x/run.sh", ("scripts/x/run.sh", reason))
    done = subprocess.run(["bash", "-c", text], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "SM_OUTPUT_DIR": str(out)}, check=False)  # fmt: skip
    assert done.returncode == 127 and done.stderr.strip() == reason
    assert (out / madrun.MISSING_MARKER).read_text() == reason + "\n"


def test_the_tools_outputs_are_staged_from_the_run_directory_and_the_workspace(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    (root / "scripts" / "common" / "trace.sh").write_text(
        "mkdir -p rocprof_output && echo t >rocprof_output/r.csv && echo e >../m_env.csv\n"
    )
    context = {"tools": [{"name": "A"}], "post_scripts": [{"path": "scripts/common/trace.sh"}]}
    done, _ = run_wrapper(tmp_path, root, context)
    assert done.returncode == 0, done.stderr
    tools = tmp_path / "out" / "tools"
    assert (tools / "rocprof_output" / "r.csv").read_text() == "t\n" and (tools / "m_env.csv").exists()


@pytest.mark.parametrize(("args", "shell"), [("--steps 20", False), ("--name 'a b'", False), ("--x $HOME", True),  # noqa: E501
                                             ("--glob *.csv", True), ("a; b", True), ("`id`", True)])  # fmt: skip # noqa: E501
def test_args_that_need_a_shell(args: str, shell: bool) -> None:
    assert madrun.needs_shell(args) is shell


def test_with_a_tools_dir_the_outputs_are_staged_there_not_in_the_output_dir(tmp_path: Path) -> None:
    root = checkout(tmp_path)
    (root / "scripts" / "common" / "trace.sh").write_text(
        "mkdir -p rocprof_output && echo t >rocprof_output/r.csv\n"
    )
    context = {"tools": [{"name": "A"}], "post_scripts": [{"path": "scripts/common/trace.sh"}]}
    inside = tmp_path / "in-container"
    done, _ = run_wrapper(tmp_path, root, context, SM_MAD_TOOLS_DIR=str(inside))
    assert done.returncode == 0, done.stderr
    assert (inside / "rocprof_output" / "r.csv").read_text() == "t\n"
    assert not (tmp_path / "out" / "tools").exists()


def test_a_custom_provider_runs_its_script_in_datahome_before_the_model(tmp_path: Path) -> None:
    root = data_checkout(tmp_path, {"d": {"custom": {"path": "scripts/m/make.sh", "args": "2 $X"}}})
    (root / "scripts" / "m" / "make.sh").write_text('echo "made $1 $2 in $(pwd)" >made.txt; echo made\n')
    run = plan(root, model={"data": "d"})
    assert [(d.provider, d.script, d.args, d.home, d.mounted, d.writable) for d in run.data] == [
        ("custom", "scripts/m/make.sh", "2 $X", "/data_dlm_0", False, False)  # made by its script
    ]
    assert (str(root / "scripts" / "m" / "make.sh"), "scripts/m/make.sh") in run.files
    home = tmp_path / "home"
    run.data = [dataclasses.replace(run.data[0], home=str(home))]
    work = tmp_path / "ws" / "run_directory"
    work.mkdir(parents=True)
    os.symlink(root / "scripts", tmp_path / "ws" / "scripts")
    (work / "run.sh").write_text('cat "$H/made.txt"\n')
    text = madrun.wrapper(run, madrun.model_line(run, ["bash", "run.sh"], ""))
    done = subprocess.run(["bash", "-c", text], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "H": str(home), "X": "x"}, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"made 2 x in {home}" in done.stdout
    assert done.stdout.startswith(f"mad: data d (custom): scripts/m/make.sh 2 $X into {home}\nmade\n")
    # A script that fails: the model does not run, and the wrapper says so in one line.
    (root / "scripts" / "m" / "make.sh").write_text("exit 4\n")
    done = subprocess.run(["bash", "-c", text], cwd=work, capture_output=True, text=True, check=False)
    assert done.returncode == 4 and "made" not in done.stdout
    said = "mad: data d (custom): scripts/m/make.sh 2 $X failed (exit 4): the model does not run\n"
    assert done.stderr == said
    # After a failed pre-script the data is not made either (one failure, one line).
    run.pre = [madrun.Script("scripts/m/make.sh", "", "context")]
    text = madrun.wrapper(run, madrun.model_line(run, ["bash", "run.sh"], ""))
    done = subprocess.run(["bash", "-c", text], cwd=work, capture_output=True, text=True, check=False)
    assert done.returncode == 4 and " into " not in done.stdout
    assert done.stderr == "mad: pre-script scripts/m/make.sh failed (exit 4): the model does not run\n"


def test_a_custom_provider_whose_script_is_not_in_the_checkout_is_one_line(tmp_path: Path) -> None:
    root = data_checkout(tmp_path, {"d": {"custom": {"path": "scripts/none.sh"}}})
    with pytest.raises(HelperError, match="custom: script scripts/none.sh is not a file in the checkout"):
        plan(root, model={"data": "d"})


def test_bare_metal_sees_mounted_data_where_it_is_and_makes_custom_data_under_its_root(tmp_path: Path):
    root = data_checkout(tmp_path, {"d1": {"local": {"path": "ds"}}, "d2": {"custom": {"path": "scripts/m/run.sh"}}})  # fmt: skip # noqa: E501
    parts = madrun.read_parts(manifest(model={"data": "d1,d2"}), "k")
    bare = madrun.plan_run(parts, str(root), {}, 2, bare_root="/scratch/r0")
    assert [d.home for d in bare.data] == [str(root / "ds"), "/scratch/r0/data_dlm_1"]
    assert bare.env["MAD_DATAHOME"] == f"{root / 'ds'},/scratch/r0/data_dlm_1"
    # In a container: the mount point and the custom provider's home there.
    assert madrun.plan_run(parts, str(root), {}, 2).env["MAD_DATAHOME"] == "/data_dlm_0,/data_dlm_1"


def prepare_data_model(tmp_path: Path, runtime: str) -> Path:
    """`node prepare` of a model with a local and a custom data provider, the manifest giving its own
    MAD_DATAHOME; returns the scratch dir."""
    from slurm_multi import node

    root = data_checkout(tmp_path, {"d1": {"local": {"path": "ds"}}, "d2": {"custom": {"path": "scripts/m/run.sh"}}})  # fmt: skip # noqa: E501
    doc = {"built_images": {"k": {"docker_image": "toy/model:local"}},
           **manifest({"docker_env_vars": {"MAD_DATAHOME": "/theirs"}}, {"data": "d1,d2"})}  # fmt: skip
    (root / "build_manifest.json").write_text(json.dumps(doc))
    scratch = tmp_path / "scratch"
    env = {"SM_MANIFEST": str(root / "build_manifest.json"), "SM_RUNTIME": runtime, "PATH": "/usr/bin:/bin"}
    node.prepare(env, str(scratch), (), detect=False)
    return scratch


def test_prepare_on_bare_metal_names_the_data_by_its_paths_on_the_node(tmp_path: Path) -> None:
    scratch = prepare_data_model(tmp_path, "none")
    workload = (scratch / "workload.env").read_text().splitlines()
    home = f"{tmp_path / 'mad' / 'ds'},{scratch}/data_dlm_1"
    assert f"declare -gx MAD_DATAHOME={home}" in workload  # ours, over the manifest's
    assert "MAD_DATAHOME=/theirs" not in "\n".join(workload)


def test_prepare_in_a_container_mounts_the_data_and_keeps_the_manifests_datahome(tmp_path: Path) -> None:
    scratch = prepare_data_model(tmp_path, "pyxis")
    assert "declare -gx MAD_DATAHOME=/theirs" in (scratch / "workload.env").read_text().splitlines()
    context = (scratch / "context.sh").read_text()
    assert f"{tmp_path / 'mad' / 'ds'}:/data_dlm_0:ro" in context
    assert ":/data_dlm_1" not in context  # the custom provider's data is made by its script, not mounted


def test_rocprof_as_rocprofv3_is_said_once_by_the_plan_not_by_every_node(tmp_path: Path, capfd) -> None:
    from slurm_multi import node

    root = checkout(tmp_path)
    doc = manifest({"tools": [{"name": "rocprof"}]})
    doc["built_images"] = {"k": {"docker_image": "toy/model:local"}}
    path = root / "build_manifest.json"
    path.write_text(json.dumps(doc))
    note = "tool rocprof runs as rocprofv3 on a multi-node job (madengine's rule)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM_", "MAD_"))}
    env.update(PYTHONPATH=str(Path(madrun.__file__).parents[1]), SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="2")
    argv = [sys.executable, "-m", "slurm_multi", "job", "plan", "--batch-args", "--emit", str(tmp_path / "p")]
    argv += ["--submit-dir", str(tmp_path), "--", "--manifest", str(path), "--runtime", "none"]
    planned = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert planned.returncode == 0, planned.stderr
    assert planned.stderr.count(note) == 1
    capfd.readouterr()
    node_env = {"SM_MANIFEST": str(path), "SM_RUNTIME": "none", "PATH": "/usr/bin:/bin", "NNODES": "2"}
    node.prepare(node_env, str(tmp_path / "scratch"), (), detect=False)
    said = capfd.readouterr().err
    assert "madengine's run of scripts/m/run.sh: tools rocprofv3" in said and note not in said
