#!/usr/bin/env bash
# Install the carried flash-attn-4 wheels on the GPU machine (no internet there). Two device calls, back to back:
#   1. carry .fa4a (part.aa of the 92 MB nvidia-cutlass-dsl-libs-cu13 wheel):  bash gpu_runs/fa4_install.sh stash
#   2. carry .fa4b (part.ab + the other wheels):                                source gpu_runs/fa4_install.sh install
# Wheels: pip download --no-deps --python-version 3.12 --platform manylinux_2_28_x86_64 --only-binary=:all:
#   flash-attn-4 nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core
#   nvidia-cutlass-dsl-libs-cu13 quack-kernels apache-tvm-ffi torch-c-dlpack-ext; then split -b 46M the libs-cu13
#   wheel into .fa4a/part.aa and .fa4b/part.ab. The install goes to /tmp/site; a sitecustomize.py in /tmp/sc adds it
#   with site.addsitedir (the wheels ship a .pth file, which PYTHONPATH alone does not process), so worker
#   subprocesses see it too: the install exports PYTHONPATH=/tmp/sc:$PWD.
case "${1:-install}" in
stash)
    mkdir -p /root/parts && cp .fa4a/part.aa /root/parts/ && ls -la /root/parts ;;
install)
    if [ ! -f /root/parts/part.aa ]; then echo "fa4_install: /root/parts/part.aa missing (run 'stash' first)"; return 1 2>/dev/null || exit 1; fi
    cat /root/parts/part.aa .fa4b/part.ab > /tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
    pip install -q --no-deps --target /tmp/site .fa4b/*.whl /tmp/nvidia_cutlass_dsl_libs_cu13-*.whl 2>&1 | tail -2
    mkdir -p /tmp/sc && printf 'import site\nsite.addsitedir("/tmp/site")\n' > /tmp/sc/sitecustomize.py
    export PYTHONPATH=/tmp/sc:$PWD
    python -c "from flash_attn.cute import flash_attn_func; print('fa4 import ok')" ;;
esac
