"""The GPU report's logic, pure: targets, pass or fail, the Markdown. No device, no torch.

A report is a dict: `hardware` (from gpu_report.hardware), `epochs`, `limit` and `steps`, a list
of records {step, status ('ok', 'failed' or 'timeout'), seconds, command, figures, error}. A
target whose step was not run is 'not measured'; one whose step failed is 'fail'; one that does
not apply to this machine (one device, not H100-class) is 'n/a'. Figures are only ever copied
from the records: nothing here makes one up.
"""

from __future__ import annotations

STEPS = ("lessons", "solutions", "nbval", "bench", "lenet", "resnet", "ddp", "fast", "seeds")
EPOCHS = 10  # the targets hold after 10 epochs on the whole data set
LENET_ACC, RESNET_ACC, RESNET_SEC, GAP = 0.83, 0.91, 1.0, 0.01
H100_CLASS = ("H100", "H200", "H800", "GH200")
LESSON5_LR = 0.2  # the learning rate of lesson 5's full profile

# The acceptance run in parts that fit a session's device time, each planned at most 4 minutes
# on an H100-class GPU, in the order to run them when time is short: (name, steps, notebooks by
# number or "" for all, what it shows, what a run of it has taken so far).
PARTS = (
    ("fast", "fast", "", "ResNet-18 one change at a time, then 10 epochs x 3 seeds",
     "90 s, H200 2026-11-30"),
    ("lessons-a", "lessons", "06,10,11,12", "the lessons least run on a GPU",
     "156 s, H200 2026-11-30 (12 did not start)"),
    ("seeds", "seeds", "", "lesson 5's LeNet over 3 seeds and 3 learning rates",
     "< 156 s beside lessons-a, H200 2026-11-30"),
    ("solutions-a", "solutions", "01,02,03,04,05,08,09,10,11,13,14", "most solutions",
     "<= 53 s each side by side, H200 2026-11-30"),
    ("solutions-b", "solutions", "06,07,12", "the long solutions",
     "06 and 07 past 215 s side by side: not finished"),
    ("lessons-b", "lessons", "01,02,03,04,05,07,08,09,13,14", "the other lessons",
     "07 101 s, 09 77 s alone, H100 2026-11-26; together not measured"),
    ("train", "lenet,resnet,ddp", "", "lessons 5 and 6 and the training script, 10 epochs",
     "172 s, H100 2026-11-26"),
    ("bench", "bench", "", "benchmarks/bench_resnet.py --profile full", "82 s, H100 2026-11-26"),
    ("nbval-a", "nbval", "01,02,03,04,05,06,07", "strict nbval, lessons 1-7", "not measured"),
    ("nbval-b", "nbval", "08,09,10,11,12,13,14", "strict nbval, lessons 8-14", "not measured"),
)  # fmt: skip


def plan() -> str:
    """The parts in the order to run them, as printed by --plan."""
    lines = ["Each part is planned to take at most 4 minutes on an H100-class GPU. In order:", ""]
    for i, (name, steps, only, what, seen) in enumerate(PARTS, 1):
        lines.append(f"{i:>2}. {name}: {what}")
        lines.append(f"    steps {steps}; notebooks {only or 'all'}; so far: {seen}")
    return "\n".join(lines) + "\n"


def merge(old: dict, new: dict) -> dict:
    """`new`'s records over `old`'s: a step of the same name is replaced, except that lesson and
    solution rows are replaced one notebook at a time; the hardware is `new`'s."""
    if (old["epochs"], old["limit"]) != (new["epochs"], new["limit"]):
        raise ValueError(
            f"the report holds a run of {old['epochs']} epochs (limit {old['limit']}), this one "
            f"{new['epochs']} (limit {new['limit']}): they cannot be judged together"
        )
    steps = {s["step"]: s for s in old["steps"]}
    for s in new["steps"]:
        before = steps.get(s["step"])
        if s["step"] in ("lessons", "solutions") and before and before["figures"]:
            rows = {r["lesson"]: r for r in before["figures"]["lessons"]}
            rows |= {r["lesson"]: r for r in s["figures"].get("lessons", [])}
            merged = sorted(rows.values(), key=lambda r: r["lesson"])
            bad = any(r["status"] != "ok" for r in merged)
            s = {**s, "status": "failed" if bad else "ok", "figures": {"lessons": merged}}
        steps[s["step"]] = s
    return {**old, **new, "steps": list(steps.values())}


def _steps(report: dict, prefix: str) -> list[dict]:
    """Records whose step name is `prefix` or starts with `prefix` and a space."""
    return [s for s in report["steps"] if s["step"] == prefix or s["step"].startswith(prefix + " ")]


def _one(report: dict, prefix: str) -> dict | None:
    """The record of step `prefix` ('resnet 1'), else of its group ('resnet') if that crashed."""
    found = _steps(report, prefix) or _steps(report, prefix.split()[0])
    return found[0] if found else None


def _smoke(report: dict) -> str | None:
    """Why the training figures are not held against the targets, or None for a full run."""
    if report["epochs"] == EPOCHS and report["limit"] is None:
        return None
    limit = f", {report['limit']} examples per split" if report["limit"] else ""
    return f"not measured (smoke run: {report['epochs']} epochs{limit})"


def _value(report: dict, name: str, key: str):
    """(figure, None) from an ok record, else (None, result): 'not measured' or 'fail'."""
    step = _one(report, name)
    if step is None:
        return None, "not measured"
    if step["status"] != "ok" or step["figures"].get(key) is None:
        return None, "fail"
    return step["figures"][key], None


def _check(target: str, measured: str, result: str) -> dict:
    return {"target": target, "measured": measured, "result": result}


def _at_least(report, target, name, key, bound, *, smoke=True) -> dict:
    value, missing = _value(report, name, key)
    if missing:
        return _check(target, _why(report, name), missing)
    if smoke and _smoke(report):
        return _check(target, f"{value:.3f}", _smoke(report))
    return _check(target, f"{value:.3f}", "pass" if value >= bound else "fail")


def _why(report: dict, name: str) -> str:
    step = _one(report, name)
    if step is None:
        return "step not run"
    return f"step {step['step']} {step['status']}"


def _gap(report, target, one, many) -> dict:
    if report["hardware"]["devices"] < 2:
        return _check(target, "one device: nothing to compare", "n/a")
    a, missing_a = _value(report, one, "test_acc")
    b, missing_b = _value(report, many, "test_acc")
    if missing_a or missing_b:
        return _check(target, _why(report, one if missing_a else many), missing_a or missing_b)
    measured = f"{b:.3f} vs {a:.3f} (gap {abs(a - b):.3f})"
    if _smoke(report):
        return _check(target, measured, _smoke(report))
    return _check(target, measured, "pass" if abs(a - b) <= GAP else "fail")


def _speed(report: dict, name: str = "resnet 1") -> dict:
    which = "ResNet-18, 1 device" if name == "resnet 1" else "ResNet-18 (benchmarks/resnet_fast.py)"
    target = f"{which}: <= {RESNET_SEC:g} s/epoch on an H100-class GPU"
    names = report["hardware"]["names"]
    value, missing = _value(report, name, "sec_per_epoch")
    if missing:
        return _check(target, _why(report, name), missing)
    fraction = _one(report, name)["figures"].get("fraction_of_peak")
    peak = "" if fraction is None else f", {fraction:.1%} of the data-sheet peak"
    measured = f"{value:.2f} s/epoch{peak}"
    if not any(key in (names[0] if names else "") for key in H100_CLASS):
        return _check(target, measured, f"n/a ({names[0] if names else '?'} is not H100-class)")
    if _smoke(report):
        return _check(target, measured, _smoke(report))
    return _check(target, measured, "pass" if value <= RESNET_SEC else "fail")


def _all_ok(target: str, records: list[dict], what: str) -> dict:
    if not records:
        return _check(target, "step not run", "not measured")
    bad = [r["step"] for r in records if r["status"] != "ok"]
    measured = f"{len(records) - len(bad)} of {len(records)} {what}"
    return _check(
        target, measured + (f"; not: {', '.join(bad)}" if bad else ""), "fail" if bad else "pass"
    )


def _lessons(report: dict, name: str = "lessons") -> dict:
    target = f"every {name[:-1]} runs in the full profile"
    step = _one(report, name)
    if step is None or step["status"] != "ok" and not step["figures"]:
        return _check(target, _why(report, name), "not measured" if step is None else "fail")
    rows = step["figures"]["lessons"]
    as_records = [{"step": r["lesson"], "status": r["status"]} for r in rows]
    return _all_ok(target, as_records, f"{name} ran")


def _seeds(report: dict) -> dict:
    target = f"LeNet (lesson 5, lr {LESSON5_LR}) over seeds: lowest - 2 x spread >= {LENET_ACC}"
    value, missing = _value(report, "seeds", "rows")
    if missing:
        return _check(target, _why(report, "seeds"), missing)
    row = next((r for r in value if r["lr"] == LESSON5_LR), None)
    if row is None:
        return _check(target, f"no run at lr {LESSON5_LR}", "not measured")
    margin = row["lowest"] - 2 * row["spread"]
    measured = f"lowest {row['lowest']:.3f}, spread {row['spread']:.3f} ({len(row['accs'])} seeds)"
    if _smoke(report):
        return _check(target, measured, _smoke(report))
    return _check(target, measured, "pass" if margin >= LENET_ACC else "fail")


def checks(report: dict) -> list[dict]:
    """Every target with what was measured and 'pass', 'fail', 'not measured' or 'n/a'."""
    n = report["hardware"]["devices"]
    nccl, gloo = _one(report, "ddp nccl"), _one(report, "ddp gloo")
    return [
        _lessons(report),
        _lessons(report, "solutions"),
        _all_ok("every committed notebook validates (nbval)", _steps(report, "nbval"), "validate"),
        _all_ok("benchmarks/bench_resnet.py --profile full runs", _steps(report, "bench"), "ran"),
        _at_least(report, f"LeNet (lesson 5), 1 device: test acc >= {LENET_ACC}", "lenet 1",
                  "test_acc", LENET_ACC),
        _gap(report, f"LeNet, {n} devices: test acc within {GAP} of 1 device", "lenet 1",
             "lenet all"),
        _at_least(report, f"ResNet-18 (lesson 6), 1 device: test acc >= {RESNET_ACC}",
                  "resnet 1", "test_acc", RESNET_ACC),
        _speed(report),
        _at_least(report, f"ResNet-18 (benchmarks/resnet_fast.py): lowest test acc over seeds "
                  f">= {RESNET_ACC}", "fast", "test_acc", RESNET_ACC),
        _speed(report, "fast"),
        _seeds(report),
        _gap(report, f"ResNet-18, {n} devices: test acc within {GAP} of 1 device", "resnet 1",
             "resnet all"),
        _all_ok("python -m d2l_gpu.ddp: alone, and under torchrun with NCCL and gloo",
                _steps(report, "ddp"), "ran"),
        _gap(report, f"DDP, NCCL x{n}: test acc within {GAP} of one process", "ddp 1 process",
             nccl["step"] if nccl else "ddp nccl"),
        _gap(report, f"DDP, gloo x{n}: test acc within {GAP} of one process", "ddp 1 process",
             gloo["step"] if gloo else "ddp gloo"),
    ]  # fmt: skip


def passed(results: list[dict]) -> bool:
    """True when some target passed and none failed (not measured and n/a do not count)."""
    return any(c["result"] == "pass" for c in results) and all(
        c["result"] != "fail" for c in results
    )


def summary(step: dict) -> str:
    """A step's figures in a few words."""
    f = step["figures"]
    if not f:
        return "-"
    if "lessons" in f:
        ok = sum(r["status"] == "ok" for r in f["lessons"])
        return f"{ok} of {len(f['lessons'])} lessons ok"
    if "rows" in f:  # lenet_seeds
        return "; ".join(f"lr {r['lr']:g}: lowest {r['lowest']:.3f}, spread {r['spread']:.3f}"
                         for r in f["rows"])  # fmt: skip
    if "validates" in f:
        return "validates" if f["validates"] else "does not validate"
    if "training" in f:  # bench_resnet's JSON
        fast = f["training"][-1]
        peak = fast.get("fraction_of_peak")
        peak = "" if peak is None else f", {peak:.1%} of peak"
        return (f"pipeline {f['pipeline']['ratio']:.1f}x, training {f['training_ratio']:.1f}x; "
                f"fast path {fast['images_per_sec']:,.0f} images/s{peak}")  # fmt: skip
    parts = []
    if "test_acc" in f:
        parts.append(f"test acc {f['test_acc']:.3f}")
    if f.get("sec_per_epoch") is not None:
        parts.append(f"{f['sec_per_epoch']:.2f} s/epoch")
    if f.get("images_per_sec") is not None:
        parts.append(f"{f['images_per_sec']:,.0f} images/s")
    if f.get("fraction_of_peak") is not None:
        parts.append(f"{f['fraction_of_peak']:.1%} of peak")
    if "world_size" in f:
        parts.append(f"world size {f['world_size']} ({f['backend']}, {f['device']})")
    if "devices" in f:
        parts.append("on " + ", ".join(f["devices"]))
    return ", ".join(parts) or "-"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(report: dict) -> str:
    """The report in Markdown: hardware, targets, steps, failures."""
    h = report["hardware"]
    toolkit = f"CUDA {h['cuda']}" if h.get("cuda") else f"ROCm {h['hip']}" if h.get("hip") else ""
    names = ", ".join(sorted(set(h["names"]))) or "-"
    lines = [
        "# GPU acceptance report",
        "",
        f"{h['date']}: {h['devices']} x {names} ({h['accelerator']}), driver {h['driver']}"
        + (f", {toolkit}" if toolkit else "")
        + f", PyTorch {h['torch']}; CPU {h['cpu']} ({h['cores']} cores). "
        + f"{report['epochs']} epochs"
        + (f", {report['limit']} examples per split (smoke run)." if report["limit"] else "."),
        "",
        "| target | measured | result |",
        "| --- | --- | --- |",
    ]
    results = report.get("checks") or checks(report)
    lines += [f"| {_cell(c['target'])} | {_cell(c['measured'])} | {c['result']} |" for c in results]
    failed = sum(c["result"] == "fail" for c in results)
    lines += ["", f"**{failed} target(s) failed.**" if failed else "**No target failed.**", ""]
    lines += ["| step | status | seconds | figures |", "| --- | --- | ---: | --- |"]
    for s in report["steps"]:
        lines.append(f"| {_cell(s['step'])} | {s['status']} | {s['seconds']:.1f} | "
                     f"{_cell(summary(s))} |")  # fmt: skip
    errors = [s for s in report["steps"] if s.get("error")]
    if errors:
        lines += ["", "## Failures", ""]
        for s in errors:
            lines += [f"- `{s['step']}` ({s['command'] or 'no command'}):", "", "```text"]
            lines += [s["error"][-1500:].strip(), "```", ""]
    if h.get("report"):
        lines += ["", "## Devices", "", "```text", h["report"], "```"]
    return "\n".join(lines).rstrip("\n") + "\n"
