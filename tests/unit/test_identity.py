"""Container and pod identity from cgroup paths of each runtime's layout (paths in the
shapes each runtime's documentation shows), and names from a node's files."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import pytest

from gputrace import identity, schema
from gputrace.identity import NONE, Identity, NodeNames, from_cgroup, from_proc_cgroup

CID = "7d8b3b6c8e5a4c9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6b7"
UID = "2f2d9e3e-5c0c-11e9-9b7c-080027b6a4e8"
UID_ = UID.replace("-", "_")


def test_identity_mirrors_the_schema_columns() -> None:
    assert [f.name for f in fields(Identity)] == [c.name for c in schema.IDENTITY_COLUMNS]
    assert schema.PROCESSES.columns[-len(schema.IDENTITY_COLUMNS):] == schema.IDENTITY_COLUMNS


@pytest.mark.parametrize(("path", "want"), [
    # kubelet, cgroupfs driver (docs: kubelet --cgroup-driver=cgroupfs, pod cgroups)
    (f"/kubepods/burstable/pod{UID}/{CID}", Identity(CID, None, UID, "burstable")),
    (f"/kubepods/besteffort/pod{UID}/{CID}", Identity(CID, None, UID, "besteffort")),
    (f"/kubepods/pod{UID}/{CID}", Identity(CID, None, UID, "guaranteed")),
    (f"/kubepods/burstable/pod{UID}/crio-{CID}", Identity(CID, "cri-o", UID, "burstable")),
    # kubelet, systemd driver (containerd, CRI-O, dockershim)
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope", Identity(CID, "containerd", UID, "burstable")),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
     f"crio-{CID}.scope", Identity(CID, "cri-o", UID, "besteffort")),
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope",
     Identity(CID, "docker", UID, "guaranteed")),
    # kind and other nodes with a kubelet --cgroup-root below the slice tree
    (f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
     Identity(CID, "containerd", UID, "besteffort")),
    # a container that made cgroups of its own (systemd in a container): still its own
    (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope",
     Identity(CID, "containerd", UID, "guaranteed")),
    # containerd with runc's cgroupfs manager given a systemd-style path
    (f"/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}",
     Identity(CID, "containerd", UID, "besteffort")),
    (f"/kubepods-pod{UID_}.slice:cri-containerd:{CID}",
     Identity(CID, "containerd", UID, "guaranteed")),
    # Docker (docs: runtime metrics, cgroupfs and systemd drivers)
    (f"/docker/{CID}", Identity(CID, "docker")),
    (f"/system.slice/docker-{CID}.scope", Identity(CID, "docker")),
    # Podman: root, rootless, cgroupfs manager
    (f"/machine.slice/libpod-{CID}.scope", Identity(CID, "podman")),
    (f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope",
     Identity(CID, "podman")),
    (f"/libpod_parent/libpod-{CID}", Identity(CID, "podman")),
    # ctr run: /<containerd namespace>/<id>
    (f"/default/{CID}", Identity(CID, "containerd")),
])
def test_layouts(path: str, want: Identity) -> None:
    assert from_cgroup(path) == want


@pytest.mark.parametrize("path", [
    # monitors: in the pod, but no container
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"crio-conmon-{CID}.scope",
])
def test_conmon_is_no_workload(path: str) -> None:
    assert from_cgroup(path) == Identity(pod_uid=UID, qos_class="burstable")


@pytest.mark.parametrize("path", [
    None, "", "/", "/user.slice/user-1000.slice/session-3.scope", "/system.slice/sshd.service",
    f"/machine.slice/libpod-conmon-{CID}.scope",  # podman's monitor, in no pod
    f"/something/{CID}",  # a bare id not under a pod, docker or ctr: no guess
    f"/kubepods/burstable/pod{UID}",  # the pod itself: no container
    f"/kubepods/burstable/podnot-a-uid/{CID}",
    f"/kubepods/guaranteed/pod{UID}/{CID}",  # no such QoS level
    f"/docker/{CID[:63]}",  # 63 hex
    f"/docker/{CID.upper()}",
    f"/system.slice/docker-{CID}.service",
    f"/k8s.io/{CID}",  # another containerd namespace: could be anything
])
def test_unknown_layouts_give_nothing(path: str | None) -> None:
    assert from_cgroup(path) == NONE


def test_v2_first_then_v1_on_a_hybrid_host() -> None:
    v2_only = f"0::/kubepods/pod{UID}/{CID}\n"
    assert from_proc_cgroup(v2_only).pod_uid == UID
    # hybrid: the unified path says nothing; the memory controller's says the container
    hybrid = ("12:devices:/system.slice/containerd.service\n"
              f"11:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
              "1:name=systemd:/system.slice/containerd.service\n"
              "0::/system.slice/containerd.service\n")
    assert from_proc_cgroup(hybrid) == Identity(CID, None, UID, "besteffort")
    assert identity.proc_cgroup_paths(hybrid)[:2] == [
        "/system.slice/containerd.service", f"/kubepods/besteffort/pod{UID}/{CID}"]
    assert from_proc_cgroup("0::/init.scope\n1:name=systemd:/init.scope\n") == NONE


def _write(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_node_names(tmp_path: Path) -> None:
    pods = tmp_path / "var/log/pods"
    (pods / f"ml_trainer-7c9f_{UID}" / "cuda").mkdir(parents=True)
    (pods / "bad_name_with_underscores_x").mkdir()
    other = "0" * 64
    _write(tmp_path / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / CID
           / "config.json", {"annotations": {"io.kubernetes.cri.container-name": "cuda"}})
    _write(tmp_path / "var/lib/docker/containers" / other / "config.v2.json",
           {"Config": {"Labels": {"io.kubernetes.container.name": "side\x1b[2Jcar"}}})
    nn = NodeNames(tmp_path)
    assert nn.pod(UID) == ("ml", "trainer-7c9f")
    # a bare id under a cgroupfs pod: the runtime whose files hold it names it
    got = nn.named(from_cgroup(f"/kubepods/pod{UID}/{CID}"))
    assert got == Identity(CID, "containerd", UID, "guaranteed", "ml", "trainer-7c9f", "cuda")
    # a name that is not a Kubernetes name is dropped (it came from the host)
    assert nn.container(other) == ("docker", None)
    # a runtime that disagrees with the cgroup's is not this container's
    assert nn.named(from_cgroup(f"/system.slice/docker-{CID}.scope")).container_name is None
    # nothing readable: the uid alone is kept
    lone = "11111111-2222-3333-4444-555555555555"
    assert NodeNames(tmp_path / "nowhere").named(
        Identity("a" * 64, "cri-o", lone, "besteffort")) == Identity(
        "a" * 64, "cri-o", lone, "besteffort")


def test_runtime_files_are_bounded_and_never_followed(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text('{"a": "' + "x" * identity.MAX_JSON_BYTES + '"}')
    assert identity.read_json(big) is None
    (tmp_path / "ok.json").write_text('{"a": 1}')
    assert identity.read_json(tmp_path / "ok.json") == {"a": 1}
    os.symlink(tmp_path / "ok.json", tmp_path / "link.json")
    assert identity.read_json(tmp_path / "link.json") is None
    (tmp_path / "deep.json").write_text("[" * 100_000)
    assert identity.read_json(tmp_path / "deep.json") is None
    assert identity.read_json(tmp_path / "absent.json") is None


def test_pod_log_dir() -> None:
    assert identity.pod_log_dir(f"kube-system_coredns-5d78c9869d-abcde_{UID}") == (
        "kube-system", "coredns-5d78c9869d-abcde", UID)
    assert identity.pod_log_dir(f"ml_a_b_{UID}") is None
    assert identity.pod_log_dir("ml_trainer_not-a-uid") is None
    assert identity.pod_log_dir(f"ml_\x1b[31m_{UID}") is None


def test_paths_seen_from_a_cgroup_namespace() -> None:
    """A recorder in a pod with its own cgroup namespace reads other processes' cgroups
    relative to its own ('/../..' first): the names still say who they are."""
    path = (f"/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope")
    assert from_cgroup(path) == Identity(CID, "containerd", UID, "besteffort")
    assert from_cgroup(f"/../../../kubepods/burstable/pod{UID}/{CID}") == Identity(
        CID, None, UID, "burstable")


@pytest.mark.parametrize("path", [
    # a delegated subtree (a user's, a container's own) copying kubelet's layouts with a
    # victim pod's uid: not under a kubelet root, so no pod and no container
    f"/user.slice/user-1000.slice/user@1000.service/kubepods/besteffort/pod{UID}/{CID}",
    f"/user.slice/x/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}"
    f".slice/cri-containerd-{CID}.scope",
    f"/kubepods/burstable/pod{UID}/{CID}/kubepods/besteffort/pod{UID}/{CID}",
    f"/x/kubepods-pod{UID_}.slice/docker-{CID}.scope",
    f"/../../podA/ctr/kubepods/besteffort/pod{UID}/{CID}",  # below another pod's, in a ns
])
def test_a_pod_is_recognised_only_under_kubelets_roots(path: str) -> None:
    got = from_cgroup(path)
    assert got.pod_uid is None and got.qos_class is None
    assert got.container_id in (None, CID)  # a runtime's own scope name still says its id


def test_kubelets_roots_can_be_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose kubelet runs with another --cgroup-root names its roots."""
    path = f"/custom/kubepods/besteffort/pod{UID}/{CID}"
    assert from_cgroup(path).pod_uid is None
    monkeypatch.setenv(identity.KUBE_ROOTS_ENV, "/custom/kubepods:relative/ignored")
    assert from_cgroup(path) == Identity(CID, None, UID, "besteffort")
    assert identity.kube_roots() == ("/custom/kubepods",)
    assert from_cgroup(f"/kubepods/besteffort/pod{UID}/{CID}").pod_uid is None  # replaced


def _cgroup2() -> Path | None:
    """A writable cgroup v2 mount (root), else None."""
    if os.geteuid() != 0:
        return None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _dev, mnt, kind, *_ = line.split()
        if kind == "cgroup2" and os.access(mnt, os.W_OK):
            return Path(mnt)
    return None


def test_a_real_delegated_subtree_copying_kubelets_layout_is_no_pod(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real cgroup tree: a process moved into `<a subtree>/kubepods/besteffort/pod<uid>/
    <64 hex>` (what a user with a delegated subtree can make) reads, through
    /proc/PID/cgroup, as no pod; the same under kubelet's root reads as that pod."""
    import subprocess
    import sys
    import uuid

    mnt = _cgroup2()
    if mnt is None:
        pytest.skip("needs root and a writable cgroup v2 mount")
    tag = f"gputrace-test-{uuid.uuid4().hex[:8]}"
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    made: list[Path] = []

    def tree(*parts: str) -> Path:
        d = mnt
        for part in parts:
            d = d / part
            if not d.exists():
                d.mkdir()
                made.append(d)
        return d

    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE)  # fmt: skip
    try:
        got = {}
        for where, parts in (("delegated", (tag, "user", "kubepods", "besteffort")),
                             ("kubelet", (tag, "kubepods", "besteffort"))):
            leaf = tree(*parts, f"pod{uid}", cid)
            (leaf / "cgroup.procs").write_text(str(p.pid))
            text = Path(f"/proc/{p.pid}/cgroup").read_text()
            assert f"/pod{uid}/{cid}" in text
            got[where] = from_proc_cgroup(text)
        assert got["delegated"].pod_uid is None and got["delegated"].qos_class is None
        # kubelet's root is /kubepods: the test's own is named as a node would name it
        monkeypatch.setenv(identity.KUBE_ROOTS_ENV, f"/{tag}/kubepods")
        again = from_proc_cgroup(Path(f"/proc/{p.pid}/cgroup").read_text())
        assert (again.pod_uid, again.qos_class) == (uid, "besteffort")
    finally:
        (mnt / "cgroup.procs").write_text(str(p.pid))  # back to the root, then gone
        p.kill()
        p.wait()
        for d in reversed(made):
            d.rmdir()
