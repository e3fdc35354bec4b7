"""One test per tuned setting per host (parametrised in conftest.py from the host's own verify)."""


def test_setting(host_name, setting):
    r = setting
    optional_unsupported = r["status"] == "unsupported" and not r.get("required", True)
    assert r["status"] == "ok" or optional_unsupported, (
        f"{host_name}: {r['subsystem']} {r['target']} {r['key']}: {r['status']}: "
        f"current {r['current']!r}, desired {r['desired']!r} ({r.get('reason', '')})")
