"""Lesson 6's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "06-concise-multi-gpu.ipynb"
SETUP = ("from d2l_gpu import init_weights, materialize",)  # imports, d2l and the devices

VARIANTS = """
num_epochs = 4
variants = {
    "book's run 2": [0.41, 0.62, 0.70, 0.66],
    "fresh, initialised as run 1": [0.55, 0.74, 0.79, 0.77],
    "fresh, every layer N(0, 0.01)": [0.48, 0.66, 0.77, 0.71],
    "book's run 2, warm-up + cosine": [0.32, 0.65, 0.78, 0.80],
}
"""

WARMUP = """
num_epochs = 4
warmup_runs = {
    (4, False): [0.30, 0.55, 0.70, 0.74],
    (4, True): [0.42, 0.63, 0.74, 0.78],
    (8, False): [0.10, 0.25, 0.41, 0.52],
    (8, True): [0.21, 0.40, 0.56, 0.63],
}
"""

GAIN = """
warmup_gain = {{k: warmup_runs[k, {first}][-1] - warmup_runs[k, {second}][-1] for k in (4, 8)}}
"""

BATCHNORM = """
for per_replica in (8, 32, 128, 256):
    parts = torch.cat([bn(chunk) for chunk in X.{split}(per_replica)])
    largest_difference[per_replica] = (parts - whole).abs().max().item()
"""

REPLICAS = """
replica_seconds = {1: 0.0759, 2: 0.0843, 4: 0.1179}
"""

CASES = [
    Case(
        cell="and the highest named",
        context=SETUP,
        right=Answer(code=VARIANTS + 'ends_highest = "book\'s run 2, warm-up + cosine"'),
        wrong=Answer(code=VARIANTS + 'ends_highest = "fresh, initialised as run 1"'),
        why="the highest peak (epoch 3) named, not the highest final accuracy",
    ),
    Case(
        cell="the gain of warm-up in final test accuracy",
        context=SETUP,
        right=Answer(code=WARMUP + GAIN.format(first="True", second="False")),
        wrong=Answer(code=WARMUP + GAIN.format(first="False", second="True")),
        why="the difference taken the wrong way round",
    ),
    Case(
        cell="the difference shrinks as the replicas' batches grow",
        context=(*SETUP, "halves = torch.cat([bn(X[:256])", "largest_difference = {}"),
        right=Answer(code=BATCHNORM.format(split="split")),
        wrong=Answer(code=BATCHNORM.format(split="chunk")),
        why="X.chunk(n) makes n chunks, not chunks of n examples",
    ),
    Case(
        cell="what each extra replica adds",
        context=SETUP,
        right=Answer(code=REPLICAS + "per_replica = (replica_seconds[4] - replica_seconds[1]) / 3"),
        wrong=Answer(code=REPLICAS + "per_replica = replica_seconds[4] / 4"),
        why="the step time shared out, not the time added",
    ),
]
