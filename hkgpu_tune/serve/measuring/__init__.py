"""Measuring the server: the deployment gate, the load generator, the independent plain clients
(HTTP and gRPC) it is checked against, and the sweep with its table and chart."""
