"""The ``kubernetes`` runtime (``runtime.KubernetesRuntime``): one Pod per episode; ``objects`` renders what it
sends to the cluster."""
