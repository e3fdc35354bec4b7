"""One Prometheus text renderer (core/promtext.py) for verify --prometheus, export and the
collectors. Label values are checked by prometheus_client's own parser, not by ours."""
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hkgpu_tune.core import promtext
from hkgpu_tune.core.report import Result, to_prometheus
from hkgpu_tune.observe import collect

NASTY = ['back\\slash', 'a "quoted" word', "two\nlines", '\\"\n mixed \\n']


@pytest.mark.parametrize("value", NASTY)
def test_a_label_value_comes_back_as_it_was(value):
    text = "\n".join(promtext.render([promtext.Family("x_up", "gauge", "Up.", [({"dev": value}, 1)])])) + "\n"
    (fam,) = text_string_to_metric_families(text)
    assert [s.labels["dev"] for s in fam.samples] == [value]


def test_the_escapes_are_the_formats_own():
    assert promtext.label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


@pytest.mark.parametrize("value", NASTY)
def test_verify_prometheus_escapes_like_the_collectors(value):
    text = to_prometheus([Result("sysctl", value, "net.core.rmem_max", "1", "2", "drift")])
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    targets = {s.labels["target"] for s in fams["hkgpu_tune_setting_status"].samples}
    assert targets == {value}
    assert fams["hkgpu_tune_failures"].samples[0].value == 1


def test_one_renderer():
    assert collect.render is promtext.render and collect.label is promtext.label and collect.Family is promtext.Family


def test_an_empty_verify_keeps_its_headers():
    assert to_prometheus([]).splitlines()[:2] == [
        "# HELP hkgpu_tune_setting_status Status of one tuned setting (1 = the status in the label).",
        "# TYPE hkgpu_tune_setting_status gauge"]
