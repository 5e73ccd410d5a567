"""Two real "machines": two network namespaces with their own addresses, joined by a veth pair.

One torchrun agent runs in each namespace (--nnodes 2), and they meet at a c10d rendezvous on
the first one's address over the virtual cable, as two hosts on a private network would. Then
the cable is unplugged mid-epoch (`ip link set ... down`): plugged back in before --timeout, the
job goes on and ends as if nothing happened; left out, both agents give up within a bounded time
and say why. Needs root and iproute2 (CI runs as root); skipped with the reason otherwise.
The namespaces, the link and every process in them are removed whatever happens.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from train_launch import ARGS, SCRIPT, job_env, load, max_diff, run

ARGS64 = [*ARGS, "--epochs", "3", "--dtype", "float64"]  # the last --epochs wins
JOB_TIMEOUT = 8  # seconds a rank waits for the others (--timeout)
# A machine cut off from the network: its kernel gives up on the dead TCP connection to the
# rendezvous store after about 13 s (tcp_retries2=5; Linux's default 15 retries take ~15 min,
# and until then that machine's torchrun agent waits). Set in the namespaces only.
TCP_RETRIES = 5
BOUND = 240  # seconds by which both agents must have exited, even on a loaded machine


def _can_make_namespaces() -> str | None:
    """None if this process can create network namespaces, else why not."""
    if not sys.platform.startswith("linux"):
        return "network namespaces exist on Linux only"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CI runs as root)"
    if not shutil.which("ip"):
        return "needs the `ip` tool (iproute2)"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    pytest.mark.skipif(_can_make_namespaces() is not None, reason=str(_can_make_namespaces())),
]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


class Hosts:
    """Two namespaces 'a' and 'b' with addresses 10.231.N.1 and .2 on a veth pair of their own."""

    def __init__(self):
        tag, net = os.urandom(3).hex(), random.randrange(256)
        self.ns = [f"d2l-{tag}-a", f"d2l-{tag}-b"]
        self.link = [f"d2l{tag}a", f"d2l{tag}b"]  # interface names: at most 15 characters
        self.ip = [f"10.231.{net}.1", f"10.231.{net}.2"]
        self.logs = Path(tempfile.mkdtemp(prefix="d2l-netns-logs-"))  # torchrun's --log-dir

    def create(self) -> None:
        for ns in self.ns:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", self.link[0], "type", "veth", "peer", "name", self.link[1])
        for ns, link, ip in zip(self.ns, self.link, self.ip, strict=True):
            sh("ip", "link", "set", link, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", link)
            sh("ip", "-n", ns, "link", "set", link, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w",
               f"net.ipv4.tcp_retries2={TCP_RETRIES}")  # fmt: skip

    def remove(self) -> None:
        """Kill every process left in the namespaces, then delete them (and the veth pair)."""
        for ns in self.ns:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(self.logs, ignore_errors=True)
        # a pair left in this namespace by a creation that failed half-way
        subprocess.run(["ip", "link", "del", self.link[0]], capture_output=True, timeout=30)

    def unplug(self, node: int) -> None:
        sh("ip", "-n", self.ns[node], "link", "set", self.link[node], "down")

    def plug(self, node: int) -> None:
        sh("ip", "-n", self.ns[node], "link", "set", self.link[node], "up")

    def agent(self, node: int, *script_args: str) -> list[str]:
        """The torchrun command of `node`, run inside its namespace."""
        rdzv = f"is_host={int(node == 0)},join_timeout=20,read_timeout=10"
        return ["ip", "netns", "exec", self.ns[node], sys.executable, "-m",
                "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.ip[0]}:29400",
                "--rdzv-id", "d2l-netns", "--rdzv-conf", rdzv, "--local-addr", self.ip[node],
                "--log-dir", str(self.logs / f"node{node}"), "--max-restarts", "1",
                *SCRIPT, *script_args]  # fmt: skip


@pytest.fixture
def hosts():
    """Two fresh namespaces joined by a veth pair; always removed afterwards."""
    h = Hosts()
    try:
        h.create()
        yield h
    finally:
        h.remove()


@pytest.fixture(scope="module")
def one_process(small_data, tmp_path_factory) -> dict:
    """Final parameters of the same job on a single process, for comparison."""
    cwd = tmp_path_factory.mktemp("one")
    run([sys.executable, *SCRIPT, *ARGS64, "--save", "final.pt"], job_env(small_data), cwd)
    return load(cwd / "final.pt")


def start_agents(hosts: Hosts, small_data: Path, cwd: Path, stack) -> list[subprocess.Popen]:
    """Both agents, each in its namespace and its own session, killed when `stack` closes."""
    args = [*ARGS64, "--checkpoint", "ckpt.pt", "--save", "final.pt"]
    args += ["--timeout", str(JOB_TIMEOUT)]
    agents = []
    for node in (0, 1):
        env = {**job_env(small_data), "GLOO_SOCKET_IFNAME": hosts.link[node]}
        log = stack.enter_context(open(cwd / f"node{node}.log", "w"))
        proc = subprocess.Popen(hosts.agent(node, *args), env=env, cwd=cwd, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        stack.callback(_kill_session, proc)
        agents.append(proc)
    return agents


def _kill_session(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_all(agents, deadline: float) -> list[int | None]:
    """Exit statuses of the agents, None for one still running at `deadline`."""
    for proc in agents:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    return [proc.poll() for proc in agents]


def wait_for(path: Path, agents, deadline: float) -> None:
    while not path.exists():
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents), (
            f"{path.name} never appeared"
        )
        time.sleep(0.01)


def logs(cwd: Path) -> str:
    return "\n".join((cwd / f"node{n}.log").read_text(errors="replace") for n in (0, 1))


@pytest.mark.parametrize("outage", [None, 3.0], ids=["steady", "link-down-3s"])
def test_two_hosts_train_as_one(hosts, small_data, tmp_path, one_process, outage):
    """Two namespaces train one job; a 3 s outage mid-epoch (less than --timeout) is ridden
    out by TCP: the job goes on and ends with the weights of one process."""
    with contextlib.ExitStack() as stack:
        agents = start_agents(hosts, small_data, tmp_path, stack)
        deadline = time.monotonic() + BOUND
        if outage:
            wait_for(tmp_path / "ckpt.pt", agents, deadline)  # epoch 1 done: epoch 2 is running
            hosts.unplug(1)
            time.sleep(outage)
            hosts.plug(1)
        codes = wait_all(agents, deadline)
    out = logs(tmp_path)
    assert codes == [0, 0], out
    assert "world size 2 (gloo, cpu, ddp)" in out and "epoch 3/3" in out, out
    assert max_diff(load(tmp_path / "final.pt"), one_process) < 1e-12


def test_link_down_for_good_ends_within_bounded_time(hosts, small_data, tmp_path):
    """The cable stays out: every rank says it lost contact, and both agents give up (the
    rendezvous host after join_timeout, the cut-off machine when TCP gives up); nothing hangs."""
    with contextlib.ExitStack() as stack:
        agents = start_agents(hosts, small_data, tmp_path, stack)
        tic, deadline = time.monotonic(), time.monotonic() + BOUND
        wait_for(tmp_path / "ckpt.pt", agents, deadline)
        hosts.unplug(1)
        codes = wait_all(agents, deadline)
    out = logs(tmp_path)
    assert None not in codes, f"an agent still ran after {BOUND} s:\n{out}"
    assert all(code != 0 for code in codes), out
    assert "lost contact with the other ranks" in out, out
    assert "RendezvousTimeoutError" in out or "RendezvousConnectionError" in out, out
    assert not (tmp_path / "final.pt").exists()
    assert load(tmp_path / "ckpt.pt")["epoch"] >= 1  # the last good checkpoint is kept
    print(f"both agents ended {time.monotonic() - tic:.0f} s after the start")
