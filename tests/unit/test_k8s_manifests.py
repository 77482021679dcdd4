"""The production manifests in infra/k8s: the kinds they declare, Kafka's shape and Orchard's topics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchard.topics import STANDARD_TOPICS

K8S_DIR = Path(__file__).resolve().parents[2] / "infra" / "k8s"
THIRTY_DAYS_MS = 30 * 24 * 3600 * 1000


def _docs(name: str) -> list[dict[str, Any]]:
    with (K8S_DIR / name).open() as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc is not None]


def _kinds(name: str) -> list[tuple[str, str, str]]:
    return [(doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) for doc in _docs(name)]


def test_every_manifest_declares_the_expected_resources() -> None:
    found = {path.name: _kinds(path.name) for path in sorted(K8S_DIR.glob("*.yaml"))}
    topic = "kafka.strimzi.io/v1beta2", "KafkaTopic"
    assert found == {
        "namespace.yaml": [("v1", "Namespace", "orchard")],
        "kafka.yaml": [
            ("kafka.strimzi.io/v1beta2", "KafkaNodePool", "dual-role"),
            ("kafka.strimzi.io/v1beta2", "Kafka", "orchard"),
        ],
        "topics.yaml": [
            (*topic, name)
            for name in (
                "model-calls",
                "outcomes",
                "scores",
                "samples",
                "policy-versions",
                "rollout-rounds",
                "sandbox-events",
                "dead-letters",
                "trajectories",
            )
        ],
        "minio.yaml": [
            ("v1", "Secret", "orchard-minio"),
            ("v1", "Service", "minio"),
            ("v1", "Service", "minio-headless"),
            ("apps/v1", "StatefulSet", "minio"),
        ],
        "pipeline.yaml": [
            ("v1", "ConfigMap", "orchard-pipeline"),
            ("apps/v1", "Deployment", "assembler"),
            ("apps/v1", "Deployment", "sample-builder"),
            ("apps/v1", "Deployment", "reward-rule-process"),
            ("apps/v1", "Deployment", "policy-trainer"),
            ("v1", "ConfigMap", "orchard-policy-trainer"),
            ("apps/v1", "Deployment", "value-trainer"),
        ],
        "episode-runtime-rbac.yaml": [
            ("v1", "ServiceAccount", "orchard-env"),
            ("rbac.authorization.k8s.io/v1", "Role", "orchard-episode-runtime"),
            ("rbac.authorization.k8s.io/v1", "RoleBinding", "orchard-episode-runtime"),
        ],
    }


@pytest.mark.parametrize("name", ["kafka.yaml", "topics.yaml", "minio.yaml", "pipeline.yaml"])
def test_namespaced_resources_live_in_orchard(name: str) -> None:
    assert {doc["metadata"]["namespace"] for doc in _docs(name)} == {"orchard"}


def test_topics_match_orchards_standard_topics() -> None:
    topics = {
        doc["metadata"]["name"]: (doc["metadata"]["labels"], doc["spec"]["partitions"], doc["spec"]["replicas"])
        for doc in _docs("topics.yaml")
    }
    cluster = {"strimzi.io/cluster": "orchard"}
    assert topics == {
        "model-calls": (cluster, 24, 3),
        "outcomes": (cluster, 12, 3),
        "scores": (cluster, 12, 3),
        "samples": (cluster, 12, 3),
        "policy-versions": (cluster, 1, 3),
        "rollout-rounds": (cluster, 1, 3),
        "sandbox-events": (cluster, 12, 3),
        "dead-letters": (cluster, 3, 3),
        "trajectories": (cluster, 12, 3),
    }
    assert sorted(topics) == sorted(spec.name for spec in STANDARD_TOPICS)


def test_topic_configs_keep_replayable_topics_forever() -> None:
    configs = {doc["metadata"]["name"]: doc["spec"]["config"] for doc in _docs("topics.yaml")}
    forever = {"min.insync.replicas": 2, "retention.ms": -1, "cleanup.policy": "delete"}
    month = {"min.insync.replicas": 2, "retention.ms": THIRTY_DAYS_MS, "cleanup.policy": "delete"}
    assert configs == {
        "model-calls": {**forever, "max.message.bytes": 8 * 1024 * 1024},
        "outcomes": forever,
        "scores": month,
        "samples": month,
        "policy-versions": forever,
        "rollout-rounds": forever,
        "sandbox-events": month,
        "dead-letters": month,
        "trajectories": {**month, "max.message.bytes": 8 * 1024 * 1024},
    }


def test_kafka_runs_kraft_with_three_combined_persistent_nodes() -> None:
    pool, kafka = _docs("kafka.yaml")
    assert (pool["metadata"]["labels"], pool["spec"]["replicas"], sorted(pool["spec"]["roles"])) == (
        {"strimzi.io/cluster": "orchard"},
        3,
        ["broker", "controller"],
    )
    assert pool["spec"]["storage"] == {
        "type": "jbod",
        "volumes": [
            {"id": 0, "type": "persistent-claim", "size": "500Gi", "deleteClaim": False, "kraftMetadata": "shared"}
        ],
    }
    assert kafka["metadata"]["annotations"] == {"strimzi.io/node-pools": "enabled", "strimzi.io/kraft": "enabled"}
    spec = kafka["spec"]["kafka"]
    assert (spec["version"], spec["metadataVersion"]) == ("4.1.1", "4.1-IV1")
    durability = {key: spec["config"][key] for key in ("default.replication.factor", "min.insync.replicas")}
    assert durability == {"default.replication.factor": 3, "min.insync.replicas": 2}
    assert (spec["config"]["auto.create.topics.enable"], spec["config"]["unclean.leader.election.enable"]) == (
        False,
        False,
    )
    assert kafka["spec"]["entityOperator"] == {"topicOperator": {}, "userOperator": {}}


def test_minio_reads_its_credentials_from_the_secret() -> None:
    secret, service, _, statefulset = _docs("minio.yaml")
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in container["env"]}
    assert sorted(secret["stringData"]) == ["access-key", "secret-key"]
    assert env == {
        "MINIO_ROOT_USER": {"name": "orchard-minio", "key": "access-key"},
        "MINIO_ROOT_PASSWORD": {"name": "orchard-minio", "key": "secret-key"},
    }
    assert [(port["name"], port["port"]) for port in service["spec"]["ports"]] == [("s3", 9000), ("console", 9001)]
    assert statefulset["spec"]["volumeClaimTemplates"][0]["spec"]["resources"] == {"requests": {"storage": "1Ti"}}


def test_pipeline_pods_run_registered_consumers_and_valid_trainer_configs() -> None:
    from consumers.builtin import build_processor
    from trainers.config import PolicyTrainerConfig

    docs = {doc["metadata"]["name"]: doc for doc in _docs("pipeline.yaml")}
    for name in ("assembler", "sample-builder", "reward-rule-process"):
        [container] = docs[name]["spec"]["template"]["spec"]["containers"]
        consumer = container["command"][-1].split("consumer run ")[1].split()[0]
        assert build_processor(consumer).name  # a name `orchard consumer run` knows
        assert '--instance "$POD_NAME"' in container["command"][-1]  # static membership: a restart keeps partitions
    trainer_yaml = yaml.safe_load(docs["orchard-policy-trainer"]["data"]["trainer.yaml"])
    assert PolicyTrainerConfig.model_validate(trainer_yaml).loss.kind == "rl"
    for name in ("policy-trainer", "value-trainer"):
        [container] = docs[name]["spec"]["template"]["spec"]["containers"]
        secrets = {item["name"]: item["valueFrom"]["secretKeyRef"]["name"] for item in container["env"]}
        assert secrets == {"ORCHARD_STORE__ACCESS_KEY": "orchard-minio", "ORCHARD_STORE__SECRET_KEY": "orchard-minio"}
