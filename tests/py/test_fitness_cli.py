"""The fitness stage's command line (slurm_multi.fitness.cli): usage errors, --help, the judge
command, the job's port, and collect's use of the same verdict.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from fitness_nodes import REPO, TOKEN, cli, view
from slurm_multi.fitness import cli as fitness_cli

RUN = ["run", "--rank", "0", "--nnodes", "2", "--hosts", "a b", "--port", "23456", "--job-id", "7"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*RUN[:7], "--port", "http", *RUN[9:]], "--port 'http' is not allowed; use an integer 1-65535"),
        (["run", "--rank", "2", *RUN[3:]], "--rank '2' is not allowed; use an integer 0-1"),
        ([*RUN[:5], "--hosts", "a", *RUN[7:]], "--hosts 'a' is not allowed; give 2 host names"),
        ([*RUN[:5], "--hosts", "a a", *RUN[7:]], "--hosts 'a a' is not allowed; give each rank its own host"),
        ([*RUN, "--runtime", "podman"], "--runtime 'podman' is not allowed; use docker, pyxis or none"),
        ([*RUN, "--disk", "/var/lib/docker"], "--disk '/var/lib/docker' is not allowed; use PATH=BYTES"),
        ([*RUN, "--disk", "/d=2G"], "--disk '2G' is not allowed; use an integer 0 or more"),
        (
            [*RUN, "--gpu-mem-fraction", "1.5"],
            "--gpu-mem-fraction '1.5' is not allowed; use a number at least 0",
        ),
        ([*RUN, "--timeout", "0"], "--timeout '0' is not allowed; use a number more than 0"),
        ([*RUN, "--slow-factor", "nan"], "--slow-factor 'nan' is not allowed"),
        ([*RUN, "--min-rate", "-1"], "--min-rate '-1' is not allowed; use a number at least 0"),
        ([*RUN, "--tmeout", "3"], ("No such option '--tmeout'", "; Usage: slurm-multi fitness run")),
        ([*RUN, "stray"], "Got unexpected extra argument (stray)"),
        (["rn", *RUN[1:]], "No such command 'rn'"),
        (RUN[:5], "Missing option '--hosts'"),
        ([*RUN, "--token-env", "NO_SUCH_TOKEN"], "--token-env NO_SUCH_TOKEN: $NO_SUCH_TOKEN is not set"),
        ([*RUN[:-2]], "--job-id '' is not allowed; give the job ID"),
        (["judge", "--jobdir", "/no/such/dir", "--nnodes", "2"], "--jobdir '/no/such/dir' is not allowed"),
        (
            ["judge", "--jobdir", "/", "--nnodes", "0"],
            "--nnodes '0' is not allowed; use an integer 1 or more",
        ),
        ([], "Missing command; Usage: slurm-multi fitness"),
        (["record-cmd", "f.json", "node1", "-1", "why"], "No such option '-1'"),
        (["record-cmd", "f.json", "node1", "x", "why"], "Invalid value for 'EXIT_CODE'"),
    ],
)
def test_usage_errors_are_one_line_naming_the_flag_and_exit_2(
    argv: list[str], expected: str | tuple[str, ...]
) -> None:
    result = cli(argv, {"SM_BARRIER_TOKEN": TOKEN})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert re.match(r"slurm-multi: fitness( run| judge| record-cmd)?: ", line), line
    for part in [expected] if isinstance(expected, str) else expected:
        assert part in line, line


def test_the_token_value_is_never_shown_in_a_usage_error() -> None:
    result = cli(RUN, {"SM_BARRIER_TOKEN": "has spaces in it"})
    assert result.returncode == 2 and "has spaces" not in result.stderr
    assert "$SM_BARRIER_TOKEN is not set or not 1-64 printable ASCII characters" in result.stderr


def test_the_token_given_where_its_name_goes_is_never_said_back() -> None:
    for given in ("3fa9c0d1e2b4a6978877665544332211", "abcdefTOKENxyz"):
        result = cli([*RUN, "--token-env", given], {"SM_BARRIER_TOKEN": given})
        assert result.returncode == 2 and given not in result.stderr, result.stderr
        assert "--token-env is not an environment variable name" in result.stderr


def test_judge_command_prints_bad_nodes_as_tab_separated_lines_or_json(tmp_path: Path) -> None:
    for rank, report in enumerate(
        [view(0, 3, local="GPU 1 held by pid 4242 (2048 MiB) of another job"), view(1, 3)]
    ):
        (tmp_path / f"node_{rank}").mkdir()
        (tmp_path / f"node_{rank}" / "fitness.json").write_text(json.dumps(report))
    (tmp_path / "node_2").mkdir()
    (tmp_path / "node_2" / "fitness.json").write_text("{not json")
    text = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "3"])
    assert text.returncode == 0, text.stderr
    # Without the job's host list a rank is named by its own report only: node_2 wrote none it can read.
    assert text.stdout.splitlines() == [
        "0\tnode0\tGPU 1 held by pid 4242 (2048 MiB) of another job\tlocal",
        "2\trank2\tno fitness report (the stage did not finish on that node)\tnone",
    ]
    (tmp_path / "job.json").write_text(json.dumps({"nodes": ["node0", "node1", "node2"]}))
    text = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "3"])
    assert (
        text.stdout.splitlines()[1]
        == "2\tnode2\tno fitness report (the stage did not finish on that node)\tnone"
    )
    as_json = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "3", "--json"])
    assert [entry["rank"] for entry in json.loads(as_json.stdout)] == [0, 2]
    assert cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "2", "--json"]).stdout.strip() == (
        '[{"rank": 0, "host": "node0", "reason": "GPU 1 held by pid 4242 (2048 MiB) of another job", '
        '"evidence": "local"}]'
    )
    (tmp_path / "node_0" / "fitness.json").write_text(json.dumps(view(0, 2)))
    fine = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "2"])
    assert (fine.returncode, fine.stdout) == (0, "")


def _bad_node_job(root: Path) -> Path:
    """A finished 2-node job whose rank 0 found its own GPU held: its fitness stage failed."""
    reports = [view(0, 2, local="GPU 1 held by pid 4242 (2048 MiB) of another job"), view(1, 2)]
    job = {"job_id": "77", "model": "m", "nnodes": 2, "nodes": ["node0", "node1"], "results_csv": "p.csv",
           "settings": {"SM_FITNESS": "on"}}  # fmt: skip
    root.mkdir()
    (root / "job.json").write_text(json.dumps(job))
    for rank, report in enumerate(reports):
        node = root / f"node_{rank}"
        node.mkdir()
        (node / "fitness.json").write_text(json.dumps(report))
        failed = rank == 0
        stages = {"prepare": {"seconds": 0.2, "status": "ok"},
                  "fitness": {"seconds": 0.1, "status": "failed" if failed else "ok"}}  # fmt: skip
        status = {"rank": rank, "node": f"node{rank}", "exit_code": 1 if failed else 0,
                  "status": "failed" if failed else "ok", "reason": "", "stages": stages}  # fmt: skip
        (node / "status.json").write_text(json.dumps(status))
        (node / "p.csv").write_text("model,performance,metric\nm,1.5,x\n")
    return root


def test_collect_writes_the_bad_nodes_the_judge_finds_and_holds_the_perf_csv_for_a_requeue(
    tmp_path: Path,
) -> None:
    """The batch step judges the fitness reports once, in collect (--bad-nodes): the same lines as
    `fitness judge`, with the cause (fitness) after them; a job to be requeued appends no rows
    (--no-perf-csv-on-bad-nodes)."""
    jobdir = _bad_node_job(tmp_path / "job")
    judged = cli(["judge", "--jobdir", str(jobdir), "--nodes", "node0 node1"])
    assert judged.returncode == 0 and judged.stdout, judged.stderr
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    collect = [sys.executable, "-m", "slurm_multi", "results", "collect", str(jobdir), "--no-picture"]
    shared = tmp_path / "perf.csv"
    hold = ["--bad-nodes", str(tmp_path / "bad"), "--perf-csv", str(shared), "--no-perf-csv-on-bad-nodes"]
    held = subprocess.run([*collect, *hold], capture_output=True, text=True, env=env)
    assert held.returncode == 1, held.stderr
    judge_line = "0\tnode0\tGPU 1 held by pid 4242 (2048 MiB) of another job\tlocal"
    assert judged.stdout == f"{judge_line}\n"
    assert (tmp_path / "bad").read_text() == f"{judge_line}\tfitness\n"
    assert not shared.exists() and "no rows appended" in held.stderr
    # Not to be requeued (the flag not given): the rows go to the shared file as before.
    kept = subprocess.run([*collect, "--bad-nodes", str(tmp_path / "bad"), "--perf-csv", str(shared)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert kept.returncode == 1 and shared.exists(), kept.stderr
    # A healthy job: the file is written, empty.
    for rank in (0, 1):
        (jobdir / f"node_{rank}" / "fitness.json").write_text(json.dumps(view(rank, 2)))
        status = json.loads((jobdir / f"node_{rank}" / "status.json").read_text())
        status.update(exit_code=0, status="ok", stages={"fitness": {"seconds": 0.1, "status": "ok"}})
        (jobdir / f"node_{rank}" / "status.json").write_text(json.dumps(status))
    fine = subprocess.run(
        [*collect, "--bad-nodes", str(tmp_path / "bad")], capture_output=True, text=True, env=env
    )
    assert fine.returncode == 0, fine.stderr
    assert (tmp_path / "bad").read_text() == ""


RUN_OPTIONS = (
    "--rank --nnodes --hosts --port --master-port --job-id --token-env --timeout --runtime --runtime-timeout "
    "--disk --disk-reserve --min-inodes --disk-timeout --gpus-needed --gpu-mem-fraction --gpu-timeout "
    "--probe-bytes --probe-seconds --slow-factor --min-rate --clock-bound --out --docker-image --image-bytes"
).split()


def test_every_run_option_says_what_it_does_and_its_default_in_its_help() -> None:
    result = cli(["run", "--help"])
    assert (result.returncode, result.stderr) == (0, "")
    shown = " ".join(result.stdout.split())
    options = [param for param in fitness_cli.run_cmd.params if isinstance(param, click.Option)]
    starts = [shown.index(f" {option.opts[0]} {option.metavar} ") for option in options]
    assert starts == sorted(starts)
    assert [option.opts[0] for option in options] == RUN_OPTIONS
    for option, start, end in zip(options, starts, [*starts[1:], len(shown)]):
        entry = "".join(shown[start:end].split())  # as wrapped, `--job-id` may be `--job- id`
        assert option.help and "".join(option.help.split()) in entry, entry
        if isinstance(option.default, str) and option.default:
            assert f"[default:{option.default}]" in entry, entry
    assert "[env var: SLURM_JOB_ID]" in shown  # --job-id's default


def test_help_goes_to_stdout_and_exits_0() -> None:
    for argv in (["--help"], ["run", "--help"], ["judge", "-h"], ["record-cmd", "--help"]):
        result = cli(argv)
        assert (result.returncode, result.stderr) == (0, "")
        command = "" if argv[0].startswith("-") else f" {argv[0]}"
        assert result.stdout.startswith(f"Usage: slurm-multi fitness{command} "), result.stdout
    assert (
        "Exit codes: run 0 = this node's view finds nothing bad; 3 = it finds a bad node"
        in cli(["-h"]).stdout
    )


def test_the_token_rule_is_the_barriers() -> None:
    from slurm_multi import wire, words

    # one rule, slurm_multi.words's (it was a second regex here, held equal by this test)
    assert fitness_cli.is_token is wire.is_token is words.is_token
    assert fitness_cli.DEFAULT_TOKEN_ENV == wire.DEFAULT_TOKEN_ENV


# --------------------------------------------------------------------------------------------------
# What the integration adds: the job's port, docker's data root, one attempt's verdict


def test_the_job_ports_are_the_same_on_every_node_and_none_of_the_barriers_or_relays() -> None:
    from slurm_multi import net

    ports = fitness_cli.job_ports("", "29500", "77")
    assert ports == fitness_cli.job_ports("", "29500", "77")
    assert len(ports) == len(set(ports)) == fitness_cli.CANDIDATES
    window = net.read_local_port_range()
    barrier = net.derive_ports(29500, 77, window, 4)
    relay = net.derive_ports(29500, 77 + 64, window, 8)
    assert not set(ports) & set(barrier + relay + [29500])
    assert fitness_cli.job_ports("", "29500", "78") != ports
    assert fitness_cli.job_ports("12345", "29500", "") == [12345, 12346, 12347, 12348]
    # `run` takes them: a node alone listens on nothing, but its report names the job's candidates
    alone = ["--rank", "0", "--nnodes", "1", "--hosts", "127.0.0.1", "--runtime", "none"]
    result = cli(["run", *alone, "--master-port", "29500", "--job-id", "77"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ports"] == [ports]


def test_the_min_rate_floor_reaches_the_judge_and_collect_from_the_jobs_settings(tmp_path: Path) -> None:
    """--fitness-min-rate (SM_FITNESS_MIN_RATE, MB/s): the batch step passes it to `fitness judge`,
    collect reads it from job.json's settings; two links of 40 MB/s are slow under a 50 MB/s floor."""
    jobdir = _bad_node_job(tmp_path / "job")
    for rank in (0, 1):  # (each node's own view named them too: rank 0's fitness stage failed)
        (jobdir / f"node_{rank}" / "fitness.json").write_text(
            json.dumps(view(rank, 2, rates={0: 40e6, 1: 40e6}))
        )
    judge = ["judge", "--jobdir", str(jobdir), "--nodes", "node0 node1"]
    assert cli(judge).stdout == ""  # two nodes: nothing to compare with, no floor
    reason = (
        "both ring links slow: node1->node0 40.0 MB/s and node0->node1 40.0 MB/s, below the "
        "--fitness-min-rate floor of 50.0 MB/s"
    )
    floored = cli([*judge, "--min-rate", "50"])
    assert floored.stdout.splitlines() == [f"0\tnode0\t{reason}\tnone", f"1\tnode1\t{reason}\tnone"]
    job = json.loads((jobdir / "job.json").read_text())
    job["settings"]["SM_FITNESS_MIN_RATE"] = "50"
    (jobdir / "job.json").write_text(json.dumps(job))
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    collect = [sys.executable, "-m", "slurm_multi", "results", "collect", str(jobdir), "--no-picture"]
    subprocess.run([*collect, "--bad-nodes", str(tmp_path / "bad")], capture_output=True, text=True, env=env)
    assert (
        tmp_path / "bad"
    ).read_text() == f"0\tnode0\t{reason}\tnone\tfitness\n1\tnode1\t{reason}\tnone\tfitness\n"
