"""The running server: where it is and how it runs (a systemd unit, a container command, a
supervised process), start, stop and readiness, the HTTP client that speaks to it, and keep-warm."""
