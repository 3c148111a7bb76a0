"""slurm/ddp.sbatch under a real SLURM: munged, slurmctld and slurmd on localhost, started here.

The daemons run as root with their own config, keys, ports and spool in a tmp
dir (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, one node named
after ``hostname -s``), and are stopped, with every job process, at the end.
Skipped where SLURM is not installed (apt-get install slurm-wlm munge) or not root.
The script's own logic (the command it hands to srun, its environment, its
quoting) is also checked without SLURM, with stand-ins for ``scontrol`` and ``srun``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO, cpu_env
from tests.reliability import RUN, environ_of, reference_metrics, same_results
from workshop_lib.launching.launch import free_port, torchrun_argv

SBATCH = REPO / "slurm" / "ddp.sbatch"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sinfo", "squeue", "scancel", "scontrol", "srun")


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


_missing = [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]
needs_slurm = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing), reason=f"SLURM not installed ({', '.join(_missing)} missing); "
                                              "apt-get install slurm-wlm munge"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test's own slurmd must run as root"),
]

CONF = """\
ClusterName=workshop
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
PlugStackConfig={dir}/plugstack.conf
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=workshop Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _wait(predicate, timeout: float, what: str, logs: list[Path]) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs if p.exists())
    raise AssertionError(f"{what} within {timeout}s\n{tails}")


def _job_processes(conf: Path) -> list[int]:
    """Every process that carries our SLURM_CONF: the daemons' children and the job's ranks."""
    return [proc.pid for proc in psutil.process_iter() if proc.pid != os.getpid()
            and environ_of(proc.pid).get("SLURM_CONF") == str(conf)]


def _wait_for_job(job_id: str, env: dict[str, str], timeout: float) -> tuple[str, str]:
    """(JobState, ExitCode) once the job has ended; polled often (sbatch --wait sleeps up to 10 s per poll)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        p = subprocess.run([_which("scontrol"), "-o", "show", "job", job_id], env=env, capture_output=True,
                           text=True, timeout=10)
        fields = dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)
        if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return fields["JobState"], fields.get("ExitCode", "")
        time.sleep(0.3)
    subprocess.run([_which("scancel"), job_id], env=env, timeout=10)
    raise AssertionError(f"job {job_id} still running after {timeout}s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-node SLURM cluster on localhost; yields the environment its clients need."""
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    (d / "plugstack.conf").write_text("")
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(host=socket.gethostname().split(".")[0], dir=d, cpus=os.cpu_count(),
                                ctld_port=free_port(), slurmd_port=free_port()))
    env = {**cpu_env(), "SLURM_CONF": str(conf), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    logs = [d / "munged.log", d / "slurmctld.log", d / "slurmd.log", d / "daemons.out"]
    daemons = []
    try:
        daemons.append(_start([_which("munged"), "-F", "--force", f"--socket={d}/munge.socket",
                               f"--key-file={key}", f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                               f"--seed-file={d}/munged.seed"], env, d / "daemons.out"))
        _wait(lambda: (d / "munge.socket").exists(), 20, "munged did not start", logs)
        daemons.append(_start([_which("slurmctld"), "-D", "-c", "-f", str(conf)], env, d / "daemons.out"))
        daemons.append(_start([_which("slurmd"), "-D", "-f", str(conf)], env, d / "daemons.out"))

        def idle() -> bool:
            p = subprocess.run([_which("sinfo"), "-h", "-o", "%t"], env=env, capture_output=True, text=True, timeout=10)
            return p.stdout.strip() == "idle"

        _wait(idle, 60, "the node did not become idle", logs)
        yield env
    finally:
        with contextlib.suppress(Exception):
            subprocess.run([_which("scancel"), "--full", "--user=root"], env=env, timeout=10, capture_output=True)
        for daemon in reversed(daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait(timeout=10)
        for pid in _job_processes(conf):  # slurmstepd and ranks left behind, if any
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@needs_slurm[0]
@needs_slurm[1]
@needs_slurm[2]
@pytest.mark.timeout(120)
def test_srun_works(cluster):
    p = subprocess.run([_which("srun"), "-n2", "hostname"], env=cluster, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [socket.gethostname()] * 2


def _rank_of_job(conf: str, rank: str) -> int | None:
    """The pid of the job's worker with RANK ``rank`` (it carries our SLURM_CONF), if it is running."""
    for proc in psutil.process_iter():
        env = environ_of(proc.pid)
        if env.get("SLURM_CONF") == conf and env.get("RANK") == rank and "TORCHELASTIC_RUN_ID" in env:
            return proc.pid
    return None


@needs_slurm[0]
@needs_slurm[1]
@needs_slurm[2]
@pytest.mark.timeout(300)
def test_sbatch_trains_step4_like_torchrun_through_a_killed_rank(cluster, tmp_path):
    """One node x 2 processes of step 4 through sbatch -> srun -> torchrun, a rank SIGKILLed in epoch 2: the sbatch
    script's --max-restarts and TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 restart the group, and the job ends with the
    numbers of torchrun alone, uninterrupted.

    The --out path holds a space, a ';' and a '$(...)': it must arrive as one argument, never run.
    """
    out, log = tmp_path / "out dir;$(touch pwned)", tmp_path / "job.out"
    job = subprocess.run([_which("sbatch"), "--parsable", "--nodes=1", f"--cpus-per-task={os.cpu_count()}",
                          f"--output={log}", f"--chdir={REPO}", str(SBATCH), "solutions/step4_snapshots.py", *RUN,
                          "--out", str(out)],
                         env={**cluster, "NPROC_PER_NODE": "2"}, capture_output=True, text=True, timeout=30)
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip().split(";")[0]
    end = time.monotonic() + 180  # epoch 1's snapshot: rank 0 has gone on to epoch 2
    while not (out / "snapshot.pt").exists() and time.monotonic() < end:
        time.sleep(0.05)
    victim = _rank_of_job(cluster["SLURM_CONF"], "1")
    assert victim, log.read_text()[-3000:] if log.exists() else "no job output"
    os.kill(victim, signal.SIGKILL)
    state = _wait_for_job(job_id, cluster, timeout=200)
    text = log.read_text() if log.exists() else ""
    assert state == ("COMPLETED", "0:0"), (state, text[-3000:])
    assert "resuming from" in text, text[-3000:]
    host = socket.gethostname().split(".")[0]
    assert f"1 node(s) x 2 process(es), rendezvous {host}:" in text, text[-3000:]
    assert not list(tmp_path.rglob("pwned")) and not (REPO / "pwned").exists()
    same_results(json.loads((out / "metrics.json").read_text()), reference_metrics())


def test_the_script_hands_srun_one_torchrun_per_node_with_the_restart_workaround(tmp_path):
    """Without SLURM: stand-ins for scontrol and srun; srun's stand-in prints what it would run, one item a line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\nprintf 'node-a\\nnode-b\\n'\n")
    variable = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    (bin_dir / "srun").write_text(f"#!/bin/bash\necho \"{variable}=${variable}\"\nprintf '%s\\n' \"$@\"\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    out = "out dir;$(touch pwned)"
    env = {**cpu_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a-b]",
           "SLURM_JOB_ID": "12345", "SLURM_JOB_NUM_NODES": "2"}
    p = subprocess.run(["bash", str(SBATCH), "solutions/step4_snapshots.py", "--epochs", "3", "--out", out],
                       capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "job 12345: 2 node(s) x 1 process(es), rendezvous node-a:32345"
    assert lines[1] == "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    torchrun = torchrun_argv("solutions/step4_snapshots.py", 1, standalone=False, nnodes=2,
                             rdzv=("c10d", "node-a:32345", "12345"), flags=["--max-restarts=1"],
                             args=["--epochs", "3", "--out", out])  # the out folder one argument, never run
    assert lines[2:] == ["--kill-on-bad-exit=1", "--ntasks-per-node=1", "torchrun", *torchrun[3:]]
    assert not list(tmp_path.rglob("pwned"))


def test_a_long_node_list_does_not_end_the_script_with_sigpipe(tmp_path):
    """The first of many node names: a pipe into `head -n1` under pipefail died of SIGPIPE (exit status 141)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node-a\nfor i in $(seq 1 20000); do echo node-$i; done\n")
    (bin_dir / "srun").write_text("#!/bin/bash\nexit 0\n")
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    env = {**cpu_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-[a,1-20000]",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "20001"}
    p = subprocess.run(["bash", str(SBATCH), "solutions/step4_snapshots.py"], capture_output=True, text=True,
                       timeout=30, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0] == "job 7: 20001 node(s) x 1 process(es), rendezvous node-a:20007"


def test_sbatch_script_without_a_training_script_says_so():
    p = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, timeout=10, env=cpu_env())
    assert p.returncode == 2
    assert p.stderr == ("error: no training script given; use: sbatch slurm/ddp.sbatch "
                        "solutions/step4_snapshots.py [flags]\n")
