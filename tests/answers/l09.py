"""Lesson 9's exercise checks (making one GPU fast), each fed a right and a plausible wrong one."""

from answers import Answer, Case

NOTEBOOK = "09-speed-one-gpu.ipynb"
SETUP = ("from d2l_gpu import amp_dtype",)  # imports, the device and the lesson's sizes

STEP_SECONDS = """
step_seconds = {{8: (0.0912, 0.0874), 64: (0.571, 0.566)}}
item_cost = {{b: {ratio} for b, (t_with, t_without) in step_seconds.items()}}
"""

COPIES = """
sides = [256, 512, 1024, 2048]
copy_times = {{
    "contiguous": [1.0e-5, 3.2e-5, 1.1e-4, 5.0e-4],
    "transposed": [4.0e-5, 1.6e-4, 8.0e-4, 4.4e-3],
}}
gbps = {{way: [{nbytes} / t / 1e9 for s, t in zip(sides, ts)] for way, ts in copy_times.items()}}
"""

LOOP = """
torch.manual_seed(0)
small = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.SGD(small.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
scales, stepped = [], []
for _ in range(40):
    opt.zero_grad()
    before = small[1].weight.detach().clone()
    with torch.autocast("cpu", dtype=torch.float16):
        l = nn.functional.cross_entropy(small(X_small), y_small)
    scaler.scale(l).backward()
    scaler.step(opt)
    scaler.update()
    scales.append(scaler.get_scale())
    stepped.append({changed})
"""

CASES = [
    Case(
        cell="the FLOPs of one training image of each model",
        context=SETUP,
        right=Answer(
            code='gflops = {("resnet18", 28): 2.734, ("resnet18_imagenet_stem", 96): 1.897}'
        ),
        wrong=Answer(
            code='gflops = {("resnet18", 28): 5.468, ("resnet18_imagenet_stem", 96): 3.795}'
        ),
        why="a batch of two counted, not divided by two",
    ),
    Case(
        cell="each ratio is the step time with .item()",
        context=SETUP,
        right=Answer(code=STEP_SECONDS.format(ratio="t_with / t_without")),
        wrong=Answer(code=STEP_SECONDS.format(ratio="t_without / t_with")),
        why="the ratio upside down",
    ),
    Case(
        cell="each GB/s is the bytes read and written",
        context=SETUP,
        right=Answer(code=COPIES.format(nbytes="2 * s * s * 4")),
        wrong=Answer(code=COPIES.format(nbytes="s * s * 4")),
        why="bytes read counted, bytes written forgotten",
    ),
    Case(
        cell="the scale halved exactly on the skipped steps",
        context=(*SETUP, "init_scale=2.0**40"),
        right=Answer(code=LOOP.format(changed="not torch.equal(before, small[1].weight)")),
        wrong=Answer(code=LOOP.format(changed="True")),
        why="every step assumed to update the weights",
    ),
    Case(
        cell="the first block, which compiles",
        context=SETUP,
        right=Answer(
            code='batches = [None, None]\ncompile_result = {"first block": 48.3, "step": 0.21}'
        ),
        wrong=Answer(
            code='batches = [None, None]\ncompile_result = {"first block": 0.43, "step": 0.21}'
        ),
        why="the first block timed after a warm-up, compilation excluded",
    ),
]
