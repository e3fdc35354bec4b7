"""Well-known places on a node, shared by layers that must not import each other."""
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"   # Debian's prometheus-node-exporter textfile collector
TEXTFILE_NAME = "hkgpu-tune.prom"
