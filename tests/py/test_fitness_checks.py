"""The fitness stage's local checks (slurm_multi.fitness.checks, .gpucheck): the container runtime,
free disk and inodes, the GPUs (through the fakes of tests/fakes), each alone and end to end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fake_engine import engine
from fitness_nodes import FAKES, Node, make_tools, node_env, start_node
from slurm_multi.fitness import checks, gpucheck


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    return make_tools(tmp_path)


# --------------------------------------------------------------------------------------------------
# The runtime


@pytest.fixture
def hung_engine(tmp_path: Path) -> Iterator[str]:
    """A unix socket that accepts (the kernel's backlog does) and never answers."""
    path = str(tmp_path / "docker.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.listen(8)
    yield path
    sock.close()


def test_a_hung_docker_engine_fails_within_the_runtime_bound(
    tmp_path: Path, tools: Path, hung_engine: str
) -> None:
    env = node_env(tools, DOCKER_HOST=f"unix://{hung_engine}")
    node = Node(
        start_node(
            tmp_path,
            env,
            0,
            "127.0.0.1",
            "--runtime",
            "docker",
            "--runtime-timeout",
            "0.5",
            "--timeout",
            "30",
        ),
        tmp_path / "node_0" / "fitness.json",
    )
    assert node.rc == 3
    assert node.bad_lines() == [
        "fitness: 127.0.0.1 (rank 0): docker engine did not answer /_ping within 0.5 s"
    ]
    assert node.report["checks"]["runtime"]["status"] == "failed"
    assert node.report["seconds"] < 15  # the 0.5 s bound ended it, not the 30 s deadline


def test_docker_engine_answering_ping_passes_and_a_missing_socket_fails(tmp_path: Path) -> None:
    path = str(tmp_path / "ok.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

    threading.Thread(target=answer, daemon=True).start()
    try:
        good = checks.check_runtime("docker", 2.0, {"DOCKER_HOST": f"unix://{path}"}, [])
    finally:
        server.close()
    assert (good["status"], good["ok"]) == ("ok", True), good
    gone = checks.check_runtime("docker", 2.0, {"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}, [])
    assert gone["reason"] == (
        f"docker engine at {tmp_path}/none.sock did not answer /_ping (no such file or directory); "
        "is dockerd running?"
    )
    assert checks.check_runtime("docker", 1.0, {"DOCKER_HOST": "tcp://h:2375"}, [])["status"] == "skipped"


def test_pyxis_runtime_needs_enroot_version_to_succeed(tmp_path: Path, tools: Path) -> None:
    (tools / "enroot").symlink_to(FAKES / "enroot")
    env = {"PATH": f"{tools}:{Path(sys.executable).parent}"}
    assert checks.check_runtime("pyxis", 10.0, env, [])["ok"] is True
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "enroot").write_text("#!/bin/sh\necho 'enroot: broken install' >&2\nexit 4\n")
    (failing / "enroot").chmod(0o755)
    assert checks.check_runtime("pyxis", 10.0, {"PATH": str(failing)}, [])["reason"] == (
        "enroot version failed (exit 4: enroot: broken install)"
    )
    assert checks.check_runtime("pyxis", 10.0, {"PATH": str(tmp_path / "empty")}, [])["reason"] == (
        "enroot not found on PATH (--runtime pyxis needs it)"
    )


# --------------------------------------------------------------------------------------------------
# Disk


def test_disk_needing_more_than_is_free_fails_at_the_nearest_existing_parent(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    target = str(tmp_path / "not" / "yet")
    (entry,) = checks.check_disks([(target, free + (1 << 30))], 0, 0)
    assert entry["checked"] == str(tmp_path) and entry["ok"] is False
    assert entry["reason"].startswith(f"{target}: ") and " free, " in entry["reason"]
    assert entry["reason"].endswith(" needed + 0 GiB reserve")
    (fine,) = checks.check_disks([(target, 0)], 0, 0)
    assert fine["ok"] is True and fine["reason"] == ""


def test_paths_on_one_filesystem_add_up_and_the_reserve_counts(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    (alone,) = checks.check_disks([(str(tmp_path / "a"), free // 2 + 1)], 0, 0)
    assert alone["ok"] is True
    both = checks.check_disks(
        [(str(tmp_path / "a"), free // 2 + 1), (str(tmp_path / "b"), free // 2 + 1)], 0, 0
    )
    assert [entry["ok"] for entry in both] == [False, False]
    assert both[0]["reason"].startswith(f"{tmp_path}/a and {tmp_path}/b (one filesystem): ")
    (reserved,) = checks.check_disks([(str(tmp_path), 0)], free + (1 << 30), 0)
    assert reserved["ok"] is False


class FakeStatvfs:
    def __init__(self, files: int, favail: int) -> None:
        self.f_bavail, self.f_frsize, self.f_files, self.f_favail = 1 << 40, 1, files, favail


@pytest.mark.parametrize(
    ("files", "favail", "ok"), [(1000000, 5, False), (1000000, 20000, True), (0, 0, True)]
)
def test_free_inodes_are_checked_unless_the_filesystem_reports_none(
    files: int, favail: int, ok: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checks.os, "statvfs", lambda path: FakeStatvfs(files, favail))
    (entry,) = checks.check_disks([(str(tmp_path), 0)], 0, 10000)
    assert entry["ok"] is ok
    if not ok:
        assert entry["reason"] == f"{tmp_path}: 5 free inodes, 10000 needed"


def test_a_full_disk_fails_the_node_and_names_it_in_sm_error_file(tmp_path: Path, tools: Path) -> None:
    error_file = tmp_path / "error.txt"
    env = node_env(tools, SM_ERROR_FILE=str(error_file))
    node = Node(
        start_node(tmp_path, env, 0, "127.0.0.1", "--disk", f"{tmp_path}/cache=1000000000000000000"),
        tmp_path / "node_0" / "fitness.json",
    )
    assert node.rc == 3
    (line,) = node.bad_lines()
    assert (
        line.startswith(f"fitness: 127.0.0.1 (rank 0): {tmp_path}/cache: ")
        and "GiB needed + 1 GiB reserve" in line
    )
    assert error_file.read_text() == line + "\n"
    assert node.report["checks"]["disk"][0]["need_bytes"] == 10**18


# --------------------------------------------------------------------------------------------------
# GPUs (through the fakes)


@pytest.fixture
def gpu_path(tools: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Put the chosen GPU fakes on PATH (the tools run in this process's environment)."""
    for name in list(os.environ):
        if name.startswith(("FAKE_NVIDIA_", "FAKE_AMDSMI_", "FAKE_GPU_")):
            monkeypatch.delenv(name)

    def use(*fakes: str) -> dict[str, str]:
        for fake in fakes:
            (tools / fake).symlink_to(FAKES / fake)
        monkeypatch.setenv("PATH", str(tools))
        return dict(os.environ)

    return use


def gpus(env: dict[str, str], needed: int = 0, timeout: float = 10.0) -> dict[str, Any]:
    return gpucheck.check_gpus(needed, 0.1, timeout, env, [])


def test_a_process_of_another_job_on_a_gpu_is_an_offender(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gpu_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_PROCS", "1:4242:2048")
    found = gpus(env, needed=8)
    assert found["status"] == "failed" and found["tool"] == "nvidia-smi" and found["count"] == 8
    assert found["reason"] == "GPU 1 held by pid 4242 (2048 MiB) of another job"
    assert found["offenders"] == [{"gpu": 1, "pid": 4242, "mib": 2048, "total_mib": None, "why": "process"}]
    assert found["gpus"][1] == {
        "index": 1,
        "uuid": "GPU-5f1c7a2e-0d3b-4c1a-9e8f-000000000001",
        "used_mib": 2048,
        "total_mib": 81559,
    }


def test_a_gpu_with_too_much_memory_in_use_is_an_offender(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gpu_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_MEM_USED", "3:20000,5:8000")  # 8000 of 81559 MiB is under 10 %
    found = gpus(env)
    assert found["reason"] == "GPU 3: 20000 of 81559 MiB in use (more than 10%) by another job"
    assert [o["gpu"] for o in found["offenders"]] == [3]


def test_amd_processes_are_found_through_amd_smis_noise(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gpu_path("amd-smi", "nvidia-smi")  # amd-smi wins, as in slurm_multi.gpus
    monkeypatch.setenv("FAKE_AMDSMI_NOISE", "warning,double,banner")
    monkeypatch.setenv("FAKE_AMDSMI_PROCS", "2:777:512,2:778:1")
    found = gpus(env, needed=8)
    assert found["tool"] == "amd-smi" and found["count"] == 8
    assert found["reason"] == (
        "GPU 2 held by pid 777 (512 MiB) of another job; GPU 2 held by pid 778 (1 MiB) of another job"
    )
    assert found["gpus"][2]["used_mib"] == 513 and found["gpus"][2]["total_mib"] == 196592


def test_a_gpu_seeded_on_this_host_only_is_found(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = gpu_path("amd-smi")
    host_dir = tmp_path / "gpu-hosts"
    host_dir.mkdir()
    host = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    (host_dir / f"{host}.env").write_text("FAKE_AMDSMI_PROCS=0:31337:4096\n")
    monkeypatch.setenv("FAKE_GPU_HOST_DIR", str(host_dir))
    assert gpus(env)["reason"] == "GPU 0 held by pid 31337 (4096 MiB) of another job"


def test_gpu_count_tool_absence_failure_and_hang(gpu_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    none = gpu_path()
    assert gpus(none)["status"] == "skipped"
    assert gpus(none, needed=2)["reason"] == (
        "the job needs 2 GPU(s) but this node has neither amd-smi nor nvidia-smi on PATH"
    )
    env = gpu_path("nvidia-smi")
    assert gpus(env, needed=8)["status"] == "ok"
    assert gpus(env, needed=16)["reason"] == "only 8 GPU(s) (nvidia-smi), the job needs 16"
    monkeypatch.setenv("FAKE_NVIDIA_FAIL", "9")
    assert gpus(env)["reason"] == (
        "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total failed "
        "(exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)"
    )
    monkeypatch.delenv("FAKE_NVIDIA_FAIL")
    (Path(env["PATH"]) / "nvidia-smi").unlink()
    env = gpu_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_SLEEP", "30")
    hung = gpus(env, timeout=0.3)
    assert hung["reason"] == "amd-smi did not answer within 0.3 s (is the GPU driver hung?)"


def test_a_gpu_offender_fails_the_node_end_to_end(tmp_path: Path, tools: Path) -> None:
    (tools / "nvidia-smi").symlink_to(FAKES / "nvidia-smi")
    env = node_env(tools, FAKE_NVIDIA_PROCS="6:4343:1024", FAKE_NVIDIA_GPUS="8")
    node = Node(
        start_node(tmp_path, env, 0, "127.0.0.1", "--gpus-needed", "8"), tmp_path / "node_0" / "fitness.json"
    )
    assert node.rc == 3
    assert node.bad_lines() == [
        "fitness: 127.0.0.1 (rank 0): GPU 6 held by pid 4343 (1024 MiB) of another job"
    ]


def test_docker_data_root_needs_nothing_for_a_held_image_and_the_tar_size_otherwise(tmp_path: Path) -> None:
    root = tmp_path / "docker-root"
    root.mkdir()
    info = json.dumps({"DockerRootDir": str(root)}).encode()
    held = json.dumps({"Id": "sha256:" + "a" * 64}).encode()
    path, server = engine(tmp_path, {"/info": info, "/images/toy/model:local/json": held})
    env = {"DOCKER_HOST": f"unix://{path}"}
    try:
        assert checks.docker_disk(env, "toy/model:local", 5 << 30, 2.0) == [(str(root), 0)]
        assert checks.docker_disk(env, "other:1", 5 << 30, 2.0) == [(str(root), 5 << 30)]
    finally:
        server.close()
    # An engine that does not answer: nothing to check here (the runtime check names it).
    assert checks.docker_disk({"DOCKER_HOST": f"unix://{tmp_path}/gone.sock"}, "x", 1, 0.5) == []
    assert checks.docker_disk(env, "", 1, 0.5) == []
