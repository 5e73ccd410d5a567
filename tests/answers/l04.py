"""Lesson 4's exercise checks, each fed a right and a plausible wrong answer."""

from dataclasses import replace

from answers import Answer, Case

NOTEBOOK = "04-networks.ipynb"
SETUP = ("import copy", "def check(")
NET = ("net_cpu = [p.detach().clone()", "net.eval()  # use running")
DATA = ("true_w, true_b = torch.tensor",)
TODO = "    ...  # TODO"
READ = ("weight = ...", "weight = net[0].weight.detach().cpu().numpy()")
BIAS = "...  # TODO: set net[0].bias"
STEP = "    loss = loss_fn(m(X_batch), y_batch)\n    opt.zero_grad()\n    loss.backward()\n"
ON_DEV = "X.to(next(net.parameters()).device)"
SAVE = '"""Write model, optimizer state and step to `path`."""\n' + TODO
LOAD = '"""Restore model and optimizer from `path` in place; return the step it was saved at."""\n'
LOAD += TODO
SAVED = (
    '"""Write."""\n    torch.save({"m": model.state_dict(), "o": optimizer.state_dict(),'
    ' "s": step}, path)'
)
LOADED = (
    '"""Load."""\n    c = torch.load(path, map_location=next(model.parameters()).device,'
    ' weights_only=True)\n    model.load_state_dict(c["m"])\n'
    '    optimizer.load_state_dict(c["o"])\n    return c["s"]'
)

CASES = [
    Case(
        cell="weight = ...  # TODO: net[0].weight",
        context=SETUP + NET,
        right=Answer(
            replace=(
                READ,
                (BIAS, "with torch.no_grad():\n    net[0].bias.copy_(torch.zeros(4))  #"),
            )
        ),
        wrong=Answer(replace=(READ, (BIAS, "net[0].bias = nn.Parameter(torch.zeros(4))  #"))),
        why="a new Parameter instead of an in-place change",
    ),
    Case(
        cell="def sgd_step(m, opt, X_batch, y_batch):",
        context=SETUP + DATA,
        right=Answer(replace=(("    ...  # TODO: the loss", STEP + "    opt.step()  #"),)),
        wrong=Answer(replace=(("    ...  # TODO: the loss", STEP + "    #"),)),
        why="forgot opt.step()",
    ),
    Case(
        cell="def predict(net, X):",
        context=SETUP + NET,
        right=Answer(
            replace=((TODO, f"    with torch.no_grad():\n        return net({ON_DEV}).cpu()"),)
        ),
        wrong=Answer(replace=((TODO, f"    return net({ON_DEV}).cpu()"),)),
        why="no torch.no_grad(): the output keeps its graph",
    ),
    Case(
        cell="def save_checkpoint(path, model, optimizer, step):",
        context=SETUP + DATA + ("def make_model_and_trainer(device):",),
        right=Answer(replace=((SAVE, SAVED), (LOAD, LOADED))),
        wrong=Answer(
            replace=(
                (SAVE, '"""Write."""\n    torch.save({"m": model.state_dict(), "s": step}, path)'),
                (LOAD, LOADED.replace('    optimizer.load_state_dict(c["o"])\n', "")),
            )
        ),
        why="the optimizer's state not saved",
    ),
    Case(
        cell="def strip_module_prefix(state):",
        context=SETUP + NET + ("net_ref = nn.Sequential(", "wrapped = nn.DataParallel("),
        right=Answer(
            replace=((TODO, '    return {k.removeprefix("module."): v for k, v in state.items()}'),)
        ),
        wrong=Answer(
            replace=((TODO, '    return {k.removeprefix("module"): v for k, v in state.items()}'),)
        ),
        why="strips 'module' but leaves the dot",
    ),
]
# lstrip removes letters, not a prefix; the check renames names that start with them
CASES.append(
    replace(
        CASES[-1],
        wrong=Answer(
            replace=((TODO, '    return {k.lstrip("module."): v for k, v in state.items()}'),)
        ),
        why="lstrip removes letters, not a prefix: 'decoder' loses its 'de'",
    )
)
