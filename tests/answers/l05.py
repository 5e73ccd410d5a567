"""Lesson 5's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "05-data-parallel.ipynb"
SETUP = ("from collections.abc import Iterable",)
TIMES = "step_times = {1: 0.012, 2: 0.019, 3: 0.026, 4: 0.035}\n"
RUNS = "runs = {False: ([0.31, 0.52, 0.63], 2.4), True: ([0.31, 0.52, 0.63], 2.2)}\n"
SHARDS = "X = torch.zeros(61, 1, 28, 28)\npair = [torch.device('cpu')] * 2\n"
TIMED = "t_book, t_split = 0.8, 1.1\n"

CASES = [
    Case(
        cell="speedup[n] * step_times[n]",
        context=SETUP,
        right=Answer(TIMES + "speedup = {n: step_times[1] / t for n, t in step_times.items()}\n"),
        wrong=Answer(TIMES + "speedup = {n: t / step_times[1] for n, t in step_times.items()}\n"),
        why="the speed-up inverted: t_k / t_1",
    ),
    Case(
        cell="B, shards = len(X)",
        context=SETUP,
        right=Answer(SHARDS + "predicted = [61 / 31, 61 / 30]\nmeasured = [1.9677, 2.0333]\n"),
        wrong=Answer(SHARDS + "predicted = [2, 2]\nmeasured = [2.0, 2.0]\n"),
        why="the factor k for both instead of B / n_j",
    ),
    Case(
        cell="time_ratio * runs[False]",
        context=SETUP,
        right=Answer(RUNS + "time_ratio = runs[True][1] / runs[False][1]\n"),
        wrong=Answer(RUNS + "time_ratio = runs[False][1] / runs[True][1]\n"),
        why="time ratio the wrong way round",
    ),
    Case(
        cell="in_steps = 0.1 < d[0]",
        context=SETUP,
        right=Answer("distances = {0.05: 0.399, 0.1: 0.627, 0.2: 0.765, 0.4: 0.932}\n"),
        wrong=Answer("distances = {0.05: 0.512, 0.1: 0.476, 0.2: 0.566, 0.4: 0.792}\n"),
        why="(b) measured: the lr not multiplied by k",
    ),
    Case(
        cell='faster = "book" if t_book',
        context=SETUP,
        right=Answer(TIMED + "winner = 'book'\n"),
        wrong=Answer(TIMED + "winner = 'split'\n"),
        why="the expected winner, not the measured one",
    ),
]
