"""GPU acceptance run: every lesson, the benchmark, one and all devices, DDP; a report with targets.

    python scripts/gpu_report.py [--steps STEP,...] [--epochs 10] [--limit N] [--out build]

Needs a machine with an accelerator; anywhere else it exits 2 at once and says so. Each step runs
in its own process with a time limit and produces a record (status, seconds, figures, error); a
step that fails or times out is recorded and the report goes on. Steps (all by default):

  lessons  every lesson in the full profile (scripts/run_lessons.py --profile full)
  nbval    the committed notebooks validated with nbval, one pytest per notebook
  bench    benchmarks/bench_resnet.py --profile full
  lenet    lesson 5's LeNet from scratch (batch 256, lr 0.2), on one device and on all devices
  resnet   lesson 6's ResNet-18 (batch 256 per device, lr 0.1 per device, cosine, data on the
           device, channels_last, autocast; torch.compile on one device), one and all devices
  ddp      python -m d2l_gpu.ddp (LeNet): one process; torchrun with NCCL and with gloo on all GPUs

Writes build/gpu-report.md and build/gpu-report.json: hardware, driver, PyTorch, every figure and
each target passed, failed or not measured (never a figure no step produced). --epochs and
--limit make a smoke run, whose figures are not held against the targets. Exit status: 0 when
every target that applies passed, 1 otherwise, 2 without an accelerator.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpu_report_logic import STEPS, checks, markdown, passed

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: import this checkout's d2l_gpu
from d2l_gpu._checks import count_arg, positive_arg  # noqa: E402 - light: no torch imported

PY = sys.executable
NEEDS = (
    "scripts/gpu_report.py needs a machine with an accelerator: PyTorch {torch} sees none here. "
    "Run it where `python -c 'import d2l_gpu as d2l; print(d2l.num_gpus())'` prints 1 or more "
    "(a CUDA or ROCm build of PyTorch with its driver; MPS or XPU also count); on this machine, "
    "`make test` and `make lessons` are the checks that apply."
)


def run(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run `cmd` in its own session with a time limit: rc, output tail, seconds, timed_out."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, timed_out = proc.communicate(timeout=timeout)[0], False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun's workers too
        out, timed_out = proc.communicate()[0], True
    return {
        "rc": proc.returncode,
        "output": out or "",
        "seconds": round(time.perf_counter() - start, 1),
        "timed_out": timed_out,
        "command": " ".join(cmd),
    }


def record(step: str, result: dict, figures: dict | None = None, error: str | None = None) -> dict:
    """A step's record from its command's result: ok only with exit 0, figures and no error."""
    if result["timed_out"]:
        status, error = "timeout", error or f"no result within {result['seconds']:.0f} s"
    elif result["rc"] != 0 or error or figures is None:
        status = "failed"
        why = f"exit code {result['rc']}" if result["rc"] else "exit code 0 but no figures"
        error = error or f"{why}: " + result["output"][-1500:].strip()
    else:
        status = "ok"
    return {
        "step": step,
        "status": status,
        "seconds": result["seconds"],
        "command": result["command"],
        "figures": figures or {},
        "error": error,
    }


def last_json(output: str) -> dict | None:
    """The last line of `output` that is a JSON object, or None."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def hardware() -> dict:
    """What the report ran on: accelerators, driver, PyTorch, CPU, date."""
    import torch

    import d2l_gpu as d2l

    kind, n = d2l.accelerator_type(), d2l.num_gpus()
    names = [torch.cuda.get_device_name(i) if kind == "cuda" else kind for i in range(n)]
    driver = "not reported"
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            got = subprocess.run(query, capture_output=True, text=True, timeout=60)
            driver = got.stdout.strip().splitlines()[0] if got.returncode == 0 else driver
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return {
        "date": datetime.date.today().isoformat(),
        "accelerator": kind,
        "devices": n,
        "names": names,
        "driver": driver,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "torch": torch.__version__,
        "cpu": d2l.cpu_name(),
        "cores": os.cpu_count(),
        "peak_tflops": d2l.peak_tflops(d2l.gpu(0)) if kind == "cuda" else None,
        "report": d2l.devices_report(),
    }


def step_lessons(args) -> list[dict]:
    """Every lesson in the full profile; the figures are run_lessons' summary."""
    cmd = [PY, "scripts/run_lessons.py", "--profile", "full", "--timeout", "1800"]
    summary = ROOT / "build" / "lessons" / "summary.json"
    summary.unlink(missing_ok=True)  # never an older run's figures
    result = run(cmd, args.timeout * 4)
    lessons = json.loads(summary.read_text())["lessons"] if summary.exists() else None
    figures = None if lessons is None else {"lessons": lessons}
    return [record("lessons", result, figures)]


def step_nbval(args) -> list[dict]:
    """Each committed notebook validated by nbval (strict, the project's sanitizers)."""
    out = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb")):
        cmd = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
               "--nbval-current-env", "--nbval-sanitize-with", "nbval_sanitize.cfg",
               str(nb.relative_to(ROOT))]  # fmt: skip
        result = run(cmd, args.timeout)
        out.append(record(f"nbval {nb.stem}", result, {"validates": result["rc"] == 0}))
    return out


def step_bench(args) -> list[dict]:
    """benchmarks/bench_resnet.py --profile full; the figures are its JSON."""
    path = Path(args.out) / "gpu-report" / "bench_resnet.json"
    cmd = [PY, "benchmarks/bench_resnet.py", "--profile", "full", "--epochs", str(args.epochs)]
    cmd += ["--json", str(path)] + (["--limit", str(args.limit)] if args.limit else [])
    path.unlink(missing_ok=True)  # never an older run's figures
    result = run(cmd, args.timeout)
    figures = json.loads(path.read_text()) if result["rc"] == 0 and path.exists() else None
    return [record("bench", result, figures)]


def step_train(model: str, args) -> list[dict]:
    """`model` trained by this script's worker on one device, then on all devices."""
    import d2l_gpu as d2l

    out = []  # with one device, "all" is the same run again: the report says n/a for the gap
    for count in ("1", "all") if d2l.num_gpus() > 1 else ("1",):
        cmd = [PY, __file__, "--worker", model, "--devices", count, "--epochs", str(args.epochs)]
        cmd += ["--limit", str(args.limit)] if args.limit else []
        result = run(cmd, args.timeout, env={"D2L_GPU_PROFILE": "full", "D2L_GPU_LIVE_PLOTS": "0"})
        out.append(record(f"{model} {count}", result, last_json(result["output"])))
    return out


EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+): loss ([\d.]+), train acc ([\d.]+), test acc ([\d.]+)")


def ddp_figures(output: str) -> dict | None:
    """Final test accuracy, epochs and world size from d2l_gpu.ddp's log, or None."""
    epochs = EPOCH_LINE.findall(output)
    # "world size 2 (nccl, cuda:0, ddp)": backend, rank 0's device, strategy (older logs: none)
    world = re.search(r"world size (\d+) \((\w+), ([\w:]+)(?:, (\w+))?\)", output)
    if not epochs or not world:
        return None
    done, total, _, _, acc = epochs[-1]
    return {"epochs": int(done), "of": int(total), "test_acc": float(acc),
            "world_size": int(world[1]), "backend": world[2], "device": world[3],
            "strategy": world[4] or "ddp"}  # fmt: skip


def step_ddp(args) -> list[dict]:
    """python -m d2l_gpu.ddp alone, then under torchrun on all GPUs with NCCL and with gloo."""
    import d2l_gpu as d2l

    n = d2l.num_gpus()
    job = ["-m", "d2l_gpu.ddp", "--model", "lenet", "--epochs", str(args.epochs)]
    job += ["--limit", str(args.limit)] if args.limit else []
    runs = {"ddp 1 process": [PY, *job]}
    for backend in ("nccl", "gloo"):
        logs = Path(args.out) / "gpu-report" / "torchrun-logs"  # not torchrun's default, /tmp
        launch = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                  "--log-dir", str(logs)]  # fmt: skip
        runs[f"ddp {backend} x{n}"] = [*launch, *job, "--backend", backend]
    out = []
    for name, cmd in runs.items():
        result = run(cmd, args.timeout)
        out.append(record(name, result, ddp_figures(result["output"])))
    return out


def worker(model: str, count: str, epochs: int, limit: int | None) -> dict:
    """Train `model` on one or all devices in this process; the figures as a dict."""
    import torch

    import d2l_gpu as d2l

    devices = d2l.try_all_gpus()[: 1 if count == "1" else None]
    if model == "lenet":  # lesson 5, full profile
        data = d2l.load_data_fashion_mnist(256, limit=limit, device=devices[0], seed=0)
        accs, secs = d2l.train_parallel(devices, *data, 0.2, epochs, init_scale=0.01)
        return {"test_acc": accs[-1], "sec_per_epoch": secs, "devices": [str(d) for d in devices]}
    batch_size, lr = d2l.scale_for_devices(256, 0.1, len(devices))  # lesson 6
    train_iter, test_iter = d2l.load_data_fashion_mnist(
        batch_size, limit=limit, device=devices[0], seed=0
    )
    options = {"cosine": True, "channels_last": True, "amp": True, "plot": False}
    if len(devices) == 1:
        options["compile"] = devices[0].type == "cuda"
    else:
        options["warmup_steps"] = len(train_iter)
    torch.manual_seed(0)
    r = d2l.train_concise(
        d2l.resnet18(10, 1), train_iter, test_iter, epochs, lr, devices, **options
    )
    net = d2l.materialize(d2l.resnet18(10, 1), (1, 1, 28, 28))
    X, y = torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)
    tflops = d2l.training_flops(net, X, y) / 2 * r["images_per_sec"] / 1e12
    peak = d2l.peak_tflops(devices[0])
    return {
        "test_acc": r["test_acc"],
        "sec_per_epoch": r["sec_per_epoch"],
        "images_per_sec": r["images_per_sec"],
        "tflops": tflops,
        "fraction_of_peak": tflops / (peak * len(devices)) if peak else None,
        "devices": r["devices"],
    }


RUNNERS = {"lessons": step_lessons, "nbval": step_nbval, "bench": step_bench,
           "lenet": lambda a: step_train("lenet", a), "resnet": lambda a: step_train("resnet", a),
           "ddp": step_ddp}  # fmt: skip


def write(report: dict, out: Path) -> None:
    """build/gpu-report.json and .md, each written atomically."""
    from d2l_gpu._fs import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "gpu-report.json", json.dumps(report, indent=1) + "\n")
    write_atomic(out / "gpu-report.md", markdown(report))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--steps", default=",".join(STEPS), help="comma-separated, of: " + " ".join(STEPS)
    )
    p.add_argument(
        "--epochs", type=count_arg, default=10, help="training epochs (10: the targets')"
    )
    p.add_argument("--limit", type=count_arg, help="examples per split, for a smoke run")
    p.add_argument(
        "--timeout", type=positive_arg, default=1800, help="seconds per command (lessons: x4)"
    )
    p.add_argument("--out", default=str(ROOT / "build"), help="folder for the report")
    p.add_argument("--worker", choices=["lenet", "resnet"], help=argparse.SUPPRESS)
    p.add_argument("--devices", choices=["1", "all"], default="1", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = sorted(set(args.steps.split(",")) - set(STEPS))
    if unknown:
        p.error(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    import d2l_gpu as d2l

    if d2l.num_gpus() == 0:
        print(NEEDS.format(torch=torch.__version__), file=sys.stderr)
        return 2
    if args.worker:
        print(json.dumps(worker(args.worker, args.devices, args.epochs, args.limit)))
        return 0
    report = {"hardware": hardware(), "epochs": args.epochs, "limit": args.limit, "steps": []}
    for name in args.steps.split(","):
        print(f"gpu-report: {name} ...", flush=True)
        try:
            report["steps"] += RUNNERS[name](args)
        except Exception as e:  # noqa: BLE001 - recorded; the report goes on
            report["steps"].append({"step": name, "status": "failed", "seconds": 0.0,
                                    "command": "", "figures": {}, "error": repr(e)})  # fmt: skip
        write(report, Path(args.out))  # after every step: a crash later keeps what was measured
    report["checks"] = checks(report)
    report["passed"] = passed(report["checks"])
    write(report, Path(args.out))
    print(markdown(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # d2l_gpu from this checkout (commands run in ROOT find it too)
    sys.exit(main())
