"""Lesson 3's exercise checks, each fed a right and a plausible wrong answer."""

from dataclasses import replace

from answers import Answer, Case

NOTEBOOK = "03-copying.ipynb"
SETUP = ("import torch", "def check(")
FEWER = ("range(1000)", "range(20)")  # 20 products instead of 1000 keep the test fast

CASES = [
    Case(
        cell="def log_on_device(M):",
        context=SETUP,
        right=Answer(
            replace=(
                FEWER,
                (
                    "...  # TODO: return a CPU tensor holding the 1000 norms",
                    "return torch.stack([torch.linalg.matrix_norm(M @ M) for _ in range(20)])"
                    ".cpu()",
                ),
            )
        ),
        wrong=Answer(
            replace=(
                FEWER,
                (
                    "...  # TODO: return a CPU tensor holding the 1000 norms",
                    "return [torch.linalg.matrix_norm(M @ M) for _ in range(20)]",
                ),
            )
        ),
        why="a list of device tensors, not one CPU tensor",
    ),
    Case(
        cell="def products_on_each(As):",
        context=SETUP,
        right=Answer(replace=(("...  # TODO: append A @ A", "results += [A @ A for A in As]  #"),)),
        wrong=Answer(replace=(("...  # TODO: append A @ A", "results += [A * A for A in As]  #"),)),
        why="elementwise product instead of A @ A",
    ),
    Case(
        cell="waits_per_step = ...",
        context=SETUP,
        right=Answer(
            replace=(
                ("waits_per_step = ...", "waits_per_step = 2"),
                (
                    "    ...  # TODO",
                    "    losses = []\n    for _ in range(steps):\n"
                    "        losses.append((V @ V).square().mean())\n        V = V * 0.5\n"
                    "    return torch.stack(losses).min().item()",
                ),
            )
        ),
        wrong=Answer(
            replace=(
                ("waits_per_step = ...", "waits_per_step = 2"),
                (
                    "    ...  # TODO",
                    "    losses = []\n    for _ in range(steps):\n"
                    "        losses.append((V @ V).square().mean())\n        V = V * 0.5\n"
                    "    return torch.stack(losses).min()",
                ),
            )
        ),
        why="returns a device tensor, not a float",
    ),
]
# the same checks fed the mistake they now count: a wait for the device inside the loop
CASES += [
    replace(
        CASES[0],
        wrong=Answer(
            replace=(
                FEWER,
                (
                    "...  # TODO: return a CPU tensor holding the 1000 norms",
                    "return torch.tensor([torch.linalg.matrix_norm(M @ M).item() for _ in "
                    "range(20)])",
                ),
            )
        ),
        why="the right CPU tensor, but one .item() (one wait) per product",
    ),
    replace(
        CASES[2],
        wrong=Answer(
            replace=(
                ("waits_per_step = ...", "waits_per_step = 2"),
                (
                    "    ...  # TODO",
                    "    best = None\n    for _ in range(steps):\n"
                    "        loss = (V @ V).square().mean()\n"
                    "        best = loss if best is None or loss < best else best\n"
                    "        V = V * 0.5\n    return best.item()",
                ),
            )
        ),
        why="the same float, but an `if` on a device tensor (a wait) in every step",
    ),
]
