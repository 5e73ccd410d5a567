"""Lesson 1's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "01-devices.ipynb"
SETUP = ("import importlib.util", "def check(")
TRY = ("def try_gpu(i=0):",)
# The child reports the variable without importing torch (its GPU count is 0 with "" anyway):
# two fresh Pythons that import torch would take seconds.
NO_TORCH = ("import os, torch;", "import os;"), ("print(torch.cuda.device_count())", "print(0)")
TODO = "...  # TODO: set CUDA_VISIBLE_DEVICES"

CASES = [
    Case(
        cell="def run_child(setting):",
        context=SETUP,
        right=Answer(
            replace=(
                *NO_TORCH,
                (
                    "...  # TODO: set CUDA_VISIBLE_DEVICES",
                    'env["CUDA_VISIBLE_DEVICES"] = setting  #',
                ),
            )
        ),
        wrong=Answer(
            replace=(
                *NO_TORCH,
                (
                    "...  # TODO: set CUDA_VISIBLE_DEVICES",
                    'env["HIP_VISIBLE_DEVICES"] = setting  #',
                ),
            )
        ),
        why="the ROCm variable instead of CUDA's",
    ),
    Case(
        cell="def pick_devices(k, devices=None):",
        context=SETUP + TRY,
        right=Answer(
            replace=(
                (
                    "...  # TODO: return the right list; raise ValueError for k < 1",
                    "if k < 1:\n        raise ValueError(k)\n    return devices[:k]",
                ),
            )
        ),
        wrong=Answer(
            replace=(
                (
                    "...  # TODO: return the right list; raise ValueError for k < 1",
                    "if k < 1:\n        raise ValueError(k)\n    return (devices * k)[:k]",
                ),
            )
        ),
        why="repeats devices to reach k",
    ),
    Case(
        cell="def same_device(a, b, current=0):",
        context=SETUP,
        right=Answer(
            replace=(
                (
                    "...  # TODO",
                    "if a.type != b.type:\n        return False\n"
                    "    return (current if a.index is None else a.index) == "
                    "(current if b.index is None else b.index)",
                ),
            )
        ),
        wrong=Answer(replace=(("...  # TODO", "return a == b"),)),
        why="plain == on devices, 'cuda' != 'cuda:0'",
    ),
]
