#!/usr/bin/env bash
# Here, before a GPU session (run in the project's root): what a lent GPU machine lacks, packed
# to carry. ../shared/gpu/pack.sh writes .gpu/part-* (onnxruntime-gpu, pydantic, llguidance) and
# .gpu/install.sh; this adds .gpu/extra.tar: the wheels the GPU tests and benchmarks/gpu.py need
# beyond the device's image, for its Python 3.12 on x86-64: transformers and its dependencies
# (PyTorch's side of the benchmark) and pytest. The image's own numpy stays (torch is built on it).
# Then the device calls it prints; the last one is
#   run(carry=[".gpu/install.sh", ".gpu/SHA256SUMS", ".gpu/extra.tar"], command="bash benchmarks/gpu_session.sh", timeout_s=420)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bash ../shared/gpu/pack.sh
rm -rf .gpu/extra && mkdir -p .gpu/extra
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .gpu/extra "transformers==5.24.0" "tokenizers==0.23.3" "safetensors>=0.8" "pytest>=8"
rm -f .gpu/extra/numpy-*.whl
tar -C .gpu -cf .gpu/extra.tar extra
rm -rf .gpu/extra
echo "extra wheels: $(tar -tf .gpu/extra.tar | wc -l) files, $(du -h .gpu/extra.tar | cut -f1) (.gpu/extra.tar)"
echo "last device call: run(carry=[\".gpu/install.sh\", \".gpu/SHA256SUMS\", \".gpu/extra.tar\"], command=\"bash benchmarks/gpu_session.sh\", timeout_s=420)"
