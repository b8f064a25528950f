"""Host-mode `gputrace record` says which container and pod each process ran in, with no
container runtime: real cgroups made here in the host's cgroup v2 hierarchy under each
runtime's directory names, stand-in workloads started inside them (the shell joins the
cgroup, then execs the workload), one of them short enough to be gone before the
recorder may read it, and a node's /var/log/pods and runtime files under a tmp
`--kube-root`. One recording serves the module, on one pytest-xdist worker (its group):
two recordings at once would each make and remove the same cgroups. Every cgroup lies
under a root of this process's own (the layouts are recognised under any root, as on a
nested cluster), so no other test's cgroups meet these. Planted truth: `CASES` (each process's
identity) and the stand-in's expected.json (the RM memory each run allocates).
Live: real BPF probes on the FUSE stand-in driver (root)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from gputrace import identity
from gputrace.analyses.helpers.inputs import inputs_from_trace
from gputrace.analyses.helpers.partition import PER_PROCESS
from gputrace.analyses.report_spec import ReportOptions
from gputrace.analyses.run import run_reports
from gputrace.record import procfs
from gputrace.trace.reader import open_trace
from tests.live.test_record_host_mode_processes import ready_pid, wait_for_ioctls_of
from tests.record_helpers import RecorderProc, live_skip_reason, record_cmd, standin_driver_args

pytestmark = [pytest.mark.live, pytest.mark.xdist_group("record_containers")]
_SKIP = live_skip_reason()
if _SKIP is not None:
    pytestmark.append(pytest.mark.skip(reason=_SKIP))

U1 = "5d2f4a7c-1b3e-4f60-8a9d-0c1e2f3a4b5c"  # ml/trainer-0, burstable (systemd driver)
U2 = "7e8f9a0b-2c3d-4e5f-9a6b-1c2d3e4f5a6b"  # ml/eval-0, besteffort (cgroupfs driver)
U3 = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"  # batch/oneshot-0, guaranteed (cgroupfs)
U4 = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"  # ml/v1-0, burstable: in a v1 hierarchy only
C = {k: (f"{i:02x}" * 32)
     for i, k in enumerate(("a", "a2", "b", "d", "p", "e", "v1", "x"), start=0xa1)}
V1_MEMORY = Path("/sys/fs/cgroup/memory")
"""A cgroup v1 hierarchy (hybrid hosts): the memory controller's, where a runtime on a
hybrid host puts the container even when the v2 path says nothing."""
U1_ = U1.replace("-", "_")
ROOT = f"gputrace-test-containers-{os.getpid()}"
"""The cgroups' own root, in each hierarchy used."""
SLICE = f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U1_}.slice"


@dataclass(frozen=True)
class Case:
    """A workload's cgroup (under the v2 mount) and the identity its row must carry."""

    cgroup: str
    want: dict[str, str | None]
    wait: bool = True  # False: started, left to run out, perhaps gone before it is read
    v1: bool = False  # in the v1 memory hierarchy; in v2 it stays where the test runs


def _who(cid: str | None, runtime: str | None = None, uid: str | None = None,
         qos: str | None = None, ns: str | None = None, pod: str | None = None,
         name: str | None = None) -> dict[str, str | None]:
    return {"container_id": cid, "container_runtime": runtime, "pod_uid": uid,
            "qos_class": qos, "pod_namespace": ns, "pod_name": pod, "container_name": name}


CASES = {
    # systemd driver, containerd: name from containerd's task config.json
    "a": Case(f"{SLICE}/cri-containerd-{C['a']}.scope",
              _who(C["a"], "containerd", U1, "burstable", "ml", "trainer-0", "cuda")),
    # the same pod's second container: its runtime files unreadable, the uid and id kept
    "a2": Case(f"{SLICE}/cri-containerd-{C['a2']}.scope",
               _who(C["a2"], "containerd", U1, "burstable", "ml", "trainer-0")),
    # cgroupfs driver: the bare id says no runtime; Docker's config.v2.json does
    "b": Case(f"kubepods/besteffort/pod{U2}/{C['b']}",
              _who(C["b"], "docker", U2, "besteffort", "ml", "eval-0", "eval")),
    "d": Case(f"system.slice/docker-{C['d']}.scope", _who(C["d"], "docker")),
    "p": Case(f"machine.slice/libpod-{C['p']}.scope", _who(C["p"], "podman")),
    # Guaranteed (no QoS level), short-lived: read at its first event or, gone, by its
    # cgroup id (the cgroup outlives it); both give the same identity
    "e": Case(f"kubepods/pod{U3}/{C['e']}",
              _who(C["e"], None, U3, "guaranteed", "batch", "oneshot-0"), wait=False),
    # a hybrid host: v2 says nothing (the test's own cgroup), v1's memory hierarchy does
    "v1": Case(f"kubepods/burstable/pod{U4}/{C['v1']}",
               _who(C["v1"], None, U4, "burstable", "ml", "v1-0"), v1=True),
    # a delegated subtree that copies kubelet's layout with eval-0's uid: not under a
    # kubelet root, so no pod (and a bare id under no pod is no container)
    "x": Case(f"user.slice/delegated/kubepods/besteffort/pod{U2}/{C['x']}", _who(None)),
}
KUBE_ROOTS = f"/{ROOT}/kubepods.slice:/{ROOT}/kubepods"
"""kubelet's roots on this test's node (identity.KUBE_ROOTS_ENV): under the test's own."""


def _node(root: Path) -> None:
    """What a node shows without an API server: /var/log/pods and the runtimes' files."""
    for entry in (f"ml_trainer-0_{U1}/cuda", f"ml_eval-0_{U2}/eval", f"batch_oneshot-0_{U3}/job",
                  f"ml_v1-0_{U4}/job"):
        (root / "var/log/pods" / entry).mkdir(parents=True)
    task = root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / C["a"]
    task.mkdir(parents=True)
    (task / "config.json").write_text(json.dumps({"ociVersion": "1.1.0", "annotations": {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": "cuda", "io.kubernetes.cri.sandbox-uid": U1}}))
    docker = root / "var/lib/docker/containers" / C["b"]
    docker.mkdir(parents=True)
    (docker / "config.v2.json").write_text(json.dumps({"ID": C["b"], "Config": {
        "Labels": {"io.kubernetes.container.name": "eval", "io.kubernetes.pod.uid": U2}}}))


def _rmdirs(dirs: list[Path]) -> None:
    for d in reversed(dirs):  # deepest first
        for _ in range(100):  # rmdir fails until the kernel has moved the exited pids out
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)  # polling a condition (bounded), not a timing assertion


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One host-mode recording of every case; the trace, each case's pid, and the peak
    RM bytes and allocations of one workload run."""
    from tests.standin.standin import build, expected, mounted_driver

    mount = procfs._cgroup2_mount(procfs.CGROUP2)
    if mount is None or not (V1_MEMORY / "cgroup.procs").is_file():
        pytest.skip("needs a cgroup2 mount and a v1 memory hierarchy (a hybrid host)")
    tmp = tmp_path_factory.mktemp("containers")
    kube = tmp / "node"
    _node(kube)
    wl = str(build("workload").workload)
    out = tmp / "trace"
    made: list[Path] = []
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for case in CASES.values():
            parts = Path(ROOT, case.cgroup).parts
            for i in range(1, len(parts) + 1):
                d = (V1_MEMORY if case.v1 else mount).joinpath(*parts[:i])
                if d not in made:
                    d.mkdir()  # the root is this process's: nothing below it exists yet
                    made.append(d)
        os.environ[identity.KUBE_ROOTS_ENV] = KUBE_ROOTS  # the recorder's, inherited
        with mounted_driver(tmp, budget=1 << 30) as dev:
            rec = RecorderProc(record_cmd(out, "--device-dir", str(dev), *standin_driver_args(),
                                          "--kube-root", str(kube), "-d", "300"))
            try:
                rec.wait_ready()
                pids: dict[str, int] = {}
                for key, case in CASES.items():
                    wait = ["--wait"] if case.wait else []
                    cg = (V1_MEMORY if case.v1 else mount) / ROOT / case.cgroup
                    procs[key] = subprocess.Popen(
                        ["/bin/sh", "-c", f'echo $$ > "{cg}/cgroup.procs" && '
                         f'exec "{wl}" "{dev}" {" ".join(wait)}; echo "pid $$"'],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                    pids[key] = procs[key].pid  # the shell execs the workload: one pid
                    if case.wait:
                        assert ready_pid(procs[key]) == pids[key]
                for key, case in CASES.items():
                    if case.wait:
                        wait_for_ioctls_of(out, pids[key])
                for key, p in procs.items():
                    said, _ = p.communicate("go\n" if CASES[key].wait else None, timeout=60)
                    assert p.returncode == 0 and said.endswith("DONE\n"), (key, said)
                rec.proc.send_signal(signal.SIGINT)
                assert rec.wait(timeout=120) == 0, "".join(rec.stderr)
            finally:
                for p in (*procs.values(), rec.proc):
                    if p.poll() is None:
                        p.kill()
                        p.wait()
        # one run's RM memory: each successful memory allocation (not the VA reservation,
        # class NV50_MEMORY_VIRTUAL, nor the dup, which moves no bytes)
        mem = [a for a in expected()["memory_allocations"] if a["status"] == 0
               and a["ioctl"] != "RM_DUP_OBJECT" and a["class"] != 0x50A0]
        # and the GPU memory of a run, each piece once (the summary's held figure):
        # video memory (host memory left out) and the UVM semaphore pool it maps
        gpu = [a["size"] for a in mem if a["class"] == 0x40]
        gpu.append(expected()["semaphore_pool"]["length"])
        yield {"trace": out, "pids": pids, "peak": sum(a["size"] for a in mem),
               "allocations": len(mem), "gpu_peak": sum(gpu), "gpu_pieces": len(gpu)}
    finally:
        os.environ.pop(identity.KUBE_ROOTS_ENV, None)
        _rmdirs(made)


def test_each_process_has_its_exact_container_and_pod(recorded: dict[str, Any]) -> None:
    rows = {r["pid"]: r for r in open_trace(recorded["trace"]).scan("processes")
            .collect().to_dicts()}
    for key, case in CASES.items():
        row = rows[recorded["pids"][key]]
        mine = procfs.cgroup_path(Path("/proc/self/cgroup").read_text())  # v2, unmoved
        assert row["cgroup"] == (mine if case.v1 else f"/{ROOT}/{case.cgroup}"), key
        assert {k: row[k] for k in case.want} == case.want, key


def test_by_pod_totals_are_the_workloads_known_bytes(recorded: dict[str, Any]) -> None:
    """Each run's GPU memory peaks at every successful video-memory allocation of its
    section plus the UVM semaphore pool (all live before the section's frees;
    expected.json): a pod's sum of peaks is that many runs' worth, its pieces that many
    runs' pieces, nothing held at the end."""
    # A host-mode recording also hears the live tests running beside this one: only
    # this test's processes are its truth.
    inp = inputs_from_trace(open_trace(recorded["trace"]))
    ours = pl.col("pid").is_in(list(recorded["pids"].values()))
    inp = dataclasses.replace(inp, tables={n: t.filter(ours) if n in PER_PROCESS else t
                                           for n, t in inp.tables.items()})
    doc = run_reports(inp, ["summary"], ReportOptions(by="pod"))
    pods = {(r["pod_namespace"], r["pod_name"]): r for r in doc["summary"]["by_pod"]}
    peak, allocs = recorded["peak"], recorded["allocations"]
    assert (peak, allocs) == (103 * (1 << 20) + (192 << 10), 7)  # stand-in truth, as read
    want = {("ml", "trainer-0"): 2, ("ml", "eval-0"): 1, ("batch", "oneshot-0"): 1,
            ("ml", "v1-0"): 1, (None, None): 3}  # Docker's, Podman's and the delegated one:
    # in no pod
    gpu, pieces = recorded["gpu_peak"], recorded["gpu_pieces"]
    assert (gpu, pieces) == (104 << 20, 5)  # 2 + 64 + 4 + 32 MiB video memory, 2 MiB pool
    assert {k: (r["sum_of_peaks_bytes"], r["pieces"], r["processes"], r["live_end_bytes"],
                r["rm_layer_live_end_bytes"])
            for k, r in pods.items()} == {k: (n * gpu, n * pieces, n, 0, 0)
                                          for k, n in want.items()}
