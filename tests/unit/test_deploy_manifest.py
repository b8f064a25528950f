"""docs/daemonset.yaml, the DaemonSet docs/deploy.md describes: every document valid
against the Kubernetes API schema (kubernetes-validate's bundled schemas, offline, strict:
no field the API does not know), its `gputrace record` arguments options `record` has,
and the host paths the recorder reads for names mounted where `--kube-root` says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gputrace import identity
from gputrace.record import procfs

MANIFEST = Path(__file__).resolve().parents[2] / "docs" / "daemonset.yaml"
KUBERNETES = "1.30"
"""The oldest Kubernetes release the manifest is checked against (still supported by
the major clouds when written); later releases only add fields."""


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def _recorder() -> dict[str, Any]:
    ds = next(d for d in documents() if d["kind"] == "DaemonSet")
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    (c,) = spec["containers"]
    assert c["securityContext"]["privileged"] is True
    return {"pod": spec, "container": c}


@pytest.mark.parametrize("version", [KUBERNETES, "1.33"])
def test_manifest_is_valid_kubernetes(version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    docs = documents()
    assert [d["kind"] for d in docs] == ["Namespace", "DaemonSet"]
    for d in docs:
        kv.validate(d, version, strict=True)  # raises on any error


def test_validation_would_catch_a_mistake() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    ds = next(d for d in documents() if d["kind"] == "DaemonSet")
    ds["spec"]["template"]["spec"]["hostPid"] = True  # misspelt: not a field
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, KUBERNETES, strict=True)


def test_recorder_arguments_are_record_options() -> None:
    import typer

    from gputrace.cli import app, register

    register(("record",))
    cmd = typer.main.get_command(app).get_command(None, "record")  # type: ignore[attr-defined]
    known = {o for p in cmd.params for o in p.opts}
    c = _recorder()["container"]
    assert c["command"] == ["gputrace", "record"]
    flags = [a for a in c["args"] if a.startswith("-")]
    assert flags and set(flags) <= known, set(flags) - known
    args = c["args"]
    assert args[args.index("--freeze-on") + 1] == "oom"  # the flight recorder
    assert args[args.index("--kube-root") + 1] == "/host"


def test_what_the_recorder_reads_under_kube_root_is_mounted() -> None:
    r = _recorder()
    mounts = {m["mountPath"]: m for m in r["container"]["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in r["pod"]["volumes"]}
    root = Path("/host")
    wanted = [root / "var/log/pods", root / procfs.CGROUP2.relative_to("/"),
              *(f.parent.parent for _rt, f, _k in identity.container_files(root, "ID"))]
    for want in wanted:
        # the mount that holds it, and the host path it is bound to
        m = next((mp for mp in mounts if want == Path(mp) or Path(mp) in want.parents), None)
        assert m is not None, f"{want} is not mounted"
        host = Path(paths[mounts[m]["name"]])
        assert Path("/") / want.relative_to(root) == host / want.relative_to(m), want
        assert mounts[m].get("readOnly") is True, want
    assert paths[mounts["/dev"]["name"]] == "/dev"  # /dev/nvidia*
