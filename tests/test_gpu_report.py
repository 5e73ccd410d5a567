"""scripts/gpu_report.py on the CPU: targets, pass or fail, Markdown and JSON from recorded inputs;
the refusal without an accelerator; time limits; the workers and parsers on small data.

The reports below are made-up inputs for the logic, shaped like the records a run writes. They
are not measurements: no figure of them appears in the README or docs/maintaining.md.
"""

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import gpu_report
import pytest
import run_lessons
from gpu_report_logic import PARTS, checks, markdown, merge, passed, plan

from d2l_gpu import ddp, devices


def rec(step, figures, status="ok", error=None):
    return {"step": step, "status": status, "seconds": 12.5, "command": f"run {step}",
            "figures": figures, "error": error}  # fmt: skip


def ddp_rec(step, acc, world, backend):
    figures = {"test_acc": acc, "world_size": world, "backend": backend, "device": "cuda"}
    return rec(step, figures)


def sample_report(n=2, name="NVIDIA H100 80GB HBM3", epochs=10, limit=None) -> dict:
    """A full run on n devices in which every target is met (invented figures)."""
    lessons = [
        {"lesson": f"0{i}-x", "status": "ok", "seconds": 9.0, "key_result": "k"}
        for i in range(1, 9)
    ]
    train = {"sec_per_epoch": 0.8, "images_per_sec": 75000.0, "fraction_of_peak": 0.2}
    fast = {"images_per_sec": 5.0, "fraction_of_peak": 0.2}
    bench = {"pipeline": {"ratio": 40.0}, "training_ratio": 5.0, "training": [{}, fast]}
    steps = [rec("lessons", {"lessons": lessons})]
    steps += [rec(f"nbval 0{i}-x", {"validates": True}) for i in range(1, 9)]
    steps += [
        rec("bench", bench),
        rec("lenet 1", {"test_acc": 0.835, "sec_per_epoch": 2.0, "devices": ["cuda:0"]}),
        rec("lenet all", {"test_acc": 0.831, "sec_per_epoch": 1.5, "devices": ["cuda:0"] * n}),
        rec("resnet 1", {"test_acc": 0.912, **train, "devices": ["cuda:0"]}),
        rec("resnet all", {"test_acc": 0.915, **train, "devices": ["cuda:0"] * n}),
        ddp_rec("ddp 1 process", 0.86, 1, "nccl"),
        ddp_rec(f"ddp nccl x{n}", 0.861, n, "nccl"),
        ddp_rec(f"ddp gloo x{n}", 0.859, n, "gloo"),
        rec("solutions", {"lessons": [{**r, "lesson": f"1{i}-y"} for i, r in enumerate(lessons)]}),
        rec("fast", {"test_acc": 0.925, "spread": 0.007, "seeds": 3, **train}),
        rec(
            "seeds",
            {
                "rows": [
                    {
                        "lr": 0.2,
                        "accs": [0.85, 0.845, 0.848],
                        "lowest": 0.845,
                        "spread": 0.005,
                        "margin_ok": True,
                    }
                ]
            },
        ),
    ]
    hardware = {
        "date": "2030-01-01", "accelerator": "cuda", "devices": n, "names": [name] * n,
        "driver": "999.1", "cuda": "12.9", "hip": None, "torch": "9.9.9", "cpu": "Some CPU",
        "cores": 64, "peak_tflops": 989.4, "report": "cuda:0  X",
    }  # fmt: skip
    return {"hardware": hardware, "epochs": epochs, "limit": limit, "steps": steps}


def find(report, start) -> dict:
    (check,) = [c for c in checks(report) if c["target"].startswith(start)]
    return check


def test_a_run_that_meets_every_target_passes():
    report = sample_report()
    assert [c["result"] for c in checks(report)] == ["pass"] * len(checks(report))
    assert passed(checks(report))
    text = markdown(report)
    assert "**No target failed.**" in text and "2 x NVIDIA H100 80GB HBM3 (cuda)" in text
    assert "| LeNet (lesson 5), 1 device: test acc >= 0.83 | 0.835 | pass |" in text
    assert "0.80 s/epoch, 20.0% of the data-sheet peak | pass |" in text
    assert "| resnet all | ok | 12.5 | test acc 0.915, 0.80 s/epoch, 75,000 images/s" in text


@pytest.mark.parametrize(
    "step, key, value, target",
    [
        ("lenet 1", "test_acc", 0.829, "LeNet (lesson 5), 1 device"),
        ("resnet 1", "test_acc", 0.909, "ResNet-18 (lesson 6), 1 device: test acc"),
        ("resnet 1", "sec_per_epoch", 1.01, "ResNet-18, 1 device: <= 1"),
        ("lenet all", "test_acc", 0.824, "LeNet, 2 devices"),  # gap 0.011
        ("resnet all", "test_acc", 0.923, "ResNet-18, 2 devices"),  # gap 0.011, either side
        ("ddp gloo x2", "test_acc", 0.849, "DDP, gloo x2"),
        ("fast", "test_acc", 0.909, "ResNet-18 (benchmarks/resnet_fast.py): lowest"),
        ("fast", "sec_per_epoch", 1.01, "ResNet-18 (benchmarks/resnet_fast.py): <= 1"),
    ],
)
def test_each_target_fails_just_past_its_bound(step, key, value, target):
    report = sample_report()
    (record,) = [s for s in report["steps"] if s["step"] == step]
    record["figures"][key] = value
    assert find(report, target)["result"] == "fail"
    assert sum(c["result"] == "fail" for c in checks(report)) == 1
    assert not passed(checks(report)) and "**1 target(s) failed.**" in markdown(report)


def test_a_failed_lesson_or_notebook_fails_its_target():
    report = sample_report()
    report["steps"][0]["figures"]["lessons"][4]["status"] = "FAILED"
    report["steps"][0]["status"] = "failed"
    report["steps"][3]["status"] = "failed"  # nbval 03-x
    assert find(report, "every lesson")["measured"] == "7 of 8 lessons ran; not: 05-x"
    assert find(report, "every committed")["measured"] == "7 of 8 validate; not: nbval 03-x"
    assert [c["result"] for c in checks(report)].count("fail") == 2


def test_a_failed_step_is_recorded_and_the_report_goes_on():
    report = sample_report()
    i = [s["step"] for s in report["steps"]].index("resnet 1")
    report["steps"][i] = rec("resnet 1", {}, status="timeout", error="no result within 1800 s")
    assert find(report, "ResNet-18 (lesson 6)") == {
        "target": "ResNet-18 (lesson 6), 1 device: test acc >= 0.91",
        "measured": "step resnet 1 timeout",
        "result": "fail",
    }
    assert find(report, "LeNet (lesson 5)")["result"] == "pass"  # the others still count
    text = markdown(report)
    assert "## Failures" in text and "no result within 1800 s" in text


def test_steps_not_run_are_not_measured_and_no_figure_is_invented():
    report = sample_report()
    report["steps"] = [s for s in report["steps"] if s["step"] == "lessons"]
    found = {c["target"]: c for c in checks(report)}
    assert found["every lesson runs in the full profile"]["result"] == "pass"
    others = [c for t, c in found.items() if not t.startswith("every lesson")]
    assert {c["result"] for c in others} == {"not measured"}
    assert {c["measured"] for c in others} == {"step not run"}
    assert passed(checks(report))  # what ran passed; the rest says so instead of passing
    assert not passed(checks({**report, "steps": []}))  # nothing ran: nothing passed


def test_one_device_and_other_gpus_are_not_held_to_what_does_not_apply():
    report = sample_report(n=1, name="NVIDIA A100-SXM4-80GB")
    assert find(report, "LeNet, 1 devices")["result"] == "n/a"
    assert find(report, "DDP, NCCL x1")["result"] == "n/a"
    speed = find(report, "ResNet-18, 1 device: <=")
    assert speed["result"] == "n/a (NVIDIA A100-SXM4-80GB is not H100-class)"
    assert speed["measured"].startswith("0.80 s/epoch")  # still reported
    assert passed(checks(report))


def test_a_smoke_run_reports_figures_but_claims_no_target():
    report = sample_report(epochs=2, limit=5000)
    smoke = "not measured (smoke run: 2 epochs, 5000 examples per split)"
    assert find(report, "LeNet (lesson 5)") == {
        "target": "LeNet (lesson 5), 1 device: test acc >= 0.83",
        "measured": "0.835",
        "result": smoke,
    }
    assert find(report, "ResNet-18, 2 devices")["result"] == smoke
    assert find(report, "every lesson")["result"] == "pass"
    assert "(smoke run)" in markdown(report)


def test_json_round_trip_gives_the_same_report(tmp_path, monkeypatch):
    report = sample_report()
    report["checks"] = checks(report)
    gpu_report.write(report, tmp_path)
    loaded = json.loads((tmp_path / "gpu-report.json").read_text())
    assert loaded == report
    assert (tmp_path / "gpu-report.md").read_text() == markdown(loaded)


@pytest.fixture
def no_accelerator(monkeypatch):
    monkeypatch.setattr(devices, "_accel_type", lambda: None)
    monkeypatch.setattr(devices, "_accel_count", lambda: 0)


def test_refuses_at_once_without_accelerator(no_accelerator, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_report, "RUNNERS", {})  # would raise KeyError if a step started
    assert gpu_report.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs a machine with an accelerator" in err and "make test" in err
    assert list(tmp_path.iterdir()) == []  # no report


def test_cli_exits_2_on_a_cpu_only_machine(tmp_path, root):
    if devices.num_gpus() > 0:
        pytest.skip("this machine has an accelerator: the refusal cannot be seen here")
    cmd = [sys.executable, str(root / "scripts" / "gpu_report.py"), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "needs a machine with an accelerator" in proc.stderr and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_crashing_step_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(devices, "_accel_type", lambda: "cuda")
    monkeypatch.setattr(devices, "_accel_count", lambda: 2)
    hardware = sample_report()["hardware"]
    monkeypatch.setattr(gpu_report, "hardware", lambda: hardware)
    lenet = [s for s in sample_report()["steps"] if s["step"].startswith("lenet")]

    def crash(args):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(gpu_report, "RUNNERS", {"resnet": crash, "lenet": lambda args: lenet})
    code = gpu_report.main(["--steps", "resnet,lenet", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "gpu-report.json").read_text())
    assert [s["step"] for s in report["steps"]] == ["resnet", "lenet 1", "lenet all"]
    assert (
        report["steps"][0]["status"] == "failed" and "out of memory" in report["steps"][0]["error"]
    )
    assert find(report, "LeNet (lesson 5)")["result"] == "pass"
    assert find(report, "ResNet-18 (lesson 6)")["result"] == "fail"
    assert code == 1 and "out of memory" in (tmp_path / "gpu-report.md").read_text()


def test_a_command_past_its_time_limit_is_killed_and_recorded():
    result = gpu_report.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)
    assert result["timed_out"] and result["seconds"] < 30
    record = gpu_report.record("nbval 01-x", result, {"validates": False})
    assert record["status"] == "timeout" and "no result within" in record["error"]
    done = gpu_report.run([sys.executable, "-c", "print('{\"a\": 1}')"], timeout=60)
    assert gpu_report.record("x", done, gpu_report.last_json(done["output"]))["status"] == "ok"
    assert gpu_report.record("x", done, None)["error"].startswith("exit code 0 but no figures")


def test_unknown_step_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        gpu_report.parse_args(["--steps", "lessons,gpus"])
    err = capsys.readouterr().err
    assert "--steps: unknown ['gpus']; choose from lessons, solutions, nbval" in err


def test_ddp_figures_from_the_scripts_real_log(small_data, capsys, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    args = ["--epochs", "2", "--batch-size", "32", "--limit", "64", "--data-dir", str(small_data)]
    assert ddp.main(args) == 0
    figures = gpu_report.ddp_figures(capsys.readouterr().out)
    assert figures["epochs"] == figures["of"] == 2 and 0 <= figures["test_acc"] <= 1
    got = tuple(figures[k] for k in ("world_size", "backend", "device", "strategy"))
    assert got == (1, "gloo", "cpu", "ddp")
    assert gpu_report.ddp_figures("Traceback ...") is None


@pytest.mark.parametrize("model", ["lenet", "resnet"])
def test_workers_train_and_report_figures(model, small_data, monkeypatch):
    monkeypatch.setenv("D2L_GPU_DATA", str(small_data))
    monkeypatch.setenv("D2L_GPU_LIVE_PLOTS", "0")
    epochs = 2 if model == "lenet" else 1  # lesson 5's plot needs two epochs for an x range
    figures = gpu_report.worker(model, "1", epochs=epochs, limit=32)
    assert 0 <= figures["test_acc"] <= 1 and figures["sec_per_epoch"] > 0
    assert figures["devices"] == [str(devices.try_gpu())]
    if model == "resnet":
        assert figures["tflops"] > 0 and figures["images_per_sec"] > 0
        if devices.num_gpus() == 0:
            assert figures["fraction_of_peak"] is None  # a CPU has no data-sheet peak here


def test_lesson_table_in_markdown_names_the_machine():
    rows = [
        {"lesson": "01-devices", "status": "ok", "seconds": 4.04, "key_result": "a | b"},
        {"lesson": "02-tensors", "status": "FAILED", "seconds": 1.0, "key_result": "-"},
    ]
    info = {"date": "2030-01-01", "cpu": "Some CPU", "cores": 2, "accelerator": "none",
            "torch": "9.9.9", "python": "3.11", "profile": "quick"}  # fmt: skip
    text = run_lessons.markdown(rows, info)
    assert text.splitlines()[0] == (
        "Run by `scripts/run_lessons.py` on 2030-01-01: Some CPU (2 cores), no accelerator, "
        "PyTorch 9.9.9, profile quick."
    )
    assert "| 01-devices | ok | 4.0 | a \\| b |" in text
    assert "| 02-tensors | FAILED | 1.0 | - |" in text
    machine = run_lessons.machine()
    assert machine["cores"] > 0 and machine["profile"] in ("quick", "full")


def test_a_copy_of_the_report_is_independent():
    report = sample_report()
    before = copy.deepcopy(report)
    checks(report)
    markdown(report)
    assert report == before  # pure: nothing changed in the input


DDP_LOG = """lenet: world size {w} ({b}, cuda:0, ddp), 60000 training examples, global batch 256
epoch 1/10: loss 0.900, train acc 0.660, test acc 0.750, 3.1 s
epoch 10/10: loss 0.400, train acc 0.850, test acc {acc}, 1.2 s
"""


def fake_run(root):
    """gpu_report.run stand-in: each command 'prints' what its real program would."""

    def run(cmd, timeout, env=None, cwd=None):
        out = ""
        if "benchmarks/resnet_fast.py" in cmd:
            runs = [{"test_acc": a, "median_epoch_s": 0.62} for a in (0.93, 0.925, 0.931)]
            rows = [{"row": 10, "images_per_sec": 1e5, "fraction_of_peak": 0.28}]
            got = {"runs": runs, "rows": rows, "trained_row": 10}
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(got))
        elif "benchmarks/lenet_seeds.py" in cmd:
            rows = [{"lr": 0.2, "accs": [0.85, 0.85], "lowest": 0.85, "spread": 0.0}]
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps({"rows": rows}))
        elif "--worker" in cmd:
            model = cmd[cmd.index("--worker") + 1]
            acc = 0.85 if model == "lenet" else 0.92
            out = json.dumps({"test_acc": acc, "sec_per_epoch": 0.9, "devices": ["cuda:0"]})
        elif "d2l_gpu.ddp" in cmd:
            world = 2 if "torch.distributed.run" in cmd else 1
            backend = cmd[-1] if "--backend" in cmd else "nccl"
            out = DDP_LOG.format(w=world, b=backend, acc=0.86)
        elif "benchmarks/bench_resnet.py" in cmd:
            bench = {"pipeline": {"ratio": 40.0}, "training_ratio": 5.0,
                     "training": [{}, {"images_per_sec": 5.0}]}  # fmt: skip
            Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(bench))
        elif "scripts/run_lessons.py" in cmd:
            name = Path(cmd[-1]).stem
            rows = [{"lesson": name, "status": "ok", "seconds": 1.0, "key_result": "-"}]
            (cwd / "build" / "lessons").mkdir(parents=True)
            (cwd / "build" / "lessons" / "summary.json").write_text(json.dumps({"lessons": rows}))
        return {"rc": 0, "output": out, "seconds": 1.0, "timed_out": False,
                "command": " ".join(cmd)}  # fmt: skip

    return run


def test_every_step_feeds_the_targets_it_names(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "_accel_type", lambda: "cuda")
    monkeypatch.setattr(devices, "_accel_count", lambda: 2)
    monkeypatch.setattr(gpu_report, "ROOT", tmp_path)
    monkeypatch.setattr(gpu_report, "run", fake_run(tmp_path))
    args = gpu_report.parse_args(["--out", str(tmp_path)])
    (tmp_path / "gpu-report").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01-devices.ipynb").write_text("{}")
    (tmp_path / "solutions").mkdir()
    (tmp_path / "solutions" / "01-devices.ipynb").write_text("{}")
    steps = [r for name in gpu_report.STEPS for r in gpu_report.RUNNERS[name](args)]
    assert all(s["status"] == "ok" for s in steps), [s for s in steps if s["status"] != "ok"]
    report = {"hardware": sample_report()["hardware"], "epochs": 10, "limit": None, "steps": steps}
    results = {c["target"]: c["result"] for c in checks(report)}
    assert set(results.values()) == {"pass"}, results


def test_step_commands_are_what_each_program_accepts(monkeypatch, root):
    from torch.distributed.run import parse_args as torchrun_args

    monkeypatch.setattr(devices, "_accel_type", lambda: "cuda")
    monkeypatch.setattr(devices, "_accel_count", lambda: 4)
    commands = []

    def run(cmd, timeout, env=None):
        commands.append(cmd)
        return {"rc": 1, "output": "", "seconds": 0.0, "timed_out": False, "command": ""}

    monkeypatch.setattr(gpu_report, "run", run)
    monkeypatch.setattr(gpu_report, "record", lambda *a, **k: {})
    monkeypatch.setattr(gpu_report, "last_json", lambda out: None)
    monkeypatch.setattr(gpu_report, "ddp_figures", lambda out: None)
    args = gpu_report.parse_args(["--epochs", "3", "--limit", "500"])
    for name in ("bench", "lenet", "resnet", "ddp"):
        gpu_report.RUNNERS[name](args)
    spec = importlib.util.spec_from_file_location("bench", root / "benchmarks/bench_resnet.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench_args = bench.parse_args(commands[0][2:])
    assert (bench_args.profile, bench_args.epochs, bench_args.limit) == ("full", 3, 500)
    for cmd in commands[1:5]:  # lenet 1, lenet all, resnet 1, resnet all
        worker = gpu_report.parse_args(cmd[2:])
        assert (worker.epochs, worker.limit) == (3, 500) and worker.worker in ("lenet", "resnet")
    alone, *launched = commands[5:]
    assert ddp.parse_args(alone[3:]).epochs == 3
    for cmd, backend in zip(launched, ["nccl", "gloo"], strict=True):
        job = cmd.index("-m", 3)
        launch = torchrun_args(cmd[3:job] + ["dummy.py"])
        assert launch.standalone and launch.nproc_per_node == "4"
        assert ddp.parse_args(cmd[job + 2 :]).backend == backend


def test_the_plan_lists_every_part_once_in_order_and_each_names_known_steps():
    from gpu_report_logic import STEPS

    names = [name for name, *_ in PARTS]
    assert len(set(names)) == len(names) and names[0] == "fast"
    text = plan()
    assert [line.split(". ")[1].split(":")[0] for line in text.splitlines()[2::2]] == names
    for _, steps, only, _, seen in PARTS:
        assert set(steps.split(",")) <= set(STEPS) and seen
        assert not only or all(len(n) == 2 and n.isdigit() for n in only.split(","))


def test_the_notebook_parts_cover_every_lesson_and_solution_once(root):
    numbers = sorted(nb.name[:2] for nb in (root / "notebooks").glob("[0-9][0-9]-*.ipynb"))
    for step in ("lessons", "solutions", "nbval"):
        chosen = [n for _, s, only, *_ in PARTS if s == step for n in only.split(",")]
        assert sorted(chosen) == numbers, step


@pytest.mark.parametrize("part", [name for name, *_ in PARTS])
def test_every_part_refuses_cleanly_without_an_accelerator(part, no_accelerator, tmp_path, capsys):
    assert gpu_report.main(["--part", part, "--out", str(tmp_path)]) == 2
    assert "needs a machine with an accelerator" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_plan_runs_anywhere(no_accelerator, capsys):
    assert gpu_report.main(["--plan"]) == 0
    assert "1. fast:" in capsys.readouterr().out


def test_a_part_sets_its_steps_and_notebooks():
    args = gpu_report.parse_args(["--part", "lessons-a"])
    assert args.steps == "lessons" and args.only == ["06", "10", "11", "12"]
    assert gpu_report.parse_args(["--part", "fast"]).only is None


def test_only_takes_two_digit_numbers(capsys):
    with pytest.raises(SystemExit):
        gpu_report.parse_args(["--only", "6,10"])
    assert "--only: 6,10 is not a list of two-digit notebook numbers" in capsys.readouterr().err


def test_parts_of_two_sessions_merge_into_one_report():
    first = sample_report()
    first["steps"] = [s for s in first["steps"] if s["step"] in ("lessons", "fast")]
    first["steps"][0]["figures"]["lessons"][2]["status"] = "FAILED"
    first["steps"][0]["status"] = "failed"
    second = sample_report(name="NVIDIA H200")
    redo = {"lesson": "03-x", "status": "ok", "seconds": 5.0, "key_result": "k"}
    second["steps"] = [rec("lessons", {"lessons": [redo]}), rec("seeds", {"rows": []})]
    merged = merge(first, second)
    assert [s["step"] for s in merged["steps"]] == ["lessons", "fast", "seeds"]
    rows = merged["steps"][0]["figures"]["lessons"]
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)  # 03-x re-run, the rest kept
    assert merged["steps"][0]["status"] == "ok" and merged["hardware"]["names"][0] == "NVIDIA H200"
    assert find(merged, "every lesson")["result"] == "pass"
    assert first["steps"][0]["figures"]["lessons"][2]["status"] == "FAILED"  # inputs untouched


def test_a_smoke_run_is_not_merged_into_a_full_one(tmp_path, monkeypatch, capsys):
    with pytest.raises(ValueError, match="cannot be judged together"):
        merge(sample_report(), sample_report(epochs=1, limit=500))
    monkeypatch.setattr(devices, "_accel_type", lambda: "cuda")
    monkeypatch.setattr(devices, "_accel_count", lambda: 1)
    monkeypatch.setattr(gpu_report, "hardware", lambda: sample_report()["hardware"])
    monkeypatch.setattr(gpu_report, "RUNNERS", {})  # no step may start
    (tmp_path / "gpu-report.json").write_text(json.dumps(sample_report()))
    assert gpu_report.main(["--part", "fast", "--epochs", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot merge into" in err and "cannot be judged together" in err and "--fresh" in err


def test_a_notebook_stopped_before_its_summary_is_a_row_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_report, "ROOT", tmp_path)
    (tmp_path / "notebooks").mkdir()
    for name in ("06-a", "07-b"):
        (tmp_path / "notebooks" / f"{name}.ipynb").write_text("{}")

    def run(cmd, timeout, env=None, cwd=None):
        stopped = cmd[-1].endswith("07-b.ipynb")
        if not stopped:
            (cwd / "build" / "lessons").mkdir(parents=True)
            row = {"lesson": "06-a", "status": "ok", "seconds": 2.0, "key_result": "k"}
            (cwd / "build" / "lessons" / "summary.json").write_text(json.dumps({"lessons": [row]}))
        return {"rc": -9 if stopped else 0, "output": "killed" if stopped else "", "seconds": 9.0,
                "timed_out": stopped, "command": " ".join(cmd)}  # fmt: skip

    monkeypatch.setattr(gpu_report, "run", run)
    monkeypatch.setattr(gpu_report.time, "sleep", lambda s: None)
    (step,) = gpu_report.step_notebooks(gpu_report.parse_args(["--timeout", "5"]))
    rows = {r["lesson"]: r["status"] for r in step["figures"]["lessons"]}
    assert rows == {"06-a": "ok", "07-b": "timeout"} and step["status"] == "failed"
