"""The GPU report's logic, pure: targets, pass or fail, the Markdown. No device, no torch.

A report is a dict: `hardware` (from gpu_report.hardware), `epochs`, `limit` and `steps`, a list
of records {step, status ('ok', 'failed' or 'timeout'), seconds, command, figures, error}. A
target whose step was not run is 'not measured'; one whose step failed is 'fail'; one that does
not apply to this machine (one device, not H100-class) is 'n/a'. Figures are only ever copied
from the records: nothing here makes one up.
"""

from __future__ import annotations

STEPS = ("lessons", "nbval", "bench", "lenet", "resnet", "ddp")
EPOCHS = 10  # the targets hold after 10 epochs on the whole data set
LENET_ACC, RESNET_ACC, RESNET_SEC, GAP = 0.83, 0.91, 1.0, 0.01
H100_CLASS = ("H100", "H200", "H800", "GH200")


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


def _speed(report: dict) -> dict:
    target = f"ResNet-18, 1 device: <= {RESNET_SEC:g} s/epoch on an H100-class GPU"
    names = report["hardware"]["names"]
    value, missing = _value(report, "resnet 1", "sec_per_epoch")
    if missing:
        return _check(target, _why(report, "resnet 1"), missing)
    fraction = _one(report, "resnet 1")["figures"].get("fraction_of_peak")
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


def _lessons(report: dict) -> dict:
    target = "every lesson runs in the full profile"
    step = _one(report, "lessons")
    if step is None or step["status"] != "ok" and not step["figures"]:
        return _check(target, _why(report, "lessons"), "not measured" if step is None else "fail")
    rows = step["figures"]["lessons"]
    as_records = [{"step": r["lesson"], "status": r["status"]} for r in rows]
    return _all_ok(target, as_records, "lessons ran")


def checks(report: dict) -> list[dict]:
    """Every target with what was measured and 'pass', 'fail', 'not measured' or 'n/a'."""
    n = report["hardware"]["devices"]
    nccl, gloo = _one(report, "ddp nccl"), _one(report, "ddp gloo")
    return [
        _lessons(report),
        _all_ok("every committed notebook validates (nbval)", _steps(report, "nbval"), "validate"),
        _all_ok("benchmarks/bench_resnet.py --profile full runs", _steps(report, "bench"), "ran"),
        _at_least(report, f"LeNet (lesson 5), 1 device: test acc >= {LENET_ACC}", "lenet 1",
                  "test_acc", LENET_ACC),
        _gap(report, f"LeNet, {n} devices: test acc within {GAP} of 1 device", "lenet 1",
             "lenet all"),
        _at_least(report, f"ResNet-18 (lesson 6), 1 device: test acc >= {RESNET_ACC}",
                  "resnet 1", "test_acc", RESNET_ACC),
        _speed(report),
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
