"""Lesson 10's exercise checks, each fed a right and a plausible wrong answer."""

from answers import Answer, Case

NOTEBOOK = "10-model-parallel.ipynb"
SETUP = ("from d2l_gpu.distributed import pick_backend", "returned = []  # what a function")
NAMES = 'meta, f64 = torch.device("meta"), torch.float64\n'
TODO = "    return ...  # TODO"
# the check needs no ResNet: counting its layers would take seconds
RESNET = ("d2l.materialize(d2l.resnet18())", "d2l.lenet_sequential()")
SHARE = """    stages = [sum(costs[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    return max(stages){}
"""
GRADIENT = """torch.manual_seed(2)
X4 = torch.randn(6, 8, dtype=f64, requires_grad=True)
W = torch.randn(12, 8, dtype=f64)
target = torch.randn(6, 12, dtype=f64)
((X4 @ W.T - target) ** 2).sum().backward()
dY = 2 * (X4.detach() @ W.T - target)
grad_parts = [dY_r @ W_r for dY_r, W_r in zip(dY.chunk(3, 1), W.chunk(3, 0), strict=True)]
"""
MLP = """torch.manual_seed(1)
X3 = torch.randn(5, 8, dtype=f64)
W1 = torch.randn(16, 8, dtype=f64)
W2 = torch.randn(3, 16, dtype=f64)
Y3 = F.relu(X3 @ W1.T) @ W2.T
"""
MEGATRON = "zip(W1.chunk(4, 0), W2.chunk(4, 1), strict=True)"
BY_COLUMNS = "zip(X3.chunk(4, 1), W1.chunk(4, 1), strict=True)"
PARTIALS = "partials = (\n    ...\n)"
HIDDEN = "hidden_parts = ..."
HIDDEN_RIGHT = f"hidden_parts = [x @ w.T for x, w in {BY_COLUMNS}]"
HIDDEN_WRONG = f"hidden_parts = [F.relu(x @ w.T) for x, w in {BY_COLUMNS}]"
PARTS = "grad_parts = ..."
ZIP_PARTS = "zip(dY.chunk(3, 1), W.chunk(3, 0), strict=True)"
PARTS_RIGHT = f"grad_parts = [d @ w for d, w in {ZIP_PARTS}]"
PARTS_WRONG = f"grad_parts = [d @ w / 3 for d, w in {ZIP_PARTS}]"
NORM = "torch.linalg.norm"
STAGE_STEP = """    if rank == 0:
        h = X
    else:
        h = torch.empty(len(X), width, dtype=X.dtype, device=X.device)
        dist.recv(h, rank - 1)
        h.requires_grad_()
    out = stage(h)
    loss = None
    if rank == world - 1:
        loss = F.cross_entropy(out, y{})
        loss.backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(h.grad, rank - 1)
    return loss"""

CASES = [
    Case(
        cell="def busiest_share(",
        context=SETUP,
        right=Answer(code=NAMES, replace=(RESNET, (TODO, SHARE.format(" / sum(costs)")))),
        wrong=Answer(code=NAMES, replace=(RESNET, (TODO, SHARE.format("")))),
        why="the busiest stage's cost, not its share",
    ),
    Case(
        cell="m_10 = ...",
        context=SETUP,
        right=Answer(replace=(("m_10 = ...", "m_10 = 28"),)),
        wrong=Answer(replace=(("m_10 = ...", "m_10 = 27"),)),
        why="m > 27 solved as m = 27",
    ),
    Case(
        cell=PARTIALS,
        context=SETUP,
        right=Answer(
            code=NAMES,
            replace=((PARTIALS, f"partials = [F.relu(X3 @ a.T) @ b.T for a, b in {MEGATRON}]"),),
        ),
        wrong=Answer(
            code=NAMES, replace=((PARTIALS, f"partials = [X3 @ a.T @ b.T for a, b in {MEGATRON}]"),)
        ),
        why="the ReLU left out of each rank's part",
    ),
    Case(
        cell=HIDDEN,
        context=SETUP,
        right=Answer(code=NAMES + MLP, replace=((HIDDEN, HIDDEN_RIGHT),)),
        wrong=Answer(code=NAMES + MLP, replace=((HIDDEN, HIDDEN_WRONG),)),
        why="each rank applies the ReLU to its partial sum",
    ),
    Case(
        cell=PARTS,
        context=SETUP,
        right=Answer(code=NAMES, replace=((PARTS, PARTS_RIGHT),)),
        wrong=Answer(code=NAMES, replace=((PARTS, PARTS_WRONG),)),
        why="the parts averaged over the ranks, not summed",
    ),
    Case(
        cell="own_error = ...",
        context=SETUP,
        right=Answer(
            code=NAMES + GRADIENT,
            replace=(
                (
                    "own_error = ...",
                    f"own_error = {NORM}(grad_parts[0] - X4.grad) / {NORM}(X4.grad)",
                ),
            ),
        ),
        wrong=Answer(
            code=NAMES + GRADIENT,
            replace=(("own_error = ...", f"own_error = {NORM}(grad_parts[0]) / {NORM}(X4.grad)"),),
        ),
        why="the size of rank 0's part, not its error",
    ),
    Case(
        cell="def stage_step(stage, X, y, rank, world, width)",
        context=SETUP,
        right=Answer(replace=(("    return ...  # TODO", STAGE_STEP.format("")),)),
        wrong=Answer(replace=(("    return ...  # TODO", STAGE_STEP.format(', reduction="sum"')),)),
        why="the loss summed over the batch, not averaged: every gradient 8 times too large",
    ),
]
