"""GPU acceptance run: every lesson, the benchmark, one and all devices, DDP; a report with targets.

    python scripts/gpu_report.py [--steps STEP,...] [--epochs 10] [--limit N] [--out build]
    python scripts/gpu_report.py --part PART     # one part of the run, merged into the report
    python scripts/gpu_report.py --plan          # the parts, in the order to run them

Needs a machine with an accelerator; anywhere else it exits 2 at once and says so. Each step runs
in its own process with a time limit and produces a record (status, seconds, figures, error); a
step that fails or times out is recorded and the report goes on. Steps (all by default):

  lessons  every lesson in the full profile (scripts/run_lessons.py --profile full), side by
           side, each in its own copy of the checkout
  solutions  every solution, the same way
  nbval    the committed notebooks validated with nbval, one pytest per notebook
  bench    benchmarks/bench_resnet.py --profile full
  lenet    lesson 5's LeNet from scratch (batch 256, lr 0.2), on one device and on all devices
  resnet   lesson 6's ResNet-18 (batch 256 per device, lr 0.1 per device, cosine, data on the
           device, channels_last, autocast; torch.compile on one device), one and all devices
  ddp      python -m d2l_gpu.ddp (LeNet): one process; torchrun with NCCL and with gloo on all GPUs
  fast     benchmarks/resnet_fast.py: ResNet-18 one change at a time, then trained over 3 seeds
  seeds    benchmarks/lenet_seeds.py: lesson 5's LeNet over 3 seeds and 3 learning rates

--only NN,NN limits lessons, solutions and nbval to those notebook numbers. A part (--part; the
list and the order to run them when device time is short: --plan) is a set of steps and
notebooks that takes at most about 4 minutes on an H100-class GPU. The report is merged into an
existing build/gpu-report.json of the same --epochs and --limit (a step of the same name is
replaced, lessons and solutions one notebook at a time), so that the parts of several sessions
make one report; --fresh starts a new one.

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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpu_report_logic import PARTS, STEPS, checks, markdown, merge, passed, plan

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


def run(cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run `cmd` in its own session with a time limit: rc, output tail, seconds, timed_out."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd or ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
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


def chosen(folder: str, args) -> list[Path]:
    """The numbered notebooks of `folder`, only those --only names when it is given."""
    found = sorted((ROOT / folder).glob("[0-9][0-9]-*.ipynb"))
    return [nb for nb in found if not args.only or nb.name[:2] in args.only]


def _copy_of_checkout(into: Path) -> Path:
    """A copy of the checkout without .git, build and the environments: one notebook's room."""
    skip = shutil.ignore_patterns(".git", ".venv", "build", ".device", ".whl", "__pycache__")
    shutil.copytree(ROOT, into, ignore=skip, symlinks=True)
    return into


def step_notebooks(args, folder: str = "notebooks") -> list[dict]:
    """The chosen notebooks of `folder` in the full profile, side by side, each in its own copy of
    the checkout (their files and ports apart), started 3 s apart (kernels started at the same
    instant can take the same port); the figures are run_lessons' rows."""
    from concurrent.futures import ThreadPoolExecutor

    notebooks = chosen(folder, args)
    rooms = Path(tempfile.mkdtemp(prefix="gpu-report-"))

    def one(i: int, nb: Path) -> tuple[dict, list[dict]]:
        time.sleep(3 * i)
        room = _copy_of_checkout(rooms / nb.stem)
        cmd = [PY, "scripts/run_lessons.py", "--profile", "full", "--timeout", str(args.timeout),
               f"{folder}/{nb.name}"]  # fmt: skip
        result = run(cmd, args.timeout + 60, cwd=room)
        summary = room / "build" / "lessons" / "summary.json"
        return result, json.loads(summary.read_text())["lessons"] if summary.exists() else []

    workers = max(1, min(len(notebooks), (os.cpu_count() or 2) // 2))
    with ThreadPoolExecutor(workers) as pool:
        done = list(pool.map(one, range(len(notebooks)), notebooks))
    shutil.rmtree(rooms, ignore_errors=True)
    rows = [row for _, got in done for row in got]
    for (result, got), nb in zip(done, notebooks, strict=True):
        if not got:  # stopped before run_lessons wrote its summary: a row saying so
            status = "timeout" if result["timed_out"] else "FAILED"
            rows.append({"lesson": nb.stem, "status": status, "seconds": result["seconds"],
                         "key_result": None, "error": result["output"][-500:]})  # fmt: skip
    rc = next((r["rc"] for r, _ in done if r["rc"]), 0)
    rc = rc or int(any(row["status"] != "ok" for row in rows))  # a row FAILED inside a kernel
    result = {"rc": rc, "timed_out": False,
              "seconds": max((r["seconds"] for r, _ in done), default=0.0),
              "output": "\n".join(r["output"][-800:] for r, _ in done if r["rc"]),
              "command": f"run_lessons.py --profile full, side by side: {folder}"}  # fmt: skip
    return [record("lessons" if folder == "notebooks" else folder, result, {"lessons": rows})]


def step_fast(args) -> list[dict]:
    """benchmarks/resnet_fast.py; the figures: the trained row's median s/epoch over the seeds,
    its lowest test accuracy and the spread, and the table."""
    path = Path(args.out) / "gpu-report" / "resnet_fast.json"
    cmd = [PY, "benchmarks/resnet_fast.py", "--epochs", str(args.epochs), "--json", str(path)]
    cmd += ["--limit", str(args.limit)] if args.limit else []
    path.unlink(missing_ok=True)  # never an older run's figures
    result = run(cmd, args.timeout)
    figures = None
    if result["rc"] == 0 and path.exists():
        got = json.loads(path.read_text())
        accs = [r["test_acc"] for r in got["runs"]]
        row = next((r for r in got["rows"] if r["row"] == got["trained_row"]), {})
        if accs:
            sec = statistics.median(r["median_epoch_s"] for r in got["runs"])
            figures = {"test_acc": min(accs), "spread": max(accs) - min(accs), "seeds": len(accs),
                       "sec_per_epoch": sec, "images_per_sec": row.get("images_per_sec"),
                       "fraction_of_peak": row.get("fraction_of_peak"),
                       "table": got["rows"]}  # fmt: skip
    return [record("fast", result, figures)]


def step_seeds(args) -> list[dict]:
    """benchmarks/lenet_seeds.py; the figures are its rows (per learning rate)."""
    path = Path(args.out) / "gpu-report" / "lenet_seeds.json"
    cmd = [PY, "benchmarks/lenet_seeds.py", "--epochs", str(args.epochs), "--json", str(path)]
    cmd += ["--limit", str(args.limit)] if args.limit else []
    path.unlink(missing_ok=True)
    result = run(cmd, args.timeout, env={"D2L_GPU_LIVE_PLOTS": "0"})
    ok = result["rc"] == 0 and path.exists()
    return [record("seeds", result, {"rows": json.loads(path.read_text())["rows"]} if ok else None)]


def step_nbval(args) -> list[dict]:
    """Each committed notebook validated by nbval (strict, the project's sanitizers)."""
    out = []
    for nb in chosen("notebooks", args):
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


RUNNERS = {"lessons": step_notebooks, "solutions": lambda a: step_notebooks(a, "solutions"),
           "nbval": step_nbval, "bench": step_bench, "lenet": lambda a: step_train("lenet", a),
           "resnet": lambda a: step_train("resnet", a), "ddp": step_ddp, "fast": step_fast,
           "seeds": step_seeds}  # fmt: skip


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
    p.add_argument("--part", choices=[name for name, *_ in PARTS], help="one part (see --plan)")
    p.add_argument("--plan", action="store_true", help="print the parts in order and stop")
    p.add_argument("--only", help="notebook numbers for lessons, solutions, nbval: 06,10")
    p.add_argument("--fresh", action="store_true", help="a new report, not merged into build's")
    p.add_argument("--worker", choices=["lenet", "resnet"], help=argparse.SUPPRESS)
    p.add_argument("--devices", choices=["1", "all"], default="1", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part:
        _, args.steps, only, _, _ = next(part for part in PARTS if part[0] == args.part)
        args.only = args.only or only or None
    if args.only:
        args.only = args.only.split(",")
        if not all(len(n) == 2 and n.isdigit() for n in args.only):
            p.error(f"--only: {','.join(args.only)} is not a list of two-digit notebook numbers")
    unknown = sorted(set(args.steps.split(",")) - set(STEPS))
    if unknown:
        p.error(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plan:
        print(plan(), end="")
        return 0
    import torch

    import d2l_gpu as d2l

    if d2l.num_gpus() == 0:
        print(NEEDS.format(torch=torch.__version__), file=sys.stderr)
        return 2
    if args.worker:
        print(json.dumps(worker(args.worker, args.devices, args.epochs, args.limit)))
        return 0
    report = {"hardware": hardware(), "epochs": args.epochs, "limit": args.limit, "steps": []}
    earlier = Path(args.out) / "gpu-report.json"
    if earlier.exists() and not args.fresh:
        try:
            base = json.loads(earlier.read_text())
            merge(base, report)  # refuses a report of other --epochs/--limit before any step runs
        except (ValueError, KeyError) as e:
            print(f"gpu_report.py: cannot merge into {earlier}: {e}; move it away or pass "
                  "--fresh", file=sys.stderr)  # fmt: skip
            return 2
    else:
        base = None
    for name in args.steps.split(","):
        print(f"gpu-report: {name} ...", flush=True)
        try:
            report["steps"] += RUNNERS[name](args)
        except Exception as e:  # noqa: BLE001 - recorded; the report goes on
            report["steps"].append({"step": name, "status": "failed", "seconds": 0.0,
                                    "command": "", "figures": {}, "error": repr(e)})  # fmt: skip
        # after every step: a crash later keeps what was measured
        write(merge(base, report) if base else report, Path(args.out))
    report = merge(base, report) if base else report
    report["checks"] = checks(report)
    report["passed"] = passed(report["checks"])
    write(report, Path(args.out))
    print(markdown(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # d2l_gpu from this checkout (commands run in ROOT find it too)
    sys.exit(main())
