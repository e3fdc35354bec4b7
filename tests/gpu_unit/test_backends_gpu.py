"""The NVML backend without a driver, with a stand-in pynvml, and the sysfs recorder."""
import sys
import types

import pytest

from hkgpu_tune.backends.nvml import NO_LIBRARY, Nvml, cpus_from_masks
from hkgpu_tune.backends.procfs import SysFs
from hkgpu_tune.backends.sysfs_record import RecordingSysFs
from hkgpu_tune.core.errors import UnsupportedError
from hkgpu_tune.backends.topology import nics


def test_cpu_masks():
    assert cpus_from_masks([0xFFFF]) == list(range(16))
    assert cpus_from_masks([0, 0b101]) == [64, 66]


def fake_pynvml():
    """pynvml as NVIDIA's NVML API reference describes it for two x86 GPUs: nvmlDeviceGetNumaNodeId
    answers NVML_ERROR_NOT_SUPPORTED (the GPU is not a NUMA node), nvmlDeviceGetCpuAffinity a list
    of 64-bit masks, nvmlDeviceGetPciInfo a busId of 8-digit domain; calls it lacks raise AttributeError."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NotSupported(NVMLError):
        pass

    class LibraryNotFound(NVMLError):
        pass
    m.NVMLError, m.NVMLError_NotSupported, m.NVMLError_LibraryNotFound = NVMLError, NotSupported, LibraryNotFound
    m.NVMLError_NoPermission = type("NoPermission", (NVMLError,), {})
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_NVLINK_MAX_LINKS = 1, 2, 18
    m.inits = 0

    def init():
        m.inits += 1
    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetPersistenceMode = lambda h: 1
    m.nvmlDeviceGetComputeMode = lambda h: 3

    def numa(h):
        raise NotSupported()
    m.nvmlDeviceGetNumaNodeId = numa
    m.nvmlDeviceGetCpuAffinity = lambda h, n: [0xFF00 if h else 0xFF]
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:18:00.0")
    return m


def test_no_library_is_unsupported_with_reason(monkeypatch):
    m = fake_pynvml()

    def init():
        raise m.NVMLError_LibraryNotFound()
    m.nvmlInit = init
    monkeypatch.setitem(sys.modules, "pynvml", m)
    nv = Nvml()
    assert nv.available() == (False, NO_LIBRARY)
    with pytest.raises(UnsupportedError, match=r"NVML library not found \(libnvidia-ml.so.1\)"):
        nv.gpu(0, ("persistence",))


def test_fields_one_init(monkeypatch):
    m = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", m)
    nv = Nvml()
    g = nv.gpu(1, ("persistence", "compute_mode", "numa_node", "cpu_affinity", "pci_bus_id"))
    assert g == {"index": 1, "persistence": True, "compute_mode": "exclusive_process", "numa_node": None,
                 "cpu_affinity": list(range(8, 16)), "pci_bus_id": "00000000:18:00.0"}
    nv.gpu(0, ("persistence",))
    assert m.inits == 1


def test_recorder_round_trip(tmp_path):
    """Record what the NIC reader reads on this machine, replay the tree, get the same answer."""
    rec = RecordingSysFs(SysFs("/"))
    live = nics(rec)
    rec.dump(str(tmp_path))
    assert nics(SysFs(str(tmp_path))) == live


def test_systemd_backend(tmp_path):
    from hkgpu_tune.backends.systemd import Systemd

    from .conftest import FakeCmd
    cmd = FakeCmd(programs=["systemctl"])
    sd = Systemd(cmd, root=str(tmp_path))
    assert not sd.available()                      # no /run/systemd/system: PID 1 is not systemd
    with pytest.raises(UnsupportedError, match="PID 1 is not systemd"):
        sd.enable("nvidia-mps.service")
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    assert sd.available()
    sd.enable("nvidia-mps.service")
    sd.daemon_reload()
    assert sd.is_active("nvidia-mps.service")
    assert cmd.runs == [["systemctl", "enable", "--now", "nvidia-mps.service"], ["systemctl", "daemon-reload"],
                        ["systemctl", "is-active", "--quiet", "nvidia-mps.service"]]
    sd.write_unit("nvidia-mps.service", "[Unit]\n")
    assert sd.read_unit("nvidia-mps.service") == "[Unit]\n"
    assert oct((tmp_path / "etc/systemd/system/nvidia-mps.service").stat().st_mode & 0o777) == "0o644"
    sd.write_unit("nvidia-mps.service", None)
    assert sd.read_unit("nvidia-mps.service") is None
