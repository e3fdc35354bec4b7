"""The running server: where it is and how it runs (a systemd unit, a container command, a
supervised process), start, stop and readiness, the HTTP client that speaks to it, and keep-warm."""

# the launch forms register themselves (form_base.FORMS) as they are imported
from hkgpu_tune.serve.running import container, forms  # noqa: E402,F401
