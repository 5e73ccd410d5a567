"""The shipped Slurm batch script (scripts/slurm/train.sbatch) on a real Slurm cluster.

tests/slurm_cluster.py starts munge, a slurmctld and two slurmd compute nodes on this machine,
each in a network namespace of its own. The script is submitted with sbatch as a student would:
its 2 nodes x 1 rank end with the weights of one process (float64); a job requeued after its
first checkpoint resumes from it to the same weights; a job that got fewer nodes than it needs
is refused with the script's sentence. Needs root and Debian's Slurm and munge packages (CI
installs them); skipped with the reason otherwise. The script run without sbatch is refused too
(no cluster needed).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import DONE, Cluster, why_not
from train_launch import ARGS, ROOT, SCRIPT, job_env, load, max_diff, run

SBATCH = ROOT / "scripts" / "slurm" / "train.sbatch"
EPOCHS = 6  # enough epochs after the first checkpoint for a requeue to land mid-job
ARGS64 = [*ARGS, "--epochs", str(EPOCHS), "--dtype", "float64"]  # the last --epochs wins
BOUND = 240  # seconds by which a job must have ended, even on a loaded machine

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def cluster():
    """A controller and two idle compute nodes; everything removed afterwards."""
    if why_not() is not None:
        pytest.skip(why_not())
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def env(small_data, tmp_path_factory) -> dict:
    """What a student's shell would have: the small data, and this Python's environment first."""
    e = job_env(small_data)
    e["TMPDIR"] = str(tmp_path_factory.mktemp("job-tmp"))  # torchrun's log folders go there
    e.pop("GLOO_SOCKET_IFNAME", None)  # the nodes' own names resolve to their own addresses
    e["PATH"] = f"{Path(sys.executable).parent}:{e['PATH']}"  # as `source .venv/bin/activate`
    return e


@pytest.fixture(scope="module")
def one_process(small_data, tmp_path_factory) -> dict:
    """Final parameters of the same job on a single process, for comparison."""
    cwd = tmp_path_factory.mktemp("one")
    run([sys.executable, *SCRIPT, *ARGS64, "--save", "final.pt"], job_env(small_data), cwd)
    return load(cwd / "final.pt")


def output(cwd: Path, job: str) -> str:
    return (cwd / f"train-{job}.out").read_text(errors="replace")


def wait_for_checkpoint(cluster: Cluster, job: str, cwd: Path) -> None:
    """Return once the job's first checkpoint exists; fail if the job ends or BOUND passes."""
    checkpoint, deadline = cwd / f"checkpoint-{job}.pt", time.monotonic() + BOUND
    while not checkpoint.exists():
        state = cluster.job(job)["JobState"]
        assert time.monotonic() < deadline and state in ("PENDING", "CONFIGURING", "RUNNING"), (
            f"job {job} is {state} and wrote no checkpoint:\n{output(cwd, job)}"
        )
        time.sleep(0.01)


def test_sbatch_script_trains_as_one_process(cluster, env, tmp_path, one_process, small_data):
    """2 nodes x 1 rank through sbatch, srun and torchrun end with one process's weights; the
    same check fails against a job with another --lr (the negative control)."""
    job = cluster.sbatch(SBATCH, *ARGS64, env=env, cwd=tmp_path)
    fields = cluster.wait(job, BOUND)
    out = output(tmp_path, job)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", out
    assert f"nodes node[1-2], rendezvous at node1:{20000 + int(job) % 10000}" in out, out
    assert "world size 2 (gloo, cpu, ddp)" in out and f"epoch {EPOCHS}/{EPOCHS}" in out, out
    final = load(tmp_path / f"final-{job}.pt")
    assert max_diff(final, one_process) < 1e-12

    other = tmp_path / "other-lr"
    other.mkdir()
    run([sys.executable, *SCRIPT, *ARGS64, "--lr", "0.05", "--save", "final.pt"],
        job_env(small_data), other)  # fmt: skip
    assert max_diff(final, load(other / "final.pt")) > 1e-6


def test_requeued_job_resumes_to_the_uninterrupted_result(cluster, env, tmp_path, one_process):
    """`scontrol requeue` after the first checkpoint stops the job; Slurm starts it again, and
    it resumes from its checkpoint to one process's weights."""
    job = cluster.sbatch(SBATCH, *ARGS64, env=env, cwd=tmp_path)
    wait_for_checkpoint(cluster, job, tmp_path)
    cluster.client("scontrol", "requeue", job)
    fields = cluster.wait(job, BOUND)
    out = output(tmp_path, job)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", out
    assert "DUE TO JOB REQUEUE" in out and f"job {job}, run 2:" in out, out
    resumed = re.search(rf"resumed from checkpoint-{job}\.pt: (\d+) of {EPOCHS} epochs done", out)
    assert resumed and 1 <= int(resumed[1]) < EPOCHS, out
    assert max_diff(load(tmp_path / f"final-{job}.pt"), one_process) < 1e-12


def test_dead_node_ends_the_run_in_bounded_time_and_the_job_resumes(cluster, env, tmp_path,
                                                                    one_process):  # fmt: skip
    """node2 dies after the first checkpoint (its slurmd and processes killed): rank 0 says it
    lost contact, the run ends within a bound and the job is requeued, by the script (its run
    failed with a checkpoint) or by Slurm (node2 declared down), whichever notices first; node2
    comes back and the job resumes from its checkpoint to one process's weights."""
    job = cluster.sbatch(SBATCH, *ARGS64, env={**env, "WAIT": "10"}, cwd=tmp_path)
    wait_for_checkpoint(cluster, job, tmp_path)
    cluster.kill_node("node2")
    tic, deadline = time.monotonic(), time.monotonic() + BOUND
    while (fields := cluster.job(job))["Restarts"] == "0":  # the run ends, the job is requeued
        assert fields["JobState"] not in DONE, (
            f"job {job} ended without a requeue:\n{output(tmp_path, job)}"
        )
        assert time.monotonic() < deadline, f"job {job} still ran {BOUND} s after node2 died"
        time.sleep(0.2)
    took, out = time.monotonic() - tic, output(tmp_path, job)
    assert "lost contact with the other ranks" in out, out
    by_script = f"requeueing job {job} (1 of MAX_REQUEUES=3) to resume from it" in out
    print(f"requeued by {'the script' if by_script else 'Slurm'} {took:.0f} s after node2 died")
    assert by_script or "DUE TO NODE FAILURE" in out, out
    cluster.start_node("node2")
    fields = cluster.wait(job, BOUND)
    out = output(tmp_path, job)
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", out
    assert re.search(rf"resumed from checkpoint-{job}\.pt: [1-5] of {EPOCHS} epochs done", out), out
    assert max_diff(load(tmp_path / f"final-{job}.pt"), one_process) < 1e-12


def test_a_job_that_fails_every_time_is_requeued_at_most_max_requeues_times(cluster, env,
                                                                             tmp_path):  # fmt: skip
    """A run that fails with a checkpoint present puts the job back in the queue, but only
    MAX_REQUEUES times: a damaged checkpoint fails every run, and the job ends FAILED after one
    requeue with MAX_REQUEUES=1 (without the bound it would loop)."""
    (tmp_path / "damaged.pt").write_bytes(b"not a checkpoint")
    job_env_ = {**env, "WAIT": "10", "MAX_REQUEUES": "1", "CHECKPOINT": "damaged.pt"}
    job = cluster.sbatch(SBATCH, *ARGS64, env=job_env_, cwd=tmp_path)
    fields = cluster.wait(job, 2 * BOUND)
    out = output(tmp_path, job)
    assert fields["JobState"] == "FAILED" and fields["Restarts"] == "1", out
    assert out.count(f"requeueing job {job} (1 of MAX_REQUEUES=1)") == 1, out
    assert f"job {job}, run 2:" in out and f"job {job}, run 3:" not in out, out
    assert "damaged.pt" in out and out.count("d2l_gpu.train: error (rank 0)") == 2, out


def test_fewer_nodes_than_needed_refused_with_a_sentence(cluster, env, tmp_path):
    """Given one node where the script is set up for two, it says so and exits 2."""
    job = cluster.sbatch(SBATCH, *ARGS64, options=["--nodes=1"], env=env, cwd=tmp_path)
    fields = cluster.wait(job, BOUND)
    out = output(tmp_path, job)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", out
    sentence = (
        r"train.sbatch: Slurm gave this job 1 node\(s\) \(node[12]\) but training is set up for "
        r"NODES=2: submit with --nodes=2, or set NODES to the number of nodes you ask for\.\n"
    )
    assert re.search(sentence, out), out
    assert not list(tmp_path.glob("checkpoint-*")), "nothing should have started"


def test_run_outside_slurm_refused_with_a_sentence(small_data, tmp_path):
    """`bash train.sbatch` on a login node, without sbatch: a sentence, exit 2, nothing run."""
    done = subprocess.run(["bash", str(SBATCH)], env=job_env(small_data), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "train.sbatch: this is not a Slurm job (SLURM_JOB_ID is not set): submit the script "
        "with sbatch scripts/slurm/train.sbatch instead of running it.\n"
    )
    assert list(tmp_path.iterdir()) == []
