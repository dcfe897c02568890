#!/usr/bin/env bash
# tests/gpu/check_fa4_layouts.py on the device, which has no flash-attn-4: its wheels (flash-attn-4, the CuTe DSL
# libraries; ~76 MB) travel as two parts, .p8 and .p9 (git-ignored), made here from the payload of
# gpu_runs/make_payload.sh (its .payload/ folder):
#   mkdir -p /tmp/fa4pay/payload/wheels && cp .payload/payload/wheels/{apache_tvm,flash_attn_4,nvidia_cutlass,quack,torch_c_dlpack}*.whl \
#     /tmp/fa4pay/payload/wheels/ && cp .payload/payload/cutlass.tar.xz /tmp/fa4pay/payload/ && tar -C /tmp/fa4pay -cf /tmp/fa4.tar payload
#   mkdir .p8 .p9 && split -b 40M -d -a 2 /tmp/fa4.tar fq. && mv fq.00 .p8/ && mv fq.01 .p9/
# Then two device calls, back to back: `bash gpu_runs/fa4_layouts.sh stash` (carry .p8), `bash gpu_runs/fa4_layouts.sh
# run` (carry .p9): the results in $OUT/fa4_layouts.json.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /root/parts && cp .p[89]/fq.* /root/parts/ 2>/dev/null
[ "${1:-}" = stash ] && { ls -la /root/parts; exit 0; }
cat /root/parts/fq.* >/root/fa4.tar && mkdir -p /root/x && tar xf /root/fa4.tar -C /root/x || exit 1
P=/root/x/payload
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$P"/wheels/*.whl 2>&1 | tail -2
python3 -c "import tarfile; tarfile.open('$P/cutlass.tar.xz').extractall('/tmp/site')"
mkdir -p /tmp/sc && printf 'import site\nsite.addsitedir("/tmp/site")\n' >/tmp/sc/sitecustomize.py
PYTHONPATH=/tmp/sc:$PWD python3 tests/gpu/check_fa4_layouts.py --json "${OUT:-/tmp}/fa4_layouts.json" 2>&1 | grep -v -e Warning -e generate_mlir
