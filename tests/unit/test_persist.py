import os

from hkgpu_tune.tune.persist import mtu_owner

LINK = {"name": "ens1f0", "mac": "0c:42:a1:00:00:01"}


def write(root, rel, text):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    open(p, "w").write(text)
    return p


def writer(root, state):
    from hkgpu_tune.tune.journal import Journal
    from hkgpu_tune.tune.persist import Writer
    from hkgpu_tune.tune.state import State
    return Writer(str(root), Journal(State(state)))


def test_no_owner(tmp_path):
    assert mtu_owner(str(tmp_path), LINK) is None


def test_netplan_by_name_and_by_mac(tmp_path):
    f = write(tmp_path, "etc/netplan/50-cloud-init.yaml",
              "network:\n  version: 2\n  ethernets:\n    data0:\n      match: {macaddress: '0C:42:A1:00:00:01'}\n")
    assert mtu_owner(str(tmp_path), LINK) == ("netplan", f"{f}:ethernets:data0")


def test_networkmanager_keyfile(tmp_path):
    f = write(tmp_path, "etc/NetworkManager/system-connections/data.nmconnection",
              "[connection]\nid=data\ntype=ethernet\ninterface-name=ens1f0\n")
    assert mtu_owner(str(tmp_path), LINK) == ("NetworkManager", f)


def test_networkd_glob(tmp_path):
    f = write(tmp_path, "etc/systemd/network/10-data.network", "[Match]\nName=ens1f*\n[Network]\nDHCP=no\n")
    write(tmp_path, "etc/systemd/network/20-other.network", "[Match]\nName=eno*\n")
    assert mtu_owner(str(tmp_path), LINK) == ("systemd-networkd", f)


def test_unpersist_removes_the_directories_it_made_and_keeps_the_rest(tmp_path):
    from hkgpu_tune.tune.persist import unpersist
    root, state = tmp_path / "root", str(tmp_path / "state")
    (root / "etc/systemd/network").mkdir(parents=True)
    (root / "etc/sysctl.d").mkdir(parents=True)
    (root / "etc/sysctl.d/10-site.conf").write_text("x=1\n")
    w = writer(root, state)
    w.write("etc/systemd/network/20-data.network.d/60-hkgpu-tune.conf", "[Link]\nMTUBytes=9000\n")
    w.write("etc/sysctl.d/60-hkgpu-tune.conf", "y=2\n")
    w.link("etc/systemd/system/multi-user.target.wants/hkgpu-tune.service", "/x")
    unpersist(state)
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert left == ["etc", "etc/sysctl.d", "etc/sysctl.d/10-site.conf", "etc/systemd", "etc/systemd/network"]


def test_a_directory_it_made_that_now_holds_another_file_stays(tmp_path):
    from hkgpu_tune.tune.persist import unpersist
    root, state = tmp_path / "root", str(tmp_path / "state")
    root.mkdir()
    w = writer(root, state)
    w.link("etc/systemd/system/multi-user.target.wants/hkgpu-tune.service", "/x")
    (root / "etc/systemd/system/multi-user.target.wants/other.service").write_text("")
    done = unpersist(state)
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert left == ["etc", "etc/systemd", "etc/systemd/system", "etc/systemd/system/multi-user.target.wants",
                    "etc/systemd/system/multi-user.target.wants/other.service"]
    assert any(d.endswith("hkgpu-tune.service") for d in done)


def test_rollback_of_the_boot_unit_removes_its_export_textfile_unless_the_timer_owns_it(tmp_path):
    """The boot unit of apply --persist writes node_exporter's textfile at every boot; left after
    rollback, node_exporter would serve the last drift and health figures for ever. With export.env
    (the hkgpu_verify role's timer writes the file too) it stays: the rollback playbook removes it."""
    from hkgpu_tune.tune.persist import UNIT_FILE, unpersist
    for timer in (False, True):
        root, state = tmp_path / f"root{timer}", str(tmp_path / f"state{timer}")
        prom = write(root, "var/lib/prometheus/node-exporter/hkgpu-tune.prom", "hkgpu_tune_failures 0\n")
        other = write(root, "var/lib/prometheus/node-exporter/other.prom", "x 1\n")
        if timer:
            write(root, "etc/hkgpu-tune/export.env", "HKGPU_TUNE_TEXTFILE_DIR=/srv/tf\n")
        writer(root, state).write(UNIT_FILE, "[Unit]\n")
        done = unpersist(state)
        assert not os.path.exists(root / UNIT_FILE)
        assert os.path.exists(prom) == timer and os.path.exists(other), (timer, done)
        assert any("hkgpu-tune.prom" in d for d in done) != timer
