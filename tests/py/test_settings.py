"""slurm_multi.settings: the one settings table, the batch step's argv, precedence, validation, and
the places people read it (README.md, docs/options.md, --help) checked against it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_multi import settings as table
from slurm_multi.settings import SettingsError, parse_argv, resolve, validate

ROOT = Path(__file__).resolve().parents[2]


def resolved(env=None, argv=()):
    parsed = parse_argv(argv)
    return resolve(env or {}, parsed.given, parsed.typed)


def check(env=None, argv=(), command=False):
    r = resolved({"SM_IMAGE": "x", **(env or {})}, argv)
    validate(r, has_command=command, host="testhost")
    return r


# ---- parsing --------------------------------------------------------------------------------------


def test_options_both_spellings_the_command_after_the_separator_and_the_dry_run_node_count():
    p = parse_argv(["--image", "a:b", "--timeout=60", "--dry-run", "-N", "3", "--", "sh", "--image", "x"])
    assert p.given == {"SM_IMAGE": "a:b", "SM_TIMEOUT": "60"}
    assert p.typed == {"SM_IMAGE": "--image", "SM_TIMEOUT": "--timeout"}
    assert p.dry_run and p.nodes == "3"
    assert p.command == ["sh", "--image", "x"]
    assert parse_argv(["-N4"]).nodes == "4" and parse_argv(["--nodes=5"]).nodes == "5"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runtim", "pyxis"], "unknown option '--runtim' (did you mean --runtime?)"),
        (["--verbose"], "unknown option '--verbose'"),
        (["--image-cache"], "option --image-cache needs a value (DIR)"),
        (["train.py"], "unexpected argument 'train.py' (the workload command goes after --)"),
        (["-N"], "-N needs a node count"),
    ],
)
def test_a_typo_is_one_line_naming_what_was_typed(argv, message):
    with pytest.raises(SettingsError) as err:
        parse_argv(argv)
    assert str(err.value) == message


def test_did_you_mean_only_when_close():
    assert table.closest_option("--hang-timout") == "--hang-timeout"
    assert table.closest_option("--verbose") == ""


# ---- precedence -----------------------------------------------------------------------------------


def test_option_beats_variable_beats_alias_beats_slurm_beats_default():
    env = {"SM_TIMEOUT": "10", "MAD_DOCKER_BUILDS": "/alias", "SLURM_NTASKS_PER_NODE": "2"}
    r = resolved(env, ["--timeout", "20"])
    assert (r.values["SM_TIMEOUT"], r.label("SM_TIMEOUT")) == ("20", "--timeout")
    assert (r.values["SM_IMAGE_CACHE"], r.label("SM_IMAGE_CACHE")) == ("/alias", "MAD_DOCKER_BUILDS")
    assert r.values["SM_NTASKS_PER_NODE"] == "2" and r.label("SM_NTASKS_PER_NODE").startswith("sbatch")
    assert (r.values["SM_RUNTIME"], r.label("SM_RUNTIME")) == ("docker", "default")
    r = resolved({**env, "SM_IMAGE_CACHE": "/ours", "SM_NTASKS_PER_NODE": "3"})
    assert r.values["SM_IMAGE_CACHE"] == "/ours" and r.values["SM_NTASKS_PER_NODE"] == "3"
    assert resolved({"SLURM_NTASKS_PER_NODE": "4(x2)"}).values["SM_NTASKS_PER_NODE"] == "4"
    assert resolved({}).values["SM_NTASKS_PER_NODE"] == "1"


def test_every_setting_has_a_value_or_an_explicit_empty_and_no_default_is_left_to_bash():
    r = resolved({})
    assert set(r.values) == {s.name for s in table.TABLE}
    for s in table.TABLE:
        if s.name == "SM_STATE_DIR":  # made of other settings (test below)
            continue
        assert r.values[s.name] == s.default


def test_the_state_dir_defaults_beside_the_cache_else_under_out_made_absolute(tmp_path):
    out = resolved({"SLURM_SUBMIT_DIR": str(tmp_path)})
    assert out.values["SM_STATE_DIR"] == str(tmp_path / "slurm_output" / ".slurm-multi-state")
    assert out.label("SM_STATE_DIR") == "default"
    cache = resolved({"SM_IMAGE_CACHE": "/shared/cache"}, ["--out", "/shared/out"])
    assert cache.values["SM_STATE_DIR"] == "/shared/cache/.slurm-multi-state"
    given = resolved({"SM_IMAGE_CACHE": "/shared/cache"}, ["--state-dir", "/shared/state"])
    assert given.values["SM_STATE_DIR"] == "/shared/state" and given.label("SM_STATE_DIR") == "--state-dir"


def test_bash_defines_no_default_of_a_setting_in_the_table():
    """`${SM_X:-value}` for a setting of the table in bash would be a second owner of its default."""
    names = "|".join(s.name for s in table.TABLE)
    pattern = re.compile(r"\$\{(" + names + r"):-[^$}]")
    found = []
    for path in [*ROOT.glob("lib/*.sh"), *ROOT.glob("bin/*"), ROOT / "sbatch" / "multi.sbatch"]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


# ---- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "argv", "message"),
    [
        ({}, ["--hang-timeout", "-5"], "--hang-timeout '-5': expected a whole number of seconds, 0 or more"),
        (
            {"SM_TIMEOUT": "soon"},
            [],
            "--timeout (from SM_TIMEOUT) 'soon': expected a whole number of seconds",
        ),
        ({}, ["--master-port", "70000"], "--master-port '70000' is not a TCP port (1-65535)"),
        ({}, ["--runtime", "podman"], "--runtime 'podman': expected docker, pyxis or none"),
        ({}, ["--relay-fanout", "0"], "--relay-fanout '0': expected a whole number >= 1"),
        (
            {"MAD_COLLECT_METRICS": "perhaps"},
            [],
            "--collect (from MAD_COLLECT_METRICS) 'perhaps': expected true",
        ),
        ({}, ["--profile-optional", "maybe"], "--profile-optional 'maybe': expected true or false"),
        ({}, ["--ntasks-per-node", "2"], "--ntasks-per-node 2 with --runtime docker"),
        ({"SLURM_NTASKS_PER_NODE": "2"}, [], "sbatch --ntasks-per-node 2 with --runtime docker"),
        ({}, ["--profile-start-iter", "5"], "give both --profile-start-iter and --profile-stop-iter"),
        ({}, ["--profile-start-iter", "9", "--profile-stop-iter", "5"], "must not be before"),
        ({}, ["--profile", "nsys", "--profile-tool-options", "-o out"], "the output name is slurm-multi's"),
        ({}, ["--profile", "nsys", "--profile-tool-options", "'-t"], "unbalanced quotes"),
        ({}, ["--profile", "nsys", "--profile-stop-grace", "5"], "is shorter than --flush-settle-seconds 60"),
        ({}, ["--profile", "nsight-slurm"], "cannot run with --runtime docker"),
        ({}, ["--profile", "nsight-slurm", "--runtime", "none"], "needs --nsight-slurm-home DIR"),
        ({}, ["--runtime", "pyxis", "--out", "/a,b"], "--out '/a,b': pyxis cannot mount a path with a comma"),
        ({}, ["--framework", "TRT"], "--framework 'TRT': expected a lowercase name"),
        ({}, ["--image-cache", "cache"], "--image-cache 'cache' must be absolute"),
        ({"MAD_DOCKER_BUILDS": "./c"}, [], "--image-cache (from MAD_DOCKER_BUILDS) './c' must be absolute"),
        ({}, ["--out", "results"], "--out 'results' must be absolute"),
        ({"SM_OUT": "results"}, [], "--out (from SM_OUT) 'results' must be absolute"),
        (
            {},
            ["--profile", "nsys", "--nsys-host-path", "/nonexistent/nsys"],
            "not an executable file on testhost",
        ),
    ],
)
def test_a_value_that_cannot_work_is_one_line_naming_the_flag(env, argv, message):
    with pytest.raises(SettingsError) as err:
        check(env, argv)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_nsight_slurm_home_is_checked_for_both_tools(tmp_path):
    home = tmp_path / "ns"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "nsight-slurm").write_text("#!/bin/sh\n")
    os.chmod(home / "bin" / "nsight-slurm", 0o755)
    argv = ["--profile", "nsight-slurm", "--runtime", "none", "--nsight-slurm-home", str(home)]
    with pytest.raises(SettingsError, match="nsight-slurm-connector is missing or not executable"):
        check({}, argv)
    (home / "bin" / "nsight-slurm-connector").write_text("#!/bin/sh\n")
    os.chmod(home / "bin" / "nsight-slurm-connector", 0o755)
    check({}, argv)
    with pytest.raises(SettingsError, match="cuda-api needs a framework"):
        check({}, [*argv, "--nsight-slurm-mode", "cuda-api"])
    with pytest.raises(SettingsError, match="the nsight-slurm connector owns this flag"):
        check({}, [*argv, "--profile-tool-options", "--capture-range=nvtx"])


def test_nothing_to_run_and_an_unreadable_manifest(tmp_path):
    with pytest.raises(SettingsError, match="nothing to run"):
        validate(resolved({}), host="h")
    validate(resolved({}, ["--runtime", "none"]), has_command=True, host="h")
    with pytest.raises(SettingsError, match="no such readable file"):
        check({}, ["--manifest", str(tmp_path / "none.json")])


# ---- what people read -------------------------------------------------------------------------------


def test_readme_core_table_is_the_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert table.markdown_table(core_only=True) + "\n" in readme


def test_docs_options_is_the_whole_table():
    doc = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    assert table.markdown_table() + "\n" in doc


def test_readme_and_docs_name_no_option_the_table_does_not_have():
    """An option written in README.md or docs/ that the batch step would refuse as unknown."""
    known = set(table.BY_OPTION) | {"--dry-run", "--nodes", "--help"}
    texts = [ROOT / "README.md", *ROOT.glob("docs/*.md")]
    unknown = set()
    for path in texts:
        for flag in re.findall(r"sbatch/multi\.sbatch ([^`\n]*)", path.read_text(encoding="utf-8")):
            for word in re.findall(r"(?<![\w-])--[a-z][a-z-]+", flag.split(" -- ")[0]):
                if word not in known:
                    unknown.add(f"{path.name}: {word}")
    assert unknown == set()


def test_help_lists_every_option_its_variable_and_default():
    text = table.usage()
    for s in table.TABLE:
        if s.option:
            assert f"  {s.option} {s.metavar}" in text
        assert f"env {s.name}" in text or f"  {s.name}" in text
        if s.shown_default:
            assert s.shown_default in text


def test_env_cli_writes_bash_with_every_value_and_refuses_a_bad_one(tmp_path):
    out = tmp_path / "env.sh"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "py"), "SM_HANG_TIMEOUT": "12"}
    env.pop("SM_RUNTIME", None)
    proc = subprocess.run([sys.executable, "-m", "slurm_multi", "settings", "env", str(out)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "declare -gx SM_HANG_TIMEOUT=12\n" in text and "declare -gx SM_RUNTIME=docker\n" in text
    env["SM_HANG_TIMEOUT"] = "x"
    proc = subprocess.run([sys.executable, "-m", "slurm_multi", "settings", "env", str(tmp_path / "b")],
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2
    assert (
        proc.stderr
        == "slurm-multi: --hang-timeout (from SM_HANG_TIMEOUT) 'x': expected a whole number of seconds, "
        "0 or more (SM_HANG_TIMEOUT)\n"
    )


@pytest.mark.parametrize(
    ("env", "argv", "warning"),
    [
        (
            {},
            ["--runtime", "pyxis", "--relay-fanout", "2"],
            "--relay-fanout 2 does nothing with --runtime pyxis",
        ),
        (
            {},
            ["--image-transport", "cache", "--relay-fanout", "3"],
            "--relay-fanout 3 does nothing with --image-transport",
        ),
        (
            {"SM_NSYS_PATH": "/x/nsys"},
            [],
            "--nsys-path (from SM_NSYS_PATH) /x/nsys does nothing with --profile none",
        ),
        (
            {},
            ["--profile", "nsys", "--nsight-slurm-mode", "manual"],
            "--nsight-slurm-mode manual does nothing with",
        ),
        ({}, ["--container-image", "a.sqsh"], "--container-image a.sqsh does nothing with --runtime docker"),
    ],
)
def test_an_option_that_does_nothing_here_is_named(env, argv, warning):
    assert any(warning in line for line in table.unused(resolved({"SM_IMAGE": "x", **env}, argv)))


def test_defaults_and_what_does_matter_are_not_warned_about():
    assert table.unused(resolved({}, ["--runtime", "pyxis"])) == []
    assert (
        table.unused(resolved({}, ["--profile", "nsys", "--profile-dir", "/r", "--relay-fanout", "2"])) == []
    )


def test_the_default_out_is_relative_to_the_submit_dir_and_accepted():
    r = check({}, ["--image", "img"])  # the default ./slurm_output is not the user's relative path
    assert (r.values["SM_OUT"], r.label("SM_OUT")) == ("./slurm_output", "default")


@pytest.mark.parametrize(
    ("values", "tasks"),
    [
        ({}, 1),
        ({"SM_RUNTIME": "none", "SM_NTASKS_PER_NODE": "4"}, 4),
        ({"SM_RUNTIME": "pyxis", "SM_NTASKS_PER_NODE": "2"}, 2),
        ({"SM_RUNTIME": "docker", "SM_NTASKS_PER_NODE": "2"}, 1),  # one container per node
        ({"SM_RUNTIME": "none", "SM_NTASKS_PER_NODE": ""}, 1),
        ({"SM_RUNTIME": "none", "SM_NTASKS_PER_NODE": "0"}, 1),
    ],
)
def test_the_ranks_per_node_are_slurms_tasks_except_under_docker(values: dict, tasks: int) -> None:
    assert table.tasks_per_node(values) == tasks


def test_the_plan_and_madengine_count_the_ranks_per_node_with_the_settings_rule() -> None:
    from slurm_multi import madengine, plan

    assert plan.tasks_per_node is table.tasks_per_node
    assert madengine.tasks_per_node is table.tasks_per_node


# ---- numbers bash can count, and empty values ------------------------------------------------------


@pytest.mark.parametrize("name, flag", [("SM_TIMEOUT", "--timeout"), ("SM_MAX_REQUEUES", "--max-requeues"),
                                        ("SM_NTASKS_PER_NODE", "--ntasks-per-node"),
                                        ("SM_STOP_GRACE", "--stop-grace")])  # fmt: skip
def test_a_number_with_leading_zeros_reaches_bash_as_bash_reads_it(name, flag):
    # bash reads 08 as a bad octal number: `((SM_TIMEOUT > 0))` in an if was quietly false (no time
    # limit), `attempt >= SM_MAX_REQUEUES` never true (requeues without end).
    assert check({}, [flag, "08", "--runtime", "none"]).values[name] == "8"
    assert check({name: "0012"}, ["--runtime", "none"]).values[name] == "12"
    text = table.env_exports(check({}, [flag, "009", "--runtime", "none"]))
    assert f"declare -gx {name}=9\n" in text


@pytest.mark.parametrize("value", ["٣", "²", "1e3", "+5", " 5", "5 "])
def test_a_number_is_ascii_digits_only(value):
    with pytest.raises(SettingsError) as err:
        check({}, ["--hang-timeout", value])
    assert str(err.value).startswith(f"--hang-timeout '{value}': expected a whole number of seconds")


def test_a_number_past_any_sensible_bound_is_refused_before_bash_overflows_on_it():
    with pytest.raises(SettingsError) as err:
        check({}, ["--stop-grace", "99999999999999999999"])
    assert str(err.value) == (
        "--stop-grace '99999999999999999999': expected a whole number of seconds, 0 or more, "
        "at most 1000000000"
    )
    assert check({}, ["--stop-grace", "1000000000"]).values["SM_STOP_GRACE"] == "1000000000"


@pytest.mark.parametrize("flag", ["--runtime", "--timeout", "--out", "--hang-timeout", "--collect",
                                  "--nsys-path", "--image-cache", "--on-bad-node", "--profile"])  # fmt: skip
def test_an_option_typed_empty_is_refused_where_empty_is_no_value(flag):
    for argv in ([flag, ""], [f"{flag}="]):
        with pytest.raises(SettingsError) as err:
            check({}, argv)
        assert str(err.value).startswith(f"{flag} '': an empty value; give ")
        assert str(err.value).endswith(f"or drop {flag} for its default")


def test_an_empty_value_that_means_something_is_taken_and_an_empty_variable_is_unset():
    assert check({}, ["--model-args", ""]).values["SM_MODEL_ARGS"] == ""
    assert check({}, ["--profile-tool-options="]).values["SM_PROFILE_TOOL_OPTIONS"] == ""
    assert check({"SM_RUNTIME": ""}).values["SM_RUNTIME"] == "docker"  # an empty variable: unset


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "a b", "a\nb", "a\tb"])
def test_an_image_that_would_be_read_as_a_docker_option_or_two_words_is_refused(image):
    for flag in ("--image", "--container-image"):
        with pytest.raises(SettingsError) as err:
            check({}, [flag, image])
        assert "not an image reference" in str(err.value) and "\n" not in str(err.value)


def test_values_the_nodes_would_refuse_are_refused_by_the_plan():
    # The quarantine's own bound, said before the job instead of after it.
    with pytest.raises(SettingsError, match=r"^--quarantine-hours '87841': expected at most 87840 hours$"):
        check({}, ["--quarantine-hours", "87841"])
    assert check({}, ["--quarantine-hours", "87840"]).values["SM_QUARANTINE_HOURS"] == "87840"


def test_on_bad_node_is_not_called_useless_with_fitness_off_it_still_acts_on_nodes_lost_in_the_run():
    warnings = table.unused(resolved({"SM_IMAGE": "x"}, ["--fitness", "off", "--on-bad-node", "requeue",
                                                         "--fitness-timeout", "5"]))  # fmt: skip
    assert not any("--on-bad-node" in w for w in warnings)
    assert any(w.startswith("--fitness-timeout 5 does nothing with --fitness off") for w in warnings)


@pytest.mark.parametrize("path, says", [
    ("/nonexistent/x.sh", "cannot write /nonexistent/x.sh: no such file"),
    ("", "FILE '': give the path"),
    ("-", "FILE '-': give the path"),
])  # fmt: skip
def test_settings_env_into_a_file_it_cannot_write_is_one_line(tmp_path, path, says):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "py")}
    proc = subprocess.run([sys.executable, "-m", "slurm_multi", "settings", "env", path], env=env,
                          cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"slurm-multi: settings env: {says}")
    assert list(tmp_path.iterdir()) == []


def test_model_args_that_cannot_be_split_name_the_option_not_the_manifest():
    with pytest.raises(SettingsError) as err:
        check({}, ["--model-args", "'unbalanced"])
    assert str(err.value) == (
        '--model-args "\'unbalanced" cannot be split into words (No closing quotation); fix its quoting'
    )
    with pytest.raises(SettingsError, match=r"^--model-args \(from SM_MODEL_ARGS\) "):
        check({"SM_MODEL_ARGS": 'a "b'})


def test_the_manifest_models_options_are_named_when_there_is_no_manifest_or_a_command_replaces_it():
    argv = ["--model-dir", "/m", "--model-args", "--steps 9", "--launcher", "torchrun",
            "--nproc-per-node", "4", "--mad-common", "/c"]  # fmt: skip
    warnings = table.unused(resolved({"SM_IMAGE": "x"}, argv), has_command=True)
    for flag in ("--model-dir", "--model-args", "--launcher", "--nproc-per-node", "--mad-common"):
        said = [w for w in warnings if w.startswith(f"{flag} ")]
        assert len(said) == 1 and "does nothing without --manifest" in said[0], flag
    manifest = str(ROOT / "examples" / "toy" / "build_manifest.json")
    with_manifest = resolved({"SM_MANIFEST": manifest}, ["--model-args", "--steps 9"])
    assert table.unused(with_manifest) == []
    assert table.unused(with_manifest, has_command=True) == [
        "--model-args --steps 9 does nothing with a command after -- (it runs instead of the model's "
        "script); ignored"
    ]
