"""The course's commands on Linux, macOS and Windows, without make.

    python scripts/course.py COMMAND [--dry-run]      (Windows: py scripts\\course.py COMMAND)

setup         create .venv and install the learners' lock and the package
setup-dev     setup, then the maintainers' lock (tests, lint, nbval)
lessons       execute every lesson headless into build/lessons/ and print the table
              (D2L_GPU_LANG=zh or vi: the Chinese or Vietnamese lessons, into build/lessons/LANG/)
test          unit tests and strict nbval over every lesson and solution, on every core
test-other-cpu  the unit tests and the notebooks that start no processes, with an older CPU's
              kernels (AVX2, or none) and one thread a process; with test-slow: all of `test`
test-unit     the unit tests               test-notebooks      strict nbval
test-slow     nbval of the process-launching notebooks on one busy core, older kernels (Linux)
test-cluster  a real Slurm cluster and two hosts in network namespaces (Linux, root)
test-oldest   the unit tests and lax nbval on PyTorch 2.4.1, the oldest admitted (.venv-oldest)
lab           JupyterLab on the lessons    kernel              register the Python you run this with
check         ruff, mypy, notebook hygiene    format              ruff format, notebooks normalised
slides        the reveal.js decks          test-browser        the lessons, decks and website in
                                                               headless Chromium
site          the website, English and Chinese, in build/site/ (the decks first)
setup-site    setup-dev, then the website's lock (Sphinx, myst-nb, the theme, jieba)
stress        40 two-rank torchrun jobs    gpu-report          the GPU acceptance run
spread        the spread of the "it learns" figures            clean    remove build/ and caches
grading-course  the exercises as an nbgrader course in build/grading/ (docs/grading.md)

The Makefile's targets call this script, so `make test` and `python scripts/course.py test` do
the same. The virtual environment is `.venv` (VENV=... to change it); its Python is
`.venv/bin/python`, or `.venv\\Scripts\\python.exe` on Windows. A lock is installed again only
when it is newer than the stamp the last install left. --dry-run prints the commands instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STARTS_PROCESSES = (
    "07-ddp-torchrun",
    "08-performance-lab",
    "10-model-parallel",
    "11-sharding",
    "12-synchronisation",
    "13-transformer-parallel",
    "14-long-sequences-meshes",
)
SLOW_NOTEBOOKS = [
    f"{d}/{name}.ipynb" for d in ("notebooks", "solutions") for name in STARTS_PROCESSES
]
# `make test` runs the unit tests and the notebooks in one pytest spread over the cores
# (pytest-xdist, one file or notebook at a time per worker); the longest start first, so that no
# core waits at the end for one long notebook. Only an order: a name here must exist (tested).
LONGEST_FIRST = (
    "notebooks/07-ddp-torchrun.ipynb",
    "solutions/07-ddp-torchrun.ipynb",
    "solutions/06-concise-multi-gpu.ipynb",
    "notebooks/06-concise-multi-gpu.ipynb",
    "notebooks/09-speed-one-gpu.ipynb",
    "notebooks/12-synchronisation.ipynb",
    "notebooks/13-transformer-parallel.ipynb",
    "solutions/09-speed-one-gpu.ipynb",
)
OLDEST_TORCH = "2.4.1"  # torch-directml's; the oldest the course admits (README)
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "nbval_sanitize.cfg",
         "-p", "no:cacheprovider"]  # fmt: skip


def workers(cores: int | None = None) -> int:
    """How many pytest workers `make test` starts: one per core, at most 4 (memory)."""
    return max(1, min(4, cores if cores is not None else os.cpu_count() or 1))


def parallel_env(cores: int | None = None) -> dict[str, str]:
    """Threads per worker, so that the workers together use each core once (no oversubscription:
    two workers of two threads each on two cores made a notebook several times slower)."""
    cores = cores if cores is not None else os.cpu_count() or 1
    threads = str(max(1, cores // workers(cores)))
    return {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


# glibc's allocator, for the test commands only: keep freed memory for reuse instead of handing
# blocks over 128 KiB back to the kernel at once (mmap and munmap, or trimming the heap), which
# made every large tensor cost fresh zeroed pages. On lesson 6's ResNet-18 loop with 1,000-image
# evaluations: 21 s -> 16 s (sys 5.7 s -> 0.4 s). On all of `make test` (2026-11-29, 2 cores):
# sys 227 s -> 194 s and page faults 41 M -> 24 M, wall 843 s -> 836 s, since most of its time
# is interpreters and torch started again. Results are the same bit for bit; the heap counts
# that lessons 10 and 11 measure (mallinfo2: bytes in use, heap and mmapped together) do not
# depend on where a block comes from. Other C libraries ignore the names. The lessons themselves,
# and their committed outputs, run with the defaults.
TEST_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**32)}


def other_cpu_env(cpu_flags: set[str] | None = None) -> dict[str, str]:
    """The environment that makes PyTorch, MKL and oneDNN compute as an older CPU does.

    On an AVX-512 machine: AVX2 kernels (an ordinary laptop's); elsewhere the plain kernels
    without AVX. Other kernels add and multiply in another order: a proof whose tolerance was
    fitted to one machine's rounding fails here instead of on a student's laptop."""
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    one_thread = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if "avx512f" in flags:
        kernels = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                   "ONEDNN_MAX_CPU_ISA": "AVX2"}  # fmt: skip
    else:
        kernels = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                   "ONEDNN_MAX_CPU_ISA": "SSE41"}  # fmt: skip
    return {**kernels, **one_thread}


def _cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux lists them (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _said(env: dict[str, str]) -> dict[str, str]:
    """`env`, after printing it: a log shows which kernels a run used."""
    print("+ as an older CPU:", " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    return env


def ordered_for_workers(paths: list[str]) -> list[str]:
    """`paths` with LONGEST_FIRST at the front (pytest-xdist hands files out in this order)."""
    first = [p for p in LONGEST_FIRST if p in paths]
    return first + [p for p in paths if p not in first]


class CourseError(Exception):
    """A command that cannot go on, said in one sentence."""


def _edition() -> str:
    """The lessons' edition that D2L_GPU_LANG names (scripts/lab.py), or CourseError."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    from lab import edition

    try:
        return edition()
    except ValueError as e:
        raise CourseError(str(e)) from None


def venv_python(venv: Path, windows: bool | None = None) -> Path:
    """The Python inside the virtual environment `venv`, on this or the named platform."""
    windows = os.name == "nt" if windows is None else windows
    return venv / ("Scripts/python.exe" if windows else "bin/python")


def notebooks() -> list[str]:
    """Every lesson and solution notebook, lessons first, as paths relative to the root."""
    found = sorted(glob.glob("notebooks/*.ipynb", root_dir=ROOT))
    return found + sorted(glob.glob("solutions/*.ipynb", root_dir=ROOT))


class Course:
    """Runs (or, dry, prints) the commands of the course in the project root."""

    def __init__(self, venv: Path, dry_run: bool = False):
        self.venv, self.dry_run = venv, dry_run
        self.py = str(venv_python(venv))
        self.env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        self.env.setdefault("D2L_GPU_LIVE_PLOTS", "0")  # headless runs draw each curve once

    def run(self, *cmd: str, env: dict | None = None) -> None:
        """Run `cmd` in the root; a non-zero exit becomes a CourseError naming the command."""
        print("+", " ".join(cmd), flush=True)
        if self.dry_run:
            return
        done = subprocess.run(cmd, cwd=ROOT, env={**self.env, **(env or {})})
        if done.returncode != 0:
            raise CourseError(f"`{' '.join(cmd)}` exited with {done.returncode}")

    def _stale(self, stamp: str, *inputs: Path) -> bool:
        """Whether the install that left `stamp` in the venv is older than one of `inputs`."""
        path = self.venv / stamp
        if not path.exists():
            return True
        return any(p.stat().st_mtime > path.stat().st_mtime for p in inputs if p.exists())

    def setup(self) -> None:
        if not Path(self.py).exists():
            self.run(sys.executable, "-m", "venv", str(self.venv))
        if self._stale(".installed", ROOT / "requirements.txt", ROOT / "pyproject.toml"):
            self.run(self.py, "-m", "pip", "install", "--quiet", "-r", "requirements.txt")
            self.run(self.py, "-m", "pip", "install", "--quiet", "--no-deps", "-e", ".")
            self._touch(".installed")

    def setup_dev(self) -> None:
        self.setup()
        if self._stale(".installed-dev", ROOT / "requirements-dev.txt", self.venv / ".installed"):
            self.run(self.py, "-m", "pip", "install", "--quiet", "-r", "requirements.txt",
                     "-r", "requirements-dev.txt")  # fmt: skip
            self._touch(".installed-dev")

    def _touch(self, stamp: str) -> None:
        if not self.dry_run:
            (self.venv / stamp).touch()

    def lessons(self) -> None:
        """Every lesson of the edition D2L_GPU_LANG names (zh, vi), headless."""
        lang = _edition()
        self.setup()
        self.run(self.py, "scripts/run_lessons.py", "--markdown", "--lang", lang)

    def _pytest(self, *args: str, env: dict | None = None) -> None:
        """pytest over `args` on every core: one worker per core, a file or notebook at a time;
        then, where `args` hold the unit tests, the `solo` ones alone (they measure how processes
        overlap in time, which needs cores that no other test is using)."""
        self.setup_dev()
        spread = ["-n", str(workers()), "--dist", "loadfile", "--durations", "15"]
        unit = "tests" in args
        chosen = ["-m", "not cluster and not solo"] if unit else []
        self.run(self.py, "-m", "pytest", *spread, *chosen, *args,
                 env={**TEST_MALLOC, **parallel_env(), **(env or {})})  # fmt: skip
        if unit:
            self.run(self.py, "-m", "pytest", "-q", "-m", "solo", "tests",
                     env={**TEST_MALLOC, **(env or {})})  # fmt: skip

    def test_unit(self) -> None:
        self._pytest("tests")

    def test_cluster(self) -> None:
        """The tests that start a Slurm cluster and network-namespace hosts (root, Linux)."""
        self.setup_dev()
        self.run(self.py, "-m", "pytest", "-m", "cluster", "-p", "no:cacheprovider", "tests",
                 env=TEST_MALLOC)  # fmt: skip

    def test_oldest(self) -> None:
        """The unit tests, then every notebook (errors only: lax nbval), on OLDEST_TORCH.

        Its own environment, .venv-oldest beside the venv, with the locks but PyTorch
        OLDEST_TORCH. On Linux, PyPI's build of it is a CUDA build (5.5 GB in the venv with its
        NVIDIA packages) that also runs on a CPU; PIP_INDEX_URL can name a CPU-only index."""
        old = Course(self.venv.with_name(self.venv.name + "-oldest"), self.dry_run)
        if not Path(old.py).exists():
            old.run(sys.executable, "-m", "venv", str(old.venv))
        locks = [ROOT / "requirements.txt", ROOT / "requirements-dev.txt"]
        if old._stale(".installed-oldest", *locks, ROOT / "pyproject.toml"):
            pins = [line for lock in locks for line in lock.read_text().splitlines()
                    if not line.startswith("torch==")]  # fmt: skip
            wanted = ROOT / "build" / "requirements-oldest.txt"
            if not self.dry_run:
                wanted.parent.mkdir(exist_ok=True)
                wanted.write_text("\n".join(sorted(set(pins))) + "\n")
            old.run(old.py, "-m", "pip", "install", "--quiet", f"torch=={OLDEST_TORCH}",
                    "-r", str(wanted))  # fmt: skip
            old.run(old.py, "-m", "pip", "install", "--quiet", "--no-deps", "-e", ".")
            old._touch(".installed-oldest")
        old.run(old.py, "-m", "pytest", "-m", "not cluster", "-p", "no:cacheprovider", "tests")
        old.run(old.py, "-m", "pytest", "--nbval-lax", *NBVAL[1:], *notebooks())

    def test_notebooks(self) -> None:
        self._pytest(*NBVAL, *ordered_for_workers(notebooks()))

    def test(self) -> None:
        """The unit tests and every notebook in one run, so that both cores stay busy."""
        self._pytest(*NBVAL, *ordered_for_workers(notebooks()), "tests")

    def test_other_cpu(self) -> None:
        """The unit tests and the notebooks that start no processes, as an older CPU computes
        (other_cpu_env). With test-slow (the others, on one busy core, also as an older CPU):
        `make test` as CI runs it, every test and every notebook once."""
        chosen = _said(other_cpu_env())
        quick = [nb for nb in ordered_for_workers(notebooks()) if nb not in SLOW_NOTEBOOKS]
        self._pytest(*NBVAL, *quick, "tests", env=chosen)

    def test_slow(self) -> None:
        """The process-launching notebooks on one core shared with a busy loop, with an older
        CPU's kernels: an output that holds only at one speed, or with one rounding, fails."""
        self.setup_dev()
        self.run(self.py, "scripts/slow_machine.py", *SLOW_NOTEBOOKS,
                 env={**TEST_MALLOC, **_said(other_cpu_env())})  # fmt: skip

    def lab(self) -> None:
        _edition()  # a wrong D2L_GPU_LANG is said before anything is installed
        self.setup()
        self.run(self.py, "scripts/lab.py")

    def kernel(self) -> None:
        """Register the Python running this script (the user's own environment)."""
        probe = [sys.executable, "-c", "import ipykernel"]
        if not self.dry_run and subprocess.run(probe, capture_output=True).returncode:
            raise CourseError(f"{sys.executable} has no ipykernel; run: "
                              f"{sys.executable} -m pip install -e \".[notebook]\"")  # fmt: skip
        self.run(sys.executable, "-m", "ipykernel", "install", "--user", "--name", "d2l-gpu",
                 "--display-name", "Python 3 (d2l-gpu)")  # fmt: skip

    def check(self) -> None:
        self.setup_dev()
        ruff = [self.py, "-m", "ruff"]
        self.run(*ruff, "check", ".")
        self.run(*ruff, "format", "--check", ".")
        self.run(self.py, "-m", "mypy")  # the package's types (pyproject.toml's [tool.mypy])
        self.run(self.py, "scripts/nbtools.py", "check", *notebooks())

    def format(self) -> None:
        self.setup_dev()
        ruff = [self.py, "-m", "ruff"]
        self.run(*ruff, "check", "--fix", ".")
        self.run(*ruff, "format", ".")
        self.run(self.py, "scripts/nbtools.py", "tidy", *notebooks())

    def slides(self) -> None:
        self.setup_dev()
        self.run(self.py, "scripts/make_slides.py")

    def setup_site(self) -> None:
        """setup-dev, then the website's lock (Sphinx, myst-nb, the theme, jieba)."""
        self.setup_dev()
        lock = ROOT / "requirements-site.txt"
        if self._stale(".installed-site", lock, self.venv / ".installed-dev"):
            self.run(self.py, "-m", "pip", "install", "--quiet", "-r", str(lock.name))
            self._touch(".installed-site")

    def site(self) -> None:
        self.slides()  # the decks, and the local MathJax that the pages load too
        self.setup_site()
        self.run(self.py, "scripts/make_site.py")

    def test_browser(self) -> None:
        self.site()  # the decks too, which the lessons' pages link to
        cjk = Path("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc")  # for the Chinese decks
        missing = not Path("/usr/bin/chromium").exists() or (
            sys.platform == "linux" and not cjk.exists()
        )
        if os.name != "nt" and not self.dry_run and missing:
            self.run("bash", "scripts/install_browser.sh")
        browser = {**TEST_MALLOC, "D2L_GPU_BROWSER": "1"}
        self.run(self.py, "-m", "pytest", "-p", "no:cacheprovider", "tests/browser", env=browser)

    def stress(self) -> None:
        self.setup_dev()
        self.run(self.py, "scripts/stress_ddp.py")

    def gpu_report(self) -> None:
        """The acceptance run; PART=name (`make gpu-report PART=fast`) runs one part of it."""
        self.setup_dev()
        part = os.environ.get("PART")
        self.run(self.py, "scripts/gpu_report.py", *(["--part", part] if part else []))

    def fuzz(self) -> None:
        """The property-based sweeps with many random examples each (`make test` draws a few,
        the same every run); what they find stays in build/hypothesis and is tried first next
        time. Long: about 10 minutes on two cores."""
        self.setup_dev()
        sweeps = ["tests/test_sweep_functions.py", "tests/test_sweep_flags.py"]
        self.run(self.py, "-m", "pytest", "-n", str(workers()), "-p", "no:cacheprovider",
                 *sweeps, env={**TEST_MALLOC, "D2L_GPU_FUZZ": "fuzz"})  # fmt: skip

    def grading_course(self) -> None:
        """The exercises as an nbgrader course in build/grading (docs/grading.md)."""
        self.setup_dev()
        self.run(self.py, "scripts/grading.py")

    def spread(self) -> None:
        self.setup_dev()
        self.run(self.py, "benchmarks/learning_spread.py")

    def clean(self) -> None:
        for name in ("build", ".pytest_cache", ".ruff_cache"):
            print("+ remove", name)
            if not self.dry_run:
                shutil.rmtree(ROOT / name, ignore_errors=True)


COMMANDS = {name.replace("_", "-"): name for name in vars(Course)
            if not name.startswith("_") and name not in ("run",)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--help"], ["-h"]):
        print(__doc__)
        return 0
    dry = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    if len(args) != 1 or args[0] not in COMMANDS:
        print(f"course.py: give one command of: {', '.join(COMMANDS)} (got "
              f"{' '.join(args) or 'nothing'}); see `python scripts/course.py --help`",
              file=sys.stderr)  # fmt: skip
        return 2
    venv = Path(os.environ.get("VENV", ".venv"))
    course = Course(venv if venv.is_absolute() else ROOT / venv, dry_run=dry)
    try:
        getattr(course, COMMANDS[args[0]])()
    except CourseError as e:
        print(f"course.py {args[0]}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"course.py {args[0]}: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
