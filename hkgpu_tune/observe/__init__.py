"""Read-only views of the node: collectors, the Prometheus export, health and its hooks."""
