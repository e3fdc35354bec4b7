"""Conformance of the subsystem registry (issue 35): every module of hkgpu_tune/subsystems is one
subsystem declared whole in its SPEC, every list of subsystems derives from the registry, and a
subsystem that lacks a piece is refused at registration with an error that names the piece."""
import dataclasses
import importlib
import os
import pkgutil
import sys

import pytest

from hkgpu_tune import subsystems
from hkgpu_tune.core import sections
from hkgpu_tune.core.fields import SettingType
from hkgpu_tune.core.report import Change
from hkgpu_tune.subsystems.base import PERSIST, Spec, SpecError, Subsystem, check_spec
from hkgpu_tune.tune import settings

MODULES = sorted(m.name for m in pkgutil.iter_modules(subsystems.__path__) if m.name not in subsystems.NOT_SUBSYSTEMS)


def test_the_package_holds_the_subsystems_it_always_had_and_cpufreq():
    assert MODULES == sorted(["sysctl", "link", "ethtool", "qdisc", "firewall", "rdma", "cpufreq", "gpu", "mig", "mps",
                              "affinity", "triton"])


@pytest.mark.parametrize("name", MODULES)
def test_every_module_declares_a_complete_subsystem(name):
    mod = importlib.import_module(f"hkgpu_tune.subsystems.{name}")
    spec = getattr(mod, "SPEC", None)
    assert isinstance(spec, Spec), f"subsystems/{name}.py defines no SPEC"
    assert spec.name == name
    check_spec(spec)   # raises SpecError naming the missing piece
    assert subsystems.spec(name) is spec and subsystems.get(name) is mod.Plugin
    assert spec.persist in PERSIST
    assert spec.section in sections.table(), f"{name} reads section {spec.section!r}, which no module owns"
    for t in spec.types:
        assert settings.registry()[t.name] is t


def test_the_apply_order_is_the_one_before_the_registry():
    assert subsystems.ORDER == ["sysctl", "link", "ethtool", "qdisc", "firewall", "rdma", "cpufreq", "gpu", "mig",
                                "mps", "affinity", "triton"]
    assert len({s.order for s in subsystems.specs()}) == len(MODULES)


def test_the_derived_tables_equal_the_hand_written_ones_they_replace():
    assert subsystems.SECTION == {"sysctl": "sysctl", "link": "network", "ethtool": "network", "qdisc": "network",
                                  "firewall": "network", "rdma": "network", "gpu": "gpu", "mig": "gpu", "mps": "mps",
                                  "affinity": "affinity", "triton": "triton", "cpufreq": "cpufreq"}
    assert subsystems.ALSO == {"sysctl": ("tcp_buffers",)}
    boot = [s.name for s in subsystems.specs() if s.persist == "boot"]
    assert boot == ["ethtool", "qdisc", "cpufreq", "gpu", "mig", "affinity"]   # what the boot unit re-applies
    assert sorted(sections.table()) == sorted(["network", "sysctl", "gpu", "mps", "affinity", "triton", "health",
                                              "export", "baseline", "tcp_buffers", "cpufreq"])


@pytest.mark.parametrize("subsystem, key, scoped", [
    ("link", "mtu", True), ("ethtool", "rings", True), ("qdisc", "root", True),
    ("sysctl", "net.core.rmem_max", True), ("sysctl", "vm.swappiness", False),
    ("gpu", "persistence", False), ("affinity", "smp_affinity_list", False), ("persist", "file", False),
])
def test_the_namespace_scope_comes_from_each_spec(subsystem, key, scoped):
    assert subsystems.netns_scoped(Change(subsystem, "t", key, None, None)) is scoped


def test_every_setting_type_belongs_to_one_registered_subsystem():
    reg = settings.registry()
    owners = {t.subsystem for t in reg.values()}
    assert owners == {s.name for s in subsystems.specs() if s.types} | {"persist"}
    facts = [s.name for s in subsystems.specs() if s.plugin.facts_only]
    assert facts == ["firewall", "rdma"] and not any(subsystems.spec(n).types for n in facts)


def test_every_section_has_one_owner_and_every_owner_is_reached():
    own = sections.owners()
    for s in subsystems.specs():
        for name in s.sections:
            assert own[name] == f"subsystem {s.name}"
    read = {s.section for s in subsystems.specs()} | {a for s in subsystems.specs() for a in s.also}
    assert read <= set(own)


def test_the_completion_offers_every_registered_subsystem():
    from hkgpu_tune.cli.meta import _completers
    _, only, _ = _completers(["hk-inference"])
    assert only["zsh"].split()[-len(MODULES) - 1:] == [*subsystems.ORDER, "persist"]


# ---------------------------------------------------------------- refusals
class _Plugin(Subsystem):
    name = "fake"

    def read(self):
        return {}

    def compare(self, state):
        return []

    def write(self, target, key, value, data):
        pass


def _check(c):
    pass


GOOD = Spec(name="fake", order=999, section="sysctl", plugin=_Plugin, persist="boot",
            types=(SettingType("fake.value", "fake", _check),))


def test_a_complete_fake_passes_the_check():
    check_spec(GOOD)


@pytest.mark.parametrize("change, says", [
    ({"types": ()}, "types: the setting types"),
    ({"persist": ""}, "persist: one of"),
    ({"persist": "none"}, "persist: 'none' exactly when"),
    ({"section": ""}, "section: the profile section"),
    ({"order": "1"}, "order: an int"),
    ({"plugin": object}, "plugin: a Subsystem subclass"),
    ({"name": "Fake"}, "name: a lower-case identifier"),
    ({"types": (SettingType("other.value", "other", _check),)}, "is not a SettingType 'fake.KIND'"),
    ({"types": (SettingType("fake.a", "fake", _check), SettingType("fake.b", "fake", _check))}, "kind_of"),
    ({"netns": "yes"}, "netns: a bool or a predicate"),
    ({"sections": {"fake": "not callable"}}, "sections: {section name: parser(node)}"),
])
def test_a_fake_missing_a_piece_is_refused_at_registration(change, says):
    bad = dataclasses.replace(GOOD, **change)
    with pytest.raises(SpecError, match="subsystem .*incomplete") as e:
        subsystems.register(bad)
    assert says in str(e.value)
    assert "fake" not in subsystems.SECTION   # nothing half-registered


def test_a_plugin_without_its_verbs_is_refused():
    class Bare(Subsystem):
        name = "fake"
    with pytest.raises(SpecError) as e:
        subsystems.register(dataclasses.replace(GOOD, plugin=Bare))
    assert "plugin.read: not implemented" in str(e.value) and "plugin.write: not implemented" in str(e.value)


def test_a_taken_order_is_refused():
    with pytest.raises(SpecError, match="order 10 is sysctl's"):
        subsystems.register(dataclasses.replace(GOOD, order=10))


def test_a_module_without_a_spec_is_refused_at_the_first_lookup(tmp_path, monkeypatch):
    """A module dropped into subsystems/ and registered nowhere cannot be half-wired: the first
    lookup fails and names it."""
    (tmp_path / "cpuidle.py").write_text("class Plugin:\n    name = 'cpuidle'\n")
    monkeypatch.setattr(subsystems, "__path__", [*subsystems.__path__, str(tmp_path)])
    monkeypatch.setattr(subsystems, "_SPECS", {})
    monkeypatch.setattr(subsystems, "_state", {"loaded": False})
    try:
        with pytest.raises(SpecError, match="hkgpu_tune.subsystems.cpuidle defines no SPEC"):
            subsystems.ORDER
        assert subsystems._SPECS == {}
    finally:
        sys.modules.pop("hkgpu_tune.subsystems.cpuidle", None)


def test_the_engine_refuses_an_unknown_subsystem_naming_the_registered_ones():
    from hkgpu_tune.core.errors import HkError
    from hkgpu_tune.core.profile import parse_profile_text
    from hkgpu_tune.tune.engine import Engine
    with pytest.raises(HkError, match="unknown subsystem cpufreqx .*have: sysctl, link"):
        Engine(parse_profile_text("name: x\n"), only=["cpufreqx"], state_dir=os.devnull)
