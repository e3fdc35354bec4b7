"""The launch forms of the server (the profile's `launch`), one class each, chosen once by name:
forms.Binary (tritonserver itself) and container.Container (a container runtime's `run`). They
register here, where neither imports the other (running/__init__ imports both).

>>> form("binary").name                                       # doctest: +SKIP
'binary'
"""
from __future__ import annotations

FORMS: dict[str, type["Form"]] = {}


class Form:
    """What differs between launch forms: the command, what it needs before it starts, the
    environment and user it is given, its unit's [Service] lines, the program a record may run."""
    name = ""
    pinned = False     # whether the started process is pinned to the placement's CPUs by this tool
    own_user = False   # whether the tool picks the server's user (else the runtime's or the image's)

    def argv(self, t, place: dict, backends=None, resolve: bool = True) -> list[str]:
        """The full argv the service runs (resolve=False: a unit's, resolved when the unit starts)."""
        raise NotImplementedError

    def check(self, t, backends) -> None:
        """What must hold before the start (the binary and its backends, or the image's backends)."""
        raise NotImplementedError

    def env(self, t, backends=None) -> dict[str, str]:
        """The environment added to the caller's for a supervised process."""
        return {}

    def program(self, t, argv: list[str]) -> list[str]:
        """The argv a supervised process is spawned with (a runtime by absolute path)."""
        return argv

    def unit_service(self, t, argv: list[str], pos) -> list[str]:
        """The [Service] lines between Type= and the limits."""
        raise NotImplementedError

    def main_pid(self, t, pid: int, backends) -> int:
        """The server's pid, given that of the process we started."""
        return pid

    def before_signal(self, t, timeout: float) -> None:
        """What stops the server before its process group is signalled."""

    def recognise(self, argv: list[str]) -> bool:
        """Whether a saved argv runs this form's program (records.check_record)."""
        raise NotImplementedError

    def check_saved(self, argv: list[str]) -> None:
        """A saved argv against the shape the renderer writes (HkError where it differs)."""

    def trtexec(self, t, build, plan: str, cmd=None):
        """trtexec in the form's own image: (argv up to its flags, TensorRT version, where); None: the host's."""
        return None

    def trtexec_missing(self, t, cmd=None) -> str | None:
        """Why the form's image cannot build a plan ("" when it can); None: the host's trtexec decides."""
        return None


def register(cls: type[Form]) -> type[Form]:
    FORMS[cls.name] = cls
    return cls


def form(name: str) -> Form:
    """The form by the profile's or a record's `launch` name."""
    return FORMS[name]()
