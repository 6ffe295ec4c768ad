#!/usr/bin/env bash
# The GPU benchmark of issue 10, end to end, on a machine without network (see README.md):
#   1. record the machine (nvidia-smi, nvcc, CPU);
#   2. install InferFlux's Python dependencies from carried wheels into $G/site;
#   3. build llama.cpp (the sources vendored in the llama-cpp-python 0.3.36 sdist) with
#      CUDA: the shared libllama that the bindings load, llama-server and llama-quantize;
#      meanwhile write the random-weight F16 models (synth_gguf.py);
#   4. quantize them (7B: Q4_K_M);
#   5. bench_gpu.py per model: llama-server vs InferFlux, results under $G/results.
# Each step is skipped when its output exists, so a re-run continues where one stopped.
# Runs detached (device.sh starts it); writes $G/phase while running and $G/done at the end.
#
# Environment: G (work dir, holds what prepare.sh packed), GPU (1: CUDA build; 0: CPU
# rehearsal), SHAPE (synthetic big model: llama2-7b), MODELS (which to bench, in order),
# LEVELS, REQUESTS, JOBS, BUDGET_S (no new model bench starts after this many seconds).
set -u
G=${G:-/root/gpuwork}
GPU=${GPU:-1}
SHAPE=${SHAPE:-llama2-7b}
MODELS=${MODELS:-llama7b smollm2 gemma3}
LEVELS=${LEVELS:-1,8,16,32,64}
REQUESTS=${REQUESTS:-4}
JOBS=${JOBS:-16}
BUDGET_S=${BUDGET_S:-1200}
PY=${PY:-python3}
R=$G/results
M=$G/models
B=$G/build
mkdir -p "$R" "$M"
echo $$ >"$G/pid"
rm -f "$G/done"

log() { echo "[$(date +%T) +${SECONDS}s] $*"; }
phase() { echo "$1" >"$G/phase"; log "== $1"; }
finish() { phase "done: $1"; echo "$1" >"$G/done"; exit 0; }

phase env
{
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit \
        --format=csv
    command -v nvcc && nvcc --version
    cmake --version | head -1
    ninja --version
    "$PY" --version
    nproc
    free -g
    df -h "$G" /tmp
    uname -a
    lscpu | head -20
} >"$R/env.txt" 2>&1

phase deps
if [ ! -f "$G/site/.done" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$G/site" "$G"/whl/*.whl || finish "pip install failed"
    cp -r "$G/py/llama_cpp" "$G/site/"
    touch "$G/site/.done"
fi
export PYTHONPATH="$G/site:$G/repo/src"
[ -d "$G/llama.cpp" ] || tar xzf "$G/llama.cpp.tar.gz" -C "$G"
for s in "$G"/skel/*.gz; do [ -f "${s%.gz}" ] || gunzip -k "$s"; done

synth() { # name skeleton quant-type [--shape S]
    local name=$1 skel=$2 qtype=$3
    shift 3
    [ -f "$M/$name.f16.gguf" ] || [ -f "$M/$name.gguf" ] && return 0
    PYTHONPATH="$G/llama.cpp/gguf-py" "$PY" "$G/repo/bench/gpu/synth_gguf.py" build \
        "$G/skel/$skel" "$M/$name.f16.tmp" "$@" && mv "$M/$name.f16.tmp" "$M/$name.f16.gguf"
}
synth_all() {
    synth llama7b smollm2.skel.gguf Q4_K_M --shape "$SHAPE"
    synth smollm2 smollm2.skel.gguf Q4_1
    synth gemma3 gemma3.skel.gguf Q4_K_M
}

phase build
synth_all >"$R/synth.log" 2>&1 &
SYNTH_PID=$!
if [ ! -x "$B/bin/llama-server" ]; then
    flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
    if [ "$GPU" = 1 ]; then
        nvcc=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
        flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 "-DCMAKE_CUDA_COMPILER=$nvcc")
    fi
    start=$SECONDS
    cmake -S "$G/llama.cpp" -B "$B" -G Ninja "${flags[@]}" >"$R/cmake.log" 2>&1 ||
        { tail -40 "$R/cmake.log"; finish "cmake configure failed"; }
    cmake --build "$B" -j "$JOBS" --target llama llama-server llama-quantize >"$R/build.log" 2>&1 ||
        { tail -60 "$R/build.log"; finish "build failed"; }
    echo "build_s $((SECONDS - start))" >>"$R/timings.txt"
    log "built in $((SECONDS - start)) s"
fi
cp -a "$B"/bin/lib*.so* "$G/site/llama_cpp/lib/" 2>/dev/null ||
    cp -a "$B"/lib*.so* "$G/site/llama_cpp/lib/" 2>/dev/null
export LD_LIBRARY_PATH="$G/site/llama_cpp/lib:$B/bin:${LD_LIBRARY_PATH:-}"
"$PY" -c "import llama_cpp as l; print('llama_cpp', l.__version__, 'gpu offload:',
    l.llama_supports_gpu_offload())" 2>&1 | tee -a "$R/env.txt"

phase models
wait "$SYNTH_PID"
cat "$R/synth.log"
quantize() { # name type
    [ -f "$M/$1.gguf" ] && return 0
    [ -f "$M/$1.f16.gguf" ] || return 1
    local start=$SECONDS
    "$B/bin/llama-quantize" "$M/$1.f16.gguf" "$M/$1.tmp" "$2" "$JOBS" >"$R/quantize_$1.log" 2>&1 &&
        mv "$M/$1.tmp" "$M/$1.gguf" && rm -f "$M/$1.f16.gguf"
    echo "quantize_$1_s $((SECONDS - start))" >>"$R/timings.txt"
    tail -3 "$R/quantize_$1.log"
}
quantize llama7b Q4_K_M
quantize smollm2 Q4_1
quantize gemma3 Q4_K_M
ls -la "$M"

phase bench
# On the device image (Ubuntu 24.04 system Python, numpy 2.5.2), a process that imports numpy
# or pyzmq before it loads the CUDA build of libllama segfaults in init_tokenizer (seen
# 2026-11-22; cause not established). InferFlux imports both first. Preloading the system
# libstdc++ avoids it; it changes nothing for llama-server, which gets it too.
stdcxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
[ -n "$stdcxx" ] && export LD_PRELOAD="$stdcxx" && log "LD_PRELOAD=$stdcxx"
for name in $MODELS; do
    if [ $SECONDS -gt "$BUDGET_S" ]; then
        log "skip $name: over the time budget ($BUDGET_S s)"
        echo "skipped $name (time budget)" >>"$R/skipped.txt"
        continue
    fi
    [ -f "$R/$name.json" ] && continue
    [ -f "$M/$name.gguf" ] || { log "no model $name"; continue; }
    phase "bench $name"
    left=$((BUDGET_S + 300 - SECONDS))
    [ $left -lt 420 ] && left=420 # the first model gets its levels whatever the build took
    "$PY" "$G/repo/bench/gpu/bench_gpu.py" --model "$M/$name.gguf" --name "$name" \
        --llama-server "$B/bin/llama-server" --out "$R" --levels "$LEVELS" \
        --requests "$REQUESTS" --deadline "$left" --level-timeout 180 >"$R/bench_$name.log" 2>&1
    tail -14 "$R/bench_$name.log"
done
"$PY" "$G/repo/bench/gpu/summarize.py" "$R" >"$R/summary.md" 2>&1
cat "$R/summary.md"
finish ok
