#!/usr/bin/env bash
# Shuttle's native code under AddressSanitizer and UndefinedBehaviorSanitizer
# (`make sanitize`; docs/testing.md, "The sanitizer tier").
#
# Builds a copy of src/ in build/sanitize/ with everything compiled instrumented: the
# three hand-written C extensions (the read lane, the RWF_NOWAIT read, the librados
# completions) and the mypyc group (the block cache, the key locks, the loop-side
# reads, the node's protocol). Then runs, against that copy (PYTHONPATH) with the
# sanitizers' runtime preloaded into every Python process it starts (node processes
# and benchmark clients inherit it), each step stopping at the first report:
#
#   1. the C extensions' and the block cache's tests, property tests at SCALE times
#      their examples (SHUTTLE_EXAMPLES_SCALE);
#   2. the read lane's hostile frames over a real socket to a node process;
#   3. the librados completions' tests on a local Ceph (skipped with NO_CEPH=1);
#   4. a short `shuttle bench netrand --clients 8` (nodes and clients instrumented).
#
# PYTHONMALLOC=malloc sends every Python allocation through ASan's allocator, so a
# read or write past the end of a bytes object is caught, not hidden in a pymalloc
# arena. Leak checking is off: CPython keeps objects alive until exit by design.
# About 10-15 minutes on the shared 2-core machine; not part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

SCALE=${SCALE:-10}
NO_CEPH=${NO_CEPH:-0}
out=build/sanitize
py=$PWD/.venv/bin/python
cc=${CC:-cc}

asan=$("$cc" -print-file-name=libasan.so)
if [[ ! -e $asan ]]; then
    echo "sanitize: $cc has no AddressSanitizer runtime (libasan.so); install gcc's libasan" >&2
    exit 2
fi

echo "sanitize: copying src/ to $out and building it instrumented"
mkdir -p "$out/scripts"
rsync -a --delete --exclude '*.so' --exclude compiled.json --exclude __pycache__ src/ "$out/src/"
cp scripts/build_compiled.py "$out/scripts/"
# shift-base is off: mypyc's tagged integers shift negative values left by design
# (CPy.h), which UBSan reports on every negative int a compiled function takes.
flags="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize=shift-base"
flags+=" -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
# Rebuilt when a compiled source changed since the last run (the manifest's hashes).
CFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" "$py" "$out/scripts/build_compiled.py"

export PYTHONPATH=$PWD/$out/src
# libstdc++ too: ASan finds the C++ runtime's __cxa_throw when it starts, and librados
# (C++, loaded later by the RADOS tests) throws.
export LD_PRELOAD="$asan $("$cc" -print-file-name=libstdc++.so.6)"
export PYTHONMALLOC=malloc
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export SHUTTLE_EXAMPLES_SCALE=$SCALE

# Every process below must run the instrumented copy, compiled: say so or stop.
"$py" - <<'EOF'
import shuttle, shuttle.compiled as c
from shuttle.wire import _readlane
from shuttle.store import _aiodone, _nowait
import shuttle.blockcache as b
assert "build/sanitize" in shuttle.__file__, shuttle.__file__
assert c.active().compiled, c.active().reason
for m in (_readlane, _aiodone, _nowait, b):
    assert "build/sanitize" in m.__file__ and c.is_compiled(m), m.__file__
print("sanitize: running", shuttle.__file__, "compiled, instrumented")
EOF

# -s: a sanitizer's report goes to the process's stderr, which pytest would capture and
# lose when the report aborts the process. No per-test timeout: instrumented, a
# stateful test at ten times its examples runs for minutes, and a timeout in the middle
# of one is reported by Hypothesis as a flaky strategy, not as slowness.
pytest=("$py" -m pytest -s -q -x -p no:randomly -p no:cacheprovider --timeout 0)
echo "sanitize: 1/4 the C extensions' and the block cache's tests (examples x$SCALE)"
"${pytest[@]}" tests/unit/wire/test_readlane.py tests/unit/store/test_nowait_reads.py \
    tests/unit/store/test_cache.py tests/unit/store/test_cache_clock.py
echo "sanitize: 2/4 hostile read-lane frames over a socket"
"${pytest[@]}" tests/integration/test_readlane_hostile.py tests/integration/test_node_errors.py
if [[ $NO_CEPH == 0 ]]; then
    echo "sanitize: 3/4 the librados completions on a local Ceph"
    "${pytest[@]}" tests/store_suite/test_rados_aio_done.py tests/store_suite/test_rados_aio.py
else
    echo "sanitize: 3/4 skipped (NO_CEPH=1)"
fi
echo "sanitize: 4/4 shuttle bench netrand --clients 8 (short)"
# Redis is left out: its jemalloc and the preloaded ASan runtime do not mix.
"$py" -m shuttle bench netrand --clients 8 --no-redis --pages 100 --rounds 2 \
    --file-bytes $((16 << 20)) --pass-seconds 1 ${NETRAND_ARGS:-}
echo "sanitize: no report from AddressSanitizer or UBSan"
