from hkgpu_tune.core.normalize import as_bool, at_least, same


def test_whitespace_and_numbers():
    assert same("4096\t87380  6291456\n", "4096 87380 6291456")
    assert same("0x10", "16")
    assert not same("4096 87380", "4096 87380 1")
    assert not same("fq_codel", "pfifo_fast")


def test_at_least_each_field():
    assert at_least("4096 131072 536870912", "4096 87380 268435456")
    assert not at_least("4096 131072 33554432", "4096 87380 268435456")
    assert not at_least("abc", "1")


def test_bools():
    assert as_bool("on") is True and as_bool("Disabled") is False and as_bool("maybe") is None
