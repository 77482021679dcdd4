#!/usr/bin/env bash
# The test command: set up (idempotent), lint, check schema compatibility, then run the whole suite.
# The suite's session fixtures start a real Apache Kafka broker and a real S3 server (SeaweedFS) through
# infra/local/services.py, and a real Kubernetes control plane (kube-apiserver, etcd, kwok nodes) through
# infra/local/kubernetes/cluster.py, and stop them at the end; set ORCHARD_KAFKA_BOOTSTRAP / ORCHARD_S3_ENDPOINT /
# ORCHARD_K8S_TEST_KUBECONFIG to use running ones instead. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash infra/local/setup.sh
bash infra/local/kubernetes/build.sh   # the control plane's binaries: built once (most of an hour cold), cached
.venv/bin/ruff check .
.venv/bin/orchard schemas check
exec .venv/bin/pytest "$@"
