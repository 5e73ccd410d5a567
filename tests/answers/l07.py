"""Lesson 7's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "07-ddp-torchrun.ipynb"
TOOLS = """
import re
import torch
weights = {"right.pt": {"w": torch.zeros(3)}, "two.pt": {"w": torch.zeros(3)}}
def load(name):
    return weights.get(name, {"w": torch.ones(3)})
def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)
"""
REFUSED = (
    "d2l_gpu.train: error (rank 1): global --batch-size 256 is not divisible by the world size 3"
)
AGENT = "E1122 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 41) of binary: python\n"
HEADER = (
    "lenet: world size 2 (gloo, cpu, ddp), 6000 training examples, global batch 256 = 2 x 128\n"
)

CASES = [
    Case(
        cell='print("Exercise 1: not done yet: errors',
        right=Answer(TOOLS + f"errors = {{'batch 256': {REFUSED!r}, 'limit 2': {REFUSED!r}}}"),
        wrong=Answer(TOOLS + f"errors = {{'batch 256': {REFUSED!r}, 'limit 2': {HEADER!r}}}"),
        why="the second job run with 2 processes, so nothing was refused",
    ),
    Case(
        cell='print("Exercise 2: not done yet: bucket_counts',
        right=Answer("bucket_counts = {0.05: 3, None: 1}"),
        wrong=Answer("bucket_counts = {0.05: 4, None: 2}"),
        why="every output line counted, not only the bucket lines",
    ),
    Case(
        cell='print("Exercise 3: not done yet: run_ex3',
        right=Answer(
            TOOLS + f"run_ex3 = {HEADER + AGENT + HEADER!r}",
            replace=(('load("ex3.pt")', 'load("right.pt")'),),
        ),
        wrong=Answer(
            TOOLS
            + f"run_ex3 = {HEADER + AGENT + 'resumed from ckpt-ex3.pt: 1 of 2 epochs done'!r}",
            replace=(('load("ex3.pt")', 'load("right.pt")'),),
        ),
        why="the kill waited for the first checkpoint",
    ),
    Case(
        cell='print("Exercise 4: not done yet: diffs',
        right=Answer("diffs = {(0.2, 1): 3e-3, (0.2, 2): 5e-2, (0.02, 2): 1e-4}"),
        wrong=Answer("diffs = {(0.2, 1): 0.0, (0.2, 2): 0.0, (0.02, 2): 0.0}"),
        why="one.pt compared with itself",
    ),
]
