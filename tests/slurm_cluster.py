"""A real Slurm cluster on this machine, for the tests: munge, one controller, two compute nodes.

Each daemon runs in a network namespace of its own with its own address and host name, as on
three machines: `ctl` (slurmctld, 10.232.N.1) and `node1`, `node2` (slurmd, .2 and .3), joined
by a bridge inside ctl's namespace and one veth pair per node. Each daemon also has a mount
namespace of its own in which a hosts file of the cluster covers /etc/hosts, so the node names
resolve as on a real cluster; nothing outside the cluster's temporary folder is written.
munged runs in this machine's namespace: the daemons reach it through its socket in that folder.
Config, state, spool and log files all live in that folder; `stop` kills every daemon and every
process of a job, deletes the namespaces and the folder, whatever state the cluster is in.
Needs root, Linux, iproute2, util-linux (nsenter, unshare) and Debian's slurmctld, slurmd,
slurm-client and munge packages.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = ("node1", "node2")
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "ip", "nsenter", "unshare")
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
        "DEADLINE", "PREEMPTED"}  # fmt: skip

CONF = """\
ClusterName=d2l
SlurmctldHost=ctl({ctl})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long plus one second before it may start again
# (Slurm's default is 120 s); 5 is the least Slurm accepts
AuthInfo=socket={dir}/munge/munge.sock,cred_expire=5
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
PlugStackConfig={dir}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
# test pending jobs every second (default 60 s): a requeued job waits for its BeginTime
# (cred_expire, 5 s here) and then for the scheduler's next pass
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
# a node whose slurmd does not answer for 10 s is declared down (Slurm's default is 300 s)
SlurmdTimeout=10
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def why_not() -> str | None:
    """None if this machine can run the test cluster, else why not."""
    if not sys.platform.startswith("linux"):
        return "the test cluster uses network namespaces, which exist on Linux only"
    if os.geteuid() != 0:
        return "the test cluster needs root for its namespaces and daemons (CI runs as root)"
    missing = [c for c in COMMANDS if not shutil.which(c)]
    if missing:
        return (f"the test cluster needs {', '.join(missing)}, not found on PATH: install them "
                "with apt-get install slurmctld slurmd slurm-client munge iproute2 util-linux "
                "(.ci/run does)")  # fmt: skip
    return None


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


class Cluster:
    """Munge, a controller and two compute nodes, each in namespaces of its own."""

    def __init__(self):
        tag, net = os.urandom(3).hex(), random.randrange(256)
        self.dir = Path(tempfile.mkdtemp(prefix="d2l-slurm-"))
        self.ns = {name: f"d2l-{tag}-{name}" for name in ("ctl", *NODES)}
        self.ip = {name: f"10.232.{net}.{i}" for i, name in enumerate(("ctl", *NODES), 1)}
        self.daemons: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    # --- set-up -----------------------------------------------------------------------------

    def start(self, bound: float = 60) -> None:
        """Write the files, wire the namespaces, start the daemons, wait until both nodes idle."""
        self._write_files()
        self._wire()
        d = self.dir
        self._daemon(["munged", "--foreground", "--force", f"--key-file={d}/munge/munge.key",
                      f"--socket={d}/munge/munge.sock", f"--pid-file={d}/munge/munged.pid",
                      f"--seed-file={d}/munge/munged.seed", f"--log-file={d}/log/munged.log"],
                     "munged")  # fmt: skip
        self._daemon(self._inside("ctl", "slurmctld", "-D", "-i"), "slurmctld")
        for node in NODES:
            self.start_node(node)
        self._wait_idle(bound)

    def start_node(self, node: str) -> None:
        """Start `node`'s slurmd (again, after kill_node: Slurm takes the node back)."""
        self._daemon(self._inside(node, "slurmd", "-D"), f"slurmd-{node}")

    def _write_files(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
            (d / sub).mkdir(parents=True)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        (d / "munge").chmod(0o700)
        (d / "plugstack.conf").write_text("")
        nodes = "\n".join(f"NodeName={n} NodeAddr={self.ip[n]} CPUs=1 State=UNKNOWN" for n in NODES)
        conf = CONF.format(ctl=self.ip["ctl"], dir=d, nodes=nodes, names=",".join(NODES))
        (d / "slurm.conf").write_text(conf)
        hosts = "".join(f"{ip} {name}\n" for name, ip in self.ip.items())
        (d / "hosts").write_text(f"127.0.0.1 localhost\n{hosts}")

    def _wire(self) -> None:
        """ctl's namespace holds a bridge with ctl's address; each node is a veth pair on it."""
        ctl = self.ns["ctl"]
        for ns in self.ns.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ctl, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", ctl, "addr", "add", f"{self.ip['ctl']}/24", "dev", "br0")
        sh("ip", "-n", ctl, "link", "set", "br0", "up")
        for node in NODES:
            ns = self.ns[node]  # names inside namespaces: nothing is added to this machine's
            sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth",
               "peer", "name", node, "netns", ctl)  # fmt: skip
            sh("ip", "-n", ctl, "link", "set", node, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip[node]}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def _inside(self, host: str, *cmd: str) -> list[str]:
        """`cmd` run on `host`: its network namespace, its host name, the cluster's hosts file."""
        setup = f'mount --bind {self.dir}/hosts /etc/hosts && hostname {host} && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{self.ns[host]}", "unshare", "--mount", "--uts",
                "--propagation", "private", "sh", "-c", setup, host, *cmd]  # fmt: skip

    def _daemon(self, cmd: list[str], name: str) -> None:
        with open(self.dir / "log" / f"{name}.out", "w") as log:  # the daemon keeps its own copy
            proc = subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.daemons.append(proc)

    def _wait_idle(self, bound: float) -> None:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            out = self.client("sinfo", "--noheader", "--format=%n %t", check=False)
            if sorted(out.split()) == sorted([*NODES, "idle", "idle"]):
                return
            dead = [p.args for p in self.daemons if p.poll() is not None]
            if dead:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the test cluster's nodes did not become idle within {bound:g} s "
                           f"(daemons that ended: {dead or 'none'}):\n{self.logs()}")  # fmt: skip

    # --- use --------------------------------------------------------------------------------

    def client(self, *cmd: str, check: bool = True, env: dict | None = None, cwd=None) -> str:
        """Run a Slurm command (sbatch, scontrol, sinfo) on ctl's network; its stdout."""
        full = ["nsenter", f"--net=/run/netns/{self.ns['ctl']}", *cmd]
        done = subprocess.run(full, env={**(env or self.env), "SLURM_CONF": self.env["SLURM_CONF"]},
                              cwd=cwd, capture_output=True, text=True, timeout=60)  # fmt: skip
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, script: Path, *args: str, options=(), env: dict, cwd: Path) -> str:
        """Submit `script` with `args` from `cwd` in `env`; the job id."""
        return self.client("sbatch", "--parsable", *options, str(script), *args,
                           env=env, cwd=cwd).strip()  # fmt: skip

    def job(self, job_id: str) -> dict[str, str]:
        """The fields of `scontrol show job` (JobState, ExitCode, Restarts, ...)."""
        out = self.client("scontrol", "--oneliner", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait(self, job_id: str, bound: float) -> dict[str, str]:
        """The job's fields once it has ended; an AssertionError if it has not after `bound` s."""
        deadline = time.monotonic() + bound
        while (fields := self.job(job_id))["JobState"] not in DONE:
            assert time.monotonic() < deadline, (
                f"job {job_id} still {fields['JobState']} after {bound:g} s"
            )
            time.sleep(0.2)
        return fields

    def logs(self) -> str:
        """The daemons' own output and logs, for a failure's message."""
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.dir / "log").glob("*")))  # fmt: skip

    def kill_node(self, node: str) -> None:
        """The machine `node` dies: SIGKILL to its slurmd and every process of a job on it."""
        self._kill_all(self.ns[node])

    def _kill_all(self, ns: str) -> None:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    # --- teardown ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Kill every daemon and job process, delete the namespaces and the folder."""
        for ns in self.ns.values():  # slurmd, slurmstepd, srun, torchrun and the ranks
            self._kill_all(ns)
        for proc in self.daemons:  # munged, and the nsenter of a daemon that failed early
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for ns in self.ns.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
