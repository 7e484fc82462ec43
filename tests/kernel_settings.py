"""Kernel settings and the kernel fingerprint, for the tests that compare numbers stored in the repository
(marked ``@pytest.mark.stored``).

oneDNN, MKL, ATen, NumPy, OpenBLAS and OpenCV each pick SIMD kernels for the CPU at hand (AVX-512, AVX2, SSE4.1),
so the same code gives floats that differ in their last bits from one CPU to another. A stored result is compared
bit for bit only where :func:`fingerprint` of the running process equals the recording's (same libraries, same
CPU, same settings); elsewhere within a tolerance measured by ``python tests/kernel_settings.py measure``.

``python tests/kernel_settings.py`` (``make test-kernels``) runs the stored tests under each of :data:`SETTINGS`;
``python tests/kernel_settings.py measure`` prints how far the stored quantities move between the settings.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each setting caps every library's kernels at one instruction set; "default" is what the machine picks. On a CPU
# without AVX-512, "avx2" equals "default"; names a library does not know are ignored by it.
SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR", "OPENBLAS_CORETYPE": "Haswell",
             "OPENCV_CPU_DISABLE": "AVX512-SKX"},
    "sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
              "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR", "OPENBLAS_CORETYPE": "Nehalem",
              "OPENCV_CPU_DISABLE": "AVX512-SKX,AVX2,FP16,AVX,SSE4.2"},
}
KERNEL_VARS = sorted({k for env in SETTINGS.values() for k in env})


def _cpu() -> dict[str, object]:
    """The CPU's vendor, family, model and AVX-512 flags (Linux); the platform's processor string elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"processor": platform.processor()}
    first = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in text.split("\n\n")[0].splitlines())}
    info: dict[str, object] = {k: first.get(k, "") for k in ("vendor_id", "cpu family", "model", "model name")}
    info["avx512"] = sorted(f for f in first.get("flags", "").split() if f.startswith("avx512"))
    return info


# the libraries whose kernels or decoders decide the floats of a stored result: their pins in the lock
NUMERIC = ("torch", "torchvision", "numpy", "opencv-python-headless", "simplejpeg", "pillow")


def has_avx512() -> bool:
    cpu = _cpu()
    return "avx512f" in cpu.get("avx512", [])


def golden_setting() -> str:
    """The setting the stored numbers are recorded and checked under: AVX2 wherever the CPU has it (capped on an
    AVX-512 CPU; an AVX2 CPU's own default), so one recording serves both kinds of machine."""
    return "avx2" if has_avx512() or "avx2" in Path("/proc/cpuinfo").read_text() else "default"


def golden_env() -> dict[str, str]:
    """This environment with the kernel variables of :func:`golden_setting` (none where the CPU is already AVX2)."""
    name = golden_setting()
    caps = SETTINGS[name] if has_avx512() else {}
    return {**{k: v for k, v in os.environ.items() if k not in KERNEL_VARS}, **caps}


def _setting() -> str:
    """The name of the setting this process runs under: the caps set, or what the machine's default amounts to."""
    env = {k: v for k in KERNEL_VARS if (v := os.environ.get(k))}
    named = next((n for n, e in SETTINGS.items() if e and e == env), None)
    if named:
        return named
    if env:
        return "custom"
    return "default" if has_avx512() else golden_setting()


def fingerprint() -> dict[str, object]:
    """What decides the kernels a run uses: the lock's pins of the numeric libraries (and whether this environment
    is the lock), the architecture, the CPU vendor (MKL's code paths differ by vendor), ATen's chosen capability
    and the kernel setting (on an AVX2 CPU its default is the "avx2" setting)."""
    import torch

    from moquad import record

    pins = record._locked(record.LOCK.read_text()) if record.LOCK.is_file() else {}
    return {"lock": {n: pins.get(n) for n in NUMERIC}, "locked": bool(record.lock().get("matches")),
            "machine": platform.machine(), "vendor": _cpu().get("vendor_id", ""),
            "aten_capability": torch.backends.cpu.get_cpu_capability(), "kernels": _setting()}


def run_stored(names: list[str]) -> int:
    """``pytest -m stored`` under each named setting (on top of the current environment); a table of exit codes."""
    codes = {}
    for name in names:
        print(f"== kernels {name}: {' '.join(f'{k}={v}' for k, v in SETTINGS[name].items()) or '(machine default)'}",
              flush=True)
        env = {**{k: v for k, v in os.environ.items() if k not in KERNEL_VARS}, **SETTINGS[name]}
        codes[name] = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "stored",
                                       "-n", "0"], cwd=ROOT, env=env)
    print("\n".join(f"kernels {n:8s} {'passed' if c == 0 else f'FAILED (exit {c})'}" for n, c in codes.items()))
    return max(codes.values(), default=0)


def measure(names: list[str]) -> int:
    """Record every stored quantity under each setting and print its largest difference from the first setting."""
    # tests/ is on the path: this file runs as a script or under pytest
    from golden_methods import record_methods

    got = {}
    for name in names:
        env = {**{k: v for k, v in os.environ.items() if k not in KERNEL_VARS}, **SETTINGS[name]}
        got[name] = record_methods.record_in(env)
    base = names[0]
    print(f"largest difference from '{base}' (loss: relative; parameters: per tensor, relative to its L1 / L2 norm)")
    for name in names[1:]:
        d = record_methods.differences(got[base]["runs"], got[name]["runs"])
        print(f"{name:8s} loss {d['loss']:.3g}  parameters {d['params']:.3g}  bit-for-bit {d['exact']}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["measure"]:
        sys.exit(measure(args[1:] or list(SETTINGS)))
    sys.exit(run_stored(args or list(SETTINGS)))
