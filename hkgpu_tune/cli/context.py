"""What every command shares: the parsed arguments, and the profile, engine and console made on first use."""
from __future__ import annotations

import argparse
import os
import sys

EXIT_OK, EXIT_ERROR, EXIT_DRIFT = 0, 1, 2


def nonempty(value: str) -> str:
    """argparse type: '' (say, an unset shell variable) must not quietly mean the default."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def subsystem_list(value: str) -> list[str]:
    names = [s.strip() for s in value.split(",") if s.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated subsystem names, got {value!r}")
    return names


class Context:
    def __init__(self, args):
        self.args = args
        self._profile = None
        self._engine = None
        self._console = None

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    def only(self):
        return getattr(self.args, "only", None)  # a list from subsystem_list, or None

    @property
    def profile(self):
        if self._profile is None:
            from ..profile import load_profile
            self._profile = load_profile(self.args.profile)
        return self._profile

    @property
    def engine(self):
        if self._engine is None:
            from ..engine import Engine
            self._engine = Engine(self.profile, only=self.only(), state_dir=self.args.state_dir)
        return self._engine

    @property
    def console(self):
        """rich is imported only here: --json never needs it."""
        if self._console is None:
            from rich.console import Console
            # into a log or the journal (no terminal): wide rows, so a key stays on one line for grep
            wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
            self._console = Console(stderr=False, soft_wrap=False, width=200 if wide else None)
        return self._console

    def line(self, *parts) -> None:
        """One line of plain text and (text, style) pairs; values are never read as rich markup."""
        if self.json:
            print("".join(p if isinstance(p, str) else p[0] for p in parts))
            return
        from rich.text import Text
        self.console.print(Text.assemble(*parts), soft_wrap=True)  # one line, never wrapped

    def close(self) -> None:
        if self._engine is not None:
            self._engine.b.close()
