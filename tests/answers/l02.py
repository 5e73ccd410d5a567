"""Lesson 2's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "02-tensors.ipynb"
SETUP = ("import gc", "def size_mib(", "def check(")

CASES = [
    Case(
        cell="float32_mib = ...",
        context=SETUP,
        right=Answer(
            replace=(
                ("float32_mib = ...", "float32_mib = 147.0"),
                ("bfloat16_mib = ...", "bfloat16_mib = 73.5"),
            )
        ),
        wrong=Answer(
            replace=(
                ("float32_mib = ...", "float32_mib = 154.1"),  # 10**6 bytes to a MiB
                ("bfloat16_mib = ...", "bfloat16_mib = 77.1"),
            )
        ),
        why="megabytes of 10**6 bytes instead of MiB",
    ),
]

CASES += [
    Case(
        cell="def largest_square(nbytes):",
        context=SETUP,
        right=Answer(replace=(("    ...  # TODO", "    return math.isqrt(nbytes // 4)"),)),
        wrong=Answer(replace=(("    ...  # TODO", "    return round(math.sqrt(nbytes / 4))"),)),
        why="rounds to nearest instead of down",
    ),
    Case(
        cell="def add_position(T):",
        context=SETUP + ("def other_device():",),
        right=Answer(
            replace=(
                (
                    "return T + torch.arange(T.shape[-1])  # TODO: the arange lives on the CPU",
                    "return T + torch.arange(T.shape[-1], device=T.device)",
                ),
            )
        ),
        wrong=Answer(
            replace=(
                (
                    "return T + torch.arange(T.shape[-1])  # TODO: the arange lives on the CPU",
                    "return T.cpu() + torch.arange(T.shape[-1])",
                ),
            )
        ),
        why="moves T to the CPU instead",
    ),
]
