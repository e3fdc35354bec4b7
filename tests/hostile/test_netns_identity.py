"""A network namespace is named by an identity the kernel never reuses (the boot id and the
namespace's cookie), not by its inode, which the next namespace made after a deletion may get. An
entry recorded in a namespace since deleted is never written into the namespace that now has its
inode; an entry without that identity is honoured only in the host's own namespace."""
import json
import os

import pytest

from .conftest import sh, write_profile

pytestmark = pytest.mark.root


def where_here(net):
    """The place the tool records inside net.A, read with the tool's own CLI (the state it saves)."""
    return json.loads(sh("ip", "netns", "exec", net.A, "python3", "-c",
                         "import json; from hkgpu_tune.core import place; print(json.dumps(place.here()))").stdout)


def saved(net, tmp_path):
    p = write_profile(tmp_path, f"""\
network:
  interfaces:
    - match: {{name: {net.a}}}
      mtu: 9000
  fabric_peers: [{net.ipb}]
""")
    sh("ip", "-n", net.B, "link", "set", net.b, "mtu", "9000")
    st = tmp_path / "st"
    rc, doc = net.hkjson("apply", "--profile", p, "--only", "link", state=st)
    assert rc == 0 and doc["error"] == "", doc
    assert net.link()["mtu"] == 9000
    return st, json.loads((st / "state.json").read_text())


def rewrite(st, doc, **where):
    for e in doc["entries"]:
        if "where" in e["data"]:
            e["data"]["where"] = {k: v for k, v in {**e["data"]["where"], **where}.items() if v is not None}
    (st / "state.json").write_text(json.dumps(doc))


def test_apply_records_the_namespace_cookie_and_rollback_in_it_restores(net, tmp_path):
    st, doc = saved(net, tmp_path)
    here = where_here(net)
    w = doc["entries"][0]["data"]["where"]
    assert here["netns_id"] and w["netns_id"] == here["netns_id"] and w["init"] is False, w
    r = net.hk("rollback", state=st)
    assert r.returncode == 0 and net.link()["mtu"] == 1500, r.stdout + r.stderr


def test_an_entry_of_a_deleted_namespace_whose_inode_came_back_is_not_written(net, tmp_path):
    """The entry carries this namespace's inode (as the kernel hands a freed inode to the next
    namespace) but the cookie of one that is gone: not touched, reported, kept."""
    st, doc = saved(net, tmp_path)
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    rewrite(st, doc, netns_id=f"{boot}:1")       # cookie 1: the first namespace of this boot, not this one
    r = net.hk("rollback", state=st)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "another network namespace" in out, out
    assert net.link()["mtu"] == 9000 and (st / "state.json").exists()


def test_an_entry_without_the_identity_is_refused_outside_the_hosts_namespace(net, tmp_path):
    st, doc = saved(net, tmp_path)
    rewrite(st, doc, netns_id=None, init=None)   # as an older version wrote it: the inode only
    r = net.hk("rollback", state=st)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "without a namespace identity" in out, out
    assert net.link()["mtu"] == 9000


def test_the_rule_honours_an_old_entry_in_the_initial_namespace_and_a_reboot():
    from hkgpu_tune.core import place
    from hkgpu_tune.core.errors import TargetGone
    from hkgpu_tune.core.report import Change
    now = {"host": "ab", "netns": 4026531840, "netns_id": "b2:1", "init": True}
    c = Change("link", "eth9", "mtu", 1500, 9000, {})
    for w in ({"host": "ab", "netns": 4026531840},                                   # old, initial
              {"host": "ab", "netns": 4026531840, "netns_id": "b1:1", "init": True},  # before a reboot
              {"host": "ab", "netns": 99, "netns_id": "b2:1", "init": False}):        # same cookie
        c.data["where"] = w
        place.check(c, now)
    c.data["where"] = {"host": "ab", "netns": 4026531840, "netns_id": "b2:7", "init": False}
    with pytest.raises(TargetGone):
        place.check(c, now)
    c.data["where"] = {"host": "ab", "netns": 5}
    with pytest.raises(TargetGone):
        place.check(c, {**now, "netns": 5, "init": False})
    assert os.path.exists("/proc/self/ns/net")
