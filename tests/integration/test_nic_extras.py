"""coalesce, pause and link speed against the real kernel: veth has neither interrupt coalescing
nor pause frames (unsupported, with the driver's reason) and reports 10000 Mb/s full duplex."""
import json

from .conftest import sh, statuses


def write(tmp_path, pair, body):
    f = tmp_path / "p.yaml"
    f.write_text(f"network:\n  interfaces:\n    - match: {{name: {pair.a}}}\n{body}")
    return str(f)


def test_veth_has_no_coalescing_or_pause(pair, tmp_path):
    # the kernel's own answer, through the ethtool command
    assert sh("ethtool", "-c", pair.a, ns=pair.A, check=False).returncode != 0
    p = write(tmp_path, pair, "      coalesce: {rx_usecs: 16, adaptive_rx: false}\n      pause: {rx: false}\n")
    rc, doc = pair.hkjson("apply", "--profile", p, "--only", "ethtool", state=tmp_path / "st")
    s = statuses(doc)
    assert doc["error"] == "" and rc == 2, doc   # nothing fixable, nothing ok: verify's exit code for it
    for k in ("coalesce rx_usecs", "coalesce adaptive_rx", "pause rx"):
        assert s[("ethtool", pair.a, k)] == "unsupported"
    reasons = {r["key"]: r["reason"] for r in doc["results"]}
    assert "not supported by the driver" in reasons["coalesce rx_usecs"]
    assert "Operation not supported" in reasons["pause rx"]


def test_link_speed_is_a_fact_and_slower_than_expected_is_drift(pair, tmp_path):
    want = int(sh("cat", f"/sys/class/net/{pair.a}/speed", ns=pair.A, check=False).stdout.strip() or 0)
    assert want == 10000      # what veth reports (ethtool: "Speed: 10000Mb/s")
    rc, doc = pair.hkjson("verify", "--profile", write(tmp_path, pair, "      speed_mbit: 10000\n"))
    assert statuses(doc)[("ethtool", pair.a, "speed_mbit")] == "ok"
    rc, doc = pair.hkjson("verify", "--profile", write(tmp_path, pair, "      speed_mbit: 25000\n"))
    r = [x for x in doc["results"] if x["key"] == "speed_mbit"][0]
    assert rc == 2 and r["status"] == "drift" and r["current"] == 10000 and "below the expected 25000" in r["reason"]
    p = pair.hk("facts", "--only", "ethtool", "--profile", write(tmp_path, pair, "      speed_mbit: 10000\n"), "--json")
    facts = json.loads(p.stdout)["facts"]["ethtool"][pair.a]
    assert facts["link_info"]["speed_mbit"] == 10000 and facts["link_info"]["duplex"] == "Full"
    assert facts["link_info"]["driver"] == "veth"
    assert "not supported" in facts["coalesce"] and "not supported" in facts["pause"]
