"""Every object under ``infra/k8s/`` as the real API server sees it: applied with a server-side dry run (validation,
defaulting and admission, nothing stored), after the namespaces they live in were created for real.

Strimzi's custom resources (``kafka.strimzi.io``: Kafka, KafkaNodePool, KafkaTopic) cannot be validated here: their
CRDs ship with the Strimzi operator, which no package registry this project reaches serves. The test names them
exactly, so a new custom resource without its CRD fails it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

pytestmark = [pytest.mark.kubernetes, pytest.mark.timeout(600)]

MANIFESTS = Path(__file__).resolve().parents[2] / "infra" / "k8s"
CRDS_NOT_OBTAINABLE = {
    "kafka.strimzi.io/v1beta2/Kafka",
    "kafka.strimzi.io/v1beta2/KafkaNodePool",
    "kafka.strimzi.io/v1beta2/KafkaTopic",
}


def manifest_objects() -> list[tuple[str, dict[str, Any]]]:
    """(file, object) for every YAML document under ``infra/k8s/``."""
    found = []
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((str(path.relative_to(MANIFESTS)), document))
    return found


def test_every_manifest_object_passes_a_server_side_dry_run(kubernetes_target: Any) -> None:
    if not kubernetes_target.local:
        pytest.skip("creates namespaces: only on the local control plane")
    api = kube_config.new_client_from_config(config_file=str(kubernetes_target.kubeconfig))
    dynamic = DynamicClient(api)
    objects = manifest_objects()
    assert len(objects) > 40, "the manifests were not found"
    core = client.CoreV1Api(api)
    for _, body in objects:
        if body["kind"] == "Namespace":
            _create_ignoring_exists(lambda body=body: core.create_namespace(body))

    refused, unvalidated = [], set()
    for source, body in objects:
        kind = f"{body['apiVersion']}/{body['kind']}"
        try:
            resource = dynamic.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        except ResourceNotFoundError:
            unvalidated.add(kind)
            continue
        namespace = body.get("metadata", {}).get("namespace") if resource.namespaced else None
        try:
            resource.create(body=body, namespace=namespace, dry_run="All")
        except ApiException as exc:
            if not (body["kind"] == "Namespace" and exc.status == 409):
                refused.append(f"{source}: {kind} {body['metadata'].get('name')}: HTTP {exc.status} {exc.body}")
    assert refused == []
    assert unvalidated == CRDS_NOT_OBTAINABLE


def _create_ignoring_exists(create: Any) -> None:
    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise
