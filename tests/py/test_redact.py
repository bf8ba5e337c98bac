"""The log filter: secret names, masking, and secrets learned while it runs."""

from __future__ import annotations

from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.redact import Redactor, is_secret_name, redact, secret_values


def test_secret_names() -> None:
    for name in (
        "HF_TOKEN",
        "hf_token",
        "MAD_SECRETS_HFTOKEN",
        "DB_PASSWORD",
        "AWS_SECRET_ACCESS_KEY",
        "OPENAI_API_KEY",
    ):
        assert is_secret_name(name), name
    for name in ("PATH", "MASTER_ADDR", "TOKENIZERS_PARALLELISM_X"[:0] or "NCCL_SOCKET_IFNAME"):
        assert not is_secret_name(name), name


def test_the_rule_knows_the_names_secrets_hide_under_beyond_tokens_and_passwords() -> None:
    for name in (
        "SMTP_PASS",
        "PGPASSFILE_CONTENT"[:6] + "WORD",  # PGPASSWORD
        "GPG_PASSPHRASE",
        "AWS_SHARED_CREDENTIALS",
        "GOOGLE_APPLICATION_CREDENTIALS_JSON",
        "SSH_PRIVATE_KEY",
        "GH_PAT",
        "GITLAB_PAT",
        "DOCKER_AUTH_CONFIG",
        "MYSQL_PWD",
        "AZURE_STORAGE_CONNECTION_STRING",
        "db_connection_string",
    ):
        assert is_secret_name(name), name
    for name in ("LD_LIBRARY_PATH", "PYTHONPATH", "SM_NSYS_PATH", "PATH", "SM_PATCH", "HOME"):
        assert not is_secret_name(name), name
    from slurm_multi.secret_rule import masked

    env = {"GH_PAT": "ghp_0123456789abcdef", "MYSQL_PWD": "hunter2-long", "PATH": "/usr/bin"}
    assert (
        masked("push ghp_0123456789abcdef with hunter2-long on /usr/bin", env)
        == "push *** with *** on /usr/bin"
    )


def test_help_lists_the_one_rule() -> None:
    from slurm_multi.secret_rule import SECRET_NAME_PATTERNS

    shown = " ".join(CliRunner().invoke(group, ["redact", "--help"]).output.split())
    assert ", ".join(SECRET_NAME_PATTERNS) in shown


def test_longest_secret_is_masked_first_and_short_values_are_left_alone() -> None:
    env = {"A_TOKEN": "abcdef", "B_TOKEN": "abcdefghij", "C_TOKEN": "ab"}
    assert secret_values(env) == ["abcdefghij", "abcdef"]
    assert redact("x abcdefghij y abcdef z ab", secret_values(env)) == "x *** y *** z ab"


def test_redactor_picks_up_a_secrets_file_written_after_it_started(tmp_path) -> None:
    path = tmp_path / "secrets"
    redactor = Redactor({"HF_TOKEN": "hf_from_env"}, str(path))
    assert redactor("hf_from_env and literal_from_manifest") == "*** and literal_from_manifest"
    path.write_text("literal_from_manifest\n")
    assert redactor("hf_from_env and literal_from_manifest") == "*** and ***"


def test_cli_masks_env_secrets_on_every_line() -> None:
    result = CliRunner().invoke(
        group, ["redact"], input="one hf_abc123\ntwo\n", env={"HF_TOKEN": "hf_abc123"}
    )
    assert result.exit_code == 0
    assert result.output == "one ***\ntwo\n"


def test_the_log_filter_masks_file_and_env_secrets_and_ends_quietly_on_a_broken_pipe(tmp_path) -> None:  # noqa: ANN001
    import os
    import subprocess
    import sys
    from pathlib import Path

    secrets = tmp_path / "secrets"
    secrets.write_text("manifest_literal_secret\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "py"),
           "API_KEY": "env_secret_value"}  # fmt: skip
    redact = [sys.executable, "-m", "slurm_multi", "redact", "--secrets-file", str(secrets)]
    proc = subprocess.run(
        redact,
        input=b"a manifest_literal_secret b env_secret_value c \xff\n",
        env=env,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"a *** b *** c \xff\n"
    # Its reader gone (the task ends), the filter ends with 0 and not a word (no traceback in a log).
    script = 'yes "a env_secret_value" | head -c 2000000 | "$@" | head -c 9 >/dev/null; echo ${PIPESTATUS[2]}'
    piped = subprocess.run(["bash", "-c", script, "_", *redact], env=env, capture_output=True, text=True)
    assert (piped.stdout, piped.stderr) == ("0\n", "")


def test_both_entries_of_the_log_filter_keep_carriage_returns_and_odd_bytes_as_they_came(tmp_path) -> None:  # noqa: ANN001
    """A progress bar's `\\r` and a `\\r\\n` line end reach the log as the workload printed them (the
    fast entry once turned each into `\\n`, the click entry did not): only the masks change bytes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root / "py"), "HF_TOKEN": "hf_secret_value"}
    given = b"step 1/3\rstep 2/3 hf_secret_value\rstep 3/3\r\nwindows line\r\n\xff\xfe raw\rtail"
    wanted = b"step 1/3\rstep 2/3 ***\rstep 3/3\r\nwindows line\r\n\xff\xfe raw\rtail"
    entries = {
        "slurm-multi redact": [sys.executable, "-m", "slurm_multi", "redact"],
    }
    for what, argv in entries.items():
        proc = subprocess.run(argv, input=given, env=env, capture_output=True, check=False, cwd=tmp_path)
        assert (proc.returncode, proc.stderr) == (0, b""), what
        assert proc.stdout == wanted, (what, proc.stdout)


def test_secrets_held_masks_with_the_values_read_once_and_lets_go_on_the_way_out(monkeypatch) -> None:  # noqa: ANN001
    from slurm_multi import secret_rule
    from slurm_multi.logline import short

    monkeypatch.setenv("SM_T_API_KEY", "hunter2-value")
    reads = []
    real = secret_rule.secret_values
    monkeypatch.setattr(secret_rule, "secret_values", lambda env: reads.append(1) or real(env))
    with secret_rule.secrets_held() as held:
        assert "hunter2-value" in held
        for _ in range(100):  # every excerpt of a 1,000-node collect: no read of the environment each
            assert short("the key hunter2-value leaked") == "the key *** leaked"
    assert len(reads) == 1
    assert short("hunter2-value") == "***" and len(reads) == 2  # outside: the environment as it is now
    monkeypatch.setenv("SM_T_API_KEY", "another-value")
    assert short("hunter2-value another-value") == "hunter2-value ***"


def test_a_secrets_file_that_is_there_and_unreadable_is_refused_in_one_line_not_ignored(tmp_path) -> None:  # noqa: ANN001
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "py")}
    (tmp_path / "listed").mkdir()  # (a directory: root reads any file, so no mode makes one unreadable here)
    argv = [sys.executable, "-m", "slurm_multi", "redact", "--secrets-file"]
    proc = subprocess.run([*argv, str(tmp_path / "listed")], input="a listed_secret_value\n",
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"slurm-multi: redact: --secrets-file {tmp_path / 'listed'}: cannot read it (Is a directory)"
    ]
    # A file not there yet is the node's (it writes it once it knows its manifest's secrets).
    proc = subprocess.run(
        [*argv, str(tmp_path / "later")], input="a b\n", env=env, capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "a b\n", "")


def test_a_running_filter_never_dies_for_its_secrets_file_it_warns_once_and_keeps_what_it_read(
    tmp_path,
    capsys,  # noqa: ANN001
) -> None:
    from slurm_multi import secret_rule

    path = tmp_path / "secrets"
    path.write_text("literal_from_manifest\n")
    redactor = Redactor({"HF_TOKEN": "hf_from_env"}, str(path))
    assert redactor("hf_from_env literal_from_manifest") == "*** ***"
    path.unlink()
    path.mkdir()  # there, and no longer readable
    for _ in range(3):
        assert redactor("hf_from_env literal_from_manifest") == "*** ***"
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and f"cannot read secrets file {path} (Is a directory)" in warned[0]
    # A helper's masking (SM_SECRETS_FILE) says it once too, and still masks the environment's.
    listed = tmp_path / "other"
    listed.mkdir()
    env = {"SM_SECRETS_FILE": str(listed), "DB_PASSWORD": "pw_from_env"}
    assert secret_rule.masked("x pw_from_env", env) == "x ***"
    assert secret_rule.masked("x pw_from_env", env) == "x ***"
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1 and f"cannot read secrets file {listed}" in warned[0]
