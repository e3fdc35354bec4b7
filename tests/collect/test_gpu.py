"""gpu: NVML health reads through ReplayNvml (answers recorded on an H200, faults in NVML's
documented shapes) and, where a GPU is present, against nvidia-smi."""
import os
import shutil
import subprocess

import pytest

from hkgpu_tune.backends.nvml import ReplayLib, ReplayNvml, reason_names
from hkgpu_tune.observe.collect import Sources, collect, gpu
from hkgpu_tune.core.profile import parse_profile_text

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gpu")
H200 = os.path.join(FIX, "h200-health.json")


def fams_of(gpus):
    return {f.name: {tuple(sorted(lab.items())): v for lab, v in f.samples} for f in gpu.families(gpus)}


def test_h200_recorded_answers():
    g = gpu.read(ReplayNvml(H200))[0]
    assert g["name"] == "NVIDIA H200" and g["uuid"].startswith("GPU-")
    assert (g["util_pct"], g["mem_total_bytes"], g["mem_used_bytes"]) == (0, 150754820096, 644939776)
    assert (g["temp_c"], g["power_w"]) == (33, 83.458)
    assert g["throttle_reasons"] == ["gpu_idle"]
    assert g["ecc"] == {"volatile": {"corrected": 0, "uncorrected": 0}, "aggregate": {"corrected": 0, "uncorrected": 0}}
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False}
    assert g["retired_pages"] is None      # H200: row remapping; retired pages answer NotSupported
    assert g["pcie"] == {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16} and g["errors"] == {}


def test_h200_families():
    f = fams_of(gpu.read(ReplayNvml(H200)))
    lab = (("gpu", "0"), ("uuid", "GPU-67c62b2b-1b01-9a21-6527-692d55b768b1"))
    assert f["hkgpu_tune_gpu_utilization_ratio"] == {lab: 0.0}
    assert f["hkgpu_tune_gpu_power_watts"] == {lab: 83.458}
    thr = f["hkgpu_tune_gpu_throttle"]
    assert len(thr) == 9 and thr[tuple(sorted(lab + (("reason", "gpu_idle"),)))] == 1 and sum(thr.values()) == 1
    assert len(f["hkgpu_tune_gpu_ecc_errors_total"]) == 4
    assert f["hkgpu_tune_gpu_retired_pages"] == {}         # NotSupported: no series, not a 0
    assert f["hkgpu_tune_gpu_pcie_link_width"][tuple(sorted(lab + (("which", "max"),)))] == 16


def test_faults_in_nvml_shapes():
    nv = ReplayNvml(H200)
    nv.set_raw(0, "nvmlDeviceGetRemappedRows", [0, 3, 1, 0])          # corrRows, uncRows, isPending, failureOccurred
    nv.set_raw(0, "nvmlDeviceGetTotalEccErrors",
               {"corrected": {"volatile": 12, "aggregate": 40}, "uncorrected": {"volatile": 2, "aggregate": 2}})
    nv.set_raw(0, "nvmlDeviceGetCurrentClocksEventReasons", 0x40 | 0x8 | 0x800)   # hw thermal + hw slowdown + unnamed
    nv.set_raw(0, "nvmlDeviceGetTemperature", {"nvml_error": "GpuIsLost"})
    g = gpu.read(nv)[0]
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 3, "pending": True, "failed": False}
    assert g["ecc"]["volatile"] == {"corrected": 12, "uncorrected": 2}
    assert g["throttle_reasons"] == ["hw_slowdown", "hw_thermal_slowdown", "bit_11"]
    assert g["temp_c"] is None and g["errors"] == {"temperature_c": "GPU is lost"}
    f = fams_of([g])
    assert sum(f["hkgpu_tune_gpu_nvml_errors"].values()) == 1
    # counts and 0/1 flags in separate families
    lab = (("gpu", "0"), ("uuid", g["uuid"]))
    assert f["hkgpu_tune_gpu_remapped_rows"] == {tuple(sorted(lab + (("cause", "correctable"),))): 0,
                                                 tuple(sorted(lab + (("cause", "uncorrectable"),))): 3}
    assert f["hkgpu_tune_gpu_remap_pending"] == {lab: True} and f["hkgpu_tune_gpu_remap_failed"] == {lab: False}
    assert list(f["hkgpu_tune_gpu_temperature_celsius"].values()) == [None]    # left out of the textfile
    from hkgpu_tune.observe.collect import render
    assert not [ln for ln in render(gpu.families([g])) if ln.startswith("hkgpu_tune_gpu_temperature_celsius")]


def test_not_supported_is_none_for_that_field_only():
    nv = ReplayNvml(H200)
    nv.set_raw(0, "nvmlDeviceGetTotalEccErrors",
               {"corrected": {"volatile": 1, "aggregate": {"nvml_error": "NotSupported"}},
                "uncorrected": {"volatile": 0, "aggregate": {"nvml_error": "NotSupported"}}})
    nv.set_raw(0, "nvmlDeviceGetRemappedRows", {"nvml_error": "NotSupported"})
    g = gpu.read(nv)[0]
    assert g["ecc"] == {"volatile": {"corrected": 1, "uncorrected": 0}, "aggregate": {"corrected": None, "uncorrected": None}}
    assert g["remapped_rows"] is None and g["errors"] == {} and g["temp_c"] == 33


def test_older_driver_without_clocks_event_reasons_uses_throttle_reasons():
    class OldDriver(ReplayLib):
        class NVMLError_FunctionNotFound(ReplayLib.NVMLError):
            pass

        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            raise self.NVMLError_FunctionNotFound("Function Not Found")

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            return 0x4

    from hkgpu_tune.backends.nvml import FIELDS
    assert FIELDS["throttle_reasons"](OldDriver({}), None) == ["sw_power_cap"]


def test_reason_names_bits():
    assert reason_names(0) == [] and reason_names(0x1 | 0x100) == ["gpu_idle", "display_clock_setting"]


def test_facts_without_health_answers_read_as_none_not_a_crash():
    gs = gpu.read(ReplayNvml(os.path.join(FIX, "dgx-h100-8gpu.json")))
    assert len(gs) == 8 and all(g["temp_c"] is None and g["ecc"] is None for g in gs)
    assert gs[4]["pcie"]["gen"] == 5


def test_no_nvml_is_fine_without_a_gpu_section_and_a_failure_with_one():
    none = ReplayNvml.missing()
    r = collect(parse_profile_text("name: t\nsysctl: {}\n", "t.yaml"), ["gpu"], sources=Sources(nvml=none))[0]
    assert r.up and r.data["gpus"] == [] and "NVML" in r.data["unsupported"]
    r = collect(parse_profile_text("name: t\ngpu: {gpus: all}\n", "t.yaml"), ["gpu"], sources=Sources(nvml=none))[0]
    assert not r.up and "NVML" in r.error


@pytest.mark.skipif(not shutil.which("nvidia-smi"), reason="needs a GPU host (nvidia-smi); the replay covers the rest")
def test_real_gpu_matches_nvidia_smi():
    q = "index,memory.total,pcie.link.gen.max,pcie.link.width.max,ecc.errors.uncorrected.aggregate.total"
    out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    got = {g["index"]: g for g in gpu.read()}
    for line in out.strip().splitlines():
        i, mem, gen, width, unc = [x.strip() for x in line.split(",")]
        g = got[int(i)]
        assert g["mem_total_bytes"] // (1024 * 1024) == int(mem)
        assert (g["pcie"]["max_gen"], g["pcie"]["max_width"]) == (int(gen), int(width))
        assert str(g["ecc"]["aggregate"]["uncorrected"]) == unc or unc in ("[N/A]", "N/A")
