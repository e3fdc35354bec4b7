"""The verbs every subsystem has: read() -> state, compare(state) -> [Result],
plan() -> [Change], apply(change), restore(change), verify() -> [Result]."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.core.report import DRIFT, Change, Result


@dataclass(frozen=True)
class Check:
    """A check that the engine's transaction runs once the writes are done (the MTU proof, the
    Triton gate). run() returns when it passes and raises an HkError with the reason when it fails
    (CheckFailed to word the undo); the engine then undoes every write of the run, newest first,
    through its one journal. A check never undoes anything itself."""
    name: str
    run: Callable[[], None]


class Subsystem:
    """Base of a subsystem. A subclass sets `name` and implements read, compare and write.

    compare() is the single place where live state meets the profile: verify returns
    its results, plan turns its fixable drifts into Changes.
    """

    name = ""
    facts_only = False   # reads facts, sets and verifies nothing (firewall, rdma)

    def __init__(self, profile, backends):
        self.profile = profile
        self.b = backends
        self.notes: list[str] = []   # one line each, printed by apply (a gate's verdict)

    # --- to implement
    def read(self) -> dict:
        """The live state this subsystem looks at (also what `facts` prints)."""
        raise NotImplementedError

    def compare(self, state: dict) -> list[Result]:
        raise NotImplementedError

    def write(self, target: str, key: str, value, data: dict) -> None:
        """Set one value. Raises HkError subclasses on failure."""
        raise NotImplementedError

    # --- shared
    def facts(self) -> dict:
        return self.read()

    def verify(self) -> list[Result]:
        return self.compare(self.read())

    def plan(self, state: dict | None = None) -> tuple[list[Change], list[Result]]:
        results = self.compare(self.read() if state is None else state)
        changes = [Change(r.subsystem, r.target, r.key, r.current, r.write, dict(r.data))
                   for r in results if r.status == DRIFT and r.write is not None]
        return changes, results

    def apply(self, change: Change) -> None:
        self.write(change.target, change.key, change.desired, change.data)

    def restore(self, change: Change) -> None:
        self.write(change.target, change.key, change.current, change.data)

    def after_apply(self, changes: list[Change]) -> None:
        """Bring live what needs the whole batch written (Triton's loads or one restart). Raise to
        roll back; never undo here: the journal's entries are restored by restore()."""

    def checks(self, changes: list[Change]) -> list[Check]:
        """The checks of what this run wrote (`changes`), run by the engine after after_apply."""
        return []

    def committed(self, changes: list[Change]) -> None:
        """Every check of the apply passed: tidy what only its undo needed (Triton's newer model copies)."""

    def result(self, target, key, current, desired, status, reason="", **kw) -> Result:
        return Result(self.name, target, key, current, desired, status, reason, **kw)


# how a subsystem's settings survive a reboot (tune/persist.py reads it)
PERSIST = {"boot": "the boot unit re-applies them (the kernel or driver forgets them)",
           "sysctl.d": "a file in /etc/sysctl.d",
           "network manager": "the network manager that owns the link, else the boot unit",
           "unit": "a systemd unit of its own",
           "none": "nothing to keep: it reports facts only"}


class SpecError(Exception):
    """A subsystem declared incompletely: a programming error the conformance test catches."""


@dataclass(frozen=True)
class Spec:
    """A subsystem, declared whole in its own module as `SPEC`; subsystems/__init__.py registers it
    and every list of subsystems in the package derives from the registry.

    sections: the profile sections it owns, name -> parser(node); `section` must be read by it
    (owned here or by another subsystem). types: what state.json may hold for it; kind_of picks the
    type of a Change where it has several. netns: whether a setting lives in one network namespace
    (a predicate on the key where only some do). checks: (sections needed, check(profile)) run
    across sections once all are parsed.
    """
    name: str
    order: int
    section: str
    plugin: type
    types: tuple = ()
    persist: str = ""
    netns: bool | Callable[[str], bool] = False
    sections: dict = field(default_factory=dict)
    also: tuple = ()
    kind_of: Callable[[Change], str] | None = None
    checks: tuple = ()

    def type_of(self, c: Change) -> str:
        if self.kind_of is not None:
            return self.kind_of(c)
        return self.types[0].name

    def per_netns(self, key) -> bool:
        return self.netns(str(key)) if callable(self.netns) else bool(self.netns)


def _overrides(cls, verb: str) -> bool:
    return getattr(cls, verb, None) is not getattr(Subsystem, verb)


def check_spec(s) -> None:
    """SpecError naming the subsystem and each piece it lacks."""
    name = getattr(s, "name", None)
    who = f"subsystem {name!r}"
    if not isinstance(s, Spec):
        raise SpecError(f"{who}: not a Spec (got {type(s).__name__})")
    bad = []
    if not (isinstance(name, str) and name.isidentifier() and name.islower()):
        bad.append("name: a lower-case identifier")
    if isinstance(s.order, bool) or not isinstance(s.order, int):
        bad.append("order: an int (apply order)")
    if not (isinstance(s.section, str) and s.section):
        bad.append("section: the profile section it reads")
    if not (isinstance(s.plugin, type) and issubclass(s.plugin, Subsystem)):
        bad.append("plugin: a Subsystem subclass")
    else:
        if s.plugin.name != name:
            bad.append(f"plugin.name: {s.plugin.name!r}, expected {name!r}")
        verbs = ("read",) if s.plugin.facts_only else ("read", "compare", "write")
        bad += [f"plugin.{v}: not implemented" for v in verbs if not _overrides(s.plugin, v)]
        if s.plugin.facts_only != (s.persist == "none"):
            bad.append("persist: 'none' exactly when the plugin is facts_only")
        if not s.plugin.facts_only and not s.types:
            bad.append("types: the setting types its saved originals have (state.json)")
    if s.persist not in PERSIST:
        bad.append(f"persist: one of {', '.join(repr(k) for k in PERSIST)}")
    for t in s.types:
        if not (isinstance(t, SettingType) and t.subsystem == name and t.name.startswith(f"{name}.")
                and callable(t.check)):
            bad.append(f"types: {getattr(t, 'name', t)!r} is not a SettingType '{name}.KIND' of {name!r}")
    if len(s.types) > 1 and s.kind_of is None:
        bad.append("kind_of: which of its several types a change is")
    if not (isinstance(s.netns, bool) or callable(s.netns)):
        bad.append("netns: a bool or a predicate on the key")
    if not isinstance(s.sections, dict) or not all(isinstance(k, str) and callable(v) for k, v in s.sections.items()):
        bad.append("sections: {section name: parser(node)}")
    if not all(isinstance(a, str) for a in s.also):
        bad.append("also: section names")
    if not all(isinstance(n, tuple) and callable(f) for n, f in s.checks):
        bad.append("checks: ((sections), check(profile)) pairs")
    if bad:
        raise SpecError(f"{who} is incomplete: " + "; ".join(bad))
