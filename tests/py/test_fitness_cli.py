"""The fitness stage's command line (slurm_multi.fitness.cli): usage errors, --help, the judge
command, the job's port, and collect's use of the same verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
        ([*RUN, "--tmeout", "3"], "No such option '--tmeout'; Usage: python -m slurm_multi.fitness run"),
        ([*RUN, "stray"], "Unexpected extra argument 'stray'"),
        (["rn", *RUN[1:]], "'rn' is not a command; use run or judge"),
        (RUN[:5], "Missing option '--hosts'"),
        ([*RUN, "--token-env", "NO_SUCH_TOKEN"], "--token-env NO_SUCH_TOKEN: $NO_SUCH_TOKEN is not set"),
        ([*RUN[:-2]], "--job-id '' is not allowed; give the job ID"),
        (["judge", "--jobdir", "/no/such/dir", "--nnodes", "2"], "--jobdir '/no/such/dir' is not allowed"),
        (
            ["judge", "--jobdir", "/", "--nnodes", "0"],
            "--nnodes '0' is not allowed; use an integer 1 or more",
        ),
        ([], "no command given; use run or judge"),
    ],
)
def test_usage_errors_are_one_line_naming_the_flag_and_exit_2(argv: list[str], expected: str) -> None:
    result = cli(argv, {"SM_BARRIER_TOKEN": TOKEN})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("slurm-multi: fitness: ") and expected in line, line


def test_the_token_value_is_never_shown_in_a_usage_error() -> None:
    result = cli(RUN, {"SM_BARRIER_TOKEN": "has spaces in it"})
    assert result.returncode == 2 and "has spaces" not in result.stderr
    assert "$SM_BARRIER_TOKEN is not set or not 1-64 printable ASCII characters" in result.stderr


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
    assert text.stdout.splitlines() == [
        "0\tnode0\tGPU 1 held by pid 4242 (2048 MiB) of another job",
        "2\tnode2\tno fitness report (the stage did not finish on that node)",
    ]
    as_json = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "3", "--json"])
    assert [entry["rank"] for entry in json.loads(as_json.stdout)] == [0, 2]
    assert cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "2", "--json"]).stdout.strip() == (
        '[{"rank": 0, "host": "node0", "reason": "GPU 1 held by pid 4242 (2048 MiB) of another job"}]'
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
    `fitness judge`; a job to be requeued appends no rows (--no-perf-csv-on-bad-nodes)."""
    jobdir = _bad_node_job(tmp_path / "job")
    judged = cli(["judge", "--jobdir", str(jobdir), "--nodes", "node0 node1"])
    assert judged.returncode == 0 and judged.stdout, judged.stderr
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    collect = [sys.executable, "-m", "slurm_multi.results.collect_main", str(jobdir), "--no-picture"]
    shared = tmp_path / "perf.csv"
    hold = ["--bad-nodes", str(tmp_path / "bad"), "--perf-csv", str(shared), "--no-perf-csv-on-bad-nodes"]
    held = subprocess.run([*collect, *hold], capture_output=True, text=True, env=env)
    assert held.returncode == 1, held.stderr
    assert (
        (tmp_path / "bad").read_text()
        == judged.stdout
        == "0\tnode0\tGPU 1 held by pid 4242 (2048 MiB) of another job\n"
    )
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


def test_every_run_option_is_in_the_docstrings_table_with_its_default() -> None:
    import re

    options = {option.name: option for option in fitness_cli._run_options()}
    doc = fitness_cli.__doc__ or ""
    table = doc[doc.find("`run` options") : doc.find("`judge` reads")]
    documented = re.findall(r"^    (--[a-z-]+) ", table, re.M)
    assert sorted(documented) == sorted(options)
    for flag, option in options.items():
        if isinstance(option.default, str) and option.default and flag not in ("--job-id", "--token-env"):
            entry = table[table.find(f"    {flag} ") :].split("\n    --")[0]
            try:
                number = float(option.default)
            except ValueError:
                shown = option.default
            else:
                shown = f"{number:g}" if number != int(number) or number < 1e6 else str(int(number))
            assert f"({shown}" in entry, (flag, option.default, entry)


def test_help_prints_the_docstring_on_stdout_and_exits_0() -> None:
    for argv in (["--help"], ["run", "--help"], ["judge", "-h"]):
        result = cli(argv)
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == fitness_cli.__doc__


def test_the_token_rule_is_the_barriers() -> None:
    from slurm_multi import wire, words

    # one rule, slurm_multi.words's (it was a second regex here, held equal by this test)
    assert fitness_cli.is_token is wire.is_token is words.is_token
    assert fitness_cli.DEFAULT_TOKEN_ENV == wire.DEFAULT_TOKEN_ENV


# --------------------------------------------------------------------------------------------------
# What the integration adds: the job's port, docker's data root, one attempt's verdict


def test_the_job_port_is_the_same_on_every_node_and_none_of_the_barriers_or_relays() -> None:
    from slurm_multi import net

    args = fitness_cli.parse_command(
        ["run", "--rank", "0", "--nnodes", "2", "--hosts", "a b", "--master-port", "29500", "--job-id", "77"]
    )
    port = fitness_cli._job_port(args)
    assert port == fitness_cli._job_port(args)
    window = net.read_local_port_range()
    barrier = net.derive_ports(29500, 77, window, 4)
    relay = net.derive_ports(29500, 77 + 64, window, 8)
    assert port not in barrier + relay + [29500]
    other_job = fitness_cli.parse_command(
        ["run", "--rank", "0", "--nnodes", "2", "--hosts", "a b", "--master-port", "29500", "--job-id", "78"]
    )
    assert fitness_cli._job_port(other_job) != port
    explicit = fitness_cli.parse_command(
        ["run", "--rank", "0", "--nnodes", "1", "--hosts", "a", "--port", "12345", "--master-port", "29500"]
    )
    assert fitness_cli._job_port(explicit) == 12345
