"""slurm_multi.fingerprint: the one rule for an image's build fingerprint, and the digest earlier
versions took with coreutils (the labels and cache sidecars they wrote must still match); prepare's
answers for the image stage (the fingerprint, the engine's ID and label of the image, asked on a
request path quoted as urllib quotes it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_engine import engine
from slurm_multi import dockerapi
from slurm_multi.fingerprint import BIG, fingerprint

REPO = Path(__file__).resolve().parents[2]
# The recipe lib/image.sh ran before slurm_multi.fingerprint owned the rule: images built then carry
# its digest as their label.
COREUTILS = r"""
SM_DOCKERFILE=$1 SM_DOCKER_CONTEXT=$2; shift 2; SM_BUILD_ARGS=("$@")
[[ -n ${SM_DOCKERFILE:-} && -f ${SM_DOCKERFILE} ]] || exit 0
ctx=${SM_DOCKER_CONTEXT:-$(dirname "${SM_DOCKERFILE}")}
{
  sha256sum <"${SM_DOCKERFILE}"
  (cd "${ctx}" && find . -type f ! -name '.*' -size -1048576c -print0 | LC_ALL=C sort -z |
    xargs -0 -r sha256sum)
  (cd "${ctx}" && find . -type f ! -name '.*' -size +1048575c -printf '%p %s %T@\n' | LC_ALL=C sort)
  printf '%s\n' "${SM_BUILD_ARGS[@]+"${SM_BUILD_ARGS[@]}"}" | LC_ALL=C sort
} | sha256sum | cut -c1-32
"""


def coreutils(dockerfile: str, context: str, args: list[str], cwd: Path) -> str:
    done = subprocess.run(["bash", "-c", COREUTILS, "fp", dockerfile, context, *args], cwd=cwd,
                          capture_output=True, check=True)  # fmt: skip
    return done.stdout.decode().strip()


def tree(root: Path) -> Path:
    """A context with what real ones hold: nested dirs, a hidden file and a hidden dir, a big blob,
    names with spaces, a backslash, a newline and a CR, links to a file and to a dir, an empty file."""
    ctx = root / "ctx"
    (ctx / "docker" / "sub").mkdir(parents=True)
    (ctx / ".git" / "objects").mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY . /\n")
    (ctx / "docker" / "a.ubuntu.amd.Dockerfile").write_text("FROM x\n")
    (ctx / "docker" / "sub" / "run me.sh").write_text("echo hi\n")
    (ctx / ".hidden").write_text("not counted\n")
    (ctx / ".git" / "objects" / "ab").write_text("counted: its name is not hidden\n")
    (ctx / "blob.bin").write_bytes(b"\0" * BIG)  # exactly 1 MiB: by size and time
    (ctx / "just-under.bin").write_bytes(b"\1" * (BIG - 1))  # by content
    (ctx / os.fsdecode(b"back\\slash")).write_text("b\n")
    (ctx / os.fsdecode(b"new\nline")).write_text("n\n")
    (ctx / os.fsdecode(b"carriage\rreturn")).write_text("r\n")
    (ctx / os.fsdecode(b"latin1-\xe9")).write_text("l\n")
    (ctx / "empty").write_text("")
    (ctx / "link-to-file").symlink_to(ctx / "empty")
    (ctx / "link-to-dir").symlink_to(ctx / "docker")
    os.utime(ctx / "blob.bin", ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    return ctx


@pytest.mark.parametrize(
    "args",
    [[], ["GREETING=hello"], ["B=2", "A=1", "A=0"], ["MULTI=line\nbreak", "SPACE=a b"], ["X=caf\u00e9"]],
)
def test_the_fingerprint_is_the_digest_earlier_versions_labelled_images_with(tmp_path: Path, args: list[str]):
    ctx = tree(tmp_path)
    dockerfile = str(ctx / "Dockerfile")
    assert fingerprint(dockerfile, str(ctx), args) == coreutils(dockerfile, str(ctx), args, tmp_path)
    # The default context is the dockerfile's dir; a relative path is the caller's cwd's.
    assert fingerprint(dockerfile, "", args) == coreutils(dockerfile, "", args, tmp_path)


def test_relative_paths_are_the_working_directory_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    want = coreutils("ctx/Dockerfile", "ctx/docker", ["A=1"], tmp_path)
    assert fingerprint("ctx/Dockerfile", "ctx/docker", ["A=1"]) == want
    assert fingerprint("ctx/Dockerfile", "", []) == coreutils("ctx/Dockerfile", "", [], tmp_path)


def test_every_input_changes_it_and_a_missing_dockerfile_has_none(tmp_path: Path):
    ctx = tree(tmp_path)
    dockerfile = str(ctx / "Dockerfile")
    first = fingerprint(dockerfile, str(ctx), ["A=1"])
    assert len(first) == 32 and int(first, 16) >= 0
    assert fingerprint(dockerfile, str(ctx), ["A=2"]) != first
    (ctx / "docker" / "sub" / "run me.sh").write_text("echo changed\n")
    second = fingerprint(dockerfile, str(ctx), ["A=1"])
    assert second != first
    os.utime(ctx / "blob.bin", ns=(1_700_000_001_000_000_000,) * 2)  # a big file: its time counts
    assert fingerprint(dockerfile, str(ctx), ["A=1"]) != second
    (ctx / ".hidden").write_text("still not counted\n")
    assert fingerprint(dockerfile, str(ctx), ["A=1"]) == fingerprint(dockerfile, str(ctx), ["A=1"])
    assert (
        fingerprint(str(ctx / "nope"), str(ctx), [])
        == ""
        == coreutils(str(ctx / "nope"), str(ctx), [], tmp_path)
    )
    assert fingerprint(dockerfile, str(tmp_path / "no-context"), []) == coreutils(
        dockerfile, str(tmp_path / "no-context"), [], tmp_path)  # fmt: skip


def test_the_command_prints_it_for_bash(tmp_path: Path):
    ctx = tree(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    command = [sys.executable, "-m", "slurm_multi", "node", "fingerprint"]
    done = subprocess.run([*command, "--", str(ctx / "Dockerfile"), "", "A=1"], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, fingerprint(str(ctx / "Dockerfile"), "", ["A=1"]))
    bad = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "Missing argument 'DOCKERFILE'" in bad.stderr
    assert len(bad.stderr.splitlines()) == 1


# ---- the engine's ID and label of an image, asked on its socket -----------------------------------


LABEL = "org.slurm-multi.fingerprint"


def test_the_engine_says_an_image_s_id_and_label_without_the_docker_cli(tmp_path: Path):
    ok = b"HTTP/1.1 200 OK"
    labelled = {"Id": "sha256:" + "a" * 64, "Config": {"Labels": {LABEL: "f" * 32, "other": "x"}}}
    unlabelled = {"Id": "sha256:" + "b" * 64, "Config": {"Labels": None}}
    path, server = engine(tmp_path, {
        "/images/toy/model:local/json": (ok, json.dumps(labelled).encode()),
        "/images/plain:1/json": (ok, json.dumps(unlabelled).encode()),
        "/images/garbage:1/json": (ok, b"[not json"),
        "/images/broken:1/json": (b"HTTP/1.1 500 Internal Server Error", b"{}"),
    })  # fmt: skip
    env = {"DOCKER_HOST": f"unix://{path}"}
    try:
        assert dockerapi.image_facts(env, "toy/model:local", LABEL) == ("sha256:" + "a" * 64, "f" * 32)
        assert dockerapi.image_facts(env, "plain:1", LABEL) == ("sha256:" + "b" * 64, "")
        assert dockerapi.image_facts(env, "absent:1", LABEL) == ("", "")  # 404: the engine has none
        # Whatever cannot be read as an answer is no answer: the image stage asks the docker CLI.
        assert dockerapi.image_facts(env, "garbage:1", LABEL) is None
        assert dockerapi.image_facts(env, "broken:1", LABEL) is None
    finally:
        server.close()
    assert dockerapi.image_facts({"DOCKER_HOST": f"unix://{tmp_path}/gone.sock"}, "x:1", LABEL) is None
    assert dockerapi.image_facts({"DOCKER_HOST": "tcp://127.0.0.1:2375"}, "x:1", LABEL) is None


def test_prepare_answers_what_its_image_stage_asks_first(tmp_path: Path):
    from slurm_multi import node

    ctx = tree(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({
        "built_images": {"m": {"docker_image": "toy/model:local", "dockerfile": str(ctx / "Dockerfile")}},
        "built_models": {"m": {"name": "toy", "scripts": "run.sh", "dockerfile": str(ctx / "Dockerfile"),
                               "dockercontext": str(ctx)}},
        "context": {"docker_build_arg": {"GREETING": "hi"}},
    }))  # fmt: skip
    image = {"Id": "sha256:" + "c" * 64, "Config": {"Labels": {LABEL: "0" * 32}}}
    ok = b"HTTP/1.1 200 OK"
    path, server = engine(
        tmp_path, {"/_ping": (ok, b"OK"), "/images/toy/model:local/json": (ok, json.dumps(image).encode())}
    )
    env = {"SM_MANIFEST": str(manifest), "SM_RUNTIME": "docker", "PATH": "/usr/bin:/bin",
           "DOCKER_HOST": f"unix://{path}", "SLURMD_NODENAME": "node1"}  # fmt: skip

    def facts(rank: str) -> dict[str, str]:
        scratch = tmp_path / f"scratch{rank}"
        node.prepare({**env, "SM_RANK": rank}, str(scratch), (), detect=True)
        script = (
            f'source {scratch}/context.sh; for v in ${{!IMAGE_@}}; do printf "%s=%s\\n" "$v" "${{!v}}"; done'
        )
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines())

    try:
        rank0, rank1 = facts("0"), facts("1")
    finally:
        server.close()
    want = fingerprint(str(ctx / "Dockerfile"), str(ctx), ["GREETING=hi"])
    assert rank0 == {"IMAGE_FINGERPRINT": want, "IMAGE_LOCAL_ASKED": "1", "IMAGE_LOCAL_ID": image["Id"],
                     "IMAGE_LOCAL_LABEL": "0" * 32}  # fmt: skip
    assert want == coreutils(str(ctx / "Dockerfile"), str(ctx), ["GREETING=hi"], tmp_path)
    # A worker is told what the engine holds too; the fingerprint it asks only if it has to rebuild.
    assert rank1 == {"IMAGE_LOCAL_ASKED": "1", "IMAGE_LOCAL_ID": image["Id"], "IMAGE_LOCAL_LABEL": "0" * 32}
