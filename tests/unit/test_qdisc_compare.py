"""The qdisc compare, with swapped backends: a kind this kernel lacks is unsupported (not drift), for
a single-queue device's root and for each queue of a multi-queue one, including queues an mq does
not cover yet (more transmit queues than it has children). Two mutants got through without these."""
from hkgpu_tune.core.report import OK, UNSUPPORTED

from .fakes import FakeNet, FakeTc, link
from .test_engine import by_key, engine, host

PROFILE = """\
network:
  interfaces:
    - match: {name: ens1f0}
      qdisc: fq_codel
"""


def verify(tmp_path, tx_queues, q):
    b = host(net=FakeNet([link("ens1f0", 2, tx_queues=tx_queues)]), tc=FakeTc({2: q}, supported=("pfifo_fast", "mq")))
    return by_key(engine(tmp_path, b, text=PROFILE, only=["qdisc"]).verify())


def test_a_single_queue_root_this_kernel_lacks_is_unsupported(tmp_path):
    r = verify(tmp_path, 1, {"root": "pfifo_fast", "root_handle": "8001:0", "children": {}})
    root = r[("qdisc", "ens1f0", "root")]
    assert root.status == UNSUPPORTED and root.reason == "qdisc fq_codel is unsupported by this kernel", root


def test_queues_an_mq_does_not_cover_are_unsupported_when_the_kernel_lacks_the_kind(tmp_path):
    """mq 1: with two fq_codel children and four transmit queues: not in place, so the kernel is
    asked, and queues 3 and 4 cannot get fq_codel here."""
    r = verify(tmp_path, 4, {"root": "mq", "root_handle": "1:0", "children": {"1:1": "fq_codel", "1:2": "fq_codel"}})
    assert r[("qdisc", "ens1f0", "queue 1")].status == OK
    for i in (3, 4):
        q = r[("qdisc", "ens1f0", f"queue {i}")]
        assert q.status == UNSUPPORTED and "unsupported by this kernel" in q.reason, q
