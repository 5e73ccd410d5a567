"""Lesson 8's (performance lab) exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "08-performance-lab.ipynb"
SETUP = ("job_n, job_k = d2l.by_profile",)  # imports, torch, d2l and the lab's sizes

# medians of a Timer for 1, 2 and 4 threads, as objects with a .median like Timer's measurements
THREAD_TIMES = """
from types import SimpleNamespace

threads = [1, 2, 4]
thread_times = [SimpleNamespace(median=m) for m in (4.0e-4, 2.5e-4, 1.6e-4)]
"""

LOG_EVERY = """
def log_every(As, B, k, to_host=lambda t: t.tolist()):
    log, pending = [], []
    for A in As:
        pending.append(torch.linalg.norm(A @ B))
        if len(pending) {op} k:
            log += to_host(torch.stack(pending))
            pending = []
    if pending:
        log += to_host(torch.stack(pending))
    return log


As, B = torch.randn(100, 100, 100), torch.randn(100, 100)
"""

COMPILED = """
first_call = 14.2
compiled_times = [{scale} * 3e-6 * max(1.0, m / 1000) for m in numels]
"""

JOBS = """
pair_mixed = [torch.device("cpu"), torch.device("cpu")]
t_alone = [0.004, 0.003]
t_in_turn, t_at_once = 0.0072, 0.0071
t_best = {best}
"""

CASES = [
    Case(
        cell="each speed-up is the 1-thread median",
        context=SETUP,
        right=Answer(
            code=THREAD_TIMES
            + "speedup = [thread_times[0].median / m.median for m in thread_times]"
        ),
        wrong=Answer(
            code=THREAD_TIMES
            + "speedup = [m.median / thread_times[0].median for m in thread_times]"
        ),
        why="the ratio upside down: t-thread time over 1-thread time",
    ),
    Case(
        cell="100 norms in 10 transfers of 10",
        context=SETUP,
        right=Answer(code=LOG_EVERY.format(op="==")),
        wrong=Answer(code=LOG_EVERY.format(op=">")),
        why="off by one: a transfer every k + 1 steps",
    ),
    Case(
        cell="a call far below the compiling first call",
        context=SETUP,
        right=Answer(code=COMPILED.format(scale="1")),
        wrong=Answer(code=COMPILED.format(scale="1e6")),
        why="times in microseconds instead of seconds",
    ),
    Case(
        cell="the best time follows from the jobs alone",
        context=SETUP,
        right=Answer(code=JOBS.format(best="sum(t_alone)")),
        wrong=Answer(code=JOBS.format(best="max(t_alone)")),
        why="overlap assumed on a single device",
    ),
    Case(
        cell="your count agrees with the one d2l.ddp_trace_worker measured",
        context=SETUP,
        right=Answer(
            code='ddp_runs = {0.05: {"launched_in_backward": 2}}\n'
            "last_gradient, launched_early = 1234.5, 2"
        ),
        wrong=Answer(
            code='ddp_runs = {0.05: {"launched_in_backward": 2}}\n'
            "last_gradient, launched_early = 1234.5, 3"
        ),
        why="every launch counted, the last bucket's too, which starts after the last gradient",
    ),
]
