#!/usr/bin/env bash
# One call of the device tool: start pipeline.sh detached (first call, or after the carried
# files changed), wait up to WAIT_S seconds for it, then copy what exists to $OUT. Later
# calls continue waiting on the same run, so the pipeline may outlast one call's limit.
#
#   bash .gpu/repo/bench/gpu/device.sh        (from the checkout root; .gpu carried)
set -u
SRC=${SRC:-.gpu}
G=${G:-/root/gpuwork}
WAIT_S=${WAIT_S:-540}
OUT=${OUT:-/tmp/gpu-out}

running() { [ -f "$G/pid" ] && kill -0 "$(cat "$G/pid")" 2>/dev/null; }

if ! running && { [ ! -f "$G/done" ] || ! cmp -s "$SRC/stamp" "$G/stamp"; }; then
    mkdir -p "$G"
    for x in repo whl py skel llama.cpp.tar.gz stamp; do
        rm -rf "${G:?}/$x"
        cp -r "$SRC/$x" "$G/"
    done
    (cd "$G" && setsid nohup bash "$G/repo/bench/gpu/pipeline.sh" >>"$G/pipeline.log" 2>&1 \
        </dev/null & echo $! >"$G/pid")
    sleep 2
fi

deadline=$((SECONDS + WAIT_S))
while running && [ $SECONDS -lt "$deadline" ]; do sleep 3; done

echo "phase: $(cat "$G/phase" 2>/dev/null)  done: $(cat "$G/done" 2>/dev/null)"
tail -n 60 "$G/pipeline.log"
mkdir -p "$OUT"
cp "$G/pipeline.log" "$OUT/"
tar czf "$OUT/results.tar.gz" -C "$G" results
[ -f "$G/results/summary.md" ] && cp "$G/results/summary.md" "$OUT/"
exit 0
