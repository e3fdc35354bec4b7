"""One exception base, a few meaningful subclasses (translated to exit codes at the CLI)."""


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


class CheckFailed(ApplyError):
    """A check of the apply's transaction failed (the MTU proof, the Triton gate): the engine undoes
    every write of the run through its journal. `undone` is added to the message when the checked
    subsystem's writes are all back; `undo_failed` leads its undo errors otherwise."""

    def __init__(self, msg, undone: str = "", undo_failed: str = ""):
        super().__init__(msg)
        self.undone, self.undo_failed = undone, undo_failed


class StateError(HkError):
    """The state file is missing, unreadable or not ours."""



class TargetGone(HkError):
    """The device a saved original belongs to is gone or was replaced (name or permanent MAC
    differ): rollback keeps the entry until it returns or the operator says --forget."""


class LockError(HkError):
    """Another apply, rollback or health run holds the state directory's lock."""
