"""configs/accelerate/*.yaml: every file is read by accelerate's own loader and launch validation,
produces the environment its launcher would give the processes, and the CPU ones really start the
processes they promise (a probe script reports what Accelerator() sees in each)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "accelerate"

# file -> (distributed_type, total processes, machines, launcher flag that launch_command picks)
EXPECTED = {
    "cpu_multiprocess.yaml": ("MULTI_GPU", 2, 1, "multi_gpu"),  # torchrun launcher; gloo via ACCELERATE_USE_CPU
    "cpu_two_machines_rank0.yaml": ("MULTI_GPU", 2, 2, "multi_gpu"),
    "cpu_two_machines_rank1.yaml": ("MULTI_GPU", 2, 2, "multi_gpu"),
    "one_gpu.yaml": ("NO", 1, 1, None),
    "multi_gpu.yaml": ("MULTI_GPU", 8, 1, "multi_gpu"),
    "multi_node.yaml": ("MULTI_GPU", 16, 2, "multi_gpu"),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 8, 1, "use_deepspeed"),
    "deepspeed_zero3.yaml": ("DEEPSPEED", 8, 1, "use_deepspeed"),
    "fsdp.yaml": ("FSDP", 8, 1, "use_fsdp"),
}

PROBE = """
import os
from accelerate import Accelerator
import torch
acc = Accelerator()
total = acc.reduce(torch.tensor([acc.process_index + 1.0]), "sum").item() if acc.num_processes > 1 else 1.0
# one write(2) per line: both ranks share the log file, and print() may split text and newline
os.write(1, f"PROBE {acc.distributed_type.value} {acc.num_processes} {acc.process_index} {acc.state.backend} {total:g}\\n".encode())
acc.end_training()  # destroys the gloo group: one left for interpreter exit can abort the process (-6)
"""


def _validated(name: str, *extra: str):
    """What `accelerate launch --config_file <name>` decides, without starting anything."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(CONFIGS / name), *extra, "train.py"])
    return _validate_launch_command(args)


def _launcher_env(name: str, monkeypatch) -> tuple:
    """The launcher's arguments and the environment it would hand to the processes."""
    from accelerate.utils import launch as L

    monkeypatch.setattr(L, "is_port_in_use", lambda port: False)  # no real port is bound here
    args, defaults, mp_from_config = _validated(name)
    if args.use_deepspeed:  # what launch_command sets before calling the DeepSpeed launcher
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        return args, L.prepare_deepspeed_cmd_env(args)[1]
    if args.multi_gpu or args.use_fsdp:
        return args, L.prepare_multi_gpu_env(args)
    return args, L.prepare_simple_launcher_cmd_env(args)[1]


def test_every_config_is_listed():
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_parses_with_accelerates_loader(name):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    dist, procs, machines, _ = EXPECTED[name]
    cfg = load_config_from_file(str(CONFIGS / name))
    assert isinstance(cfg, ClusterConfig)
    assert cfg.distributed_type.value == dist
    assert (cfg.num_processes, cfg.num_machines) == (procs, machines)
    assert cfg.num_processes % cfg.num_machines == 0  # processes per machine is a whole number
    assert cfg.mixed_precision in ("no", "bf16")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_launch_validation_picks_the_intended_launcher(name):
    _, procs, machines, flag = EXPECTED[name]
    args, _, _ = _validated(name)
    chosen = [f for f in ("multi_gpu", "use_deepspeed", "use_fsdp", "tpu") if getattr(args, f)]
    assert chosen == ([flag] if flag else [])
    assert (args.num_processes, args.num_machines) == (procs, machines)


def test_machine_rank_from_the_command_line_wins_over_the_file():
    args, _, _ = _validated("multi_node.yaml", "--machine_rank", "1")
    assert args.machine_rank == 1 and args.main_process_ip == "10.0.0.1" and args.main_process_port == 29500


@pytest.mark.parametrize("rank", [0, 1])
def test_two_machine_pair_rendezvous_at_localhost(rank, monkeypatch):
    args, _ = _launcher_env(f"cpu_two_machines_rank{rank}.yaml", monkeypatch)
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", rank, "1")
    assert args.rdzv_endpoint == "127.0.0.1:29561"


def test_fsdp_env_builds_a_valid_plugin(monkeypatch):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers.models.bert import modeling_bert

    _, env = _launcher_env("fsdp.yaml", monkeypatch)
    for key, value in env.items():
        if key.startswith(("FSDP_", "ACCELERATE_")):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()  # reads the env the processes would get
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.transformer_cls_names_to_wrap == ["BertLayer"]
    assert hasattr(modeling_bert, "BertLayer")  # the wrapped class exists in this transformers
    assert plugin.state_dict_type.name == "SHARDED_STATE_DICT"


@pytest.mark.parametrize("name,stage", [("deepspeed_zero2.yaml", 2), ("deepspeed_zero3.yaml", 3)])
def test_deepspeed_env_builds_a_valid_plugin(name, stage, monkeypatch):
    from accelerate.utils import DeepSpeedPlugin

    _, env = _launcher_env(name, monkeypatch)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env  # left "auto": filled from train.grad_accum
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == stage
    assert plugin.deepspeed_config["zero_optimization"]["stage"] == stage
    assert plugin.gradient_accumulation_steps == "auto"


# ---------------------------------------------------------------- real launches on this CPU


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(tmp_path: Path, config: str, *extra: str, log: str = "probe") -> subprocess.Popen:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config), *extra, str(script)]
    out = open(tmp_path / f"{log}.log", "w")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)


def _probes(tmp_path: Path, *logs: str) -> list[list[str]]:
    lines = [ln.split()[1:] for log in logs for ln in (tmp_path / f"{log}.log").read_text().splitlines()
             if ln.startswith("PROBE ")]
    return sorted(lines, key=lambda p: p[2])


@pytest.mark.slow
def test_the_cpu_configs_start_the_processes_they_promise(tmp_path):
    """cpu_multiprocess.yaml: two gloo processes under one launcher; the cpu_two_machines pair: one process per
    machine. The three launchers start side by side (they were two tests, one after the other)."""
    one = _launch(tmp_path, "cpu_multiprocess.yaml")
    port = str(_free_port())
    pair = [_launch(tmp_path, f"cpu_two_machines_rank{r}.yaml", "--main_process_port", port, log=f"m{r}") for r in (0, 1)]
    codes = [p.wait(timeout=120) for p in (one, *pair)]
    assert codes == [0, 0, 0], "".join((tmp_path / f"{n}.log").read_text()[-2000:] for n in ("probe", "m0", "m1"))
    # type, world size, rank, backend, all-reduced sum of (rank + 1) over both processes = 1 + 2
    both = [["MULTI_CPU", "2", "0", "gloo", "3"], ["MULTI_CPU", "2", "1", "gloo", "3"]]
    assert _probes(tmp_path, "probe") == both
    assert _probes(tmp_path, "m0", "m1") == both
