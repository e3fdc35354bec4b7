"""Standard output that a closed descriptor or a reader that went away cannot turn into a traceback.

The work a command does (apply, rollback) must never stop half-way because nobody reads its report:
writes after a broken pipe or to a closed stdout are dropped and the command's exit code stands."""
from __future__ import annotations

import os
import sys

CLOSED, BROKEN = "closed", "broken pipe"


def reopen_closed_fds() -> None:
    """Put /dev/null on a closed fd 0, 1 or 2, so that no file the tool opens (state, a netlink
    socket) takes its number and receives what a child process writes to its stdout."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


class GuardedStdout:
    """Wraps sys.stdout (None when the process started with fd 1 closed)."""

    encoding = "utf-8"

    def __init__(self, stream):
        self._stream = stream
        self.lost = None if stream is not None else CLOSED
        self.dropped = False  # something was written that nobody will read
        if stream is not None:
            self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def _drop(self, why: str) -> None:
        self.lost = why
        # later flushes, the interpreter's own at exit included, go to /dev/null
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass

    def write(self, s: str) -> int:
        if self.lost is not None:
            self.dropped = self.dropped or bool(s)
        else:
            try:
                self._stream.write(s)
            except BrokenPipeError:
                self._drop(BROKEN)
            except ValueError:  # the stream object itself was closed
                self.lost = CLOSED
        return len(s)

    def flush(self) -> None:
        if self.lost is None:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop(BROKEN)
            except ValueError:
                self.lost = CLOSED

    def isatty(self) -> bool:
        try:
            return self.lost is None and self._stream.isatty()
        except ValueError:
            return False

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError("standard output is closed")
        return self._stream.fileno()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def install() -> GuardedStdout:
    reopen_closed_fds()
    out = GuardedStdout(sys.stdout if not isinstance(sys.stdout, GuardedStdout) else sys.stdout._stream)
    sys.stdout = out
    return out
