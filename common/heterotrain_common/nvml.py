"""Guarded NVML access: which GPUs this machine has, and a GPU's utilisation and memory.

NVML comes from ``pynvml`` (PyPI ``nvidia-ml-py``, NVIDIA's own bindings). Everything here degrades
to "nothing found" when the library, the driver or the GPUs are absent, so a CPU-only machine never
crashes and never exports a GPU series. Torch-free.

Sources: NVML API reference (``nvmlDeviceGetUtilizationRates`` gives percent over the last sample
period; ``nvmlDeviceGetMemoryInfo`` gives bytes; utilisation is not supported on MIG devices and
raises ``NVML_ERROR_NOT_SUPPORTED``). GFD writes ``nvidia.com/gpu.product`` as the NVML name with
spaces turned into ``-`` (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery).

:func:`device_identity` names a rank's device the way dcgm-exporter labels its series (parent GPU
``UUID``, NVML index ``gpu``, MIG ``GPU_I_ID`` and ``GPU_I_PROFILE``), so dashboards can join DCGM
series to ranks by device rather than by the ``pod`` label that MIG series often lack
(NVIDIA/dcgm-exporter issues 272 and 577; its metrics template writes
``gpu, UUID, pci_bus_id, device, modelName[, GPU_I_PROFILE, GPU_I_ID][, Hostname]``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_module: ModuleType | None = None
_initialised: bool | None = None  # None: not tried yet


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuInfo:
    """One physical GPU as NVML sees it.

    Attributes:
        index: NVML index (ignores ``CUDA_VISIBLE_DEVICES``).
        uuid: ``"GPU-…"``.
        product: GFD-style product, e.g. ``"NVIDIA-A100-SXM4-40GB"``, ``"Tesla-T4"``.
        compute_capability: ``"8.0"``.
        memory_mib: total memory in MiB.
        mig_enabled: True when MIG mode is on (then the GPU is not usable as a whole).
    """

    index: int
    uuid: str
    product: str
    compute_capability: str
    memory_mib: int
    mig_enabled: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSample:
    """One reading of a GPU (or MIG device).

    Attributes:
        utilization_ratio: busy fraction 0..1 over NVML's last sample period; None on MIG devices.
        memory_used_bytes: device memory in use by all processes, bytes.
        memory_total_bytes: device memory, bytes.
    """

    utilization_ratio: float | None
    memory_used_bytes: int
    memory_total_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceIdentity:
    """Which physical device a rank runs on, in dcgm-exporter's terms.

    Attributes:
        uuid: UUID of the physical GPU (``"GPU-…"``); for a MIG device its parent's UUID, which is
            what dcgm-exporter writes into ``UUID`` on MIG series.
        gpu_index: NVML index of the physical GPU (dcgm-exporter's ``gpu`` label), as a string.
        gi_id: GPU instance id of a MIG device (``GPU_I_ID``) as a string; ``""`` for a whole GPU.
        gi_profile: MIG profile (``GPU_I_PROFILE``, e.g. ``"1g.10gb"``); ``""`` for a whole GPU.
        model_name: NVML name of the physical GPU (dcgm-exporter's ``modelName``, e.g.
            ``"NVIDIA A100 80GB PCIe"``).
    """

    uuid: str
    gpu_index: str
    gi_id: str
    gi_profile: str
    model_name: str


def _nvml() -> ModuleType | None:
    """Import and initialise NVML once per process; None when unavailable."""
    global _module, _initialised
    with _lock:
        if _initialised is None:
            _initialised = False
            try:
                import pynvml  # nvidia-ml-py
                pynvml.nvmlInit()
            except Exception:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded, ...
                return None
            _module, _initialised = pynvml, True
        return _module if _initialised else None


def use_module(module: ModuleType | None) -> None:
    """Replace the NVML module (tests pass a fake); None resets to "try pynvml again"."""
    global _module, _initialised
    with _lock:
        _module = module
        _initialised = None if module is None else True


def available() -> bool:
    """True when NVML initialised and reports at least one GPU."""
    nv = _nvml()
    if nv is None:
        return False
    try:
        return int(nv.nvmlDeviceGetCount()) > 0
    except Exception:
        return False


def gfd_product(name: str | bytes) -> str:
    """NVML device name -> GFD product label value (``"Tesla T4"`` -> ``"Tesla-T4"``)."""
    if isinstance(name, bytes):
        name = name.decode()
    return "-".join(name.split())


def list_gpus() -> list[GpuInfo]:
    """Every GPU NVML finds, by NVML index; ``[]`` without NVML."""
    nv = _nvml()
    if nv is None:
        return []
    gpus = []
    try:
        for index in range(int(nv.nvmlDeviceGetCount())):
            h = nv.nvmlDeviceGetHandleByIndex(index)
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
            uuid = nv.nvmlDeviceGetUUID(h)
            gpus.append(GpuInfo(
                index=index, uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                product=gfd_product(nv.nvmlDeviceGetName(h)),
                compute_capability=f"{major}.{minor}",
                memory_mib=int(nv.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024),
                mig_enabled=_mig_enabled(nv, h)))
    except Exception:
        return []
    return gpus


def _mig_enabled(nv: Any, handle: Any) -> bool:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
    except Exception:  # NVML_ERROR_NOT_SUPPORTED on GPUs without MIG
        return False
    return bool(current)


def nvml_target(cuda_visible_devices: str | None, local_rank: int) -> int | str:
    """Which NVML device a rank uses: an NVML index or a ``GPU-``/``MIG-`` UUID.

    NVML ignores ``CUDA_VISIBLE_DEVICES``, CUDA does not. With one visible device (what
    ``heterotrain launch`` sets, and what the device plugin sets for one GPU or one MIG slice) the rank
    uses it; with several, the rank uses entry ``local_rank`` (``cuda:LOCAL_RANK``); without the
    variable, NVML index ``local_rank``.

    Args:
        cuda_visible_devices: the variable's value, None when unset.
        local_rank: this process's local rank.

    Returns:
        An int index, or a UUID string.
    """
    entries = [e.strip() for e in (cuda_visible_devices or "").split(",") if e.strip()]
    if not entries:
        return local_rank
    entry = entries[local_rank] if len(entries) > local_rank else entries[0]
    return int(entry) if entry.isdigit() else entry


def _handle(nv: Any, target: int | str) -> Any:
    if isinstance(target, int):
        return nv.nvmlDeviceGetHandleByIndex(target)
    return nv.nvmlDeviceGetHandleByUUID(target)


def _sample_of(nv: Any, handle: Any) -> GpuSample | None:
    try:
        mem = nv.nvmlDeviceGetMemoryInfo(handle)
    except Exception:
        return None
    try:
        util: float | None = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
    except Exception:  # MIG devices: not supported
        util = None
    return GpuSample(utilization_ratio=util, memory_used_bytes=int(mem.used),
                     memory_total_bytes=int(mem.total))


def sample(target: int | str) -> GpuSample | None:
    """Read utilisation and memory of one device; None without NVML or on any NVML error."""
    return read_device(target, identity=False)[0]


def read_device(target: int | str, *, identity: bool
                ) -> tuple[GpuSample | None, DeviceIdentity | None]:
    """One handle lookup, then the device's reading and (when asked) its identity.

    Args:
        target: an NVML index or a ``GPU-``/``MIG-`` UUID (:func:`nvml_target`).
        identity: also resolve :class:`DeviceIdentity` (see :func:`device_identity`).

    Returns:
        ``(sample, identity)``; either is None without NVML or on an NVML error.
    """
    nv = _nvml()
    if nv is None:
        return None, None
    try:
        handle = _handle(nv, target)
    except Exception:
        return None, None
    return _sample_of(nv, handle), (_identity_of(nv, handle) if identity else None)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_profile_from_name(name: str | bytes) -> str:
    """MIG profile from a MIG device's NVML name (``"NVIDIA A100-SXM4-40GB MIG 1g.5gb"`` -> ``"1g.5gb"``).

    NVML names a MIG device ``<parent name> MIG <profile>`` (nvidia-smi -L prints the same); the
    profile is the token after ``MIG``. Returns ``""`` when the name has no such token.
    """
    words = _text(name).split()
    for i, word in enumerate(words[:-1]):
        if word == "MIG":
            return words[i + 1]
    return ""


def device_identity(target: int | str) -> DeviceIdentity | None:
    """The dcgm-exporter identity of one device (an NVML index, a ``GPU-`` or a ``MIG-`` UUID).

    A MIG device is resolved to its parent GPU (``nvmlDeviceGetDeviceHandleFromMigDeviceHandle``)
    for ``UUID``/``gpu``/``modelName`` and to its GPU instance (``nvmlDeviceGetGpuInstanceId``) for
    ``GPU_I_ID``; the profile comes from the MIG device's name (:func:`mig_profile_from_name`).

    Args:
        target: what :func:`nvml_target` returned for the rank.

    Returns:
        The identity, or None without NVML or on any NVML error (a CPU-only machine, a simulated
        device: no identity is invented).
    """
    nv = _nvml()
    if nv is None:
        return None
    try:
        handle = _handle(nv, target)
    except Exception:
        return None
    return _identity_of(nv, handle)


def _identity_of(nv: Any, handle: Any) -> DeviceIdentity | None:
    try:
        if nv.nvmlDeviceIsMigDeviceHandle(handle):
            parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            gi_id = str(int(nv.nvmlDeviceGetGpuInstanceId(handle)))
            gi_profile = mig_profile_from_name(nv.nvmlDeviceGetName(handle))
        else:
            parent, gi_id, gi_profile = handle, "", ""
        return DeviceIdentity(uuid=_text(nv.nvmlDeviceGetUUID(parent)),
                              gpu_index=str(int(nv.nvmlDeviceGetIndex(parent))),
                              gi_id=gi_id, gi_profile=gi_profile,
                              model_name=_text(nv.nvmlDeviceGetName(parent)))
    except Exception:  # NVMLError of any kind: no identity rather than a wrong one
        return None


def driver_versions() -> tuple[str, str] | None:
    """``(driver version, highest CUDA it supports)``, e.g. ``("550.54.15", "12.4")``; None without NVML."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        cuda = int(nv.nvmlSystemGetCudaDriverVersion())  # e.g. 12040
    except Exception:
        return None
    driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    return driver, f"{cuda // 1000}.{(cuda % 1000) // 10}"
