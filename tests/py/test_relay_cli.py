"""`slurm-multi relay send|recv|port` (slurm_multi.relay.cli): registered in the one group, one-line
usage errors, and the production path end to end on this host's routable address."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_multi import EXIT_USAGE
from slurm_multi.common import HelperError
from slurm_multi.relay import cli as relay_cli
from slurm_multi.relay import tree

REPO = Path(__file__).resolve().parents[2]
TOKEN = "job-token-" + "a" * 20


def job_id() -> int:
    return secrets.randbelow(1 << 20)


def run_cli(args: list[str], env: dict[str, str] | None = None, input: bytes | None = None):
    return CliRunner().invoke(relay_cli.cli, args, env=env, input=input)


def test_the_relay_group_is_registered_in_the_slurm_multi_cli():
    from slurm_multi.cli import group

    result = CliRunner().invoke(group, ["relay", "--help"])
    assert result.exit_code == 0 and "send" in result.output and "recv" in result.output


def test_port_prints_the_candidates_of_a_rank():
    result = run_cli(["port", "--rank", "2", "--master-port", "29500", "--job-id", "4242"])
    assert result.exit_code == 0
    assert [int(x) for x in result.output.split()] == tree.relay_ports(2, 29500, 4242)


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["recv", "--rank", "1", "--nodes", "a,b", "--master-port", "1", "--job-id", "1"], {}, "is not set"),
        (["recv", "--rank", "3", "--nodes", "a,b,c"], {"SM_BARRIER_TOKEN": "t"}, "--rank 3 is not in 0..2"),
        (["recv", "--rank", "1", "--nodes", "a,b", "--nnodes", "3"], {"SM_BARRIER_TOKEN": "t"},
         "names 2 hosts"),
        (["recv", "--rank", "1", "--nodes", "a,,b"], {"SM_BARRIER_TOKEN": "t"},
         "host names separated by commas"),
        (["recv", "--rank", "1", "--nodes", "a,b"], {"SM_BARRIER_TOKEN": "t"}, "no port to use"),
        (["send", "--rank", "1", "--nodes", "a,b"], {"SM_BARRIER_TOKEN": "t"}, "send runs on rank 0 only"),
        (["send", "--nodes", "a"], {"SM_BARRIER_TOKEN": "t"}, "--nnodes >= 2"),
        (["send", "--nodes", "a,b", "--port", "30000", "--purpose", "Bad Purpose"], {"SM_BARRIER_TOKEN": "t"},
         "--purpose"),
    ],
)  # fmt: skip
def test_bad_command_lines_are_one_line_usage_errors(args, env, needle):
    result = run_cli(args, env={"SM_BARRIER_TOKEN": "", **env}, input=b"")
    assert result.exit_code == EXIT_USAGE, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_send_and_recv_on_this_hosts_routable_address_deliver_the_stream(tmp_path):
    """The production path end to end: three processes, derived ports, never loopback."""
    from slurm_multi.net import choose_bind_address

    try:
        address = choose_bind_address(socket.gethostname()).address
    except HelperError as exc:
        pytest.skip(f"no routable address here: {exc}")
    host = socket.gethostname()
    payload = os.urandom(2_000_000)
    env = {**os.environ, "PYTHONPATH": str(REPO / "py"), "SM_BARRIER_TOKEN": TOKEN}
    common = ["--nodes", f"{host},{host},{host}", "--master-port", "29500", "--job-id", str(job_id()),
              "--connect-timeout", "20"]  # fmt: skip
    cmd = [sys.executable, "-m", "slurm_multi", "relay"]
    recvs = []
    for rank in (1, 2):  # stdout to files: a pipe nobody reads yet would block the receivers
        with open(tmp_path / f"out{rank}", "wb") as out:
            recvs.append(subprocess.Popen([*cmd, "recv", "--rank", str(rank), *common], env=env, stdout=out,
                                          stderr=subprocess.PIPE))  # fmt: skip
    send = subprocess.run([*cmd, "send", *common], env=env, input=payload, capture_output=True, timeout=30)
    errs = [proc.communicate(timeout=30)[1] for proc in recvs]
    assert send.returncode == 0, send.stderr.decode()
    assert b"verified by all 2 receivers" in send.stderr
    assert f"listening on {address}:".encode() in send.stderr
    for rank, proc, err in zip((1, 2), recvs, errs):
        assert proc.returncode == 0, err.decode()
        assert (tmp_path / f"out{rank}").read_bytes() == payload
    assert TOKEN.encode() not in send.stderr + b"".join(errs)


def test_the_token_given_where_its_name_goes_is_never_said_back():
    token = "3fa9c0d1e2b4a6978877665544332211"
    args = ["recv", "--rank", "1", "--nodes", "a,b", "--port", "30000", "--token-env", token]
    result = run_cli(args, env={"SM_BARRIER_TOKEN": token})
    assert result.exit_code == EXIT_USAGE and token not in result.output
    assert "--token-env is not an environment variable name" in result.output


@pytest.mark.parametrize("rank", ["16000", "99999999", str(10**30)])
def test_port_prints_ports_for_any_rank_it_takes(rank: str):
    # --port P gives rank r the ports from P + r*count: past 65535 more than once, they wrapped once
    # and printed 400000484 and up.
    result = run_cli(["port", "--rank", rank, "--port", "65000", "--count", "4"])
    assert result.exit_code == 0, result.output
    ports = [int(x) for x in result.output.split()]
    assert len(ports) == 4 and all(1024 <= p <= 65535 for p in ports), ports
    assert ports == [ports[0] + i if ports[0] + i <= 65535 else ports[0] + i - 64512 for i in range(4)]
