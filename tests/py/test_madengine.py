"""madengine's contract (slurm_multi.madengine): runners per launcher, the container's variables, the
script rule, the GPU options and the single-node fallback check (results/worldsize.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_multi import madengine as mad
from slurm_multi.common import HelperError
from slurm_multi.context import resolve
from slurm_multi.results.jobdir import NodeReport
from slurm_multi.results.worldsize import check_world, largest_world


def dist(launcher: str = "torchrun", nnodes: int = 2, nproc: int = 4, port: int = 29500) -> mad.Distributed:
    return mad.Distributed(launcher, nnodes, nproc, port)


# ---- runners -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("launcher", "nnodes", "expected"),
    [
        (
            "torchrun",
            2,
            "torchrun --nnodes=2 --nproc_per_node=4 --node_rank=1 --master_addr=n1 --master_port=29500",
        ),
        (
            "torchtitan",
            3,
            "torchrun --nnodes=3 --nproc_per_node=4 --node_rank=1 --master_addr=n1 --master_port=29500",
        ),
        (
            "megatron",
            2,
            "torchrun --nnodes=2 --nproc_per_node=4 --node_rank=1 --master_addr=n1 --master_port=29500",
        ),
        (
            "deepspeed",
            2,
            "deepspeed --hostfile=/sm-out/hf --no_ssh --node_rank=1 --master_addr=n1 --master_port=29500",
        ),
        ("none", 2, "torchrun --standalone --nproc_per_node=4"),
        ("vllm", 2, ""),
        ("sglang", 2, ""),
        ("primus", 2, ""),
        ("torchrun", 1, "torchrun --standalone --nproc_per_node=4"),
        ("deepspeed", 1, "deepspeed --num_gpus=4"),
    ],
)
def test_the_runner_of_every_launcher(launcher: str, nnodes: int, expected: str) -> None:
    assert mad.runner(dist(launcher, nnodes), 1, "n1", "/sm-out/hf") == expected


SPELLINGS = [("megatron-lm", "megatron"), ("sglang_disagg", "sglang-disagg"), ("docker", "none"),
             ("", "none"), ("TorchRun", "torchrun")]  # fmt: skip


@pytest.mark.parametrize(("spelling", "name"), SPELLINGS)
def test_madengine_spellings_of_a_launcher(spelling: str, name: str) -> None:
    assert mad.canonical_launcher(spelling, "x") == name


def test_an_unknown_launcher_is_one_line_naming_the_known_ones() -> None:
    with pytest.raises(HelperError, match="--launcher 'torchrunn' is not a launcher madengine knows"):
        mad.resolve_distributed({"SM_LAUNCHER": "torchrunn"}, 2, 0, {"SM_LAUNCHER": "torchrunn"})


def test_our_option_beats_the_manifest_and_nproc_follows_the_gpus_when_unset() -> None:
    values = {"SM_LAUNCHER": "torchrun", "SM_DIST_PORT": "29600"}
    d = mad.resolve_distributed(values, 2, 8, {})
    assert (d.launcher, d.nproc, d.port, d.world_size) == ("torchrun", 8, 29600, 16)
    assert mad.resolve_distributed(values, 2, 0, {}).nproc == 1
    d = mad.resolve_distributed({**values, "SM_NPROC_PER_NODE": "2", "SM_MASTER_PORT": "30000"}, 3, 8,
                                {"SM_MASTER_PORT": "30000"})  # fmt: skip
    assert (d.nproc, d.port, d.world_size, d.source["port"]) == (2, 30000, 6, "option/env SM_MASTER_PORT")
    with pytest.raises(HelperError, match="nproc_per_node 'two' is not a whole number"):
        mad.resolve_distributed({"SM_NPROC_PER_NODE": "two"}, 2, 0, {})


def test_the_serving_launchers_make_no_one_world() -> None:
    assert dist("vllm").world_size == 0 and dist("none").world_size == 0 and dist("deepspeed").world_size == 8


# ---- the container's variables ------------------------------------------------------------------


def facts(rank: int = 1, nnodes: int = 2, gpus: int = 0, vendor: str = "NONE") -> mad.NodeFacts:
    return mad.NodeFacts(rank, nnodes, "n1", ("n1", "n2"), vendor, gpus, gpus, {}, "/sm-out", "eth0")


def test_madengines_variables_for_a_worker_and_for_rank_0() -> None:
    values = {"SM_MODEL_NAME": "m", "SM_RESULTS_CSV": "perf.csv", "SM_GUEST_OS": "centos"}
    env = mad.mad_env(values, dist(), facts(rank=1))
    assert env["MAD_MULTI_NODE_RUNNER"].startswith("torchrun --nnodes=2 --nproc_per_node=4 --node_rank=1 ")
    assert env["MAD_COLLECT_METRICS"] == "false" and env["TORCH_ELASTIC_RDZV_TIMEOUT"] == "3600"
    assert (env["MAD_MODEL_NAME"], env["MAD_OUTPUT_CSV"], env["MAD_GUEST_OS"]) == ("m", "perf.csv", "CENTOS")
    assert env["MIOPEN_USER_DB_PATH"] == "/tmp/.miopen/node_1_rank_${LOCAL_RANK:-0}"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["MAD_RUNTIME_NGPUS"] == "4" and env["MAD_SYSTEM_NGPUS"] == "0" and env["NPROC_PER_NODE"] == "4"
    assert "MAD_GPU_VENDOR" not in env and "CUDA_VISIBLE_DEVICES" not in env
    assert mad.mad_env(values, dist(), facts(rank=0))["MAD_COLLECT_METRICS"] == "true"
    single = mad.mad_env(values, dist(nnodes=1), facts(rank=0, nnodes=1))
    assert "MAD_COLLECT_METRICS" not in single and "TORCH_ELASTIC_RDZV_TIMEOUT" not in single


def test_gpus_given_to_the_container_are_numbered_from_0_inside_it() -> None:
    env = mad.mad_env({}, dist(), facts(gpus=2, vendor="AMD"))
    assert env["MAD_GPU_VENDOR"] == "AMD" and env["MAD_RUNTIME_NGPUS"] == "2"
    assert env["HIP_VISIBLE_DEVICES"] == env["ROCR_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_launcher_variables_reach_the_container() -> None:
    assert mad.mad_env({}, dist("vllm"), facts())["VLLM_TENSOR_PARALLEL_SIZE"] == "4"
    assert mad.mad_env({}, dist("torchtitan"), facts())["TORCHTITAN_PIPELINE_PARALLEL_SIZE"] == "2"
    disagg = mad.mad_env({}, dist("sglang-disagg", nnodes=6), facts(nnodes=6))
    assert (disagg["SGLANG_DISAGG_PREFILL_NODES"], disagg["SGLANG_DISAGG_DECODE_NODES"]) == ("2", "3")
    with pytest.raises(HelperError, match="sglang-disagg needs at least 3 nodes"):
        mad.mad_env({}, dist("sglang-disagg", nnodes=2), facts())
    primus = mad.mad_env({"SM_PRIMUS_CONFIG_PATH": "c.yaml"}, dist("primus"), facts())
    assert primus["PRIMUS_CONFIG_PATH"] == "c.yaml" and primus["MAD_MULTI_NODE_RUNNER"] == ""


def test_the_users_own_values_pass_by_name_but_never_the_rank_variables() -> None:
    env = {"NCCL_DEBUG": "INFO", "MAD_MULTI_NODE_RUNNER": "mine", "RANK": "0", "CUDA_VISIBLE_DEVICES": "2,3",
           "MY_MAD_SECRETS_TOKEN": "x", "HOME": "/root"}  # fmt: skip
    assert mad.passed_by_name(env, ["MAD_MULTI_NODE_RUNNER"]) == [
        "MAD_MULTI_NODE_RUNNER", "NCCL_DEBUG", "MY_MAD_SECRETS_TOKEN"
    ]  # fmt: skip


# ---- the script ------------------------------------------------------------------------------------


def test_a_script_runs_as_madengine_runs_it(tmp_path: Path) -> None:
    (tmp_path / "scripts" / "m").mkdir(parents=True)
    (tmp_path / "scripts" / "m" / "run.sh").write_text("echo\n")
    (tmp_path / "scripts" / "m" / "bench.py").write_text("\n")
    sh = mad.script_command("scripts/m/run.sh", ["--a", "b c"], str(tmp_path))
    assert (sh.host_dir, sh.argv) == (str(tmp_path / "scripts" / "m"), ["bash", "run.sh", "--a", "b c"])
    assert mad.script_command("scripts/m/bench.py", [], str(tmp_path)).argv == ["python3", "bench.py"]
    assert mad.script_command("scripts/m", ["-x"], str(tmp_path)).argv == ["bash", "run.sh", "-x"]
    in_image = mad.script_command("run.sh", [], str(tmp_path))
    assert (in_image.host_dir, in_image.argv) == (None, ["bash", "run.sh"])


def test_resolve_gives_the_model_dir_precedence_and_the_models_timeout(tmp_path: Path) -> None:
    manifest = tmp_path / "m.json"
    model = {"name": "m", "scripts": "scripts/m/run.sh", "args": "--steps 3", "timeout": 77}
    manifest.write_text(
        json.dumps({"built_models": {"k": model}, "built_images": {"k": {"docker_image": "i"}}})
    )
    other = tmp_path / "other"
    (other / "scripts" / "m").mkdir(parents=True)
    (other / "scripts" / "m" / "run.sh").write_text("echo\n")
    ctx = resolve({"SM_MANIFEST": str(manifest), "SM_MODEL_DIR": str(other), "SM_MODEL_ARGS": "--steps 9"})
    assert ctx.script is not None and ctx.script.host_dir == str(other / "scripts" / "m")
    assert ctx.workload == ["bash", "run.sh", "--steps", "9"]
    assert ctx.values["SM_TIMEOUT"] == "77"
    assert resolve({"SM_MANIFEST": str(manifest), "SM_TIMEOUT": "5"}).values["SM_TIMEOUT"] == "5"
    assert resolve({"SM_MANIFEST": str(manifest)}, ["sh", "x"]).workload == ["sh", "x"]
    with pytest.raises(HelperError, match="--model-dir /nope: no such directory"):
        resolve({"SM_MANIFEST": str(manifest), "SM_MODEL_DIR": "/nope"})


# ---- GPU options -----------------------------------------------------------------------------------


def test_the_vendor_options_and_the_manifests_own_winning() -> None:
    amd = mad.vendor_options("AMD", [])
    assert amd == ["-u", "root", "--group-add", "video", "--cap-add=SYS_PTRACE", "--cap-add", "SYS_ADMIN",
                   "--device", "/dev/fuse", "--security-opt", "seccomp=unconfined", "--security-opt",
                   "apparmor=unconfined", "--ipc=host"]  # fmt: skip
    nvidia = mad.vendor_options("NVIDIA", [])
    assert "video" not in nvidia and "SYS_NICE" in nvidia
    assert mad.vendor_options("NONE", []) == []
    mine = mad.vendor_options("AMD", ["--shm-size", "16G", "--user=1000", "--cap-drop", "SYS_ADMIN",
                                      "--security-opt", "seccomp=/p.json"])  # fmt: skip
    assert "--ipc=host" not in mine and "root" not in mine and "SYS_ADMIN" not in mine
    assert "seccomp=unconfined" not in mine and "apparmor=unconfined" in mine


def test_ignored_fields_are_listed_and_used_ones_are_not() -> None:
    manifest = {
        "built_models": {"k": {"name": "m", "url": "https://example.invalid/x.git", "tags": ["a"]}},
        "built_images": {"k": {"docker_image": "i", "docker_sha": "abc"}},
        "context": {"tools": [{"name": "rocprof"}], "guest_os": "UBUNTU", "gen_sys_env_details": True},
        "deployment_config": {"slurm": {"nodes": 2, "partition": "gpu"}, "distributed": {"backend": "nccl"}},
    }
    assert mad.ignored_fields(manifest, "k") == [
        "built_images.k.docker_sha", "built_models.k.url", "context.gen_sys_env_details",
        "deployment_config.slurm.partition", "deployment_config.distributed.backend",
    ]  # fmt: skip


def test_a_node_count_the_allocation_does_not_have_is_said() -> None:
    assert mad.node_count_warning({"SM_DIST_NNODES": "4"}, 2).startswith(
        "the manifest's deployment_config.distributed.nnodes is 4 but the job has 2 nodes"
    )
    assert mad.node_count_warning({"SM_DIST_NNODES": "2", "SM_SLURM_NODES": "2"}, 2) is None


# ---- the single-node fallback ------------------------------------------------------------------------


def node_dir(root: Path, rank: int, log: str) -> NodeReport:
    (root / f"node_{rank}").mkdir(parents=True, exist_ok=True)
    (root / f"node_{rank}" / "node.log").write_text(log)
    return NodeReport(rank, f"node{rank + 1}", dirname=f"node_{rank}")


@pytest.mark.parametrize(
    ("line", "size"),
    [
        ("Hostname: n Rank: 1/2 Local Rank: 1", 2),
        ("ddp: rank 3 of 6 (node 1, local rank 1) joined", 6),
        ("  world_size ...................................... 16", 16),
        ("[Rank 0] World Size: 4", 4),
        ("  global_world_sizes=[8, 8]", 8),
        ("=== Running in Standalone Mode (Single GPU) ===", 1),
        ("mad: WORLD_SIZE=3", None),
        ("ddp: rank 0 step 5/40 loss=0.1", None),
        ("2026-12-01T10:00:00Z node1 r0 barrier: rank 1 of 2 ready", None),
    ],
)
def test_what_counts_as_a_world_size(tmp_path: Path, line: str, size: int | None) -> None:
    (tmp_path / "log").write_text(f"noise\n{line}\nmore noise\n")
    found = largest_world(tmp_path / "log")
    assert (found[0] if found else None) == size
    if found:
        assert found[1] == 2 and found[2] == line


def test_a_node_that_ran_alone_fails_and_a_silent_one_is_said(tmp_path: Path) -> None:
    nodes = [
        node_dir(tmp_path, 0, "Rank: 0/4\nRank: 1/4\n"),
        node_dir(tmp_path, 1, "Running in Standalone Mode\nRank: 0/2\nRank: 1/2\n"),
        node_dir(tmp_path, 2, "nothing about the world\n"),
    ]
    check = check_world(tmp_path, nodes, 4, 2)
    assert check.short == [
        "node2 (rank 1): the workload ran in a world of 2 (2 processes: this node alone), not the job's 4; "
        "it did not join the other nodes (a single-node fallback?): node.log:2: Rank: 0/2"
    ]
    assert check.silent == ["node3 (rank 2)"] and check.to_dict()["seen"] == {"0": 4, "1": 2}


@pytest.mark.parametrize("nproc", [1, 3])
def test_a_world_exactly_one_smaller_than_the_jobs_fails(tmp_path: Path, nproc: int) -> None:
    # A 2-node job of one process per node whose nodes each ran alone: a world of 1, the job's 2.
    # And a world one short of 2 x 3 = 6 (5: a rank missing from the one world).
    expected = 2 * nproc
    nodes = [node_dir(tmp_path, r, f"Rank: 0/{expected - 1}\n") for r in (0, 1)]
    check = check_world(tmp_path, nodes, expected, nproc)
    assert len(check.short) == 2
    assert check.short[0].startswith(f"node1 (rank 0): the workload ran in a world of {expected - 1}")
    assert check.describe() == f"world size: 2 node(s) ran in a smaller world than the job's {expected}"


def test_standalone_mode_fails_a_node_even_beside_a_full_world_line(tmp_path: Path) -> None:
    nodes = [
        node_dir(tmp_path, 0, "Rank: 0/2\n"),
        node_dir(tmp_path, 1, "Rank: 1/2\nRunning in Standalone Mode\n"),
    ]
    check = check_world(tmp_path, nodes, 2, 1)
    assert len(check.short) == 1
    assert check.short[0].startswith("node2 (rank 1): the workload ran in standalone mode")
    assert "node.log:2: Running in Standalone Mode" in check.short[0]


# ---- madengine's default launcher ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "nnodes", "launcher", "source"),
    [
        ({}, 2, "torchrun", "madengine's default for 2 nodes"),
        ({}, 16, "torchrun", "madengine's default for 16 nodes"),
        ({}, 1, "none", "default (one node: none)"),
        ({"SM_LAUNCHER": "none"}, 2, "none", "manifest distributed.launcher"),
        ({"SM_LAUNCHER": "  "}, 2, "torchrun", "madengine's default for 2 nodes"),
        ({"SM_RUNTIME": "none", "SM_NTASKS_PER_NODE": "2"}, 2, "none",
         "default (Slurm's tasks are the ranks: none)"),
        ({"SM_RUNTIME": "docker", "SM_NTASKS_PER_NODE": "2"}, 2, "torchrun",
         "madengine's default for 2 nodes"),
    ],
)  # fmt: skip
def test_a_manifest_without_a_launcher_gets_madengines_torchrun_on_more_than_one_node(
    values: dict[str, str], nnodes: int, launcher: str, source: str
) -> None:
    d = mad.resolve_distributed(values, nnodes, 0, {})
    assert (d.launcher, d.source["launcher"]) == (launcher, source)
    if launcher == "torchrun":
        assert mad.runner(d, 1, "n1", "/hf").startswith(f"torchrun --nnodes={nnodes} --nproc_per_node=1")


# ---- n_gpus and skip_gpu_arch on a node --------------------------------------------------------


def _ctx(tmp_path: Path, **model: object):
    from slurm_multi.context import resolve

    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {"built_models": {"k": {"name": "m", **model}}, "built_images": {"k": {"docker_image": "i"}}}
        )
    )  # noqa: E501
    return resolve({"SM_MANIFEST": str(path)}, ["true"])


@pytest.mark.parametrize(("n_gpus", "count"), [("-1", None), ("2", 2), ("0", None), (None, None), (4, 4)])
def test_the_models_n_gpus_as_a_count(tmp_path: Path, n_gpus: object, count: int | None) -> None:
    from slurm_multi.node import model_n_gpus

    model = {} if n_gpus is None else {"n_gpus": n_gpus}
    assert model_n_gpus(_ctx(tmp_path, **model)) == count
    with pytest.raises(HelperError, match="the model's n_gpus 'two' is not a whole number"):
        model_n_gpus(_ctx(tmp_path, n_gpus="two"))


@pytest.mark.parametrize(
    ("skip", "arch", "refused"),
    [
        ("gfx908, gfx942", "gfx942", True),
        (["gfx90a", "gfx942"], "gfx942", True),
        ("gfx908,gfx90a", "gfx942", False),
        ("A100", "NVIDIA A100-SXM4-40GB", True),
        ("H100", "NVIDIA A100-SXM4-40GB", False),
        ("gfx942", "", False),  # no GPUs detected: nothing to skip
    ],
)
def test_skip_gpu_arch_refuses_a_node_of_that_architecture(
    tmp_path: Path, skip, arch: str, refused: bool
) -> None:
    from slurm_multi.node import check_skip_gpu_arch

    ctx = _ctx(tmp_path, skip_gpu_arch=skip)
    details = {"MAD_SYSTEM_GPU_ARCHITECTURE": arch} if arch else {}
    if refused:
        with pytest.raises(
            HelperError, match=r"model m skips GPU architecture \S+ \(its skip_gpu_arch: .*\) and node2 has"
        ):
            check_skip_gpu_arch(ctx, details, "node2")
    else:
        check_skip_gpu_arch(ctx, details, "node2")
