"""Queueing discipline on each interface: the root, and the child of every mq transmit queue."""
from __future__ import annotations

import re

from hkgpu_tune.core.errors import ApplyError
from hkgpu_tune.core.report import DRIFT, OK, UNSUPPORTED
from hkgpu_tune.core.match import could_match, find, identity, matched, resolve
from hkgpu_tune.core import fields
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.subsystems.base import Spec, Subsystem


class Plugin(Subsystem):
    name = "qdisc"

    def read(self) -> dict:
        links, qdiscs = self.b.net.links(could_match(self.profile.network.interfaces)), {}
        for ln in matched(self.profile, links, ("qdisc",)):
            ln["tx_queues"] = self.b.net.tx_queues(ln)   # in use now (the link list is cached)
            qdiscs[ln["name"]] = self.b.tc.qdiscs(ln["index"])
        return {"links": links, "qdiscs": qdiscs}

    def facts(self) -> dict:
        return self.read()["qdiscs"]

    def compare(self, state):
        pairs, res = resolve(self, state["links"], "qdisc")
        for rule, ln in pairs:
            name, kind, q = ln["name"], rule.qdisc, state["qdiscs"][ln["name"]]
            multi = ln["tx_queues"] > 1
            in_place = (q["root"] == "mq" and len(q["children"]) == ln["tx_queues"]
                        and set(q["children"].values()) == {kind}) if multi else q["root"] == kind
            # ask the kernel whether it has the kind only when something must change
            supported, why = (True, "") if in_place else self.b.tc.supported(kind)
            data = {"identity": identity(ln), "orig": q}
            if not multi:
                st = OK if q["root"] == kind else (DRIFT if supported else UNSUPPORTED)
                res.append(self.result(name, "root", q["root"], kind, st, "" if st == OK else (why or "differs"),
                                       write=kind if st == DRIFT else None, data=data))
                continue
            # several transmit queues: mq at the root, the kind on each queue. The kernel's own mq
            # (handle 0:) cannot be given a qdisc per queue (tc: ENOENT): it is replaced by mq 1:.
            own = q["root"] == "mq" and q["root_handle"] == "0:0" and not in_place
            root_ok = q["root"] == "mq" and not own
            st = OK if root_ok else (DRIFT if supported else UNSUPPORTED)
            cur_root = "mq 0: (the kernel's)" if own else q["root"]
            reason = ("" if root_ok else why or ("the kernel's own mq takes no qdisc per queue: mq 1: replaces it"
                                                  if own else f"{ln['tx_queues']} transmit queues need mq at the root"))
            res.append(self.result(name, "root", cur_root, "mq", st, reason,
                                   write=f"mq+{kind}" if st == DRIFT else None, data=data))
            maj = q["root_handle"].split(":")[0] if q["root"] == "mq" else None
            for i in range(1, ln["tx_queues"] + 1):
                cur = q["children"].get(f"{maj}:{i:x}") if maj is not None else None
                parent = f"{maj}:{i:x}" if root_ok else f"queue {i}"
                if cur == kind:
                    res.append(self.result(name, f"queue {i}", cur, kind, OK))
                elif not supported:
                    res.append(self.result(name, f"queue {i}", cur, kind, UNSUPPORTED, why))
                else:
                    res.append(self.result(name, f"queue {i}", cur, kind, DRIFT,
                                           "differs" if root_ok else "set with the root",
                                           write=kind if root_ok else None,
                                           data={**data, "parent": parent}))
        return res

    def write(self, target, key, value, data):
        idx, tc = find(self.b.net, data, f"qdisc {key}")["index"], self.b.tc
        if key == "root":
            if value.startswith("mq+"):
                tc.replace_root(idx, "mq", target)
                q = tc.qdiscs(idx)
                maj = q["root_handle"].split(":")[0]
                n = len(q["children"]) or 1
                for i in range(1, n + 1):
                    tc.replace_child(idx, f"{maj}:{i:x}", value[3:], target)
            else:
                tc.replace_root(idx, value, target)
            want = "mq" if value.startswith("mq+") else value
        else:
            tc.replace_child(idx, data["parent"], value, target)
            want = value
        q = tc.qdiscs(idx)
        got = q["root"] if key == "root" else q["children"].get(data["parent"])
        if got != want:
            raise ApplyError(f"{target}: qdisc {key}: set {want}, the kernel shows {got}")

    def restore(self, change):
        idx = find(self.b.net, change.data, f"qdisc {change.key}")["index"]
        tc, orig = self.b.tc, change.data["orig"]
        if change.key != "root":
            if change.current:   # a queue that had no qdisc of its own keeps the default
                tc.replace_child(idx, change.data["parent"], change.current, change.target)
            return
        # back to the kernel's default, then the original where it was not the default
        tc.delete_root(idx, change.target)
        now = tc.qdiscs(idx)
        if orig["root"] not in (now["root"], "noqueue"):
            if orig["root"] != "mq":
                tc.replace_root(idx, orig["root"], change.target)
            else:
                tc.replace_root(idx, "mq", change.target)
                now = tc.qdiscs(idx)
        if orig["root"] == "mq":
            # the queues as they were (by queue number: the handle may differ)
            want = {p.split(":")[1]: k for p, k in orig["children"].items()}
            have = {p.split(":")[1]: k for p, k in now["children"].items()} if now["root"] == "mq" else {}
            if all(have.get(m) == k for m, k in want.items()):
                return
            if now["root"] != "mq" or now["root_handle"] == "0:0":   # the kernel's own: not addressable
                tc.replace_root(idx, "mq", change.target)
                now = tc.qdiscs(idx)
            maj = now["root_handle"].split(":")[0]
            for m, kind in want.items():
                if now["children"].get(f"{maj}:{m}") != kind:
                    tc.replace_child(idx, f"{maj}:{m}", kind, change.target)


# ---------------------------------------------------------------- the setting types (state.json)
_QDISC_KIND = re.compile(r"[a-z0-9_]{1,16}")


_HANDLE = re.compile(r"[0-9a-f]{1,4}:[0-9a-f]{0,4}")


def _check_queue(c) -> None:
    fields.identity(c.data)
    fields.ifname(c.target)
    if c.key != "root" and not re.fullmatch(r"queue [0-9]{1,5}", c.key):
        fields.fail(f"key: {c.key!r}, expected 'root' or 'queue N'")
    fields.text(c.current, "original", maxlen=64, none=True)
    fields.text(c.desired, "desired", maxlen=64, none=True)
    for k, v in (("original", c.current), ("desired", c.desired)):
        if c.key != "root" and v is not None and not _QDISC_KIND.fullmatch(v):
            fields.fail(f"{k}: {v!r} is not a qdisc kind")
    d = c.data
    fields.integer(d.get("index"), "data.index", 1, 2**31 - 1, none=True)
    if "parent" in d and not (isinstance(d["parent"], str) and
                              (_HANDLE.fullmatch(d["parent"]) or re.fullmatch(r"queue [0-9]{1,5}", d["parent"]))):
        fields.fail(f"data.parent: {d['parent']!r} is not a qdisc handle")
    orig = d.get("orig")
    if not isinstance(orig, dict):
        fields.fail("data.orig: expected the original qdiscs")
    root, handle, children = orig.get("root"), orig.get("root_handle"), orig.get("children", {})
    if root is not None and not (isinstance(root, str) and _QDISC_KIND.fullmatch(root)):
        fields.fail(f"data.orig.root: {root!r} is not a qdisc kind")
    if handle is not None and not (isinstance(handle, str) and _HANDLE.fullmatch(handle)):
        fields.fail(f"data.orig.root_handle: {handle!r} is not a qdisc handle")
    if not isinstance(children, dict) or len(children) > 4096:
        fields.fail("data.orig.children: expected handle: kind")
    for h, k in children.items():
        if not _HANDLE.fullmatch(h) or not (isinstance(k, str) and _QDISC_KIND.fullmatch(k)):
            fields.fail(f"data.orig.children: {h!r}: {k!r} is not a handle and a qdisc kind")


SPEC = Spec(name="qdisc", order=40, section="network", plugin=Plugin, persist="boot", netns=True,
            types=(SettingType("qdisc.queue", "qdisc", _check_queue),))
