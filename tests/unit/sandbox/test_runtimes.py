"""The sandbox runtime seam: settings keyed by ``type`` read from YAML, and ``open_runtime`` opening the one named."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.exceptions import ConfigError
from orchard.sandbox.factory import LocalRuntimeConfig, open_runtime, read_runtime_config
from orchard.sandbox.kubernetes.objects import KubernetesRuntimeConfig
from orchard.sandbox.local.runtime import LocalRuntime

KUBERNETES = "proxy: {port: 8100, pod_selector: {app: orchard-proxy}}\n"


def test_a_file_without_type_takes_the_flags_type_and_a_file_with_one_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "k8s.yaml").write_text(KUBERNETES)
    (tmp_path / "local.yaml").write_text("type: local\n")
    assert isinstance(read_runtime_config(tmp_path / "k8s.yaml", "kubernetes"), KubernetesRuntimeConfig)
    assert isinstance(read_runtime_config(tmp_path / "local.yaml", "kubernetes"), LocalRuntimeConfig)


@pytest.mark.parametrize(
    ("text", "message"),
    [("type: podman\n", "type"), ("- a list\n", "must be a mapping"), ("a: [\n", "not YAML"),
     (KUBERNETES + "namespace: Not_Valid\n", "namespace"), ("type: local\nroot: /x\n", "root")],
)  # fmt: skip
def test_a_bad_runtime_file_names_the_file_and_the_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "runtime.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as raised:
        read_runtime_config(path, "kubernetes")
    assert str(path) in str(raised.value)


def test_open_runtime_opens_the_local_backend_with_its_paths(tmp_path: Path) -> None:
    runtime = open_runtime(LocalRuntimeConfig(), sandboxes=tmp_path / "sandboxes", hidden_paths=[tmp_path / "secret"])
    try:
        assert isinstance(runtime, LocalRuntime)
    finally:
        runtime.close()
