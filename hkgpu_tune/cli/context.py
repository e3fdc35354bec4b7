"""What every command shares: the parsed arguments, and the profile, engine and console made on first use."""
from __future__ import annotations

import argparse

from hkgpu_tune.core.errors import HkError

EXIT_OK, EXIT_ERROR, EXIT_DRIFT = 0, 1, 2
PROFILE_HELP = ("profile file or shipped profile name (default: $HKGPU_TUNE_PROFILE, else "
                "/etc/hkgpu-tune/node.yaml, else /etc/hkgpu-tune/profile.yaml, else hk-inference)")


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
        """--profile > $HKGPU_TUNE_PROFILE > the node's profile > the persisted one > the shipped default."""
        if self._profile is None:
            from hkgpu_tune.core.profile import load_chosen
            self._profile = load_chosen(getattr(self.args, "profile", None))
        return self._profile

    @property
    def engine(self):
        if self._engine is None:
            from hkgpu_tune import subsystems
            from hkgpu_tune.tune.engine import Engine
            only, prof = self.only(), self.profile
            if only:   # a subsystem the profile has no section for: an error, never a green run of nothing
                known = [n for n in only if n in subsystems.SECTION]
                have = subsystems.for_sections(prof.sections)
                lacking = [n for n in known if n not in have]
                if lacking and len(known) == len(only):
                    raise HkError(f"--only {','.join(lacking)}: the profile {prof.label} has no "
                                  f"{', '.join(dict.fromkeys(subsystems.SECTION[n] + ':' for n in lacking))} "
                                  f"section (it has: {', '.join(have) or 'nothing'})")
                facts = [n for n in known if subsystems.get(n).facts_only]
                if facts and len(facts) == len(only) and self.command != "facts":
                    raise HkError(f"--only {','.join(facts)}: {', '.join(facts)} only report facts and have "
                                  f"nothing to {self.command}: run `hkgpu-tune facts --only {','.join(facts)}`")
            self._engine = Engine(prof, only=only, state_dir=self.args.state_dir)
        return self._engine

    def envelope(self, data: dict, profile=True) -> dict:
        """The command's JSON: report.envelope with this command's name and profile."""
        from hkgpu_tune.core.report import envelope
        return envelope(self.command, data, self.profile if profile is True else profile)

    def dump(self, data: dict, profile=True) -> None:
        import json
        print(json.dumps(self.envelope(data, profile), indent=2, default=str))

    @property
    def command(self) -> str:
        a = self.args
        return " ".join(x for x in (a.cmd, getattr(a, "triton_cmd", None) or getattr(a, "action", None)
                                    or getattr(a, "profiles_cmd", None)) if isinstance(x, str))

    def header(self, title: str | None = None) -> None:
        """The first line of a table report: which profile, and why."""
        from hkgpu_tune.core.profile import SOURCES
        p = self.profile
        self.line(f"{title or self.command}: profile {p.label} ({SOURCES.get(p.source, p.source)})")

    @property
    def console(self):
        """rich is imported only here: --json never needs it. 80 columns off a terminal (report.make_console)."""
        if self._console is None:
            from hkgpu_tune.core.report import make_console
            self._console = make_console()
        return self._console

    def line(self, *parts) -> None:
        """One line of plain text and (text, style) pairs; values are never read as rich markup;
        a long line wraps at spaces."""
        if self.json:
            print("".join(p if isinstance(p, str) else p[0] for p in parts))
            return
        from rich.text import Text
        self.console.print(Text.assemble(*parts))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.b.close()
