"""Two "machines" on one Linux computer: network namespaces joined by a slow link (lesson 12).

    python scripts/netns_link.py --check              # can this computer do it? (exit 0: yes)
    python scripts/netns_link.py [--rate-mbit 100] [--delay-ms 1] [--size-kb 1024] [--out FILE]

Needs Linux, root and iproute2 (`ip`, `tc`). Creates two network namespaces, each with its own
loopback (the fast link inside a machine), joins them with a veth pair (the link between the
machines) and slows each direction of that pair down with `tc`: a token bucket (tbf) limits the
bandwidth, and netem adds a delay where the kernel has it. Four ranks join one gloo group, ranks
0 and 1 in the first namespace, 2 and 3 in the second. They measure a message inside a machine
(0 <-> 1) and between the machines (0 <-> 2), then the flat ring all-reduce over 0, 1, 2, 3, the
hierarchical one (reduce inside, ring across, broadcast inside) and gloo's own all_reduce. The
results, with the alpha-beta models fitted to both links and their predictions, go to --out as
JSON. Whatever happens, the namespaces (and with them the veth pair) and the workers are removed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: import this checkout's d2l_gpu
from d2l_gpu._checks import count_arg, nonnegative_arg, positive_arg  # noqa: E402 - no torch

PORT = 29511  # inside a fresh namespace every port is free
ADDRESSES = ("10.211.0.1", "10.211.0.2")  # exist only inside the two namespaces made here


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def available() -> tuple[bool, str]:
    """Whether namespaces can be made here, and if not, why not."""
    if platform.system() != "Linux":
        return False, f"network namespaces are Linux only (this is {platform.system()})"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return False, f"{' and '.join(missing)} not found (Debian/Ubuntu: apt-get install iproute2)"
    name = f"d2l11-probe-{os.getpid()}"
    try:
        made = _ip("netns", "add", name, check=False)
        if made.returncode != 0:
            return False, f"'ip netns add' failed: {made.stderr.strip()}"
        tbf = ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf"]
        tbf += ["rate", "100mbit", "burst", "16000", "latency", "200ms"]
        shaped = subprocess.run(tbf, capture_output=True, text=True, timeout=30)
        if shaped.returncode != 0:
            return False, f"tc cannot limit a link (no tbf?): {shaped.stderr.strip()}"
    finally:
        _ip("netns", "delete", name, check=False)
    return True, "Linux, root, ip and tc: namespaces can be made and links limited"


class TwoMachines:
    """Context manager: two namespaces joined by a veth pair limited to `rate_mbit` each way."""

    def __init__(self, rate_mbit: float, delay_ms: float):
        tag = f"{os.getpid()}"
        self.names = (f"d2l11-{tag}-a", f"d2l11-{tag}-b")
        self.links = (f"d11a{tag}"[:15], f"d11b{tag}"[:15])
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms
        self.shaping = ""

    def __enter__(self) -> TwoMachines:
        try:
            for ns in self.names:
                _ip("netns", "add", ns)
            _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
            for ns, link, address in zip(self.names, self.links, ADDRESSES, strict=True):
                _ip("link", "set", link, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{address}/30", "dev", link)
                _ip("-n", ns, "link", "set", link, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                # a pause between messages must not send TCP back to its slow start
                idle = "echo 0 > /proc/sys/net/ipv4/tcp_slow_start_after_idle"
                subprocess.run(
                    ["ip", "netns", "exec", ns, "sh", "-c", idle], check=True, timeout=30
                )
                self.shaping = self._shape(ns, link)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _shape(self, ns: str, link: str) -> str:
        """Limit the link's outgoing traffic; add the delay with netem where the kernel has it."""
        rate = f"{self.rate_mbit}mbit"
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", link, "root"]
        if self.delay_ms > 0:
            netem = [*tc, "netem", "delay", f"{self.delay_ms}ms", "rate", rate]
            if subprocess.run(netem, capture_output=True, timeout=30).returncode == 0:
                return f"netem: {rate}, {self.delay_ms} ms delay"
        burst = max(16_000, int(self.rate_mbit * 1e6 / 8 / 250))  # one timer tick's worth
        tbf = [*tc, "tbf", "rate", rate, "burst", str(burst), "latency", "200ms"]
        subprocess.run(tbf, capture_output=True, text=True, check=True, timeout=30)
        return f"tbf: {rate}, no delay" + (" (this kernel has no netem)" if self.delay_ms else "")

    def __exit__(self, *exc) -> None:
        for ns in self.names:  # deleting a namespace deletes its end of the veth pair too
            _ip("netns", "delete", ns, check=False)
        _ip("link", "delete", self.links[0], check=False)  # if it never left this namespace


def run_ranks(machines: TwoMachines, args: argparse.Namespace, outdir: Path) -> dict:
    """Start ranks 0, 1 in the first namespace and 2, 3 in the second; return rank 0's result."""
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    # A stop signal only records itself (_stop) and is acted on here, between steps: raised from
    # the handler it could land inside Popen.wait while that holds its lock, and the clean-up's
    # own wait then waited for that lock forever (seen once in CI, 2026-11-29).
    _check_stop()
    try:
        for rank in range(4):
            ns, link = machines.names[rank // 2], machines.links[rank // 2]
            cmd = ["ip", "netns", "exec", ns, sys.executable, __file__, "--worker", str(rank)]
            cmd += ["--size-kb", str(args.size_kb), "--rounds", str(args.rounds)]
            cmd += ["--out", str(outdir / f"rank{rank}.json")]
            procs.append(
                subprocess.Popen(
                    cmd, env={**env, "GLOO_SOCKET_IFNAME": link}, start_new_session=True
                )
            )
        deadline = time.monotonic() + args.timeout
        while any(p.poll() is None for p in procs):
            _check_stop()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ranks ran past --timeout {args.timeout:g} s")
            time.sleep(0.05)
    finally:
        for p in procs:  # only the workers started here, by their process group
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    codes = [p.returncode for p in procs]
    if any(codes):
        raise RuntimeError(f"the ranks exited with {codes}; see their errors above")
    return json.loads((outdir / "rank0.json").read_text())


def worker(rank: int, args: argparse.Namespace) -> None:
    """One rank: join the group at rank 0's address, time the links and the all-reduces."""
    import torch.distributed as dist

    from d2l_gpu.parallel import costmodel

    dist.init_process_group(
        "gloo", init_method=f"tcp://{ADDRESSES[0]}:{PORT}", rank=rank, world_size=4
    )
    try:
        fast = [2**10, 2**20, 2**22, 2**24]  # the loopback: large enough to show its bandwidth
        slow = [2**10, 2**18, 2**19, 2**20]  # the shaped link: above tbf's burst, but the first
        inside = costmodel.pingpong_worker(rank, 4, fast, args.rounds, pair=(0, 1))
        between = costmodel.pingpong_worker(rank, 4, slow, args.rounds, pair=(0, 2))
        algorithms = ["ring", "hierarchical", "two-level", "all_reduce"]
        nbytes = args.size_kb * 1024
        cases = [(name, 4, nbytes) for name in algorithms] + [("ring step", 4, nbytes // 4)]
        timed = costmodel.collective_worker(rank, 4, cases, args.rounds)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    result = {
        "inside_sizes": fast,
        "inside": [inside[n] for n in fast],
        "between_sizes": slow,
        "between": [between[n] for n in slow],
        "nbytes": nbytes,
        "measured": {name: timed[(name, 4, nbytes)] for name in algorithms},
        "ring_step": timed[("ring step", 4, nbytes // 4)],  # all four ranks send at once
    }
    Path(args.out).write_text(json.dumps(result))


def measure(args: argparse.Namespace) -> dict:
    """Make the two machines, run the ranks, add the fitted models and their predictions."""
    sys.path.insert(0, str(ROOT))  # the script runs from a checkout, not an installed package
    from d2l_gpu.parallel import costmodel

    with TwoMachines(args.rate_mbit, args.delay_ms) as machines:
        with tempfile.TemporaryDirectory(prefix="d2l11-netns-") as tmp:
            result = run_ranks(machines, args, Path(tmp))
        shaping = machines.shaping
    _check_stop()  # a stop during the last rank's exit or the clean-up
    inside = costmodel.fit_alpha_beta(result["inside_sizes"], result["inside"])
    between = costmodel.fit_alpha_beta(result["between_sizes"], result["between"])
    n = result["nbytes"]
    result.update(
        shaping=shaping,
        rate_mbit=args.rate_mbit,
        inside_model=[inside.alpha, inside.beta],
        between_model=[between.alpha, between.beta],
        predicted={
            # every step of the flat ring waits for its slowest link, here the one between machines
            "ring": costmodel.flat_ring_time(inside, between, n, 4),
            "hierarchical": costmodel.hierarchical_time(inside, between, n, 2, 2),
            "two-level": costmodel.two_level_time(inside, between, n, 2, 2),  # one veth pair
        },
        date=datetime.date.today().isoformat(),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
    )
    return result


STOPPED: list[int] = []  # the termination signals received, in order


def _stop(signum, frame) -> None:
    """A termination signal: noted, and acted on by _check_stop at the next step."""
    STOPPED.append(signum)


def _check_stop() -> None:
    """After a termination signal, leave through the `with` blocks, which remove what was made."""
    if STOPPED:
        raise SystemExit(f"netns_link: stopped by {signal.Signals(STOPPED[0]).name}; cleaned up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it can run here")
    parser.add_argument(
        "--rate-mbit", type=positive_arg, default=100.0, help="link between machines"
    )
    parser.add_argument(
        "--delay-ms", type=nonnegative_arg, default=1.0, help="added where netem exists"
    )
    parser.add_argument("--size-kb", type=count_arg, default=1024, help="the all-reduced tensor")
    parser.add_argument("--rounds", type=count_arg, default=5, help="timed repetitions (median)")
    parser.add_argument("--timeout", type=positive_arg, default=240.0, help="seconds for the ranks")
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args)
        return 0
    ok, why = available()
    if args.check or not ok:
        print(why)
        return 0 if ok else 1
    if args.rate_mbit <= 0 or args.size_kb <= 0 or args.rounds < 1:
        parser.error("--rate-mbit and --size-kb must be positive and --rounds at least 1")
    for sig in (signal.SIGTERM, signal.SIGHUP):  # end through the `with` blocks: they clean up
        signal.signal(sig, _stop)
    result = measure(args)
    text = json.dumps(result, indent=1)
    if args.out:
        from d2l_gpu._fs import write_atomic

        write_atomic(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
