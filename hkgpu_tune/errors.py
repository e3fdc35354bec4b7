"""One exception base, a few meaningful subclasses (translated to exit codes at the CLI)."""
import errno as _errno


class HkError(Exception):
    """Base of every expected failure. The CLI prints it on one line and exits 1."""

    def __init__(self, msg, errno=None):
        super().__init__(msg)
        self.errno = errno


class ProfileError(HkError):
    """The profile is invalid. Message: 'file:line: key.path: problem'."""


class UnsupportedError(HkError):
    """The kernel, driver or hardware lacks this setting."""


class ApplyError(HkError):
    """A write failed (the engine rolls back what it changed)."""


class StateError(HkError):
    """The state file is missing, unreadable or not ours."""


def from_oserror(exc, what):
    """Map an OSError or NetlinkError to our exceptions, keeping errno."""
    code = getattr(exc, "errno", None) or getattr(exc, "code", None)
    if code in (_errno.EOPNOTSUPP, _errno.ENOENT, _errno.EINVAL, _errno.ENODEV) and "unsupported" in what:
        return UnsupportedError(f"{what}: {exc}", code)
    if code in (_errno.EPERM, _errno.EACCES):
        return HkError(f"{what}: permission denied (run as root)", code)
    return ApplyError(f"{what}: {exc}", code)
