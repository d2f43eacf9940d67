#!/usr/bin/env bash
# On a lent GPU machine, in one device call (prepared here by benchmarks/gpu_pack.sh, whose part
# calls go first): install what the image lacks, then run the GPU tests and benchmarks/gpu.py,
# everything written under $OUT:
#   environment.txt  nvidia-smi, the interpreter's versions and onnxruntime's providers
#   tests.txt        pytest tests/gpu and the CUDA kernel-table test (with the slowest tests)
#   tests.xml        the same as JUnit XML
#   gpu.json, gpu.md the benchmark's figures and its table for BENCHMARKS.md; gpu.log its progress
#   install.txt      what the install step printed
# Each step has a time limit of its own, so that a hang leaves the others' results: about 6
# minutes in all on an H100 (tests 150 s at most, the benchmark 240 s).
# 'bash benchmarks/gpu_session.sh compiled' (a later call, if time is left): PyTorch with
# torch.compile against the kit at batch 1 (compiled.json, compiled.md, compiled.log; 240 s).
set -uo pipefail
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
# shellcheck disable=SC1091
source .gpu/install.sh install > "$out/install.txt" 2>&1 || { cat "$out/install.txt"; exit 1; }
if [ ! -f /tmp/gpu-site/.extra ]; then
  rm -rf /tmp/gpu-extra && mkdir -p /tmp/gpu-extra && tar -C /tmp/gpu-extra -xf .gpu/extra.tar
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site /tmp/gpu-extra/extra/*.whl \
    >> "$out/install.txt" 2>&1 && touch /tmp/gpu-site/.extra
fi
{
  nvidia-smi
  python3 - <<'PY'
import importlib, onnxruntime, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for name in ("onnxruntime", "onnx", "onnxscript", "onnx_ir", "numpy", "transformers", "pydantic", "pytest"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:
        print(name, "missing:", exc)
print("providers", onnxruntime.get_available_providers())
from transformer_kit.runtime.providers import cuda_works
print("a CUDA session works:", cuda_works())
PY
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"
if [ "${1:-}" = compiled ]; then
  timeout 240 python3 benchmarks/gpu.py --compiled --workdir /tmp/bench-gpu --out "$out/compiled.json" \
    > "$out/compiled.md" 2> "$out/compiled.log"
  echo "benchmark exit status $?" >> "$out/compiled.log"
  tail -n 5 "$out/compiled.log"; cat "$out/compiled.md"
  exit 0
fi
timeout 150 python3 -m pytest tests/gpu tests/export/test_cuda_kernels.py -q -p no:cacheprovider \
  --durations=10 --junitxml "$out/tests.xml" > "$out/tests.txt" 2>&1
echo "pytest exit status $?" >> "$out/tests.txt"
tail -n 40 "$out/tests.txt"
timeout 240 python3 benchmarks/gpu.py --workdir /tmp/bench-gpu --out "$out/gpu.json" \
  > "$out/gpu.md" 2> "$out/gpu.log"
echo "benchmark exit status $?" >> "$out/gpu.log"
tail -n 5 "$out/gpu.log"
cat "$out/gpu.md"
