"""The Pallas kernel's Triton compile time, measured on the CPU (no GPU needed).

    pip install triton          # a stand-alone Triton, only for this script
    python benchmarks/kernel_compile.py [--json]

On a GPU, XLA compiles the kernel's Triton module as part of the program, and
a slow Triton compile there eats minutes of a short GPU session. This script
takes the module as Pallas hands it to Triton
(:func:`jaxqueue.sim.kernel.triton_module`) and runs Triton's own compile
stages for an H100/H200 (sm_90) on the CPU, timing each: ``ttir`` and
``ttgir`` (Triton's passes; its memory coalescing lives here), ``llir``,
``ptx`` and ``cubin`` (ptxas). The stand-alone Triton is not the one inside
jaxlib, so the figures are a proxy for the compile on the GPU machine, not the
same number; the kernel is the same.

From the compiled kernel (with ``cuobjdump``, which comes with Triton) it
also reads the registers a thread uses, the bytes it spills to local memory,
and the machine (SASS) instructions of the step loop, found as the innermost
loop of the code: the instructions per replica-step that bound the kernel's
speed (an H200 issues about 3.3e13 thread-instructions a second: 132
multiprocessors, 4 schedulers each, one warp instruction a cycle at 1.98 GHz).

The cases are those of ``benchmarks/gpu_check.py``: its exactness cases and its
throughput kernels (Pod(2), and JIQ with r = 10 and 32 I-queue levels, at 16,
32 and 64 levels).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_check import EXACT_CASES, POLICIES, N

import jaxqueue as jq
from jaxqueue.core.system import System
from jaxqueue.sim.kernel import NUM_WARPS, triton_module

# (policy, options, dispatchers, I-queue levels, levels, buffer): the GPU
# check's exactness cases, then its throughput kernels at 32 and 64 levels
CASES = list(EXACT_CASES) + [
    (POLICIES[p][0], POLICIES[p][1], POLICIES[p][2], POLICIES[p][3], lv, None)
    for p in ("pod", "jiq")
    for lv in (32, 64)
]


def compile_stages(path: str, capability: int = 90) -> tuple[dict[str, float], bytes]:
    """Seconds of each of Triton's compile stages for the module in ``path``,
    and the compiled kernel (cubin)."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns without it
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget, Language
    from triton.backends.nvidia.compiler import CUDABackend

    backend = CUDABackend(GPUTarget("cuda", capability, 32))
    options = backend.parse_options({"num_warps": NUM_WARPS, "num_stages": 1})
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    module = ir.parse_mlir_module(path, ctx)
    module.context = ctx
    stages: dict = {}
    backend.add_stages(stages, options, Language.TRITON)
    seconds, metadata, current = {}, {}, module
    for name, stage in stages.items():
        t0 = time.perf_counter()
        current = stage(current, metadata)
        seconds[name] = time.perf_counter() - t0
    return seconds, current


def sass_figures(cubin: bytes) -> dict:
    """Registers, stack (spill) bytes, and the step loop's instructions and spill
    accesses, read from the compiled kernel with Triton's ``cuobjdump``."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        usage = subprocess.run(
            [tool, "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run(
            [tool, "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout
    finally:
        os.unlink(f.name)
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    code = [
        (int(m.group(1), 16), m.group(2))
        for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    ]
    # loops: backward branches; the step loop is the innermost with the most instructions
    loops = []
    for addr, text in code:
        m = re.search(r"\bBRA\s+(?:`?\(?\.?L?_?x?_?)?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    inner = [
        lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)
    ]
    body = max(([t for a, t in code if lo <= a <= hi] for lo, hi in inner), key=len, default=[])
    return {
        "registers": int(regs.group(1)) if regs else None,
        "stack_bytes": int(stack.group(1)) if stack else None,
        "step_instructions": len(body),
        "step_spill_accesses": sum(bool(re.search(r"\b(LDL|STL)\b", t)) for t in body),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="the JSON record alone on stdout")
    ap.add_argument("--quick", action="store_true", help="the exactness cases only")
    args = ap.parse_args(argv)
    try:
        import triton
    except ImportError:
        print("this benchmark needs a stand-alone Triton: pip install triton", file=sys.stderr)
        return 2
    rows = []
    for name, opts, m, iq, levels, buffer in EXACT_CASES if args.quick else CASES:
        policy = jq.make(name, **opts)
        system = System(N, m, buffer, buffer or levels, iq)
        t0 = time.perf_counter()
        text = triton_module(system, policy)
        lower_s = time.perf_counter() - t0
        with tempfile.NamedTemporaryFile("w", suffix=".ttir", delete=False) as f:
            f.write(text)
        try:
            stages, cubin = compile_stages(f.name)
        finally:
            os.unlink(f.name)
        row = {
            "policy": policy.label(),
            "n_dispatchers": m,
            "iqueue_levels": iq,
            "levels": system.levels,
            "buffer": buffer,
            "lower_seconds": lower_s,
            "stages": stages,
            "triton_seconds": sum(stages.values()),
            **sass_figures(cubin),
        }
        rows.append(row)
        print(
            f"{row['policy']:12s} M={m:<4d} L={system.levels:<3d} iq={iq:<3d} "
            f"Triton {row['triton_seconds']:6.1f} s ("
            + ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
            + f"); {row['registers']} registers, {row['stack_bytes']} stack bytes, "
            f"{row['step_instructions']} instructions a step "
            f"({row['step_spill_accesses']} spill accesses)",
            file=sys.stderr,
            flush=True,
        )
    record = {
        "triton": triton.__version__,
        "jaxqueue": jq.__version__,
        "target": "sm_90",
        "rows": rows,
    }
    if args.json:
        print(json.dumps(record))
        return 0
    print(f"Triton {triton.__version__} compile of the kernel for sm_90, on the CPU:\n")
    print(
        "| policy | M | levels | I-queue levels | buffer | Triton seconds | registers | "
        "spilled bytes | instructions a step | spill accesses a step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['policy']} | {r['n_dispatchers']} | {r['levels']} | {r['iqueue_levels']} | "
            f"{r['buffer']} | {r['triton_seconds']:.1f} | {r['registers']} | "
            f"{r['stack_bytes']} | {r['step_instructions']} | {r['step_spill_accesses']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
