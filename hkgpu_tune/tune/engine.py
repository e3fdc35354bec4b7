"""plan / apply (save originals first) / rollback (reverse order) / verify.

An apply is one transaction: the writes of every subsystem, then each subsystem's after_apply and
checks (subsystems.base.Check: the MTU proof, the Triton gate) in apply order. A failed write or
check undoes every write of the run, newest first, through the one journal; no subsystem undoes
anything by itself.

>>> eng = Engine(load_profile("hk-inference"), only=["sysctl"])   # doctest: +SKIP
>>> [r.status for r in eng.verify()]                               # doctest: +SKIP
['ok', 'drift', ...]
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hkgpu_tune import subsystems
from hkgpu_tune.backends import Backends
from hkgpu_tune.core import place
from hkgpu_tune.core.errors import CheckFailed, HkError, ProfileError, StateError, TargetGone, UnsupportedError
from hkgpu_tune.tune.journal import Journal
from hkgpu_tune.core.report import ERROR, UNSUPPORTED, Change, Result
from hkgpu_tune.tune.state import DEFAULT_STATE_DIR, STATE_FILE, State  # noqa: F401  (State is part of the API)


@dataclass
class ApplyReport:
    changes: list[Change] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)  # verify after apply
    error: str = ""
    rolled_back: bool = False
    notes: list[str] = field(default_factory=list)   # one line each from the subsystems (a gate's verdict)


class Engine:
    """One run over the profile's subsystems. Backends are swappable (tests)."""

    def __init__(self, profile, only: list[str] | None = None, state_dir: str | None = None,
                 backends: Backends | None = None, host_dir: str | None = None):
        self.profile = profile
        self.b = backends or Backends()
        self.state = State(state_dir, host_dir)
        if only:
            bad = [n for n in only if n not in subsystems.ORDER]
            if bad:
                raise HkError(f"--only: unknown subsystem {', '.join(bad)} "
                              f"(have: {', '.join(subsystems.ORDER)})")
        # only the subsystems this run needs: a section the profile lacks costs nothing (their modules are light)
        names = [n for n in subsystems.for_sections(profile.sections) if not only or n in only]
        self.subs = [subsystems.get(n)(profile, self.b) for n in names]
        self.by_name = {s.name: s for s in self.subs}
        self._extra: dict = {}   # subsystems rollback needs that this run did not select

    @staticmethod
    def _failed(sub, e: HkError) -> list[Result]:
        status = UNSUPPORTED if isinstance(e, UnsupportedError) else ERROR
        return [Result(sub.name, "-", "-", None, None, status, str(e))]

    def facts(self) -> dict:
        out = {}
        for s in self.subs:
            try:
                out[s.name] = s.facts()
            except HkError as e:
                out[s.name] = {"error": str(e)}
        return out

    def verify(self) -> list[Result]:
        res = []
        for s in self.subs:
            try:
                res += s.verify()
            except ProfileError:
                raise   # bad input: one line and exit 1, not a row among results
            except HkError as e:
                res += self._failed(s, e)
        return res

    def plan(self) -> tuple[list[Change], list[Result]]:
        changes, results = [], []
        for s in self.subs:
            try:
                c, r = s.plan()
            except ProfileError:
                raise   # before anything is written: the whole run stops, nothing on the host changes
            except HkError as e:
                c, r = [], self._failed(s, e)
            changes += c
            results += r
        return changes, results

    def apply(self, dry_run: bool = False) -> ApplyReport:
        if dry_run:
            changes, results = self.plan()
            return ApplyReport(changes=changes, results=results)
        with self.state.lock():   # a second apply or rollback fails fast; none loses originals
            return self._apply()

    def _apply(self) -> ApplyReport:
        changes, results = self.plan()
        rep = ApplyReport(changes=changes, results=results)
        if not changes:
            rep.results = self.verify()
            return rep
        j = Journal(self.state)
        place.stamp(changes, subsystems.netns_scoped)
        j.refuse_recorded_elsewhere(changes)   # before the first write: nothing changes
        checking = ""   # the subsystem whose after_apply or checks run
        try:
            for s in self.subs:
                mine = [c for c in changes if c.subsystem == s.name]
                if j.written or j.refusals:
                    # earlier writes can change what this subsystem must do (more channels bring
                    # more transmit queues, each with a qdisc): plan it again, now
                    try:
                        mine = s.plan()[0]
                    except HkError:
                        mine = []   # verify reports it
                self._write(j, mine)
            rep.changes = j.this_run
            for s in self.subs:   # in apply order: the MTU proof before the Triton gate
                checking = s.name
                mine = [c for c in j.written if c.subsystem == s.name]
                s.after_apply(mine)
                for ck in s.checks(mine):
                    self._check(j, s.name, ck)
                rep.notes += s.notes
            checking = ""
            for s in self.subs:   # the transaction stands
                s.committed([c for c in j.written if c.subsystem == s.name])
        except HkError as e:
            rep.changes = j.this_run
            rep.error = str(e)
            errs = j.undo_run(self._restore)
            rep.rolled_back = True
            if isinstance(e, CheckFailed):
                # the checked subsystem words its own undo ("the previous config is serving again")
                own = [m for c, m in errs if c.subsystem == checking]
                if own and e.undo_failed:
                    rep.error += f"; {e.undo_failed}: " + "; ".join(own)
                    errs = [(c, m) for c, m in errs if c.subsystem != checking]
                elif not own and e.undone:
                    rep.error += f"; {e.undone}"
            if errs:
                rep.error += "; rollback also failed: " + "; ".join(m for _, m in errs)
            if j.save_error:   # the journal could not follow the undo: say what state the host is in
                rep.error += ("; " + (f"every one of its {len(j.written)} write(s) was undone" if not errs else
                                      "the writes above were not undone") +
                              f", but {self.state.path} could not be rewritten ({j.save_error}): it may still "
                              "list originals already put back (rollback writes them again, harmlessly)")
            return rep
        try:
            j.finish()
        except HkError as e:
            rep.error = (f"applied, but {self.state.path} could not be updated ({e}): the originals were saved "
                         "before each write, so rollback restores this host")
            return rep
        rep.results = self.verify()
        for r in rep.results:
            if (r.subsystem, r.target, r.key) in j.refusals and r.status == "drift":
                r.status, r.reason = UNSUPPORTED, j.refusals[(r.subsystem, r.target, r.key)]
        return rep

    def _write(self, j: Journal, changes: list[Change]) -> None:
        place.stamp(changes, subsystems.netns_scoped)   # where each lives: a replaced device or another namespace is another setting
        j.originals(changes)   # on disk before the first write
        for c in changes:
            try:
                self.by_name[c.subsystem].apply(c)
            except UnsupportedError as e:
                # the kernel or driver would not take it: put the original back, go on
                try:
                    self.by_name[c.subsystem].restore(c)
                    put_back = True
                except HkError:
                    put_back = False
                j.refused(c, str(e), put_back)
                continue
            j.wrote(c)

    @staticmethod
    def _check(j: Journal, sub: str, ck) -> None:
        """One check of the transaction; a failure raises and _apply undoes the whole run."""
        try:
            ck.run()
        except HkError as e:
            j.checked(sub, ck.name, str(e))
            raise
        j.checked(sub, ck.name)

    def _restore(self, c: Change) -> str | None:
        if c.subsystem == "persist":
            from hkgpu_tune.tune.persist import undo_file
            return undo_file(c, self.state.dir)
        place.check(c)         # never written to another namespace or host than it was read from
        sub = self.by_name.get(c.subsystem) or self._sub(c.subsystem)
        sub.restore(c)
        return None

    def _sub(self, name):
        if name not in subsystems.SECTION:
            raise StateError(f"the state file names subsystem {name!r}, which this version lacks")
        if name not in self._extra:
            self._extra[name] = subsystems.get(name)(self.profile, self.b)
        return self._extra[name]

    def rollback(self, only: list[str] | None = None, forget: bool = False) -> "RollbackReport":
        """Restore the saved originals, newest first; each entry leaves the state file as soon as
        it is back, so a rollback killed at any point can be run again. `only`: just those
        subsystems ("persist": the files of --persist). A target that is gone (TargetGone) is
        kept and reported, or dropped with a note when `forget`."""
        known = [*subsystems.ORDER, "persist"]
        bad = [n for n in only or () if n not in known]
        if bad:
            raise HkError(f"rollback --only: unknown subsystem {', '.join(bad)} (have: {', '.join(known)})")
        rep = RollbackReport()
        if not self.state.check_dir():
            return rep
        if not only or "persist" in only:
            from hkgpu_tune.tune.persist import _refuse_legacy
            _refuse_legacy(self.state.dir)
        with self.state.lock():
            entries = self.state.load()
            stale, save_error = 0, ""
            for c in reversed(list(entries)):
                if only and c.subsystem not in only:
                    continue
                try:
                    line = self._restore(c)
                except TargetGone as e:
                    if not forget:
                        rep.errors.append(f"{c.subsystem} {c.target} {c.key}: {e} (kept: run rollback again "
                                          "when it is back, or rollback --forget to drop it)")
                        rep.kept.append(c)
                        continue
                    rep.forgotten.append(f"{c.subsystem} {c.target} {c.key}: {e}: original dropped (--forget)")
                    self.state.log.append({"event": "forgotten", "subsystem": c.subsystem, "target": c.target,
                                           "key": c.key, "detail": str(e)[:500]})
                except HkError as e:
                    rep.errors.append(f"{c.subsystem} {c.target} {c.key}: {e}")
                    continue
                except OSError as e:   # one entry's failure never stops the others
                    rep.errors.append(f"{c.subsystem} {c.target} {c.key}: {e.filename or ''}: {e.strerror}")
                    continue
                else:
                    rep.restored.append(c)
                    if line:
                        rep.files.append(line)
                entries.remove(c)
                # shrinking (listed already); a full or read-only directory never stops the restores
                try:
                    self.state.save(entries, register=False)
                    stale, save_error = 0, ""
                except (HkError, OSError) as e:
                    stale, save_error = stale + 1, str(e)
            if save_error:
                rep.errors.append(f"{self.state.path}: could not be rewritten ({save_error}): every original "
                                  f"reported restored above is back on the host, but the state file still lists "
                                  f"{stale} of them; run rollback again once the directory is writable (restoring "
                                  "again is harmless)")
                rep.stale = stale
        return rep


@dataclass
class RollbackReport:
    """What rollback did. Unpacks as (restored, errors) like before."""

    restored: list[Change] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    kept: list[Change] = field(default_factory=list)        # target gone, original kept
    forgotten: list[str] = field(default_factory=list)      # target gone, dropped on --forget
    files: list[str] = field(default_factory=list)          # persisted files removed or restored
    stale: int = 0      # restored, but still listed: the state file could not be rewritten

    @property
    def kept_files(self) -> list[str]:
        """Files left as they are (changed since the tool wrote them): the host is not as before."""
        return [f for f in self.files if f.startswith("kept ")]

    def __iter__(self):
        return iter((self.restored, self.errors))
