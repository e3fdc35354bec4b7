"""The verbs every subsystem has: read() -> state, compare(state) -> [Result],
plan() -> [Change], apply(change), restore(change), verify() -> [Result]."""
from __future__ import annotations

from hkgpu_tune.core.report import DRIFT, Change, Result


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
        """Checks that need the whole batch in place (the MTU probe). Raise to roll back."""

    def result(self, target, key, current, desired, status, reason="", **kw) -> Result:
        return Result(self.name, target, key, current, desired, status, reason, **kw)
