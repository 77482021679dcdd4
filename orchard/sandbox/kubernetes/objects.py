"""What the Kubernetes runtime creates in the cluster, rendered without talking to it: the episode's objects.

``render_episode_objects(spec, config)`` returns the episode's ``V1Pod``, its ``V1NetworkPolicy`` and its ``V1Secret``
as the official client's models, so tests check exactly what would be sent. ``KubernetesRuntimeConfig`` holds
everything about the cluster that is not per episode. The commands every sandbox operation execs in the pod are in
``orchard.sandbox.kubernetes.commands``; reading pods back is ``orchard.sandbox.kubernetes.pod_state``.

Choices worth knowing:

- **Labels.** ``orchard.dev/run``, ``orchard.dev/episode`` and ``orchard.dev/task`` carry the ids as label values.
  An id that is not a valid label value is sanitised (``label_value``): invalid characters become ``-``, the ends are
  trimmed to alphanumerics, the result is cut to fit 63 characters and suffixed with 8 hex digits of the id's
  SHA-256, so two different ids never collide after sanitising. A valid id is kept as it is. The exact ids are in
  the ``orchard.dev/spec`` annotation. ``orchard.dev/sandbox`` (the DNS-safe sandbox id) is what the NetworkPolicy
  and the runtime select on.
- **Requests equal limits** (cpu, memory, ephemeral storage): episode pods get the Guaranteed QoS class and are
  the last to be evicted under node pressure. ``Limits.cpu_seconds``, ``open_files``, ``processes`` and
  ``file_size_mb`` are rlimits of the local runtime and have no per-pod equivalent (the node's ``podPidsLimit``
  caps processes); they are not rendered.
- **Deadline.** ``activeDeadlineSeconds`` is the spec's ``ttl_s`` rounded up (or ``max_lifetime_s`` when set).
  Kubernetes never lets it grow once set, so a heartbeat moves only the ``orchard.dev/expires-at`` annotation
  that ``reap_expired`` reads; the kubelet's deadline is a hard cap counted from the pod's start (image pull
  included) that holds even when no Orchard process is left to reap.
- **Secrets.** Environment variables named in ``secret_env_keys`` (the per-episode proxy token ``OPENAI_API_KEY``)
  go into the episode's immutable Secret and reach the container through ``secretKeyRef``; they never appear in the
  pod spec or the spec annotation. ``OPENAI_BASE_URL`` is the spec's ``proxy_url``.
- **Network.** The NetworkPolicy selects the one pod, denies all ingress and allows egress only to the proxy (a pod
  selector or a CIDR, one TCP port) and, unless ``dns`` is None, to the cluster DNS on port 53. It is created
  before the pod, so the pod never runs unisolated. A CNI that does not enforce NetworkPolicies (kindnet, plain
  flannel) ignores it silently.
- **Filesystem.** The root filesystem is read-only by default; the working copy (``workspace_dir``), ``/tmp`` and
  ``HOME`` are emptyDir volumes, all counted against the ephemeral-storage limit (``Limits.disk_mb``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Literal

from kubernetes import client
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchard.sandbox import SandboxSpec

LABEL_RUN = "orchard.dev/run"
LABEL_EPISODE = "orchard.dev/episode"
LABEL_TASK = "orchard.dev/task"
LABEL_SANDBOX = "orchard.dev/sandbox"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
MANAGED_LABELS = {LABEL_MANAGED_BY: "orchard", LABEL_COMPONENT: "episode-sandbox"}
MANAGED_SELECTOR = ",".join(f"{key}={value}" for key, value in MANAGED_LABELS.items())
ANNOTATION_EXPIRES_AT = "orchard.dev/expires-at"
ANNOTATION_SPEC = "orchard.dev/spec"
CONTAINER_NAME = "sandbox"
HOME_DIR = "/home/sandbox"
TMP_DIR = "/tmp"  # noqa: S108 - an emptyDir of the episode's own pod, not the host's /tmp

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_LABEL_NAME}$")
_HASH_CHARS = 8


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProxyEgress(_Strict):
    """Where the recording proxy listens: the one destination an episode pod may open connections to."""

    port: int = Field(ge=1, le=65535, description="TCP port of the proxy (the pod port, not a Service port).")
    pod_selector: dict[str, str] | None = Field(None, description="Labels of the proxy's pods.")
    namespace_selector: dict[str, str] | None = Field(
        None, description="Labels of the proxy's namespace (with pod_selector); None: the episode's own namespace."
    )
    cidr: str | None = Field(None, description="The proxy's address range, when it runs outside the cluster.")

    @field_validator("cidr")
    @classmethod
    def _valid_cidr(cls, value: str | None) -> str | None:
        return None if value is None else str(ipaddress.ip_network(value, strict=False))

    @model_validator(mode="after")
    def _one_destination(self) -> ProxyEgress:
        if (self.pod_selector is None) == (self.cidr is None):
            raise ValueError("set exactly one of proxy.pod_selector and proxy.cidr")
        if self.namespace_selector is not None and self.pod_selector is None:
            raise ValueError("proxy.namespace_selector needs proxy.pod_selector")
        return self


class DnsEgress(_Strict):
    """The cluster DNS episode pods may query (port 53, UDP and TCP) to resolve the proxy's name."""

    namespace_selector: dict[str, str] = Field(default_factory=lambda: {"kubernetes.io/metadata.name": "kube-system"})
    pod_selector: dict[str, str] = Field(default_factory=lambda: {"k8s-app": "kube-dns"})


class Toleration(_Strict):
    """A pod toleration (for node pools tainted for episodes)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(None, ge=0)


class KubernetesRuntimeConfig(_Strict):
    """The ``kubernetes`` runtime: one Pod per episode in ``namespace``, reached through the API server."""

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field("orchard", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    kube_context: str | None = Field(None, description="Context of the kubeconfig to use (None: its current one).")
    default_image: str | None = Field(None, min_length=1, description="Image of episodes whose spec names none.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account_name: str | None = Field(
        None, description="Service account of episode pods (None: the namespace's default); its token is never mounted."
    )
    proxy: ProxyEgress
    dns: DnsEgress | None = Field(default_factory=DnsEgress, description="None: no DNS (proxy_url holds an IP).")
    secret_env_keys: tuple[str, ...] = Field(
        ("OPENAI_API_KEY",), description="Spec env variables that go through the episode's Secret, not the pod spec."
    )
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    runtime_class_name: str | None = Field(None, description="e.g. gvisor or kata, for a stronger sandbox.")
    run_as_user: int = Field(1000, ge=1, description="Non-root uid of every process in the pod.")
    run_as_group: int = Field(1000, ge=1)
    read_only_root_filesystem: bool = True
    workspace_dir: str = Field(
        "/workspace", pattern=r"^/[-A-Za-z0-9_./]*[-A-Za-z0-9_.]$", description="The working copy (an emptyDir)."
    )
    node_exec_root: str | None = Field(
        None,
        pattern=r"^/[-A-Za-z0-9_./]*[-A-Za-z0-9_.]$",
        description=(
            "Only for clusters whose exec runs commands on the node's host, not in the container (kwok's local exec,"
            " as in infra/local/kubernetes): each sandbox's working copy is <node_exec_root>/<sandbox_id>, made at"
            " create and removed at delete. None (the default) on real kubelets: the working copy is workspace_dir."
        ),
    )
    container_command: tuple[str, ...] = Field(
        ("/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"),
        min_length=1,
        description="Keeps the container alive for execs; exits at once on SIGTERM (a bare sleep as PID 1 would not).",
    )
    max_lifetime_s: int | None = Field(None, ge=1, description="activeDeadlineSeconds (None: the spec's ttl_s).")
    termination_grace_period_s: int = Field(5, ge=0)
    name_prefix: str = Field("episode-", pattern=r"^[a-z0-9][-a-z0-9]{0,30}$", description="Prefix of object names.")
    delete_finished_pods: bool = Field(
        True, description="reap_expired also deletes pods that exited or hit the deadline."
    )
    start_timeout_s: float = Field(300.0, gt=0, description="Create fails if the pod is not running by then.")
    poll_interval_s: float = Field(0.5, gt=0, description="How often create polls the pod's phase.")
    api_timeout_s: float = Field(30.0, gt=0, description="Timeout of one API request.")
    exec_grace_s: float = Field(10.0, ge=0, description="Client-side wait past an exec's timeout before giving up.")
    file_op_timeout_s: float = Field(120.0, gt=0, description="Timeout of file operations (exec-based).")


@dataclass(frozen=True)
class EpisodeObjects:
    """The three objects of one episode, in creation order: secret, network policy, pod."""

    secret: client.V1Secret
    network_policy: client.V1NetworkPolicy
    pod: client.V1Pod


def label_value(value: str) -> str:
    """``value`` as a valid label value: unchanged when already valid, else sanitised and suffixed with its hash.

    >>> label_value("run-1")
    'run-1'
    >>> label_value("run/1")
    'run-1-a7becdaa'
    """
    if _LABEL_VALUE.match(value) and len(value) <= 63:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:_HASH_CHARS]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", value)
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)[: 63 - _HASH_CHARS - 1]
    cleaned = re.sub(r"[^A-Za-z0-9]+$", "", cleaned)
    return f"{cleaned}-{digest}" if cleaned else digest


def pod_name(sandbox_id: str, config: KubernetesRuntimeConfig) -> str:
    """Name of the episode's Pod and NetworkPolicy."""
    return f"{config.name_prefix}{sandbox_id}"


def secret_name(sandbox_id: str, config: KubernetesRuntimeConfig) -> str:
    """Name of the episode's Secret."""
    return f"{pod_name(sandbox_id, config)}-env"


def episode_labels(spec: SandboxSpec) -> dict[str, str]:
    """Labels of all three objects: the spec's own labels (values sanitised), then Orchard's."""
    for key in spec.labels:
        if not _LABEL_KEY.match(key) or len(key) > 317:
            raise ValueError(f"invalid Kubernetes label key {key!r} in the sandbox spec")
    return {
        **{key: label_value(value) for key, value in spec.labels.items()},
        LABEL_RUN: label_value(spec.run_id),
        LABEL_EPISODE: label_value(spec.episode_id),
        LABEL_TASK: label_value(spec.task_id),
        LABEL_SANDBOX: spec.sandbox_id,
        **MANAGED_LABELS,
    }


def render_episode_objects(
    spec: SandboxSpec, config: KubernetesRuntimeConfig, *, now: float | None = None
) -> EpisodeObjects:
    """The episode's Secret, NetworkPolicy and Pod; ``now`` (epoch seconds) starts the TTL clock."""
    image = spec.image or config.default_image
    if image is None:
        raise ValueError(f"sandbox {spec.sandbox_id} names no image and the runtime has no default_image")
    started = time.time() if now is None else now
    labels = episode_labels(spec)
    annotations = {
        ANNOTATION_EXPIRES_AT: f"{started + spec.ttl_s:.3f}",
        ANNOTATION_SPEC: json.dumps(spec.model_dump(mode="json", exclude={"env"}), sort_keys=True),
    }
    return EpisodeObjects(
        secret=_secret(spec, config, labels),
        network_policy=_network_policy(spec, config, labels),
        pod=_pod(spec, config, image, labels, annotations),
    )


def _secret(spec: SandboxSpec, config: KubernetesRuntimeConfig, labels: dict[str, str]) -> client.V1Secret:
    secret_values = {key: value for key, value in spec.env.items() if key in config.secret_env_keys}
    return client.V1Secret(
        api_version="v1",
        kind="Secret",
        metadata=client.V1ObjectMeta(
            name=secret_name(spec.sandbox_id, config), namespace=config.namespace, labels=labels
        ),
        type="Opaque",
        immutable=True,
        string_data=dict(sorted(secret_values.items())),
    )


def _network_policy(
    spec: SandboxSpec, config: KubernetesRuntimeConfig, labels: dict[str, str]
) -> client.V1NetworkPolicy:
    egress = [
        client.V1NetworkPolicyEgressRule(
            to=[_proxy_peer(config.proxy)],
            ports=[client.V1NetworkPolicyPort(protocol="TCP", port=config.proxy.port)],
        )
    ]
    if config.dns is not None:
        egress.append(
            client.V1NetworkPolicyEgressRule(
                to=[
                    client.V1NetworkPolicyPeer(
                        namespace_selector=client.V1LabelSelector(match_labels=dict(config.dns.namespace_selector)),
                        pod_selector=client.V1LabelSelector(match_labels=dict(config.dns.pod_selector)),
                    )
                ],
                ports=[client.V1NetworkPolicyPort(protocol=protocol, port=53) for protocol in ("UDP", "TCP")],
            )
        )
    return client.V1NetworkPolicy(
        api_version="networking.k8s.io/v1",
        kind="NetworkPolicy",
        metadata=client.V1ObjectMeta(name=pod_name(spec.sandbox_id, config), namespace=config.namespace, labels=labels),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(match_labels={LABEL_SANDBOX: spec.sandbox_id}),
            policy_types=["Ingress", "Egress"],
            egress=egress,
        ),
    )


def _proxy_peer(proxy: ProxyEgress) -> client.V1NetworkPolicyPeer:
    if proxy.cidr is not None:
        return client.V1NetworkPolicyPeer(ip_block=client.V1IPBlock(cidr=proxy.cidr))
    namespaces = None
    if proxy.namespace_selector is not None:
        namespaces = client.V1LabelSelector(match_labels=dict(proxy.namespace_selector))
    return client.V1NetworkPolicyPeer(
        pod_selector=client.V1LabelSelector(match_labels=dict(proxy.pod_selector or {})),
        namespace_selector=namespaces,
    )


def _pod(
    spec: SandboxSpec,
    config: KubernetesRuntimeConfig,
    image: str,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> client.V1Pod:
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=pod_name(spec.sandbox_id, config), namespace=config.namespace, labels=labels, annotations=annotations
        ),
        spec=client.V1PodSpec(
            containers=[_container(spec, config, image)],
            restart_policy="Never",
            active_deadline_seconds=config.max_lifetime_s or math.ceil(spec.ttl_s),
            automount_service_account_token=False,
            enable_service_links=False,
            service_account_name=config.service_account_name,
            termination_grace_period_seconds=config.termination_grace_period_s,
            security_context=client.V1PodSecurityContext(
                run_as_non_root=True,
                run_as_user=config.run_as_user,
                run_as_group=config.run_as_group,
                fs_group=config.run_as_group,
                seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
            ),
            node_selector=dict(config.node_selector) or None,
            tolerations=[client.V1Toleration(**item.model_dump()) for item in config.tolerations] or None,
            runtime_class_name=config.runtime_class_name,
            volumes=[
                client.V1Volume(
                    name="workspace", empty_dir=client.V1EmptyDirVolumeSource(size_limit=f"{spec.limits.disk_mb}Mi")
                ),
                client.V1Volume(name="tmp", empty_dir=client.V1EmptyDirVolumeSource()),
                client.V1Volume(name="home", empty_dir=client.V1EmptyDirVolumeSource()),
            ],
        ),
    )


def _container(spec: SandboxSpec, config: KubernetesRuntimeConfig, image: str) -> client.V1Container:
    limits = spec.limits
    quantities = {
        "cpu": f"{max(1, round(limits.cpus * 1000))}m",
        "memory": f"{limits.memory_mb}Mi",
        "ephemeral-storage": f"{limits.disk_mb}Mi",
    }
    return client.V1Container(
        name=CONTAINER_NAME,
        image=image,
        image_pull_policy=config.image_pull_policy,
        command=list(config.container_command),
        working_dir=config.workspace_dir,
        env=_env(spec, config),
        resources=client.V1ResourceRequirements(requests=dict(quantities), limits=dict(quantities)),
        security_context=client.V1SecurityContext(
            run_as_non_root=True,
            privileged=False,
            allow_privilege_escalation=False,
            read_only_root_filesystem=config.read_only_root_filesystem,
            capabilities=client.V1Capabilities(drop=["ALL"]),
        ),
        volume_mounts=[
            client.V1VolumeMount(name="workspace", mount_path=config.workspace_dir),
            client.V1VolumeMount(name="tmp", mount_path=TMP_DIR),
            client.V1VolumeMount(name="home", mount_path=HOME_DIR),
        ],
    )


def _env(spec: SandboxSpec, config: KubernetesRuntimeConfig) -> list[client.V1EnvVar]:
    plain = {"HOME": HOME_DIR}
    if spec.proxy_url is not None:
        plain["OPENAI_BASE_URL"] = spec.proxy_url
    plain.update({key: value for key, value in spec.env.items() if key not in config.secret_env_keys})
    env = [client.V1EnvVar(name=key, value=value) for key, value in sorted(plain.items())]
    secret = secret_name(spec.sandbox_id, config)
    env += [
        client.V1EnvVar(
            name=key,
            value_from=client.V1EnvVarSource(secret_key_ref=client.V1SecretKeySelector(name=secret, key=key)),
        )
        for key in sorted(spec.env)
        if key in config.secret_env_keys
    ]
    return env
