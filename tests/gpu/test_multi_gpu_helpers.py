"""The pieces of tests/gpu/run_multi_gpu.sh that need no GPU: the `nvidia-smi topo -m` parser, the
comparison it feeds, and the generated host profile (gpu, mps and a Triton instance group over N GPUs)
checked by the library's own profile parser and Triton's schema."""
import json
import os

import pytest
import yaml

from hkgpu_tune.core.profile import parse_profile_text
from hkgpu_tune.backends.topology import service_placement

from tests.gpu import multi_gpu
from tests.gpu_unit.conftest import backends, load

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gpu")


def topo_text(name):
    with open(os.path.join(FIX, name)) as f:
        return f.read()


def test_parse_topo_dgx_two_sockets():
    t = multi_gpu.parse_topo(topo_text("topo-m-dgx-h100.txt"))
    assert sorted(t["gpus"]) == list(range(8))
    assert t["gpus"][0]["cpus"] == list(range(52)) and t["gpus"][0]["numa"] == 0
    assert t["gpus"][5]["cpus"] == list(range(52, 104)) and t["gpus"][5]["numa"] == 1
    assert t["gpus"][5]["gpu_numa_id"] == "N/A"
    assert t["gpus"][3]["links"]["GPU7"] == "NV18" and t["gpus"][3]["links"]["GPU3"] == "X"
    assert t["gpus"][6]["links"]["NIC1"] == "PXB"


def test_parse_topo_one_gpu_no_numa_and_ansi():
    text = ("\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
            "GPU0\t X \t0-15\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n")
    t = multi_gpu.parse_topo(text)
    assert t["gpus"] == {0: {"cpus": list(range(16)), "cpus_text": "0-15", "numa": 0, "gpu_numa_id": "N/A",
                             "links": {"GPU0": "X"}}}
    t = multi_gpu.parse_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\tN/A\n")
    assert t["gpus"][0]["numa"] is None and t["gpus"][0]["gpu_numa_id"] is None


def test_parse_topo_no_affinity_column():
    with pytest.raises(ValueError):
        multi_gpu.parse_topo("NVIDIA-SMI has failed\n")


A100 = os.path.join(FIX, "dgx-a100")


def a100_host(root, bus_ids=None):
    """Backends for the DGX A100 of tests/fixtures/gpu/dgx-a100: its sysfs files under root, and
    NVML answering index -> PCI bus id only (no NUMA node, no CPU affinity: sysfs must be used)."""
    with open(os.path.join(A100, "sysfs.txt")) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                path, text = line.rstrip("\n").split("\t")
                os.makedirs(os.path.dirname(root / path.lstrip("/")), exist_ok=True)
                (root / path.lstrip("/")).write_text(text + "\n")
    if bus_ids is None:
        with open(os.path.join(A100, "query-gpu.csv")) as f:
            bus_ids = [line.split(",")[1].strip() for line in f if line.strip()]
    gpus = [{"index": i, "pci_bus_id": b, "numa_node": None, "cpu_affinity": None} for i, b in enumerate(bus_ids)]
    return backends({"driver": {}, "gpus": gpus}, root=str(root))


def test_dgx_a100_placement_matches_its_recorded_topo(tmp_path):
    """The library's placement (NVML's bus id -> sysfs numa_node and node cpulist) equals what
    `nvidia-smi topo -m` printed on a DGX A100, GPU by GPU; the sources are separate files."""
    t = multi_gpu.parse_topo(topo_text(os.path.join("dgx-a100", "topo-m.txt")))
    b = a100_host(tmp_path)
    got = {i: service_placement(b, i) for i in range(8)}
    assert {i: (p["cpus"], p["numa_node"]) for i, p in got.items()} == \
        {i: (t["gpus"][i]["cpus"], t["gpus"][i]["numa"]) for i in range(8)}
    assert all(p["mems"] == [p["numa_node"]] and "sysfs" in p["source"] for p in got.values())
    assert got[0]["numa_node"] == 3 and got[2]["numa_node"] == 1     # index order is not NUMA order


def test_a_wrong_gpu_to_bus_mapping_does_not_match_the_topo(tmp_path):
    """The comparison above can fail: NVML's bus ids of GPU0 and GPU2 swapped give GPU0 the CPUs
    of NUMA node 1, which topo -m does not say."""
    with open(os.path.join(A100, "query-gpu.csv")) as f:
        buses = [line.split(",")[1].strip() for line in f if line.strip()]
    buses[0], buses[2] = buses[2], buses[0]
    t = multi_gpu.parse_topo(topo_text(os.path.join("dgx-a100", "topo-m.txt")))
    b = a100_host(tmp_path, buses)
    wrong = [i for i in range(8) if service_placement(b, i)["cpus"] != t["gpus"][i]["cpus"]]
    assert wrong == [0, 2]


def _doc(n):
    dgx = load("dgx-h100-8gpu.json")
    gpus = dgx["gpu"]["gpus"][:n]
    place = {i: {"cpus": g["cpu_affinity"], "numa_node": g["numa_node"]} for i, g in enumerate(gpus)}
    return multi_gpu.profile_doc(gpus, place, (18000, 18001, 18002))


@pytest.mark.parametrize("n", [1, 8])
def test_profile_doc_parses(n, tmp_path):
    doc, differ = _doc(n)
    assert differ == []
    doc.pop("triton")   # checked below, with Triton's schema
    prof = parse_profile_text(yaml.safe_dump(doc), str(tmp_path / "p.yaml"))
    g = prof.section("gpu")
    assert (g.persistence, g.compute_mode, g.power_limit_w) == (True, "default", 700)
    assert g.application_clocks.sm == 1980
    assert prof.section("mps").default_pinned_mem_limit == tuple((i, "16G") for i in range(n))


@pytest.mark.parametrize("n", [1, 8])
def test_profile_doc_spreads_triton_instances(n, tmp_path):
    pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="Triton's schema check needs tritonclient[grpc]")
    doc, _ = _doc(n)
    m = parse_profile_text(yaml.safe_dump(doc), str(tmp_path / "p.yaml")).section("triton").models[0]
    assert m.config["instance_group"] == [{"count": 1, "kind": "KIND_GPU", "gpus": list(range(n))}]
    want = range(52, 104) if n == 8 else range(52)
    assert m.config["parameters"][f"cpus_gpu{n - 1}"]["string_value"] == ",".join(map(str, want))


def test_profile_doc_reports_gpus_that_differ():
    dgx = load("dgx-h100-8gpu.json")
    gpus = json.loads(json.dumps(dgx["gpu"]["gpus"][:2]))
    gpus[1]["power_limit_w"] = 650.0
    _, differ = multi_gpu.profile_doc(gpus, {0: {"cpus": [0]}, 1: {"cpus": [1]}})
    assert differ == ["gpu1 power_limit_w"]


def test_parse_topo_recorded_h200():
    """The output recorded on the one-GPU H200 machine (ANSI underlined header, GPU NUMA ID N/A)."""
    t = multi_gpu.parse_topo(topo_text("topo-m-h200.txt"))
    assert t["gpus"] == {0: {"cpus": list(range(16)), "cpus_text": "0-15", "numa": 0, "gpu_numa_id": "N/A",
                             "links": {"GPU0": "X"}}}


NODES = {0: list(range(0, 52)), 1: list(range(52, 104))}
ALL = list(range(104))


@pytest.mark.parametrize("pl, tp, nodes, verdict, why", [
    ({"cpus": list(range(52, 104)), "numa_node": 1}, {"cpus": ALL, "numa": 1}, NODES, "MATCH", ""),
    ({"cpus": list(range(52)), "numa_node": 0}, {"cpus": list(range(52, 104)), "numa": 1}, NODES,
     "MISMATCH", "cpus 0-51 != 52-103; numa 0 != 1"),
    ({"cpus": list(range(52)), "numa_node": None}, {"cpus": list(range(52)), "numa": 0}, NODES,
     "MISMATCH", "numa None != 0"),   # two nodes: no node is not "node 0"
    ({"cpus": list(range(16)), "numa_node": None}, {"cpus": list(range(16)), "numa": 0}, {0: list(range(16))},
     "MATCH", "equivalent: "),        # one node: all memory is on node 0
    ({"cpus": [0], "numa_node": 0}, None, NODES, "MISMATCH", "GPU missing from nvidia-smi topo -m"),
])
def test_compare_placement_with_topo(pl, tp, nodes, verdict, why):
    got = multi_gpu.compare(pl, tp, nodes, ALL)
    assert got[0] == verdict and got[1].startswith(why) and (why or got[1] == ""), got
