"""What the benchmark ran on: the GPU (name, memory, compute capability, driver, clocks,
temperature, power, throttle reasons where NVML is readable) or, without one, the CPU."""

from __future__ import annotations

import os
import platform

import torch

# NVML's clock-throttle reason bits (nvml.h, nvmlClocksEventReasons*), by name.
THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


def throttle_reasons(mask: int) -> list[str]:
    """The active throttle reasons of an NVML bit mask, by name (idle is not a slowdown)."""
    return [name for name, bit in THROTTLE_BITS.items() if mask & bit and name != "gpu_idle"]


def _nvml(index: int) -> dict:
    """Driver, clocks, temperature, power and throttle reasons from NVML (the nvidia-ml-py
    package); empty where it is missing or unreadable (containers without the library)."""
    try:
        import pynvml as nv
    except ImportError:
        return {}
    try:
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(index)
        out = {
            "driver": nv.nvmlSystemGetDriverVersion(),
            "sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "throttle": throttle_reasons(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        }
        nv.nvmlShutdown()
        return {k: v.decode() if isinstance(v, bytes) else v for k, v in out.items()}
    except Exception as e:  # NVML present but not readable here: say so, measure anyway
        return {"nvml_error": f"{type(e).__name__}: {e}"}


def _host() -> dict:
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "ram_bytes": mem, "python": platform.python_version(),
            "torch": torch.__version__}  # fmt: skip


def detect(device: torch.device | str = "cuda") -> dict:
    """The device the benchmark runs on, and the host around it."""
    device = torch.device(device)
    info = {"host": _host()}
    if device.type == "cuda" and torch.cuda.is_available():
        i = device.index or 0
        p = torch.cuda.get_device_properties(i)
        info |= {
            "kind": "gpu", "name": p.name, "memory_bytes": p.total_memory,
            "compute_capability": f"{p.major}.{p.minor}",
            "multiprocessors": p.multi_processor_count, "cuda": torch.version.cuda,
        }  # fmt: skip
        info |= _nvml(i)
    else:
        info |= {"kind": "cpu", "name": info["host"]["cpu"], "threads": torch.get_num_threads()}
    return info
