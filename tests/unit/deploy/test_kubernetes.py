"""deploy/kubernetes: every overlay renders, every object validates against the Kubernetes
schemas (custom resources against their vendored CRD schemas), every workload keeps its
security context, probes and resources, and the pieces refer to each other correctly."""

from __future__ import annotations

import copy
import inspect
import re
import shutil
from pathlib import Path

import pytest
import yaml

from inferflux.config.loader import ENV_ALIASES, SECRET_KEYS, load_settings
from inferflux.observability import metrics, worker_metrics
from tests.unit.deploy.manifests import (
    KUBERNETES,
    OVERLAYS,
    Manifest,
    by_kind,
    crd_schema,
    one,
    render,
    server,
    validate,
    workload_problems,
)

QUEUE_METRIC = "inferflux_scheduler_queue_depth"


def _metrics_source() -> str:
    """The source of every module that defines a Prometheus metric."""
    return inspect.getsource(metrics) + inspect.getsource(worker_metrics)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, list[Manifest]]:
    """Each overlay, the base, and the cpu overlay switched to KEDA the way docs/deploy.md
    says (one line of its kustomization.yaml), rendered from a copy of the tree."""
    out = {name: render(KUBERNETES / "overlays" / name) for name in OVERLAYS}
    out["base"] = render(KUBERNETES / "base")
    tree = tmp_path_factory.mktemp("kubernetes") / "kubernetes"
    shutil.copytree(KUBERNETES, tree)
    kustomization = tree / "overlays" / "cpu" / "kustomization.yaml"
    text = kustomization.read_text()
    assert "components/autoscaling-hpa" in text
    kustomization.write_text(text.replace("autoscaling-hpa", "autoscaling-keda"))
    out["cpu+keda"] = render(tree / "overlays" / "cpu")
    return out


def test_the_overlays_render_what_the_docs_promise(rendered):
    for name in (*OVERLAYS, "cpu+keda"):
        kinds = {obj["kind"] for obj in rendered[name]}
        assert {
            "Namespace",
            "ServiceAccount",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "ServiceMonitor",
        } <= kinds, name
        autoscaler = "ScaledObject" if name == "cpu+keda" else "HorizontalPodAutoscaler"
        assert autoscaler in kinds, name
        assert not {"HorizontalPodAutoscaler", "ScaledObject"} <= kinds, "two autoscalers"
        namespaced = [obj for obj in rendered[name] if obj["kind"] != "Namespace"]
        assert {obj["metadata"].get("namespace") for obj in namespaced} == {"inferflux"}, name
    assert "PersistentVolumeClaim" in {obj["kind"] for obj in rendered["gpu"]}


def test_every_rendered_object_validates_against_its_schema(rendered):
    problems = [p for objects in rendered.values() for obj in objects for p in validate(obj)]
    assert problems == []


def test_validation_catches_a_typo_in_a_core_object_and_in_a_custom_resource(rendered):
    deployment = copy.deepcopy(server(rendered["cpu"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    assert any("readinesProbe" in p for p in validate(deployment))
    monitor = copy.deepcopy(one(rendered["cpu"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    assert any("intervall" in p for p in validate(monitor))
    scaled = copy.deepcopy(one(rendered["cpu+keda"], "ScaledObject"))
    scaled["spec"]["minReplicaCount"] = "two"
    assert any("minReplicaCount" in p for p in validate(scaled))
    pool = copy.deepcopy(one(rendered["gateway"], "InferencePool"))
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    assert any("targetPort" in p for p in validate(pool))
    route = copy.deepcopy(one(rendered["gateway"], "HTTPRoute"))
    route["spec"]["rules"][0]["backendRefs"][0]["nmae"] = "x"
    assert any("nmae" in p for p in validate(route))


def test_the_vendored_crd_schemas_name_their_source_and_license():
    for path in sorted((KUBERNETES / "schemas").glob("*.schema.yaml")):
        header = path.read_text(encoding="utf-8").split("\n", 6)[:6]
        assert any(line.startswith("# Source: https://github.com/") for line in header), path
        assert any(line.startswith("# Commit: ") for line in header), path
        assert any(line.startswith("# License: Apache-2.0") for line in header), path
        assert crd_schema(path.name.removesuffix(".schema.yaml"))["type"] == "object"


def test_every_workload_keeps_security_context_probes_and_resources(rendered):
    problems = [
        p for objects in rendered.values() for obj in objects for p in workload_problems(obj)
    ]
    assert problems == []
    assert all(by_kind(objects, "Deployment") for objects in rendered.values())


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (("containers", 0, "readinessProbe"), "readinessProbe is not an httpGet on /readyz"),
        (("containers", 0, "startupProbe"), "startupProbe is not an httpGet on /livez"),
        (("containers", 0, "securityContext", "readOnlyRootFilesystem"), "readOnlyRootFilesystem"),
        (("containers", 0, "resources", "requests", "cpu"), "requests.cpu != limits.cpu"),
        (("securityContext", "seccompProfile"), "seccompProfile.type is not RuntimeDefault"),
        (("enableServiceLinks",), "enableServiceLinks is not false"),
        (("containers", 0, "livenessProbe"), "livenessProbe is not an httpGet on /livez"),
        (("containers", 0, "lifecycle"), "lifecycle.preStop is missing"),
        (("containers", 0, "securityContext", "capabilities"), "capabilities.drop is not [ALL]"),
        (("securityContext", "runAsNonRoot"), "runAsNonRoot is not true"),
        (("containers", 0, "resources", "limits", "memory"), "limits.memory is missing"),
    ],
)
def test_a_workload_missing_a_setting_is_reported(rendered, path, expected):
    deployment = copy.deepcopy(server(rendered["cpu"]))
    node = deployment["spec"]["template"]["spec"]
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    assert any(expected in p for p in workload_problems(deployment)), workload_problems(deployment)


def test_secrets_are_referenced_never_written(rendered):
    for name, objects in rendered.items():
        assert by_kind(objects, "Secret") == [], name
        container = server(objects)["spec"]["template"]["spec"]["containers"][0]
        env = {item["name"]: item for item in container["env"]}
        secret_env = {n for n, key in ENV_ALIASES.items() if key in SECRET_KEYS}
        for var in secret_env & env.keys():
            assert "value" not in env[var], f"{name}: {var} has a literal value"
            assert env[var]["valueFrom"]["secretKeyRef"]["name"] == "inferflux-secrets"
        assert {"INFERFLUX_POLICY_PASSPHRASE", "INFERFLUX_AUTH_PEPPER"} <= env.keys()


def test_the_guide_creates_the_secret_keys_the_pods_read(rendered):
    guide = (KUBERNETES.parents[1] / "docs" / "deploy.md").read_text()
    command = re.search(r"create secret generic inferflux-secrets((?:.*\\\n)+.*)", guide)
    assert command is not None, "the guide no longer creates inferflux-secrets"
    created = set(re.findall(r"--from-literal=([a-z-]+)=", command.group(1)))
    container = server(rendered["cpu"])["spec"]["template"]["spec"]["containers"][0]
    refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"]
            if "secretKeyRef" in e.get("valueFrom", {})]  # fmt: skip
    assert {ref["key"] for ref in refs if not ref.get("optional")} == created
    for optional in (ref["key"] for ref in refs if ref.get("optional")):
        assert f"--from-literal={optional}=" in guide, f"the guide never shows {optional}"


def test_the_server_yaml_is_a_valid_inferflux_config(rendered, tmp_path):
    """The ConfigMap's server.yaml loads with the real settings schema, with the pod's
    environment (the secrets stand-ins, n_threads from the CPU limit)."""
    for name in ("cpu", "gpu"):
        config = one(rendered[name], "ConfigMap")["data"]["server.yaml"]
        (tmp_path / "server.yaml").write_text(config)
        container = server(rendered[name])["spec"]["template"]["spec"]["containers"][0]
        env = {
            e["name"]: e.get("value", "stand-in-secret-value")
            for e in container["env"]
            if not e.get("valueFrom", {}).get("secretKeyRef", {}).get("optional")
        }
        env["INFERFLUX_RUNTIME__N_THREADS"] = container["resources"]["limits"]["cpu"]
        settings = load_settings(tmp_path / "server.yaml", env=env)
        assert settings.server.host == "0.0.0.0"
        assert settings.server.port == container["ports"][0]["containerPort"]
        assert settings.registry.models_dir == "/models"
        assert settings.auth.api_keys, "authentication must be on in a cluster"
        assert settings.runtime.n_gpu_layers == (-1 if name == "gpu" else 0)
        mounts = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        for path in (settings.auth.policy_store, settings.audit.path):
            assert path is not None and str(Path(path).parent) in mounts, path


def test_the_service_monitor_and_network_policy_reach_the_pods(rendered):
    objects = rendered["cpu"]
    deployment, service = server(objects), one(objects, "Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(objects, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= service_ports
    assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}
    policy = one(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert allowed == service_ports
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_the_autoscalers_scale_the_deployment_on_the_real_queue_metric(rendered):
    assert f'"{QUEUE_METRIC}"' in _metrics_source(), "the metric was renamed"
    hpa = one(rendered["cpu"], "HorizontalPodAutoscaler")
    scaled = one(rendered["cpu+keda"], "ScaledObject")
    for objects, target in ((rendered["cpu"], hpa), (rendered["cpu+keda"], scaled)):
        assert target["spec"]["scaleTargetRef"]["name"] == server(objects)["metadata"]["name"]
        assert "replicas" not in server(objects)["spec"], "the autoscaler owns replicas"
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == QUEUE_METRIC
    trigger = scaled["spec"]["triggers"][0]
    assert QUEUE_METRIC in trigger["metadata"]["query"]
    assert 'namespace="inferflux"' in trigger["metadata"]["query"]
    assert (
        trigger["metadata"]["threshold"]
        == hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"]
    )
    assert scaled["spec"]["minReplicaCount"] == hpa["spec"]["minReplicas"]
    adapter = yaml.safe_load(
        (KUBERNETES / "autoscaling" / "prometheus-adapter-values.yaml").read_text()
    )
    (rule,) = adapter["rules"]["custom"]
    assert QUEUE_METRIC in rule["seriesQuery"] and rule["name"]["as"] == QUEUE_METRIC


def test_the_gpu_overlay_asks_for_a_gpu_and_shares_its_models(rendered):
    spec = server(rendered["gpu"])["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["image"] == "inferflux:cuda"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    (models,) = [v for v in spec["volumes"] if v["name"] == "models"]
    assert models == {"name": "models", "persistentVolumeClaim": {"claimName": "inferflux-models"}}
    assert one(rendered["gpu"], "PersistentVolumeClaim")["metadata"]["name"] == "inferflux-models"
    assert (
        server(rendered["cpu"])["spec"]["template"]["spec"]["containers"][0]["image"]
        == "inferflux:cpu"
    )


def test_the_own_overlay_of_the_guide_replaces_the_bootstrap_digest(tmp_path):
    """docs/deploy.md, "Deploy the cpu overlay" step 3, as written there: the overlay's
    kustomization.yaml is taken from the guide's heredoc."""
    guide = (KUBERNETES.parents[1] / "docs" / "deploy.md").read_text()
    match = re.search(
        r"cat > deploy/kubernetes/overlays/mine/kustomization.yaml <<'EOF'\n(.*?)\nEOF\n",
        guide,
        re.DOTALL,
    )
    assert match is not None, "the guide no longer shows the overlay"
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, tree)
    mine = tree / "overlays" / "mine"
    mine.mkdir()
    (mine / "kustomization.yaml").write_text(match.group(1))
    digest = "ab" * 32
    config = (KUBERNETES / "base" / "server.yaml").read_text()
    (mine / "server.yaml").write_text(re.sub("0{64}", digest, config))
    objects = render(mine)
    configmap = one(objects, "ConfigMap")
    assert digest in configmap["data"]["server.yaml"]
    volumes = server(objects)["spec"]["template"]["spec"]["volumes"]
    (config_volume,) = [v for v in volumes if v["name"] == "config"]
    assert config_volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert [p for obj in objects for p in validate(obj) + workload_problems(obj)] == []


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def _pod_labels(deployment: Manifest) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_cluster_overlay_wires_router_replicas_and_redis(rendered, tmp_path):
    """overlays/cluster: the router finds the InferFlux pods through the headless Service,
    both it and the pods use the overlay's Redis, and every URL comes from the Secret."""
    objects = rendered["cluster"]
    deployments = {d["metadata"]["name"]: d for d in by_kind(objects, "Deployment")}
    assert set(deployments) == {"inferflux", "inferflux-router", "inferflux-redis"}
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    replicas = services["inferflux-replicas"]
    assert replicas["spec"]["clusterIP"] == "None"
    assert _labels_match(replicas["spec"]["selector"], _pod_labels(deployments["inferflux"]))
    assert not _labels_match(
        replicas["spec"]["selector"], _pod_labels(deployments["inferflux-router"])
    ), "the router must not route to itself"
    for name in ("inferflux-router", "inferflux-redis"):
        assert _labels_match(services[name]["spec"]["selector"], _pod_labels(deployments[name]))

    config = {c["metadata"]["name"].rsplit("-", 1)[0]: c for c in by_kind(objects, "ConfigMap")}
    router_yaml = yaml.safe_load(config["inferflux-router-config"]["data"]["router.yaml"])
    port = replicas["spec"]["ports"][0]["port"]
    assert router_yaml["router"]["replica_dns"] == f"inferflux-replicas:{port}"
    router_env = {"INFERFLUX_ROUTER__REDIS_URL": "redis://:stand-in@inferflux-redis:6379/0"}
    (tmp_path / "router.yaml").write_text(config["inferflux-router-config"]["data"]["router.yaml"])
    settings = load_settings(tmp_path / "router.yaml", env=router_env).router
    assert settings.replica_dns == f"http://inferflux-replicas:{port}" and not settings.replicas
    assert settings.host == "0.0.0.0" and settings.redis_url is not None
    server_yaml = yaml.safe_load(config["inferflux-config"]["data"]["server.yaml"])
    assert settings.shutdown_grace_s >= server_yaml["server"]["shutdown_grace_s"]
    router = deployments["inferflux-router"]["spec"]["template"]["spec"]
    (volume,) = [v for v in router["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == config["inferflux-router-config"]["metadata"]["name"]
    container = router["containers"][0]
    assert container["args"][0] == "router"
    assert container["ports"][0]["containerPort"] == router_yaml["router"]["port"]

    def secret_keys(deployment: Manifest) -> dict[str, str]:
        env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        return {
            e["name"]: e["valueFrom"]["secretKeyRef"]["key"]
            for e in env
            if "secretKeyRef" in e.get("valueFrom", {})
        }

    assert secret_keys(deployments["inferflux"])["INFERFLUX_REDIS_URL"] == "redis-url"
    assert secret_keys(deployments["inferflux-router"])["INFERFLUX_ROUTER__REDIS_URL"] == (
        "redis-url"
    )
    assert secret_keys(deployments["inferflux-redis"])["REDIS_PASSWORD"] == "redis-password"
    redis = deployments["inferflux-redis"]["spec"]["template"]["spec"]["containers"][0]
    assert "$REDIS_PASSWORD" not in " ".join(redis.get("command", [])), "password in argv"
    assert "requirepass" in redis["args"][0] and "redis-server -" in redis["args"][0]


def test_the_cluster_network_policies_open_only_what_the_overlay_uses(rendered):
    objects = rendered["cluster"]
    policies = {p["metadata"]["name"]: p for p in by_kind(objects, "NetworkPolicy")}
    deployments = {d["metadata"]["name"]: d for d in by_kind(objects, "Deployment")}
    to_redis = policies["inferflux-to-redis"]["spec"]
    assert _labels_match(
        to_redis["podSelector"]["matchLabels"], _pod_labels(deployments["inferflux"])
    )
    redis = policies["inferflux-redis"]["spec"]
    assert redis["egress"] == []
    allowed = [peer["podSelector"]["matchLabels"] for peer in redis["ingress"][0]["from"]]
    assert {"app.kubernetes.io/name": "inferflux"} in allowed
    assert {"app.kubernetes.io/name": "inferflux-router"} in allowed
    router_egress = policies["inferflux-router"]["spec"]["egress"]
    reached = {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        for rule in router_egress
        for peer in rule.get("to", [])
    }
    assert reached == {"inferflux", "inferflux-redis"}


def test_the_gateway_overlay_pools_the_server_pods_for_the_endpoint_picker(rendered):
    """overlays/gateway: the InferencePool selects the server pods on their API port, its
    EPP exists, reads metrics InferFlux really exports, and the HTTPRoute targets the pool."""
    objects = rendered["gateway"]
    pool = one(objects, "InferencePool")
    deployment = server(objects)
    assert _labels_match(pool["spec"]["selector"]["matchLabels"], _pod_labels(deployment))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [
        container["ports"][0]["containerPort"]
    ]
    epp_ref = pool["spec"]["endpointPickerRef"]
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    epp_service = services[epp_ref["name"]]
    assert epp_ref["port"]["number"] in {p["port"] for p in epp_service["spec"]["ports"]}
    (epp,) = [d for d in by_kind(objects, "Deployment") if d["metadata"]["name"] == epp_ref["name"]]
    assert _labels_match(epp_service["spec"]["selector"], _pod_labels(epp))
    args = dict(
        a.removeprefix("--").split("=", 1)
        for a in epp["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    assert args["pool-name"] == pool["metadata"]["name"]
    source = _metrics_source()
    for flag in (
        "total-queued-requests-metric",
        "total-running-requests-metric",
        "kv-cache-usage-percentage-metric",
    ):
        assert f'"{args[flag]}"' in source, f"{flag}: InferFlux exports no {args[flag]}"
    (rule,) = one(objects, "HTTPRoute")["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool["metadata"]["name"],
    )
    binding = one(objects, "RoleBinding")
    assert binding["subjects"][0]["name"] == epp["spec"]["template"]["spec"]["serviceAccountName"]
