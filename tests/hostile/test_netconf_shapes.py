"""--persist reads the network managers' files (netplan YAML, NetworkManager keyfiles, networkd
.network files) as root: one of unexpected shape (binary, huge, a FIFO, a link to a device,
invalid, a list where a mapping belongs, keys of other types) is one HkError naming the file,
never a traceback, a hang or a gigabyte read, and nothing is written."""
import contextlib
import os
import signal

import pytest

from hkgpu_tune.core.errors import HkError
from hkgpu_tune.tune.persist import mtu_owner, persist

from .test_kills import tree
from .test_persist_safety import setup

LINK = {"name": "ens1f0", "mac": "0c:42:a1:00:00:01"}
NETPLAN = "etc/netplan/50-cloud-init.yaml"
NM = "etc/NetworkManager/system-connections/data.nmconnection"
NETWORKD = "etc/systemd/network/10-data.network"


class Hung(BaseException):
    """Not an OSError: code that catches those cannot swallow it."""


@contextlib.contextmanager
def within(seconds):
    def late(*_):
        raise Hung(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def place(root, rel, how):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    if how == "fifo":
        os.mkfifo(p)
    elif how == "zero-link":
        os.symlink("/dev/zero", p)
    elif how == "huge":
        with open(p, "wb") as f:
            f.truncate(3 << 30)        # sparse: 3 GiB of NUL bytes, one "line"
    elif how == "dir":
        os.mkdir(p)
    else:
        with open(p, "wb") as f:
            f.write(how if isinstance(how, bytes) else how.encode())
    return p


CASES = [
    (NETPLAN, "fifo", "not a regular file"),
    (NETPLAN, "huge", "larger than"),
    (NETPLAN, "dir", "not a regular file"),
    (NETPLAN, b"network:\n  ethernets: {\xff\xfe}\n", "not UTF-8"),
    (NETPLAN, "network: [unclosed\n", "not valid YAML"),
    (NETPLAN, "- network\n- ethernets\n", "top level: a mapping expected, found list"),
    (NETPLAN, "network: 3\n", "network: a mapping expected, found int"),
    (NETPLAN, "network:\n  ethernets: [ens1f0]\n", "network.ethernets: a mapping expected, found list"),
    (NETPLAN, "network:\n  ethernets:\n    data0: on\n", "network.ethernets.data0: a mapping expected, found bool"),
    (NETPLAN, "network:\n  ethernets:\n    data0: {match: [x]}\n", "data0.match: a mapping expected, found list"),
    (NETPLAN, "network:\n  ethernets:\n    data0: {match: {name: 12}}\n", "data0.match.name: a string expected"),
    (NETPLAN, "network:\n  ethernets:\n    data0: {match: {macaddress: 0x0c42}}\n",
     "data0.match.macaddress: a string expected"),
    (NETPLAN, "a: &a [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi")), "values once aliases are expanded"),
    (NM, "fifo", "not a regular file"),
    (NM, "zero-link", "not a regular file"),
    (NM, "huge", "larger than"),
    (NM, b"[connection]\ninterface-name=\xff\n", "not UTF-8"),
    (NM, "interface-name=ens1f0\n", ":1: not a valid system-connections file"),
    (NM, "[connection]\nid=a\nid=b\n", ":3: not a valid system-connections file"),
    (NETWORKD, "fifo", "not a regular file"),
    (NETWORKD, "huge", "larger than"),
    (NETWORKD, "Name=ens1f0\n", ":1: not a valid network file"),
]


@pytest.mark.parametrize("rel,how,msg", CASES, ids=[f"{c[0].split('/')[1]}-{i}" for i, c in enumerate(CASES)])
def test_a_manager_file_of_unexpected_shape_is_one_error_naming_it(tmp_path, rel, how, msg):
    p = place(str(tmp_path), rel, how)
    with within(10), pytest.raises(HkError) as e:
        mtu_owner(str(tmp_path), LINK)
    line = str(e.value)
    assert line.startswith(p) and msg in line and "\n" not in line


def test_wellformed_files_still_find_their_owner(tmp_path):
    place(str(tmp_path), NETPLAN, "network:\n  version: 2\n  ethernets:\n    eno1: {dhcp4: true}\n")
    f = place(str(tmp_path), NETWORKD, "[Match]\nName=ens1f*\n[Address]\nAddress=198.18.0.1/24\n"
                                       "[Address]\nAddress=198.18.1.1/24\n")
    assert mtu_owner(str(tmp_path), LINK) == ("systemd-networkd", f)


def test_persist_with_a_bad_netplan_file_writes_nothing(tmp_path):
    root, eng = setup(tmp_path)
    place(str(root), NETPLAN, "- not\n- a mapping\n")
    before = tree(root)
    with pytest.raises(HkError, match="top level: a mapping expected"):
        persist(eng, str(root))
    assert tree(root) == before
    assert not (tmp_path / "st/backup").exists()
