"""The click types every command shares (slurm_multi.common).

Every float option of every command is a FiniteFloat: click's FloatRange lets nan and inf through,
and a timeout of nan never ends (reports wait, coordinator probe, node hang-watch), a threshold of
nan compares false with everything (report --regression-pct, layers prune --older-than).

A host to dial or listen on (HostName, words.is_address) with a newline or an escape sequence in it
is refused in one line at once, not named by the resolver's error over several lines after every
retry."""

from __future__ import annotations

import click
import pytest

from slurm_multi.cli import SUBCOMMANDS, group, run
from slurm_multi.common import FiniteFloat, HostName


def float_options() -> list[tuple[list[str], str]]:
    """(the words down the groups to a command, one of its float options' flags), for every one."""
    found: list[tuple[list[str], str]] = []
    ctx = click.Context(group)

    def walk(command: click.Command, words: list[str]) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    walk(sub, [*words, name])
            return
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.types.FloatParamType):
                found.append((words, param.opts[0]))

    for name in SUBCOMMANDS:
        command = group.get_command(ctx, name)
        assert command is not None
        walk(command, [name])
    return found


FLOAT_OPTIONS = float_options()


def test_the_commands_have_float_options_and_each_is_finite_float() -> None:
    assert len(FLOAT_OPTIONS) >= 15  # the walk found them (a broken walk would pass the next test)
    assert (["reports", "wait"], "--timeout-seconds") in FLOAT_OPTIONS
    ctx = click.Context(group)
    for words, flag in FLOAT_OPTIONS:
        command = group.get_command(ctx, words[0])
        for word in words[1:]:
            assert isinstance(command, click.Group)
            command = command.get_command(ctx, word)
        option = next(p for p in command.params if flag in p.opts)
        assert isinstance(option.type, FiniteFloat), f"{' '.join(words)} {flag}: {option.type!r}"


@pytest.mark.parametrize("value", ["nan", "inf", "NaN", "1e999"])  # (-inf: below every bound there is)
@pytest.mark.parametrize(("words", "flag"), FLOAT_OPTIONS, ids=[" ".join([*w, f]) for w, f in FLOAT_OPTIONS])
def test_every_float_option_refuses_a_number_that_is_not_finite_in_one_line(
    words: list[str], flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run([*words, flag, value]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f"Invalid value for '{flag}'" in err and f"{value!r} is not a finite number" in err


def test_a_finite_float_keeps_floatranges_bounds_and_its_words() -> None:
    seconds = FiniteFloat(min=0, min_open=True)
    assert seconds.convert("2.5", None, None) == 2.5
    with pytest.raises(click.BadParameter, match="not in the range x>0"):
        seconds.convert("0", None, None)
    with pytest.raises(click.BadParameter, match="'nan' is not a finite number"):
        seconds.convert("nan", None, None)
    with pytest.raises(click.BadParameter, match="is not a valid float"):
        FiniteFloat().convert("x", None, None)


BAD_HOSTS = ["a\nb", "node1\n", "\x1b[31mnode1", "node 1", "", "a\tb", "n\u202eode"]


@pytest.mark.parametrize("host", BAD_HOSTS)
@pytest.mark.parametrize(
    "args",
    [
        ["barrier", "join", "--rank", "1", "--nnodes", "2", "--wait-timeout", "1", "--master-addr"],
        ["barrier", "serve", "--nnodes", "2", "--timeout", "1", "--master-addr"],
        ["barrier", "serve", "--nnodes", "2", "--timeout", "1", "--bind"],
        ["barrier", "abort", "--reason", "x", "--master-addr"],
        ["relay", "recv", "--rank", "1", "--nnodes", "2", "--parent-host"],
        ["relay", "recv", "--rank", "1", "--port", "20000", "--nodes"],
    ],
    ids=["join", "serve", "serve-bind", "abort", "relay-parent", "relay-nodes"],
)
def test_a_host_with_a_control_character_is_refused_in_one_line(
    args: list[str], host: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SM_BARRIER_TOKEN", "t")
    monkeypatch.setenv("SM_RELAY_TOKEN", "t")
    if args[-1] == "--nodes" and host.strip() != host:
        pytest.skip("--nodes strips each name: `scontrol show hostnames | paste` may end in a newline")
    value = f"node0,{host}" if args[-1] == "--nodes" else host
    assert run([*args, value]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and repr(value) in err, err


@pytest.mark.parametrize("host", [h for h in BAD_HOSTS if h])
def test_a_probed_endpoint_with_a_control_character_is_refused_in_one_line(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["coordinator", "probe", f"{host}:20001", "--timeout-seconds", "0.3"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and f"malformed host {host!r}" in err, err


@pytest.mark.parametrize("host", ["node1", "10.0.0.1", "fe80::1%eth0", "gpu-a01.cluster_x"])
def test_a_host_name_or_an_address_is_taken_as_it_is(host: str) -> None:
    assert HostName().convert(host, None, None) == host
