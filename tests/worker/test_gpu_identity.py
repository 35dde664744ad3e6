"""The device identity each rank exports as ``htj_gpu_info`` (case 30), read through a fake NVML.

The fake answers the pynvml calls :func:`heterotrain_common.nvml.device_identity` makes for one node with
a whole A100 (NVML index 0, ``GPU-eeee0000``) and an A100 in MIG mode (index 1, ``GPU-dddd0000``)
holding one 1g.10gb slice (``MIG-1111``, GPU instance 12), as ``nvidia-smi -L`` would list them.
"""

from __future__ import annotations

import types

import pytest
from prom.workload import rank_envs

import heterotrain_common.contract as c
from hetero_worker.metrics import GPU_INFO, WorkerMetrics
from heterotrain_common import envnames, nvml


class MigNvml(types.SimpleNamespace):
    """pynvml calls for a whole GPU and a MIG slice; handles are plain strings."""

    GPUS = {"gpu0": ("GPU-eeee0000", 0, "NVIDIA A100 80GB PCIe"),
            "gpu1": ("GPU-dddd0000", 1, "NVIDIA A100 80GB PCIe")}

    def __init__(self) -> None:
        super().__init__(calls=[])

    def nvmlDeviceGetHandleByIndex(self, i):
        self.calls.append(("index", i))
        return f"gpu{i}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("uuid", uuid))
        return {"GPU-eeee0000": "gpu0", "GPU-dddd0000": "gpu1", "MIG-1111": "mig1"}[uuid]

    def nvmlDeviceIsMigDeviceHandle(self, h):
        return h.startswith("mig")

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        assert h == "mig1"
        return "gpu1"

    def nvmlDeviceGetGpuInstanceId(self, h):
        assert h == "mig1"
        return 12

    def nvmlDeviceGetName(self, h):
        return "NVIDIA A100 80GB PCIe MIG 1g.10gb" if h == "mig1" else self.GPUS[h][2]

    def nvmlDeviceGetUUID(self, h):
        return self.GPUS[h][0].encode()  # older pynvml returns bytes

    def nvmlDeviceGetIndex(self, h):
        return self.GPUS[h][1]

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=1, total=10 * 1024 ** 3)

    def nvmlDeviceGetUtilizationRates(self, h):
        if h.startswith("mig"):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return types.SimpleNamespace(gpu=50, memory=5)


@pytest.fixture
def mig_nvml():
    fake = MigNvml()
    nvml.use_module(fake)
    yield fake
    nvml.use_module(None)


def _contract(*, simulated: bool, product: str, local_rank: int = 0) -> c.Contract:
    env = rank_envs(job="job-mig", batches=[8], products=[product], groups=[0],
                    metrics_ports=[0])[0]
    env[envnames.DEVICE_PROFILE] = c.DeviceProfile(product=product, compute_capability="8.0",
                                            simulated=simulated).to_json()
    env[envnames.LOCAL_RANK] = str(local_rank)
    return c.parse_contract(env)


def _info(m: WorkerMetrics) -> list[dict[str, str]]:
    return [s.labels for fam in m.registry.collect() if fam.name == GPU_INFO
            for s in fam.samples if s.value == 1]


def test_mig_slice_identity_is_parent_uuid_and_gpu_instance(mig_nvml):
    assert nvml.device_identity("MIG-1111") == nvml.DeviceIdentity(
        uuid="GPU-dddd0000", gpu_index="1", gi_id="12", gi_profile="1g.10gb",
        model_name="NVIDIA A100 80GB PCIe")


def test_whole_gpu_identity_has_empty_instance_labels(mig_nvml):
    assert nvml.device_identity(0) == nvml.DeviceIdentity(
        uuid="GPU-eeee0000", gpu_index="0", gi_id="", gi_profile="",
        model_name="NVIDIA A100 80GB PCIe")


@pytest.mark.parametrize(("name", "profile"), [
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"), (b"NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb"),
    ("NVIDIA A100-SXM4-40GB", ""), ("MIG", "")])
def test_mig_profile_from_name(name, profile):
    assert nvml.mig_profile_from_name(name) == profile


def test_mig_rank_exports_gpu_info_with_parent_uuid_and_gi_id(mig_nvml):
    m = WorkerMetrics(_contract(simulated=False, product="NVIDIA-A100-80GB-PCIe-MIG-1g.10gb"),
                      environ={"CUDA_VISIBLE_DEVICES": "MIG-1111"})
    m.update_device()
    m.update_device()  # identity is looked up once
    assert _info(m) == [{"job": "job-mig", "rank": "0", "group": "0",
                         "gpu_product": "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb",
                         "UUID": "GPU-dddd0000", "gpu": "1", "GPU_I_ID": "12",
                         "GPU_I_PROFILE": "1g.10gb"}]
    assert mig_nvml.calls == [("uuid", "MIG-1111"), ("uuid", "MIG-1111")]  # one lookup per update


def test_whole_gpu_rank_exports_gpu_info_without_instance(mig_nvml):
    m = WorkerMetrics(_contract(simulated=False, product="NVIDIA-A100-80GB-PCIe"),
                      environ={})
    m.update_device()
    assert _info(m) == [{"job": "job-mig", "rank": "0", "group": "0",
                         "gpu_product": "NVIDIA-A100-80GB-PCIe", "UUID": "GPU-eeee0000",
                         "gpu": "0", "GPU_I_ID": "", "GPU_I_PROFILE": ""}]


def test_simulated_device_exports_no_identity(mig_nvml):
    """A simulated device gets no invented UUID: ``htj_gpu_info`` stays absent."""
    m = WorkerMetrics(_contract(simulated=True, product="NVIDIA-A100-80GB-PCIe"))
    m.update_device()
    assert _info(m) == [] and mig_nvml.calls == []


def test_nvml_error_exports_no_identity(mig_nvml):
    def broken(_h):
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")

    mig_nvml.nvmlDeviceGetIndex = broken
    m = WorkerMetrics(_contract(simulated=False, product="NVIDIA-A100-80GB-PCIe"), environ={})
    m.update_device()
    assert _info(m) == []


@pytest.mark.gpu
def test_real_gpu_identity_matches_nvidia_smi():
    """On a real GPU: the identity NVML gives equals what nvidia-smi prints for the same device
    (UUID, index; MIG slices: GPU instance id), and the rank exports it as htj_gpu_info."""
    import shutil
    import subprocess

    nvml.use_module(None)
    if not nvml.available() or shutil.which("nvidia-smi") is None:
        pytest.skip("needs an NVIDIA driver and nvidia-smi")
    ident = nvml.device_identity(0)
    assert ident is not None and ident.uuid.startswith("GPU-") and ident.gpu_index == "0"
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name,mig.mode.current",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True)
    index, uuid, name, _mig = (f.strip() for f in smi.stdout.splitlines()[0].split(","))
    assert (ident.gpu_index, ident.uuid, ident.model_name) == (index, uuid, name)
    assert (ident.gi_id, ident.gi_profile) == ("", "")
    m = WorkerMetrics(_contract(simulated=False, product=nvml.gfd_product(name)), environ={})
    m.update_device()
    (labels,) = _info(m)
    assert (labels["UUID"], labels["gpu"], labels["GPU_I_ID"]) == (uuid, index, "")
