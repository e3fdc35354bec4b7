"""The qdisc dump as the kernel gives it (netlink messages), read by backends.netlink.Tc."""
from hkgpu_tune.backends.netlink import TC_H_ROOT, Tc


class Msg(dict):
    def __init__(self, parent, handle, kind):
        super().__init__(parent=parent, handle=handle)
        self.kind = kind

    def get_attr(self, name):
        return self.kind if name == "TCA_KIND" else None


class FakeIP:
    def __init__(self, msgs):
        self.msgs = msgs

    def get_qdiscs(self, index):
        return self.msgs


def tc_with(msgs):
    tc = Tc.__new__(Tc)
    tc.ip = FakeIP(msgs)
    return tc


def test_the_kernels_own_mq_has_handle_zero():
    # `tc qdisc show` on a multi-queue NIC after boot: qdisc mq 0: root; fq_codel parent :1, :2
    q = tc_with([Msg(TC_H_ROOT, 0, "mq"), Msg(0x1, 0, "fq_codel"), Msg(0x2, 0, "fq_codel")]).qdiscs(3)
    assert q == {"root": "mq", "root_handle": "0:0", "children": {"0:1": "fq_codel", "0:2": "fq_codel"}}


def test_mq_set_by_the_tool_and_other_parents():
    q = tc_with([Msg(TC_H_ROOT, 0x10000, "mq"), Msg(0x10002, 0, "pfifo_fast"), Msg(0x10001, 0, "fq_codel"),
                 Msg(0x80000001, 0, "x")]).qdiscs(3)
    assert q["root_handle"] == "1:0" and q["children"] == {"1:1": "fq_codel", "1:2": "pfifo_fast"}


def test_no_root_qdisc_is_noqueue():
    assert tc_with([]).qdiscs(1) == {"root": "noqueue", "root_handle": None, "children": {}}


def test_transmit_queues_in_use_come_from_this_namespaces_sysfs():
    from hkgpu_tune.backends.netlink import Net
    lo = {"name": "lo", "index": 1, "tx_queues": 9}   # lo: ifindex 1, one queue (tx-0)
    assert Net.tx_queues(lo) == 1
    # another namespace's "lo" (ifindex differs), or no such device: the allocated count
    assert Net.tx_queues({**lo, "index": 7}) == 9
    assert Net.tx_queues({**lo, "name": "no-such-link"}) == 9
