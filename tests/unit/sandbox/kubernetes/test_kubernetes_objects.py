"""The Kubernetes runtime's objects, checked as the API server would receive them.

Three kinds of checks, and what each is evidence of:

1. ``render_episode_objects``: the Secret, NetworkPolicy and Pod serialised through the official client
   (``ApiClient().sanitize_for_serialization``), compared as whole subtrees. Evidence of what is sent.
2. ``KubernetesRuntime`` against fake ``CoreV1Api``/``NetworkingV1Api`` objects that record calls: the order and
   shape of requests (create, adopt, wait, clean up, delete, reap). Evidence of request shapes only, never that the
   runtime works against a cluster: that is ``tests/integration/test_kubernetes_runtime.py`` (needs KUBECONFIG).
3. The exec wrapper and file-operation scripts, run by this machine's ``/bin/sh`` through a stream that executes
   the argv locally instead of in a pod. Evidence that the shell side (stdin bounding, timeout, env, cwd, find
   output parsing) is right; not of the WebSocket transport.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from orchard.sandbox import FileEntry, Limits, SandboxSpec
from orchard.sandbox.exceptions import (
    InvalidSandboxRequestError,
    PathEscapeError,
    SandboxExistsError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
)
from orchard.sandbox.kubernetes.commands import exec_argv, workspace_path
from orchard.sandbox.kubernetes.objects import (
    ANNOTATION_EXPIRES_AT,
    ANNOTATION_SPEC,
    KubernetesRuntimeConfig,
    ProxyEgress,
    Toleration,
    label_value,
    render_episode_objects,
)
from orchard.sandbox.kubernetes.runtime import (
    KubernetesRuntime,
    KubernetesRuntimeError,
    KubernetesSandbox,
    KubernetesStartError,
)
from orchard.sandbox.kubernetes.streams import exit_code_of

NOW = 1_800_000_000.0
PROXY_LABELS = {"app.kubernetes.io/name": "orchard-proxy"}
LABELS = {
    "orchard.dev/run": "run-2026-11",
    "orchard.dev/episode": "ep-7",
    "orchard.dev/task": "django__django-11099",
    "orchard.dev/sandbox": "sb-7",
    "app.kubernetes.io/managed-by": "orchard",
    "app.kubernetes.io/component": "episode-sandbox",
}
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def make_config(**overrides: Any) -> KubernetesRuntimeConfig:
    values: dict[str, Any] = {
        "proxy": ProxyEgress(port=8000, pod_selector=PROXY_LABELS),
        "default_image": "ghcr.io/orchard/swe-task:1",
    }
    return KubernetesRuntimeConfig(**{**values, **overrides})


def make_spec(**overrides: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "sandbox_id": "sb-7",
        "run_id": "run-2026-11",
        "episode_id": "ep-7",
        "task_id": "django__django-11099",
        "limits": Limits(cpus=1.5, memory_mb=3072, disk_mb=8192),
        "ttl_s": 900.5,
        "env": {"OPENAI_API_KEY": "tok-episode-7", "PYTHONUNBUFFERED": "1"},
        "proxy_url": "http://orchard-proxy.orchard.svc:8000/v1",
    }
    return SandboxSpec(**{**values, **overrides})


def serialised(spec: SandboxSpec | None = None, config: KubernetesRuntimeConfig | None = None) -> dict[str, Any]:
    objects = render_episode_objects(spec or make_spec(), config or make_config(), now=NOW)
    api = client.ApiClient()
    return {
        "secret": api.sanitize_for_serialization(objects.secret),
        "policy": api.sanitize_for_serialization(objects.network_policy),
        "pod": api.sanitize_for_serialization(objects.pod),
    }


# --- 1. rendered objects ------------------------------------------------------------------------------------------


def test_container_requests_equal_limits_from_the_spec() -> None:
    container = serialised()["pod"]["spec"]["containers"][0]
    quantities = {"cpu": "1500m", "memory": "3072Mi", "ephemeral-storage": "8192Mi"}
    assert container["resources"] == {"requests": quantities, "limits": quantities}


def test_pod_spec_deadline_restart_policy_and_service_account() -> None:
    pod_spec = serialised()["pod"]["spec"]
    scalars = {key: value for key, value in pod_spec.items() if not isinstance(value, dict | list)}
    assert scalars == {
        "activeDeadlineSeconds": 901,  # ttl_s rounded up
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
    }


def test_max_lifetime_service_account_and_scheduling_settings_are_rendered() -> None:
    config = make_config(
        max_lifetime_s=7200,
        service_account_name="orchard-episode",
        node_selector={"orchard.dev/pool": "episodes"},
        tolerations=(Toleration(key="orchard.dev/episodes", operator="Exists", effect="NoSchedule"),),
        runtime_class_name="gvisor",
        image_pull_policy="Always",
    )
    pod_spec = serialised(config=config)["pod"]["spec"]
    assert {key: pod_spec[key] for key in ("activeDeadlineSeconds", "serviceAccountName", "runtimeClassName")} == {
        "activeDeadlineSeconds": 7200,
        "serviceAccountName": "orchard-episode",
        "runtimeClassName": "gvisor",
    }
    assert (pod_spec["nodeSelector"], pod_spec["tolerations"]) == (
        {"orchard.dev/pool": "episodes"},
        [{"key": "orchard.dev/episodes", "operator": "Exists", "effect": "NoSchedule"}],
    )
    assert pod_spec["containers"][0]["imagePullPolicy"] == "Always"


def test_every_object_carries_the_episode_labels_and_names() -> None:
    objects = serialised()
    metadata = {kind: obj["metadata"] for kind, obj in objects.items()}
    assert {kind: (meta["name"], meta["namespace"], meta["labels"]) for kind, meta in metadata.items()} == {
        "secret": ("episode-sb-7-env", "orchard", LABELS),
        "policy": ("episode-sb-7", "orchard", LABELS),
        "pod": ("episode-sb-7", "orchard", LABELS),
    }


def test_pod_annotations_hold_the_expiry_and_the_spec_without_env() -> None:
    spec = make_spec(run_id="Run/2026:11")
    annotations = serialised(spec)["pod"]["metadata"]["annotations"]
    assert sorted(annotations) == [ANNOTATION_EXPIRES_AT, ANNOTATION_SPEC]
    assert annotations[ANNOTATION_EXPIRES_AT] == f"{NOW + 900.5:.3f}"
    assert SandboxSpec.model_validate_json(annotations[ANNOTATION_SPEC]) == spec.model_copy(update={"env": {}})


def test_ids_with_invalid_characters_are_sanitised_into_distinct_valid_label_values() -> None:
    spec = make_spec(run_id="Run/2026:11", episode_id="-ep 7-", task_id="t" * 80)
    labels = serialised(spec)["pod"]["metadata"]["labels"]
    assert {key: labels[key] for key in ("orchard.dev/run", "orchard.dev/episode", "orchard.dev/task")} == {
        "orchard.dev/run": "Run-2026-11-" + label_value("Run/2026:11")[-8:],
        "orchard.dev/episode": "ep-7-" + label_value("-ep 7-")[-8:],
        "orchard.dev/task": "t" * 54 + "-" + label_value("t" * 80)[-8:],
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("run-1", "run-1"),
        ("a_b.C-9", "a_b.C-9"),
        ("", ""),
        ("run/1", "run-1-a7becdaa"),
        ("x" * 63, "x" * 63),
    ],
)
def test_label_value_keeps_valid_values_and_suffixes_changed_ones_with_a_hash(raw: str, expected: str) -> None:
    assert label_value(raw) == expected


def test_sanitised_label_values_are_valid_and_do_not_collide() -> None:
    raws = ["a/b", "a:b", "a b", "-a-", "é", "x" * 64, "x" * 64 + "y", "..", "a.", "a" * 200 + "/"]
    values = [label_value(raw) for raw in raws]
    assert [bool(LABEL_VALUE.match(value)) and 0 < len(value) <= 63 for value in values] == [True] * len(raws)
    assert len(set(values)) == len(raws)


def test_spec_labels_are_added_with_sanitised_values_and_invalid_keys_refused() -> None:
    labels = serialised(make_spec(labels={"team": "rl/swe", "example.com/tier": "gold"}))["pod"]["metadata"]["labels"]
    assert labels == {**LABELS, "team": label_value("rl/swe"), "example.com/tier": "gold"}
    with pytest.raises(ValueError, match="label key"):
        serialised(make_spec(labels={"bad key": "x"}))


def test_pod_and_container_security_context_and_volumes() -> None:
    pod_spec = serialised()["pod"]["spec"]
    container = pod_spec["containers"][0]
    assert pod_spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod_spec["volumes"] == [
        {"name": "workspace", "emptyDir": {"sizeLimit": "8192Mi"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
    ]
    assert (container["workingDir"], container["volumeMounts"]) == (
        "/workspace",
        [
            {"name": "workspace", "mountPath": "/workspace"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": "/home/sandbox"},
        ],
    )
    assert (container["name"], container["image"], container["imagePullPolicy"]) == (
        "sandbox",
        "ghcr.io/orchard/swe-task:1",
        "IfNotPresent",
    )


def test_the_proxy_token_reaches_the_container_only_through_the_secret() -> None:
    objects = serialised()
    assert {key: value for key, value in objects["secret"].items() if key != "metadata"} == {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "stringData": {"OPENAI_API_KEY": "tok-episode-7"},
    }
    assert objects["pod"]["spec"]["containers"][0]["env"] == [
        {"name": "HOME", "value": "/home/sandbox"},
        {"name": "OPENAI_BASE_URL", "value": "http://orchard-proxy.orchard.svc:8000/v1"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {
            "name": "OPENAI_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "episode-sb-7-env", "key": "OPENAI_API_KEY"}},
        },
    ]
    assert "tok-episode-7" not in json.dumps(objects["pod"])


def test_network_policy_denies_ingress_and_allows_egress_to_the_proxy_and_dns_only() -> None:
    policy = serialised()["policy"]
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"orchard.dev/sandbox": "sb-7"}},
        "policyTypes": ["Ingress", "Egress"],
        "egress": [
            {"to": [{"podSelector": {"matchLabels": PROXY_LABELS}}], "ports": [{"protocol": "TCP", "port": 8000}]},
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                    }
                ],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            },
        ],
    }


def test_network_policy_with_a_proxy_cidr_and_no_dns_allows_that_address_alone() -> None:
    config = make_config(proxy=ProxyEgress(port=443, cidr="10.20.30.40"), dns=None)
    assert serialised(config=config)["policy"]["spec"] == {
        "podSelector": {"matchLabels": {"orchard.dev/sandbox": "sb-7"}},
        "policyTypes": ["Ingress", "Egress"],
        "egress": [{"to": [{"ipBlock": {"cidr": "10.20.30.40/32"}}], "ports": [{"protocol": "TCP", "port": 443}]}],
    }


def test_proxy_in_another_namespace_is_selected_by_namespace_and_pod() -> None:
    proxy = ProxyEgress(port=8000, pod_selector=PROXY_LABELS, namespace_selector={"team": "inference"})
    egress = serialised(config=make_config(proxy=proxy, dns=None))["policy"]["spec"]["egress"]
    assert egress == [
        {
            "to": [
                {
                    "podSelector": {"matchLabels": PROXY_LABELS},
                    "namespaceSelector": {"matchLabels": {"team": "inference"}},
                }
            ],
            "ports": [{"protocol": "TCP", "port": 8000}],
        }
    ]


@pytest.mark.parametrize(
    "proxy",
    [
        {"port": 8000},
        {"port": 8000, "pod_selector": PROXY_LABELS, "cidr": "10.0.0.0/8"},
        {"port": 8000, "cidr": "10.0.0.0/8", "namespace_selector": {"a": "b"}},
        {"port": 8000, "cidr": "not-an-address"},
        {"port": 0, "cidr": "10.0.0.0/8"},
    ],
)
def test_proxy_egress_needs_exactly_one_valid_destination(proxy: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ProxyEgress(**proxy)


def test_config_forbids_unknown_fields_and_needs_a_proxy() -> None:
    with pytest.raises(ValidationError):
        make_config(namspace="typo")
    with pytest.raises(ValidationError):
        KubernetesRuntimeConfig()  # type: ignore[call-arg]


def test_spec_image_wins_and_a_missing_image_is_refused() -> None:
    assert serialised(make_spec(image="python:3.12"))["pod"]["spec"]["containers"][0]["image"] == "python:3.12"
    with pytest.raises(ValueError, match="no image"):
        serialised(config=make_config(default_image=None))


# --- 2. request shapes against fake APIs (not evidence the runtime works) ----------------------------------------


def running_pod(name: str, *, phase: str = "Running", waiting: str | None = None) -> client.V1Pod:
    state = client.V1ContainerState(
        waiting=client.V1ContainerStateWaiting(reason=waiting, message="m") if waiting else None,
        running=client.V1ContainerStateRunning() if phase == "Running" else None,
    )
    status = client.V1ContainerStatus(image="i", image_id="", name="sandbox", ready=True, restart_count=0, state=state)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name), status=client.V1PodStatus(phase=phase, container_statuses=[status])
    )


LIST_TYPES = {
    "list_namespaced_pod": client.V1PodList,
    "list_namespaced_secret": client.V1SecretList,
    "list_namespaced_network_policy": client.V1NetworkPolicyList,
}


class FakeApi:
    """Records every call as ``(method, first positional argument)``; answers from ``pods``/``lists``/``fail``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.bodies: dict[str, Any] = {}
        self.pod_states: list[client.V1Pod] = []
        self.lists: dict[str, list[Any]] = {}
        self.fail: dict[str, ApiException] = {}

    def __getattr__(self, method: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            first = args[1].metadata.name if method.startswith("create") else args[0]
            self.calls.append((method, first))
            self.bodies[f"{method}:{first}"] = (args, kwargs)
            if method in self.fail:
                raise self.fail[method]
            if method == "create_namespaced_pod":
                return client.V1Pod(metadata=client.V1ObjectMeta(name=first, uid="uid-1"))
            if method == "read_namespaced_pod":
                return self.pod_states.pop(0)
            if method.startswith("list_"):
                return LIST_TYPES[method](items=self.lists.get(method, []))
            return None

        return call


def fake_runtime(**config: Any) -> tuple[KubernetesRuntime, FakeApi]:
    api = FakeApi()
    runtime = KubernetesRuntime(
        make_config(**config), core=api, networking=api, stream=_no_stream, clock=lambda: NOW, sleep=lambda _: None
    )
    return runtime, api


def _no_stream(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("no exec expected")


def test_create_makes_secret_then_policy_then_pod_adopts_them_and_waits_until_running() -> None:
    runtime, api = fake_runtime()
    api.pod_states = [running_pod("episode-sb-7", phase="Pending"), running_pod("episode-sb-7")]
    sandbox = runtime.create(make_spec())
    assert api.calls == [
        ("create_namespaced_secret", "episode-sb-7-env"),
        ("create_namespaced_network_policy", "episode-sb-7"),
        ("create_namespaced_pod", "episode-sb-7"),
        ("patch_namespaced_secret", "episode-sb-7-env"),
        ("patch_namespaced_network_policy", "episode-sb-7"),
        ("read_namespaced_pod", "episode-sb-7"),
        ("read_namespaced_pod", "episode-sb-7"),
    ]
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "episode-sb-7", "uid": "uid-1"}
    args, kwargs = api.bodies["patch_namespaced_secret:episode-sb-7-env"]
    assert (args, kwargs) == (
        ("episode-sb-7-env", "orchard", {"metadata": {"ownerReferences": [owner]}}),
        {"_content_type": "application/merge-patch+json", "_request_timeout": 30.0},
    )
    assert (sandbox.spec, sandbox.pod_name) == (make_spec(), "episode-sb-7")


def test_a_pod_that_cannot_pull_its_image_fails_create_and_is_cleaned_up() -> None:
    runtime, api = fake_runtime()
    api.pod_states = [running_pod("episode-sb-7", phase="Pending", waiting="ImagePullBackOff")]
    with pytest.raises(KubernetesStartError, match="ImagePullBackOff"):
        runtime.create(make_spec())
    # the policy is owned by the pod: the garbage collector removes it once the pod has stopped
    assert api.calls[-2:] == [
        ("delete_namespaced_pod", "episode-sb-7"),
        ("delete_namespaced_secret", "episode-sb-7-env"),
    ]


def test_a_failed_adoption_removes_the_policy_explicitly() -> None:
    runtime, api = fake_runtime()
    api.fail["patch_namespaced_network_policy"] = ApiException(status=403, reason="Forbidden")
    with pytest.raises(KubernetesStartError, match="403"):
        runtime.create(make_spec())
    assert api.calls[-3:] == [
        ("delete_namespaced_pod", "episode-sb-7"),
        ("delete_namespaced_secret", "episode-sb-7-env"),
        ("delete_namespaced_network_policy", "episode-sb-7"),
    ]


def test_create_of_an_existing_sandbox_deletes_nothing() -> None:
    runtime, api = fake_runtime()
    api.fail["create_namespaced_secret"] = ApiException(status=409, reason="Conflict")
    with pytest.raises(SandboxExistsError, match="sb-7"):
        runtime.create(make_spec())
    assert api.calls == [("create_namespaced_secret", "episode-sb-7-env")]


def test_a_pod_not_running_by_the_start_timeout_fails_create() -> None:
    runtime, api = fake_runtime(start_timeout_s=0.05, poll_interval_s=0.01)
    runtime._sleep = time.sleep
    api.pod_states = [running_pod("episode-sb-7", phase="Pending") for _ in range(100)]
    with pytest.raises(KubernetesStartError, match="not running after 0.05 s"):
        runtime.create(make_spec())


def test_delete_removes_pod_and_secret_and_the_policy_only_when_the_pod_is_gone() -> None:
    runtime, api = fake_runtime()
    runtime.delete("sb-7")
    assert api.calls == [("delete_namespaced_pod", "episode-sb-7"), ("delete_namespaced_secret", "episode-sb-7-env")]
    assert api.bodies["delete_namespaced_pod:episode-sb-7"][1] == {
        "propagation_policy": "Background",
        "_request_timeout": 30.0,
    }
    runtime, api = fake_runtime()
    api.fail["delete_namespaced_pod"] = ApiException(status=404, reason="Not Found")
    runtime.delete("sb-7")
    assert api.calls[1:] == [
        ("delete_namespaced_secret", "episode-sb-7-env"),
        ("delete_namespaced_network_policy", "episode-sb-7"),
    ]


def listed_pod(sandbox_id: str, *, expires: float, phase: str = "Running", deleting: bool = False) -> client.V1Pod:
    objects = render_episode_objects(make_spec(sandbox_id=sandbox_id), make_config(), now=NOW)
    pod = objects.pod
    pod.metadata.annotations = {**pod.metadata.annotations, ANNOTATION_EXPIRES_AT: f"{expires:.3f}"}
    pod.metadata.deletion_timestamp = dt.datetime.now(dt.UTC) if deleting else None
    pod.status = client.V1PodStatus(phase=phase)
    return pod


def test_reap_deletes_expired_and_finished_pods_and_sweeps_old_orphans() -> None:
    runtime, api = fake_runtime()
    api.lists["list_namespaced_pod"] = [
        listed_pod("live", expires=NOW + 60),
        listed_pod("expired", expires=NOW - 1),
        listed_pod("finished", expires=NOW + 60, phase="Failed"),
        listed_pod("deleting", expires=NOW - 1, deleting=True),
    ]
    old = dt.datetime.fromtimestamp(NOW - 3600, dt.UTC)
    young = dt.datetime.fromtimestamp(NOW - 1, dt.UTC)
    orphan_secret = render_episode_objects(make_spec(sandbox_id="orphan"), make_config(), now=NOW).secret
    orphan_secret.metadata.creation_timestamp = old
    fresh_secret = render_episode_objects(make_spec(sandbox_id="starting"), make_config(), now=NOW).secret
    fresh_secret.metadata.creation_timestamp = young
    api.lists["list_namespaced_secret"] = [orphan_secret, fresh_secret]
    assert runtime.reap_expired() == ["expired", "finished"]
    deletes = [call for call in api.calls if call[0].startswith("delete")]
    assert deletes == [
        ("delete_namespaced_pod", "episode-expired"),
        ("delete_namespaced_secret", "episode-expired-env"),
        ("delete_namespaced_pod", "episode-finished"),
        ("delete_namespaced_secret", "episode-finished-env"),
        ("delete_namespaced_secret", "episode-orphan-env"),
    ]
    selectors = {
        call[0]: api.bodies[f"{call[0]}:{call[1]}"][1]["label_selector"] for call in api.calls if "list" in call[0]
    }
    managed = "app.kubernetes.io/managed-by=orchard,app.kubernetes.io/component=episode-sandbox"
    assert selectors == {
        name: managed for name in ("list_namespaced_pod", "list_namespaced_secret", "list_namespaced_network_policy")
    }


def test_list_and_get_rebuild_sandboxes_from_live_pods() -> None:
    runtime, api = fake_runtime()
    api.lists["list_namespaced_pod"] = [
        listed_pod("live", expires=NOW + 60),
        listed_pod("done", expires=NOW + 60, phase="Succeeded"),
    ]
    assert [sandbox.spec for sandbox in runtime.list()] == [make_spec(sandbox_id="live", env={})]
    api.fail["read_namespaced_pod"] = ApiException(status=404, reason="Not Found")
    with pytest.raises(SandboxNotFoundError):
        runtime.get("missing")


def test_heartbeat_patches_the_expiry_annotation() -> None:
    runtime, api = fake_runtime()
    KubernetesSandbox(runtime, make_spec()).heartbeat()
    args, kwargs = api.bodies["patch_namespaced_pod:episode-sb-7"]
    assert args == (
        "episode-sb-7",
        "orchard",
        {"metadata": {"annotations": {ANNOTATION_EXPIRES_AT: f"{NOW + 900.5:.3f}"}}},
    )
    assert kwargs["_content_type"] == "application/merge-patch+json"


class ScriptedStream:
    """A finished exec: fixed output, then the status channel."""

    def __init__(self, stdout: bytes, status: dict[str, Any]) -> None:
        self.channels = {1: stdout, 2: b"", 3: json.dumps(status).encode()}
        self.open = True
        self.closed = False

    def is_open(self) -> bool:
        was, self.open = self.open, False
        return was

    def update(self, timeout: float | None = 0) -> None:
        pass

    def read_channel(self, channel: int, timeout: float = 0) -> bytes:
        return self.channels.pop(channel, b"")

    def write_stdin(self, data: bytes) -> None:
        raise AssertionError("no stdin expected")

    def close(self, **kwargs: Any) -> None:
        self.closed = True


def test_exec_request_shape_and_status_channel() -> None:
    requests: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    streams: list[ScriptedStream] = []

    def stream(*args: Any, **kwargs: Any) -> ScriptedStream:
        requests.append((args[1:], kwargs))
        failure = {
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
        }
        streams.append(ScriptedStream(b"hi\n", failure))
        return streams[-1]

    runtime, _ = fake_runtime()
    runtime._stream = stream
    result = KubernetesSandbox(runtime, make_spec()).exec(["echo", "hi"], timeout_s=7, cwd="src", env={"A": "1"})
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "hi\n", "", False)
    ((args, kwargs),) = requests
    expected_argv = exec_argv(["echo", "hi"], cwd="/workspace/src", timeout_s=7, env={"A": "1"}, stdin_len=None)
    assert (args, kwargs) == (
        ("episode-sb-7", "orchard"),
        {
            "command": expected_argv,
            "container": "sandbox",
            "stdin": False,
            "stdout": True,
            "stderr": True,
            "tty": False,
            "_preload_content": False,
            "binary": True,
        },
    )
    assert expected_argv[3:] == ["orchard-exec", "/workspace/src", "7.000", "-", "1", "A=1", "echo", "hi"]
    assert streams[0].closed


def test_a_host_exec_node_gets_a_working_copy_per_sandbox_and_the_pods_environment_with_every_command() -> None:
    commands: list[list[str]] = []

    def stream(*args: Any, **kwargs: Any) -> ScriptedStream:
        commands.append(kwargs["command"])
        return ScriptedStream(b"", {"status": "Success"})

    runtime, _ = fake_runtime(node_exec_root="/srv/nodes")
    runtime._stream = stream
    spec = make_spec(env={"OPENAI_API_KEY": "tok"}, proxy_url="http://proxy:8000/v1")
    sandbox = KubernetesSandbox(runtime, spec)
    sandbox.exec("true", cwd="src", env={"A": "1"})
    workspace = f"/srv/nodes/{spec.sandbox_id}"
    assert (runtime.workspace_of(spec.sandbox_id), sandbox.info().workdir) == (workspace, workspace)
    env = {"HOME": workspace, "OPENAI_BASE_URL": "http://proxy:8000/v1", "OPENAI_API_KEY": "tok", "A": "1"}
    assert commands == [exec_argv("true", cwd=f"{workspace}/src", timeout_s=60, env=env, stdin_len=None)]


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (b'{"metadata":{},"status":"Success"}', 0),
        (
            b'{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"137"}]}}',
            137,
        ),
        (  # kwok's kubelet server: a generic failure whose message ends with Go's ExitError text
            b'{"status":"Failure","message":"Internal error occurred: error executing command in container: cmd wait:'
            b' sh -c echo exit status 9; exit 3: exit status 3","reason":"InternalError","code":500}',
            3,
        ),
    ],
)
def test_exit_code_of_the_status_channel(status: bytes, code: int) -> None:
    assert exit_code_of(status) == code


@pytest.mark.parametrize("status", [b"", b'{"status":"Failure","message":"container not found"}', b"garbage"])
def test_an_exec_without_an_exit_code_is_an_infrastructure_error(status: bytes) -> None:
    with pytest.raises(KubernetesRuntimeError):
        exit_code_of(status)


@pytest.mark.parametrize("path", ["/etc/passwd", "..", "../x", "a/../../x"])
def test_paths_outside_the_working_copy_are_refused(path: str) -> None:
    with pytest.raises(PathEscapeError, match="leaves the working copy"):
        workspace_path("/workspace", path)
    with pytest.raises(InvalidSandboxRequestError, match="NUL"):
        workspace_path("/workspace", "a\0b")


@pytest.mark.parametrize(
    ("command", "options"),
    [([], {}), ("true", {"env": {"BAD-NAME": "x"}}), ("true", {"timeout_s": 0})],
)
def test_exec_argv_refuses_what_the_wrapper_cannot_run(command: list[str] | str, options: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"cwd": "/workspace", "timeout_s": 1.0, "env": {}, "stdin_len": None, **options}
    with pytest.raises(InvalidSandboxRequestError):
        exec_argv(command, **arguments)


def test_paths_inside_the_working_copy_are_resolved() -> None:
    assert [workspace_path("/workspace", p) for p in (".", "", "a/b/", "a/../c", "./d")] == [
        "/workspace",
        "/workspace",
        "/workspace/a/b",
        "/workspace/c",
        "/workspace/d",
    ]


# --- 3. the shell side, run by this machine's /bin/sh (not evidence of the transport) ---------------------------


class LocalExecStream:
    """Runs the argv an exec would send to the pod as a local process, speaking the WSClient subset we use."""

    def __init__(self, argv: list[str], stdin: bool) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - argv built by the runtime under test
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.buffers = {1: bytearray(), 2: bytearray()}
        self.lock = threading.Lock()
        self.pumps = [
            threading.Thread(target=self._pump, args=(channel, pipe), daemon=True)
            for channel, pipe in ((1, self.proc.stdout), (2, self.proc.stderr))
        ]
        for pump in self.pumps:
            pump.start()

    def _pump(self, channel: int, pipe: Any) -> None:
        while chunk := pipe.read1(65536):
            with self.lock:
                self.buffers[channel] += chunk

    def is_open(self) -> bool:
        return self.proc.poll() is None or any(pump.is_alive() for pump in self.pumps)

    def update(self, timeout: float | None = 0) -> None:
        time.sleep(min(timeout or 0, 0.005))

    def read_channel(self, channel: int, timeout: float = 0) -> bytes:
        if channel == 3:
            code = self.proc.wait()
            code = 128 - code if code < 0 else code
            if code == 0:
                return b'{"status":"Success"}'
            return json.dumps(
                {"status": "Failure", "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
            ).encode()
        with self.lock:
            data = bytes(self.buffers[channel])
            self.buffers[channel].clear()
        return data

    def write_stdin(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close(self, **kwargs: Any) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def local_sandbox(tmp_path: Path) -> KubernetesSandbox:
    workspace = tmp_path / "workspace"
    workspace.mkdir()

    def stream(_method: Any, _pod: str, _ns: str, *, command: list[str], stdin: bool, **_: Any) -> LocalExecStream:
        return LocalExecStream(command, stdin)

    runtime, _ = fake_runtime(workspace_dir=str(workspace))
    runtime._stream = stream
    return KubernetesSandbox(runtime, make_spec())


def test_exec_runs_strings_through_sh_with_cwd_env_and_bounded_stdin(local_sandbox: KubernetesSandbox) -> None:
    (Path(local_sandbox._workspace) / "sub").mkdir()
    result = local_sandbox.exec(
        'echo "$GREETING" "$(pwd)"; cat; exit 5', cwd="sub", env={"GREETING": "a b"}, stdin=b"x\0y"
    )
    assert (result.exit_code, result.stdout, result.timed_out) == (
        5,
        f"a b {local_sandbox._workspace}/sub\nx\0y",
        False,
    )
    assert local_sandbox.exec(["printf", "%s", "it's"]).stdout == "it's"


def test_exec_past_its_timeout_is_killed_and_reported_as_timed_out(local_sandbox: KubernetesSandbox) -> None:
    result = local_sandbox.exec("sleep 30", timeout_s=0.3)
    assert (result.exit_code, result.timed_out, result.duration_ms < 5000) == (None, True, True)


def test_exec_stream_yields_output_then_the_exit_code(local_sandbox: KubernetesSandbox) -> None:
    events = list(local_sandbox.exec_stream("echo out; echo err >&2"))
    assert events[-1] == ("exit", 0)
    assert sorted(events[:-1]) == [("stderr", b"err\n"), ("stdout", b"out\n")]


def test_file_operations_round_trip(local_sandbox: KubernetesSandbox) -> None:
    payload = bytes(range(256)) * 1024
    local_sandbox.write_file("a/b/data.bin", payload, mode=0o600)
    local_sandbox.write_file("a/tab\tname.txt", b"hello")
    assert local_sandbox.read_file("a/b/data.bin") == payload
    assert local_sandbox.list_files("a") == [
        FileEntry(path="a/b", kind="dir", size=(Path(local_sandbox._workspace) / "a/b").stat().st_size),
        FileEntry(path="a/tab\tname.txt", kind="file", size=5),
    ]
    assert [entry.path for entry in local_sandbox.list_files(recursive=True)] == [
        "a",
        "a/b",
        "a/b/data.bin",
        "a/tab\tname.txt",
    ]
    assert (Path(local_sandbox._workspace) / "a/b/data.bin").stat().st_mode & 0o777 == 0o600
    local_sandbox.delete_file("a/b")
    assert [entry.path for entry in local_sandbox.list_files(recursive=True)] == ["a", "a/tab\tname.txt"]


def test_file_errors_are_the_ones_the_local_runtime_raises(local_sandbox: KubernetesSandbox) -> None:
    local_sandbox.write_file("d/f", b"12")
    for operation in (local_sandbox.read_file, local_sandbox.list_files, local_sandbox.delete_file):
        with pytest.raises(SandboxFileNotFoundError):
            operation("nope")
    with pytest.raises(InvalidSandboxRequestError, match="is a directory"):
        local_sandbox.read_file("d")
    with pytest.raises(InvalidSandboxRequestError, match="is a directory"):
        local_sandbox.write_file("d", b"x")
    with pytest.raises(InvalidSandboxRequestError, match="working copy itself"):
        local_sandbox.delete_file(".")
    with pytest.raises(PathEscapeError):
        local_sandbox.read_file("../outside")
    assert local_sandbox.list_files("d/f") == [FileEntry(path="d/f", kind="file", size=2)]


def test_apply_patch_and_upload_dir(local_sandbox: KubernetesSandbox, tmp_path: Path) -> None:
    source = tmp_path / "task"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("x = 1\n")
    (source / ".git" / "refs").mkdir(parents=True)
    (source / ".git" / "refs" / "future-fix").write_text("the solution\n")
    local_sandbox.upload_dir(source)
    assert not any(entry.path.startswith(".git") for entry in local_sandbox.list_files(".", recursive=True))
    patch = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    result = local_sandbox.apply_patch(patch)
    assert (result.exit_code, local_sandbox.read_file("pkg/mod.py")) == (0, b"x = 2\n")
    assert local_sandbox.apply_patch(patch).exit_code != 0


def test_info_reports_lifetime_workdir_and_proxy(local_sandbox: KubernetesSandbox) -> None:
    local_sandbox.created_at, local_sandbox.expires_at = NOW, NOW + 900.5
    info = local_sandbox.info()
    assert (info.spec, info.created_at, info.expires_at, info.workdir, info.proxy_endpoint) == (
        make_spec(),
        NOW,
        NOW + 900.5,
        local_sandbox._workspace,
        "http://orchard-proxy.orchard.svc:8000/v1",
    )


def test_close_deletes_only_the_sandboxes_this_runtime_created() -> None:
    runtime, api = fake_runtime()
    api.pod_states = [running_pod("episode-mine")]
    runtime.create(make_spec(sandbox_id="mine"))
    api.calls.clear()
    runtime.close()
    assert api.calls == [("delete_namespaced_pod", "episode-mine"), ("delete_namespaced_secret", "episode-mine-env")]
