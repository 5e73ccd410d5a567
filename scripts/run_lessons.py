"""Execute lesson notebooks headless and summarise them.

    python scripts/run_lessons.py [--inplace] [--markdown] [--profile quick|full|auto]
                                  [--timeout S] [NB ...]
    python scripts/run_lessons.py --key-results   # docs/measurements.md's key results, from the
                                                  # committed notebooks

Without NB, runs every notebooks/[0-9][0-9]-*.ipynb in order. Each notebook runs top to
bottom in a fresh python3 kernel (this interpreter) with cwd = the notebook's folder and
D2L_GPU_LIVE_PLOTS=0. The executed, tidied copy goes to build/lessons/<name>.ipynb, or back
over the source with --inplace (only when it ran without error). Prints a table of lesson,
status, seconds and key result (last output line of the cell tagged `key-result`); with
--markdown, the same table in Markdown under a line naming the machine (CPU model, cores,
accelerator, PyTorch), profile and date, as docs/measurements.md shows it. Writes both forms to
build/lessons/summary.json and summary.md, and exits 1 if any notebook failed.

Executed for a commit (--inplace), each notebook gets an execution record in its metadata
(`d2l_gpu.execution`): the machine (CPU model, cores, accelerator), the date, PyTorch, the profile,
the load averages before and after, and how busy *other* processes kept the CPUs while it ran.
A figure taken while something else runs is wrong (and a student re-running it sees another), so a
notebook is written back only if other processes used at most OTHER_LIMIT of the cores, before it
started (a 2-second look) and while it ran; otherwise it is reported FAILED and left unchanged,
unless --force-load, which writes it with `forced: true` in the record (tests refuse such a record).
Load averages alone cannot decide this: they count the lesson's own processes, and they lag a
minute behind. Other processes' share = the CPU time the whole machine used (/proc/stat) minus
the CPU time of this process and its children, per second of wall time (Linux).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

try:
    import resource
except ImportError:  # Windows
    resource = None
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]  # nbtools, and d2l_gpu from this checkout
from lab import LESSONS  # noqa: E402 - each edition's lessons (--lang), as make lab opens them
from nbtools import dumps, first_line, tidy  # noqa: E402

from d2l_gpu._checks import count_arg  # noqa: E402
from d2l_gpu._fs import write_atomic  # noqa: E402

OUT = ROOT / "build" / "lessons"
OTHER_LIMIT = 0.1  # other processes may keep at most a tenth of the cores busy


def default_notebooks(lang: str = "en") -> list[Path]:
    """Numbered lessons of the edition `lang` in order; an index notebook only if it has code."""
    found = sorted((ROOT / LESSONS[lang]).glob("[0-9][0-9]-*.ipynb"))
    return [p for p in found if not p.name.startswith("00-") or _has_code(p)]


def _has_code(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any(c.cell_type == "code" and c.source.strip() for c in nb.cells)


def key_result(nb) -> str:
    """Last non-blank line of text output of the cell tagged `key-result`, or '-'."""
    for cell in nb.cells:
        if "key-result" not in cell.get("metadata", {}).get("tags", []):
            continue
        text = ""
        for out in cell.get("outputs", []):
            if out.output_type == "stream" and out.name == "stdout":
                text += out.text
            elif out.output_type in ("execute_result", "display_data"):
                text += "\n" + out.get("data", {}).get("text/plain", "")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return lines[-1] if lines else "-"
    return "-"


MEASUREMENTS = ROOT / "docs" / "measurements.md"  # where the table of seconds and key results is


def table_with_key_results(text: str, lessons: Path = ROOT / "notebooks") -> str:
    """`text` (docs/measurements.md) with each row of its generated table given the key result
    of the committed notebook it names: the column can then never differ from the notebooks."""
    out = []
    for line in text.splitlines(keepends=True):
        cells = line.rstrip("\n").split(" | ")
        path = lessons / f"{cells[0].removeprefix('| ')}.ipynb"
        if line.startswith("| ") and len(cells) == 4 and path.is_file():
            cells[3] = key_result(nbformat.read(path, as_version=4)) + " |"
            line = " | ".join(cells) + "\n"
        out.append(line)
    return "".join(out)


def machine_cpu_seconds() -> float | None:
    """CPU seconds every process of this machine has used since boot (Linux), else None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float | None:
    """CPU seconds of this process and of its children that have ended (the kernel, its jobs)."""
    if resource is None:
        return None
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class OtherLoad:
    """How many cores other processes kept busy between start() and stop(), on average."""

    def start(self) -> None:
        self.t, self.busy, self.own = time.perf_counter(), machine_cpu_seconds(), own_cpu_seconds()

    def stop(self) -> float | None:
        busy, own = machine_cpu_seconds(), own_cpu_seconds()
        if None in (busy, own, self.busy, self.own):
            return None
        seconds = max(time.perf_counter() - self.t, 1e-3)
        return round(max(0.0, (busy - self.busy) - (own - self.own)) / seconds, 3)


def load_averages() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, where the system has them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def execution_record(before: dict, other_during: float | None, forced: bool) -> dict:
    """The record an executed notebook keeps in metadata.d2l_gpu.execution."""
    info = machine()
    limit = OTHER_LIMIT * (os.cpu_count() or 1)
    others = [before["other_cores"], other_during]
    clean = all(x is not None and x <= limit for x in others)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        **{k: info[k] for k in ("cpu", "cores", "accelerator", "torch", "python", "profile")},
        "load_before": before["load"],
        "load_after": load_averages(),
        "other_cores_before": others[0],
        "other_cores_during": others[1],
        "other_cores_limit": round(limit, 3),
        "clean": clean,
        "forced": forced and not clean,
    }


def look_before() -> dict:
    """Load averages, and the cores other processes keep busy over 2 idle seconds."""
    meter = OtherLoad()
    meter.start()
    time.sleep(2.0)
    return {"load": load_averages(), "other_cores": meter.stop()}


def run_one(
    path: Path, timeout: int, inplace: bool, force_load: bool = False, out: Path = OUT
) -> dict:
    """Execute one notebook (its executed copy into `out` unless in place); return its row."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 - not JSON, not a notebook: a FAILED row, the rest go on
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return {
            "lesson": path.stem,
            "status": "FAILED",
            "seconds": 0.0,
            "key_result": "-",
            "error": f"{path.name} is not a readable notebook ({why}); fix or restore the file",
            "output": str(path),
            "execution": None,
        }
    before = look_before() if inplace else None
    meter = OtherLoad()
    meter.start()
    current = {"index": None}
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no "TCP without encryption" noise
        resources={"metadata": {"path": str(path.parent)}},
        on_cell_execute=lambda cell, cell_index: current.update(index=cell_index),
    )
    start, error = time.perf_counter(), None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        i = current["index"]
        where = f"cell {i} ({first_line(nb.cells[i])!r})" if i is not None else "kernel"
        if isinstance(e, CellExecutionError):
            msg = f"{e.ename}: {e.evalue}"
        elif isinstance(e, CellTimeoutError):
            msg = f"ran past the limit of {timeout} s per cell (--timeout) and was stopped"
        elif isinstance(e, DeadKernelError):
            msg = "the kernel died (out of memory, a crash in native code, or it was killed)"
        else:
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e) else ''}"
        error = f"{where}: {msg}"
    except Exception as e:  # noqa: BLE001 - report kernel start failures etc. per notebook
        error = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - start
    del client  # the kernel has ended: its CPU time now counts as ours
    record = None
    if inplace:
        record = execution_record(before, meter.stop(), force_load)
        nb.metadata.setdefault("d2l_gpu", {})["execution"] = record
        if error is None and not record["clean"] and not force_load:
            error = (
                f"executed under load: other processes kept {record['other_cores_before']} cores "
                f"busy before and {record['other_cores_during']} during the run (limit "
                f"{record['other_cores_limit']}); stop them and run again (or pass --force-load, "
                "which the record shows)"
            )
    text = dumps(tidy(nb))
    target = path if inplace and error is None else out / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, text)  # over a lesson with --inplace: never half-written
    return {
        "lesson": path.stem,
        "status": "ok" if error is None else "FAILED",
        "seconds": round(seconds, 1),
        "key_result": key_result(nb),
        "error": error,
        "output": str(target),
        "execution": record,
    }


def machine(profile: str | None = None) -> dict:
    """What ran the lessons: date, CPU model and cores, accelerator, PyTorch, profile."""
    import torch

    from d2l_gpu import devices, perf

    n, kind = devices.num_gpus(), devices.accelerator_type()
    accelerator = "none"
    if n:
        name = torch.cuda.get_device_name(0) if kind == "cuda" else kind
        accelerator = f"{n} x {name} ({kind})"
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": perf.cpu_name(),
        "cores": os.cpu_count(),
        "accelerator": accelerator,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "profile": profile or devices.profile(),
    }


def markdown(rows: list[dict], info: dict) -> str:
    """The per-lesson table in Markdown, under a line saying which machine produced it."""
    acc = "no accelerator" if info["accelerator"] == "none" else info["accelerator"]
    lines = [
        f"Run by `scripts/run_lessons.py` on {info['date']}: {info['cpu']} ({info['cores']} "
        f"cores), {acc}, PyTorch {info['torch']}, profile {info['profile']}.",
        "",
        "| lesson | status | seconds | key result |",
        "| --- | --- | ---: | --- |",
    ]
    for r in rows:
        key = r["key_result"].replace("|", "\\|")
        lines.append(f"| {r['lesson']} | {r['status']} | {r['seconds']:.1f} | {key} |")
    return "\n".join(lines) + "\n"


def plain(rows: list[dict]) -> str:
    """The per-lesson table as aligned plain text."""
    width = max(len(r["lesson"]) for r in rows)
    lines = [f"{'lesson':<{width}}  status  seconds  key result"]
    for r in rows:
        lines.append(
            f"{r['lesson']:<{width}}  {r['status']:<6}  {r['seconds']:>7.1f}  {r['key_result']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--inplace", action="store_true", help="write back over the sources")
    parser.add_argument("--markdown", action="store_true", help="print the table in Markdown")
    parser.add_argument("--profile", choices=["quick", "full", "auto"])
    parser.add_argument(
        "--lang", choices=sorted(LESSONS), default="en", help="whose lessons, without NB"
    )
    parser.add_argument("--timeout", type=count_arg, default=600, help="seconds per cell")
    parser.add_argument(
        "--force-load",
        action="store_true",
        help="with --inplace: write a notebook executed while other processes were busy (recorded)",
    )
    parser.add_argument(
        "--key-results",
        action="store_true",
        help="only write the committed notebooks' key results into docs/measurements.md's table",
    )
    args = parser.parse_args(argv)
    if args.key_results:
        text = MEASUREMENTS.read_text(encoding="utf-8")
        write_atomic(MEASUREMENTS, table_with_key_results(text))
        print("docs/measurements.md: key results taken from the committed notebooks")
        return 0

    os.environ["D2L_GPU_LIVE_PLOTS"] = "0"
    if args.profile:
        os.environ["D2L_GPU_PROFILE"] = args.profile
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    paths = [p.resolve() for p in args.notebooks] or default_notebooks(args.lang)
    out = OUT if args.lang == "en" else OUT / args.lang  # zh, vi: beside the English
    if not paths:
        print("no lesson notebooks found")
        return 0
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"no such notebook: {', '.join(missing)}")
        return 2

    rows = []
    for path in paths:
        print(f"running {path.name} ...", flush=True)
        rows.append(run_one(path, args.timeout, args.inplace, args.force_load, out))
        if rows[-1]["error"]:
            print(f"  FAILED {path.name}: {rows[-1]['error']}", flush=True)

    info = machine()
    out.mkdir(parents=True, exist_ok=True)
    summary = {"machine": info, "lessons": rows}
    write_atomic(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    write_atomic(out / "summary.md", markdown(rows, info))
    print("\n" + (markdown(rows, info) if args.markdown else plain(rows)))
    failed = [r for r in rows if r["error"]]
    for r in failed:
        print(f"FAILED {r['lesson']}: {r['error']}  (executed copy: {r['output']})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
