"""logline.short: what every log excerpt and summary line goes through; this_host, what every line
names."""

from __future__ import annotations

import re
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_multi.logline import short, talk, this_host

CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # every C0 control character but the tab, and DEL


def slow_short(text: str, limit: int) -> str:
    """short as it reads in its docstring: every character str.isprintable() refuses but the tab (the
    C0 controls and DEL, the C1 controls, bidi overrides) as \\xNN or \\uNNNN, then cut."""
    text = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text.strip())
    text = "".join(
        c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
        for c in text
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


@given(st.text(max_size=60), st.integers(min_value=4, max_value=80))
def test_the_printable_fast_path_changes_nothing(text: str, limit: int):
    assert short(text, limit) == slow_short(text, limit)


def test_control_characters_and_ansi_colours_are_shown_not_sent():
    assert short("\x1b[31mred\x1b[0m\tdone\x7f") == "\\x1b[31mred\\x1b[0m\tdone\\x7f"
    # 8-bit controls (CSI as one byte) and a right-to-left override are not sent either
    assert short("a\x9b2Jb\u202ec\nd") == "a\\x9b2Jb\\u202ec\\x0ad"
    assert short("  ok  ") == "ok"
    assert short("x" * 300, 10) == "xxxxxxx..."


def test_a_line_names_slurm_s_node_else_the_host_name(monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert this_host() == socket.gethostname()  # what it replaced, without importing socket
    monkeypatch.setenv("SM_RANK", "3")
    talk("area", "said")
    assert capsys.readouterr().err.endswith(f" {socket.gethostname()} r3 area: said\n")
    monkeypatch.setenv("SLURMD_NODENAME", "node7")
    assert this_host() == "node7"


def test_an_excerpt_is_masked_before_it_is_cut(monkeypatch: pytest.MonkeyPatch, tmp_path):
    # Cut first, a secret across the cut left its first half for the log filter to miss.
    secret = "hf_" + "0123456789abcdef" * 3
    monkeypatch.setenv("HF_TOKEN", secret)
    assert short("x" * 230 + secret, 240) == "x" * 230 + "***"
    listed = tmp_path / "secrets"  # a node's list of the manifest's literal secrets
    listed.write_text("literal-from-manifest\n")
    monkeypatch.setenv("SM_SECRETS_FILE", str(listed))
    assert short("pw literal-from-manifest", 40) == "pw ***"
