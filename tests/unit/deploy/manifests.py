"""Render the Kustomize tree under deploy/kubernetes and check what it renders.

`render` runs `kubectl kustomize` (kubectl's built-in Kustomize); `validate` checks one
object against the Kubernetes schemas of `KUBERNETES_VERSIONS` (kubernetes-validate, strict:
unknown fields are errors) or, for the two custom resources, against the CRD schemas
vendored in deploy/kubernetes/schemas/; `workload_problems` lists what a pod template lacks
(security context, probes, resources). Each check returns the problems it found, so a
test can show them all at once and a test can feed it a broken manifest.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
KUBERNETES = ROOT / "deploy" / "kubernetes"
SCHEMAS = KUBERNETES / "schemas"
OVERLAYS = ("cpu", "gpu", "cluster", "gateway")
# The Kubernetes API versions the manifests are checked against: the oldest docs/deploy.md
# supports and the newest kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.27", "1.37")
# Custom resources → the vendored openAPIV3Schema of their CRD.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor",
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_v1alpha1_scaledobject",
    (
        "inference.networking.k8s.io/v1",
        "InferencePool",
    ): "inference.networking.k8s.io_v1_inferencepool",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_v1_httproute",
}
# Pods that talk to the Kubernetes API and so mount a service-account token: the Gateway API
# Inference Extension's endpoint picker watches its InferencePool and the pool's pods.
API_CLIENTS = {"inferflux-epp"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod"}

Manifest = dict[str, Any]  # Any: a parsed Kubernetes object, checked by the schemas


def kubectl() -> str:
    """The kubectl binary; a missing one fails the test with what to install."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not on PATH: tests/unit/deploy render the Kustomize overlays with "
            "`kubectl kustomize` (kubectl >= 1.27, https://kubernetes.io/docs/tasks/tools/)"
        )
    return path


def render(directory: Path) -> list[Manifest]:
    """`kubectl kustomize DIRECTORY` as a list of objects; a failed render fails the test."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj["kind"] == kind]


def server(objects: list[Manifest]) -> Manifest:
    """The InferFlux server Deployment (an overlay may add a router, Redis, an EPP)."""
    (found,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == "inferflux"]
    return found


def runs_inferflux(container: dict[str, Any]) -> bool:
    """A container of the InferFlux image (the server or `inferflux router`)."""
    return str(container.get("image", "")).split(":")[0].rsplit("/", 1)[-1] == "inferflux"


def one(objects: list[Manifest], kind: str) -> Manifest:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# -- schema validation -------------------------------------------------------------------


def validate(obj: Manifest) -> list[str]:
    """Schema errors of one rendered object (empty when it is valid)."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if key in CRD_SCHEMAS:
        validator = jsonschema.Draft7Validator(crd_schema(CRD_SCHEMAS[key]))
        return [
            f"{name}: {_where(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)
        ]
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(
                f"{name} (Kubernetes {version}): {_where(exc.absolute_path)}: {exc.message}"
            )
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{name}: {exc.message} (vendor its CRD schema in {SCHEMAS})")
    return problems


def crd_schema(stem: str) -> dict[str, Any]:
    """A vendored openAPIV3Schema, made strict the way the API server's strict field
    validation is: an object schema with `properties` accepts no other field, unless it says
    `x-kubernetes-preserve-unknown-fields` or has `additionalProperties` of its own."""
    raw = yaml.safe_load((SCHEMAS / f"{stem}.schema.yaml").read_text(encoding="utf-8"))
    schema: dict[str, Any] = copy.deepcopy(raw)
    for node in _schema_nodes(schema):
        open_ended = (
            node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node
        )
        if "properties" in node and not open_ended:
            node["additionalProperties"] = False
    # apiVersion, kind and metadata are the API server's, typed loosely in every CRD.
    schema["properties"]["metadata"] = {"type": "object"}
    return schema


def _schema_nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _schema_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schema_nodes(value)


def _where(path: Any) -> str:
    return ".".join(str(p) for p in path) or "(root)"


# -- workload checks ---------------------------------------------------------------------


def pod_spec(obj: Manifest) -> dict[str, Any] | None:
    """The pod spec of a workload object, None for anything else."""
    if obj["kind"] not in WORKLOAD_KINDS:
        return None
    if obj["kind"] == "Pod":
        spec: dict[str, Any] = obj["spec"]
        return spec
    template: dict[str, Any] = obj["spec"]["template"]["spec"]
    return template


def workload_problems(obj: Manifest) -> list[str]:
    """What the workload's pod template lacks: every rule the deployment guide promises."""
    spec = pod_spec(obj)
    if spec is None:
        return []
    name = f"{obj['kind']}/{obj['metadata']['name']}"
    inferflux = any(runs_inferflux(c) for c in spec.get("containers", []))
    api_client = obj["metadata"]["name"] in API_CLIENTS
    problems = [f"{name}: {p}" for p in _pod_problems(spec, inferflux, api_client)]
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    for container in containers:
        where = f"{name} container {container.get('name')}"
        problems += [f"{where}: {p}" for p in _container_problems(container)]
    for container in spec.get("containers", []):
        where = f"{name} container {container.get('name')}"
        problems += [f"{where}: {p}" for p in _probe_problems(container)]
    return problems


def _pod_problems(spec: dict[str, Any], inferflux: bool, api_client: bool) -> list[str]:
    problems = []
    context = spec.get("securityContext", {})
    if context.get("runAsNonRoot") is not True:
        problems.append("securityContext.runAsNonRoot is not true")
    if context.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        problems.append("securityContext.seccompProfile.type is not RuntimeDefault")
    if spec.get("automountServiceAccountToken") is not api_client:
        problems.append(f"automountServiceAccountToken is not {str(api_client).lower()}")
    if spec.get("enableServiceLinks") is not False:
        problems.append("enableServiceLinks is not false (INFERFLUX_PORT would be tcp://…)")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(f"{flag} is set")
    if any("hostPath" in volume for volume in spec.get("volumes", [])):
        problems.append("a hostPath volume (not allowed by the restricted Pod Security Standard)")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if inferflux and grace < 60:
        problems.append(
            f"terminationGracePeriodSeconds {grace} < 60 leaves streams no time to drain"
        )
    return problems


def _container_problems(container: dict[str, Any]) -> list[str]:
    problems = []
    context = container.get("securityContext", {})
    if context.get("allowPrivilegeEscalation") is not False:
        problems.append("securityContext.allowPrivilegeEscalation is not false")
    if context.get("privileged"):
        problems.append("securityContext.privileged is set")
    if context.get("readOnlyRootFilesystem") is not True:
        problems.append("securityContext.readOnlyRootFilesystem is not true")
    if context.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("securityContext.capabilities.drop is not [ALL]")
    if context.get("capabilities", {}).get("add"):
        problems.append("securityContext.capabilities.add is set")
    user = context.get("runAsUser")
    if user is not None and user == 0:
        problems.append("securityContext.runAsUser is 0")
    resources = container.get("resources", {})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    for resource in ("cpu", "memory"):
        if resource not in limits:
            problems.append(f"resources.limits.{resource} is missing")
        elif str(requests.get(resource)) != str(limits[resource]):
            problems.append(f"resources.requests.{resource} != limits.{resource}")
    return problems


def _probe_problems(container: dict[str, Any]) -> list[str]:
    """InferFlux containers: the health routes and a preStop that lets streams drain.
    Others (Redis, the endpoint picker): a readiness and a liveness probe of any kind."""
    if not runs_inferflux(container):
        return [
            f"{probe} is missing"
            for probe in ("readinessProbe", "livenessProbe")
            if not container.get(probe)
        ]
    wanted = {"startupProbe": "/livez", "livenessProbe": "/livez", "readinessProbe": "/readyz"}
    problems = []
    for probe, path in wanted.items():
        got = container.get(probe, {}).get("httpGet", {}).get("path")
        if got != path:
            problems.append(f"{probe} is not an httpGet on {path} (got {got!r})")
    if "exec" not in container.get("lifecycle", {}).get("preStop", {}):
        problems.append("lifecycle.preStop is missing (the endpoint must leave before SIGTERM)")
    return problems
