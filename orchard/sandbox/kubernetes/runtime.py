"""The ``kubernetes`` runtime: one Pod per episode, through the official ``kubernetes`` client.

``create`` makes the episode's Secret, then its NetworkPolicy, then its Pod (the policy exists before the pod, so
the pod never runs unisolated), points the Secret's and the policy's ``ownerReferences`` at the pod (the garbage
collector removes them after the pod is gone), waits until the container runs and uploads the spec's
``source_dir``. Anything failing on the way removes what this call created and raises ``KubernetesStartError``.
``delete`` removes the pod and the Secret; the policy goes with the pod once the pod has stopped (removing it first
would lift the isolation of a pod still shutting down). ``reap_expired`` deletes pods past their
``orchard.dev/expires-at`` annotation (pushed forward by ``heartbeat``) and, with ``delete_finished_pods``, pods
that exited or hit ``activeDeadlineSeconds``; it also sweeps Secrets and policies left without a pod.

Every command and file operation of a sandbox (``orchard.sandbox.kubernetes.sandbox``) is an exec
(``connect_get_namespaced_pod_exec`` over a WebSocket through ``kubernetes.stream.stream``) of a short POSIX ``sh``
wrapper (``orchard.sandbox.kubernetes.commands``) that runs the command under ``timeout -k 5``, which kills its
process group on the node; ``stream_exec`` stops waiting ``exec_grace_s`` later. Exit status 124 or 137 after the
timeout elapsed counts as timed out.

``stream`` swaps its ``ApiClient``'s ``call_api`` while it opens a WebSocket, which breaks concurrent calls
on the same client; execs therefore use an ``ApiClient`` per thread, apart from the one of plain API calls.
Errors are those of ``orchard.sandbox.exceptions`` (the local runtime raises the same), plus ``KubernetesRuntimeError``
for what the cluster refused or failed (``orchard.sandbox.kubernetes.errors``).
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, Literal

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream as kube_stream
from pydantic import ValidationError

from orchard.logging import get_logger
from orchard.sandbox import Runtime, Sandbox, SandboxSpec
from orchard.sandbox.exceptions import SandboxError, SandboxExistsError, SandboxNotFoundError
from orchard.sandbox.kubernetes.commands import KILL_AFTER_S
from orchard.sandbox.kubernetes.errors import (
    TRANSPORT_ERRORS,
    KubernetesRuntimeError,
    KubernetesStartError,
    describe_api_error,
    ignore_missing,
    unreachable_is_a_runtime_error,
)
from orchard.sandbox.kubernetes.objects import (
    ANNOTATION_EXPIRES_AT,
    ANNOTATION_SPEC,
    CONTAINER_NAME,
    LABEL_SANDBOX,
    MANAGED_SELECTOR,
    EpisodeObjects,
    KubernetesRuntimeConfig,
    pod_name,
    render_episode_objects,
    secret_name,
)
from orchard.sandbox.kubernetes.pod_state import pod_expires_at, pod_is_live, pod_start_state
from orchard.sandbox.kubernetes.sandbox import KubernetesSandbox
from orchard.sandbox.kubernetes.streams import ExecStream, StreamEvent, drain_output, exit_code_of, feed_stdin

__all__ = [
    "KubernetesRuntime",
    "KubernetesRuntimeConfig",
    "KubernetesRuntimeError",
    "KubernetesStartError",
    "KubernetesSandbox",
    "EpisodeObjects",
    "load_api_client",
    "render_episode_objects",
]

log = get_logger("env.kubernetes")


REQUIRED_RIGHTS: tuple[tuple[str, str, str], ...] = (
    ("", "pods", "create"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "patch"),
    ("", "pods", "delete"),
    ("", "pods/exec", "create"),
    ("", "pods/exec", "get"),  # a WebSocket exec is a GET: older API servers authorise it as get, newer as both
    ("", "secrets", "create"),
    ("", "secrets", "get"),
    ("", "secrets", "list"),
    ("", "secrets", "patch"),
    ("", "secrets", "delete"),
    ("networking.k8s.io", "networkpolicies", "create"),
    ("networking.k8s.io", "networkpolicies", "get"),
    ("networking.k8s.io", "networkpolicies", "list"),
    ("networking.k8s.io", "networkpolicies", "patch"),
    ("networking.k8s.io", "networkpolicies", "delete"),
)
"""(API group, resource[/subresource], verb) the runtime uses in its namespace: the Role of
``infra/k8s/episode-runtime-rbac.yaml``, no more."""


def load_api_client(config: KubernetesRuntimeConfig) -> client.ApiClient:
    """An ``ApiClient`` from ``$KUBECONFIG`` when set, else from the pod's in-cluster service account."""
    configuration = client.Configuration()
    kubeconfig = os.environ.get("KUBECONFIG")
    try:
        if kubeconfig:
            kube_config.load_kube_config(
                config_file=kubeconfig,
                context=config.kube_context,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            kube_config.load_incluster_config(client_configuration=configuration)
    except (kube_config.ConfigException, OSError) as exc:
        source = f"KUBECONFIG={kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise KubernetesRuntimeError(f"cannot load Kubernetes credentials from {source}: {exc}") from exc
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 64)
    return client.ApiClient(configuration)


class KubernetesRuntime(Runtime):
    """Episode sandboxes as pods in ``config.namespace``."""

    def __init__(
        self,
        config: KubernetesRuntimeConfig,
        *,
        api_client: client.ApiClient | None = None,
        core: Any = None,
        networking: Any = None,
        stream: Callable[..., ExecStream] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Connect through ``api_client`` (default: ``load_api_client``); tests may pass fakes for the APIs."""
        if core is None or networking is None:
            api_client = api_client or load_api_client(config)
        self.config = config
        self._core = core or client.CoreV1Api(api_client)
        self._net = networking or client.NetworkingV1Api(api_client)
        self._exec_configuration = None if stream is not None or api_client is None else api_client.configuration
        self._stream = stream or kube_stream
        self._clock = clock
        self._sleep = sleep
        self._local = threading.local()
        self._lock = threading.Lock()
        self._created: set[str] = set()

    def create(self, spec: SandboxSpec) -> KubernetesSandbox:
        """Create the episode's objects, wait until its container runs, upload ``source_dir``."""
        started = time.perf_counter()
        now = self._clock()
        objects = render_episode_objects(spec, self.config, now=now)
        created: list[str] = []
        adopted = False
        try:
            self._core.create_namespaced_secret(self.config.namespace, objects.secret, **self._timeout())
            created.append("secret")
            self._net.create_namespaced_network_policy(self.config.namespace, objects.network_policy, **self._timeout())
            created.append("policy")
            pod = self._core.create_namespaced_pod(self.config.namespace, objects.pod, **self._timeout())
            created.append("pod")
            self._adopt(objects, pod.metadata.uid)
            adopted = True
            self._wait_running(objects.pod.metadata.name)
            if self.config.node_exec_root is not None:
                self._node_command(spec.sandbox_id, ["mkdir", "-p", "-m", "0755", self.workspace_of(spec.sandbox_id)])
            sandbox = KubernetesSandbox(self, spec, created_at=now, expires_at=now + spec.ttl_s)
            if spec.source_dir is not None:
                sandbox.upload_dir(spec.source_dir)
            if spec.git_snapshot:
                sandbox.git_snapshot()
        except Exception as exc:
            if self.config.node_exec_root is not None and "pod" in created:
                self._remove_node_workspace(spec.sandbox_id)
            self._teardown(spec.sandbox_id, created, policy_owned=adopted)
            if not created and isinstance(exc, ApiException) and exc.status == 409:
                raise SandboxExistsError(f"sandbox {spec.sandbox_id} exists") from exc
            if isinstance(exc, SandboxError):
                raise
            raise KubernetesStartError(f"creating sandbox {spec.sandbox_id} failed: {describe_api_error(exc)}") from exc
        with self._lock:
            self._created.add(spec.sandbox_id)
        log.info(
            "sandbox created",
            sandbox=spec.sandbox_id,
            episode=spec.episode_id,
            seconds=round(time.perf_counter() - started, 3),
        )
        return sandbox

    @unreachable_is_a_runtime_error
    def get(self, sandbox_id: str) -> KubernetesSandbox:
        """The sandbox of a live pod (``KeyError`` when missing, finished or being deleted)."""
        try:
            pod = self._core.read_namespaced_pod(
                pod_name(sandbox_id, self.config), self.config.namespace, **self._timeout()
            )
        except ApiException as exc:
            if exc.status == 404:
                raise SandboxNotFoundError(sandbox_id) from exc
            raise KubernetesRuntimeError(f"reading sandbox {sandbox_id} failed: {describe_api_error(exc)}") from exc
        sandbox = self._sandbox_of(pod) if pod_is_live(pod) else None
        if sandbox is None:
            raise SandboxNotFoundError(sandbox_id)
        return sandbox

    @unreachable_is_a_runtime_error
    def list(self) -> list[Sandbox]:
        """Sandboxes of live pods (their ``spec.env`` is empty: env is not stored on the cluster in clear)."""
        sandboxes = (self._sandbox_of(pod) for pod in self._managed("pod") if pod_is_live(pod))
        return [sandbox for sandbox in sandboxes if sandbox is not None]

    @unreachable_is_a_runtime_error
    def missing_rights(self) -> list[str]:
        """The ``REQUIRED_RIGHTS`` the credentials lack in the namespace (asked with SelfSubjectAccessReviews, which
        every authenticated identity may make), as ``verb resource`` strings; empty when all are granted."""
        authorization = client.AuthorizationV1Api(self._core.api_client)
        missing = []
        for group, resource, verb in REQUIRED_RIGHTS:
            name, _, subresource = resource.partition("/")
            attributes = client.V1ResourceAttributes(
                namespace=self.config.namespace, group=group, resource=name, subresource=subresource or None, verb=verb
            )
            review = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
            )
            try:
                answer = authorization.create_self_subject_access_review(review, **self._timeout())
            except ApiException as exc:
                raise KubernetesRuntimeError(f"cannot check the runtime's rights: {describe_api_error(exc)}") from exc
            if not answer.status.allowed:
                missing.append(f"{verb} {resource}" + (f" ({group})" if group else ""))
        return missing

    def check_rights(self) -> None:
        """Raise ``KubernetesRuntimeError`` naming every right the credentials lack (see ``missing_rights``)."""
        missing = self.missing_rights()
        if missing:
            raise KubernetesRuntimeError(
                f"the Kubernetes credentials lack rights the runtime needs in namespace {self.config.namespace!r}: "
                f"{', '.join(missing)} (infra/k8s/episode-runtime-rbac.yaml is the Role that grants them)"
            )

    def workspace_of(self, sandbox_id: str) -> str:
        """The working copy's absolute path as the sandbox's execs see it (``node_exec_root`` in the config)."""
        root = self.config.node_exec_root
        return self.config.workspace_dir if root is None else f"{root}/{sandbox_id}"

    @unreachable_is_a_runtime_error
    def delete(self, sandbox_id: str) -> None:
        """Delete the pod and the Secret (the policy follows the pod); no error if already gone."""
        if self.config.node_exec_root is not None:
            self._remove_node_workspace(sandbox_id)
        self._teardown(sandbox_id, ["secret", "policy", "pod"], policy_owned=True)
        with self._lock:
            self._created.discard(sandbox_id)

    def close(self) -> None:
        """Delete the sandboxes this runtime object created (not every episode pod in the namespace: other
        Orchard processes may share it)."""
        with self._lock:
            mine = sorted(self._created)
        for sandbox_id in mine:
            self.delete(sandbox_id)

    @unreachable_is_a_runtime_error
    def reap_expired(self) -> list[str]:
        """Delete pods past their expiry (and finished ones with ``delete_finished_pods``); sweep orphans."""
        now = self._clock()
        pods = self._managed("pod")
        reaped = []
        for pod in pods:
            if pod.metadata.deletion_timestamp is not None:
                continue
            sandbox_id = (pod.metadata.labels or {}).get(LABEL_SANDBOX)
            finished = pod.status is not None and pod.status.phase in ("Succeeded", "Failed")
            if sandbox_id and (pod_expires_at(pod) <= now or (finished and self.config.delete_finished_pods)):
                self.delete(sandbox_id)
                reaped.append(sandbox_id)
        self._sweep_orphans({pod.metadata.labels.get(LABEL_SANDBOX) for pod in pods}, now)
        if reaped:
            log.info("sandboxes reaped", sandboxes=reaped)
        return reaped

    @unreachable_is_a_runtime_error
    def extend(self, sandbox_id: str, ttl_s: float) -> float:
        """Set the pod's expiry ``ttl_s`` from now and return it (its ``activeDeadlineSeconds`` cannot grow)."""
        expires_at = self._clock() + ttl_s
        body = {"metadata": {"annotations": {ANNOTATION_EXPIRES_AT: f"{expires_at:.3f}"}}}
        self._core.patch_namespaced_pod(
            pod_name(sandbox_id, self.config),
            self.config.namespace,
            body,
            _content_type="application/merge-patch+json",
            **self._timeout(),
        )
        return expires_at

    def stream_exec(
        self, pod: str, argv: list[str], stdin: IO[bytes] | None, timeout_s: float
    ) -> Iterator[StreamEvent]:
        """Run ``argv`` in the pod: stdout/stderr chunks, then ``("exit", code)``, ``None`` when it timed out."""
        started = time.monotonic()
        give_up = started + timeout_s + KILL_AFTER_S + self.config.exec_grace_s
        ws = self.open_stream(pod, argv, stdin=stdin is not None)
        try:
            if stdin is not None:
                feed_stdin(ws, stdin)
            while ws.is_open():
                if time.monotonic() >= give_up:
                    yield "exit", None
                    return
                ws.update(timeout=max(0.0, min(1.0, give_up - time.monotonic())))
                yield from drain_output(ws)
            yield from drain_output(ws)
            code = exit_code_of(ws.read_channel(3))
            timed_out = code in (124, 137) and time.monotonic() - started >= timeout_s
            yield "exit", None if timed_out else code
        except TRANSPORT_ERRORS as exc:
            raise KubernetesRuntimeError(f"exec in {pod} lost its connection: {exc}") from exc
        finally:
            ws.close()

    def _node_command(self, sandbox_id: str, argv: list[str]) -> None:
        """Run ``argv`` outside the exec wrapper (the working copy it changes to may not exist yet)."""
        events = self.stream_exec(pod_name(sandbox_id, self.config), argv, None, self.config.file_op_timeout_s)
        code = next((value for kind, value in events if kind == "exit"), None)
        if code != 0:
            raise KubernetesRuntimeError(f"{argv[0]} in the node's working copy of {sandbox_id} failed: exit {code}")

    def _remove_node_workspace(self, sandbox_id: str) -> None:
        """Best effort: the host directory of a host-exec node outlives its pod unless removed while it runs."""
        try:
            self._node_command(sandbox_id, ["rm", "-rf", "--", self.workspace_of(sandbox_id)])
        except (KubernetesRuntimeError, ApiException, OSError) as exc:
            log.debug("node working copy not removed", sandbox=sandbox_id, error=str(exc))

    def open_stream(self, pod: str, argv: list[str], *, stdin: bool = True, tty: bool = False) -> Any:
        """An exec WebSocket to ``argv`` in the pod (binary; with ``tty`` a terminal, stderr merged into stdout)."""
        try:
            return self._stream(
                self._exec_api().connect_get_namespaced_pod_exec,
                pod,
                self.config.namespace,
                command=argv,
                container=CONTAINER_NAME,
                stdin=stdin,
                stdout=True,
                stderr=not tty,
                tty=tty,
                _preload_content=False,
                binary=True,
            )
        except ApiException as exc:
            raise KubernetesRuntimeError(f"exec in {pod} failed: {describe_api_error(exc)}") from exc
        except TRANSPORT_ERRORS as exc:
            raise KubernetesRuntimeError(f"exec in {pod} failed: the API server could not be reached: {exc}") from exc

    def _exec_api(self) -> Any:
        if self._exec_configuration is None:
            return self._core
        api = getattr(self._local, "core", None)
        if api is None:
            api = self._local.core = client.CoreV1Api(client.ApiClient(self._exec_configuration))
        return api

    def _timeout(self) -> dict[str, float]:
        return {"_request_timeout": self.config.api_timeout_s}

    def _adopt(self, objects: EpisodeObjects, uid: str) -> None:
        owner = {"apiVersion": "v1", "kind": "Pod", "name": objects.pod.metadata.name, "uid": uid}
        body = {"metadata": {"ownerReferences": [owner]}}
        merge = {"_content_type": "application/merge-patch+json", **self._timeout()}
        self._core.patch_namespaced_secret(objects.secret.metadata.name, self.config.namespace, body, **merge)
        self._net.patch_namespaced_network_policy(
            objects.network_policy.metadata.name, self.config.namespace, body, **merge
        )

    def _wait_running(self, name: str) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        state = "not yet read"
        while time.monotonic() < deadline:
            pod = self._core.read_namespaced_pod(name, self.config.namespace, **self._timeout())
            stage, state = pod_start_state(pod)
            if stage == "running":
                return
            if stage == "failed":
                raise KubernetesStartError(f"pod {name} cannot start: {state}")
            self._sleep(self.config.poll_interval_s)
        raise KubernetesStartError(f"pod {name} not running after {self.config.start_timeout_s:g} s: {state}")

    def _teardown(self, sandbox_id: str, created: Sequence[str], *, policy_owned: bool) -> None:
        names = {"pod": pod_name(sandbox_id, self.config), "secret": secret_name(sandbox_id, self.config)}
        ns = self.config.namespace
        pod_gone = "pod" not in created
        if not pod_gone:
            pod_gone = not ignore_missing(
                self._core.delete_namespaced_pod, names["pod"], ns, propagation_policy="Background", **self._timeout()
            )
        if "secret" in created:
            ignore_missing(self._core.delete_namespaced_secret, names["secret"], ns, **self._timeout())
        if "policy" in created and (pod_gone or not policy_owned):
            ignore_missing(self._net.delete_namespaced_network_policy, names["pod"], ns, **self._timeout())

    def _managed(self, kind: Literal["pod", "secret", "policy"]) -> list[Any]:
        ns, selector = self.config.namespace, MANAGED_SELECTOR
        lister = {
            "pod": self._core.list_namespaced_pod,
            "secret": self._core.list_namespaced_secret,
            "policy": self._net.list_namespaced_network_policy,
        }[kind]
        return list(lister(ns, label_selector=selector, **self._timeout()).items)

    def _sweep_orphans(self, live: set[str | None], now: float) -> None:
        """Delete Secrets and policies whose pod is gone and that are older than a create could take."""
        cutoff = now - self.config.start_timeout_s - 2 * self.config.api_timeout_s
        kinds: tuple[tuple[Literal["secret", "policy"], Callable[..., Any]], ...] = (
            ("secret", self._core.delete_namespaced_secret),
            ("policy", self._net.delete_namespaced_network_policy),
        )
        for kind, delete in kinds:
            for obj in self._managed(kind):
                sandbox_id = obj.metadata.labels.get(LABEL_SANDBOX)
                created = obj.metadata.creation_timestamp
                if sandbox_id in live or created is None or created.timestamp() > cutoff:
                    continue
                ignore_missing(delete, obj.metadata.name, self.config.namespace, **self._timeout())
                log.info("orphan removed", kind=kind, name=obj.metadata.name)

    def _sandbox_of(self, pod: Any) -> KubernetesSandbox | None:
        raw = (pod.metadata.annotations or {}).get(ANNOTATION_SPEC)
        try:
            spec = SandboxSpec.model_validate_json(raw or "")
        except ValidationError:
            log.warning("pod without a valid sandbox spec annotation", pod=pod.metadata.name)
            return None
        if self.config.node_exec_root is not None:
            spec = spec.model_copy(update={"env": self._pod_environment(pod)})
        created = pod.metadata.creation_timestamp
        expires = pod_expires_at(pod)
        return KubernetesSandbox(
            self,
            spec,
            created_at=created.timestamp() if created is not None else None,
            expires_at=expires if expires != float("inf") else None,
        )

    def _pod_environment(self, pod: Any) -> dict[str, str]:
        """The spec's environment as the pod holds it (plain values, and the Secret's for the secret keys): what a
        kubelet gives the container, and what a host-exec node's commands must be handed (``node_exec_root``)."""
        env: dict[str, str] = {}
        from_secret = []
        for variable in pod.spec.containers[0].env or []:
            if variable.value is not None:
                env[variable.name] = variable.value
            elif variable.value_from is not None and variable.value_from.secret_key_ref is not None:
                from_secret.append((variable.name, variable.value_from.secret_key_ref))
        for name, ref in from_secret:
            secret = self._core.read_namespaced_secret(ref.name, self.config.namespace, **self._timeout())
            raw = (secret.data or {}).get(ref.key)
            if raw is not None:
                env[name] = base64.b64decode(raw).decode()
        for rendered in ("HOME", "OPENAI_BASE_URL"):  # the runtime's own, set again from the spec at each exec
            env.pop(rendered, None)
        return env
