"""Lesson 7's minimal DDP script picks a backend and a device that work on 0, 1 and 2 GPUs.

CUDA is faked as in tests/test_devices.py (only PyTorch's queries are replaced), and the script
runs until it joins its group: the test records the backend, the device, `torch.cuda.set_device`
and `device_id`. The rules are CUDA's and NCCL's: every rank chooses the same backend, NCCL only
with a GPU per process, each process on its own GPU, set as current and bound to the group. The
script as first committed (NCCL whenever CUDA exists, no set_device) is the negative control.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "notebooks" / "07-ddp-torchrun.ipynb"
CELL = "35f1484a"
# how the script chose before issue 41: rank 1 asked for cuda:1 on a machine with one GPU
FIRST_CHOICE = """on_gpu = torch.cuda.is_available()
dist.init_process_group("nccl" if on_gpu else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
"""


class Joined(Exception):
    """Raised by the faked init_process_group: the script has chosen all it needs to."""


def minimal_script() -> str:
    """The MINIMAL string that the lesson's cell writes to minimal_ddp.py."""
    cell = next(c for c in json.loads(LESSON.read_text())["cells"] if c.get("id") == CELL)
    tree = ast.parse("".join(cell["source"]))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MINIMAL":
            return ast.literal_eval(node.value)
    raise AssertionError(f"cell {CELL} of {LESSON.name} no longer assigns MINIMAL")


def with_first_choice(script: str) -> str:
    """The script with its device choice replaced by the first committed one."""
    start = script.index("# NCCL only when")
    end = script.index("raw = d2l.read_fashion_mnist()")
    return script[:start] + FIRST_CHOICE + script[end:]


def choose(script: str, monkeypatch, gpus: int, local_rank: int, local_world: int) -> dict:
    """What `script` does before joining its group, as local rank `local_rank` of `local_world`
    processes on a machine with `gpus` CUDA GPUs."""
    seen: dict = {"set_device": []}

    def init_process_group(backend=None, **kwargs):
        seen["backend"], seen["device_id"] = backend, kwargs.get("device_id")
        raise Joined

    def set_device(device):
        device = torch.device(device)
        if device.index is None or device.index >= gpus:
            raise RuntimeError(f"CUDA error: invalid device ordinal ({device})")
        seen["set_device"].append(device)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    env = {"LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": local_world, "RANK": local_rank}
    for name, value in {**env, "WORLD_SIZE": local_world}.items():
        monkeypatch.setenv(name, str(value))
    namespace: dict = {"__name__": "__main__"}
    with pytest.raises(Joined):
        exec(compile(script, "minimal_ddp.py", "exec"), namespace)
    seen["device"] = namespace.get("device")  # None: chosen only after joining
    return seen


def follows_the_rules(seen: dict, gpus: int, local_rank: int, local_world: int) -> bool:
    """NCCL exactly when each process has a GPU; then its own, current and bound to the group."""
    if gpus < local_world:
        return seen["backend"] == "gloo" and seen["device"] == torch.device("cpu")
    mine = torch.device("cuda", local_rank)
    return (
        seen["backend"] == "nccl"
        and seen["device"] == mine
        and seen["set_device"] == [mine]
        and seen["device_id"] == mine
    )


MACHINES = [  # (GPUs, local rank, processes on the machine)
    (0, 0, 2),
    (0, 1, 2),
    (1, 0, 1),
    (1, 0, 2),
    (1, 1, 2),
    (2, 0, 2),
    (2, 1, 2),
    (8, 3, 4),
]


@pytest.mark.parametrize(("gpus", "local_rank", "local_world"), MACHINES)
def test_the_script_chooses_by_the_rules(monkeypatch, gpus, local_rank, local_world):
    seen = choose(minimal_script(), monkeypatch, gpus, local_rank, local_world)
    assert follows_the_rules(seen, gpus, local_rank, local_world), seen


def test_the_first_committed_choice_breaks_the_rules(monkeypatch):
    """The negative control: the first script fails on one GPU and never sets the device."""
    first = with_first_choice(minimal_script())
    on_one_gpu = choose(first, monkeypatch, 1, 1, 2)
    assert not follows_the_rules(on_one_gpu, 1, 1, 2)  # NCCL, and cuda:1 that does not exist
    on_two = choose(first, monkeypatch, 2, 1, 2)
    assert on_two["set_device"] == [] and not follows_the_rules(on_two, 2, 1, 2)
