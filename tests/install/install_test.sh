#!/usr/bin/env bash
# Installs weft into a temporary prefix (tools/install.sh, on this test's runfiles) and uses
# it as a user would, with nothing from the build tree:
#  - C against the shared library with `cc $(pkg-config --cflags --libs weft)`, 2 ranks;
#  - C against the static archive with `pkg-config --static`, 2 ranks, no libweft.so needed;
#  - the trainer's library with `pkg-config weft-trainer`;
#  - the installed Python package (2 ranks), weftrun and weft-plan.
set -euo pipefail
root=${TEST_SRCDIR:?run by bazel test}/${TEST_WORKSPACE:?}
here=$root/tests/install
prefix=$TEST_TMPDIR/prefix
work=$TEST_TMPDIR/work
mkdir -p "$work"
"$root/tools/install.sh" --prefix "$prefix" --outputs "$root" --sources "$root"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(timeout 120 mpirun --oversubscribe -np 2 --mca btl self,vader,tcp
     --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
status=0
check() {  # check NAME EXPECTED_OK_LINES COMMAND...
  local name=$1 want=$2 out
  shift 2
  out=$("$@" 2>&1) || { echo "FAIL: $name exited non-zero"; status=1; }
  printf '%s\n' "$out"
  [[ $(grep -c ': ok' <<<"$out" || true) == "$want" ]] || { echo "FAIL: $name"; status=1; }
}

# Installed layout.
for f in include/weft/weft.h include/weft/trainer.h lib/libweft.so lib/libweft.so.0 \
         lib/libweft.a lib/libweft_trainer.so.0 lib/libweft_trainer.a bin/weftrun bin/weft-plan \
         share/weft/go/go.mod; do
  [[ -e "$prefix/$f" ]] || { echo "FAIL: $prefix/$f is missing"; status=1; }
done
[[ $(readelf -d "$prefix/lib/libweft.so" | grep -o 'soname: \[[^]]*\]') == 'soname: [libweft.so.0]' ]] ||
  { echo "FAIL: libweft.so's soname"; status=1; }

# Shared: exactly the pkg-config line of the README.
cc -std=c99 -Wall -Werror "$here/sum.c" -o "$work/sum_shared" $(pkg-config --cflags --libs weft)
readelf -d "$work/sum_shared" | grep -q 'NEEDED.*\[libweft.so.0\]' ||
  { echo "FAIL: the program does not record libweft.so.0"; status=1; }
check "shared program" 2 "${mpi[@]}" "$work/sum_shared"

# Static: the archive, the private libraries from pkg-config --static.
cc -std=c99 -Wall -Werror "$here/sum.c" -o "$work/sum_static" $(pkg-config --cflags weft) \
  -Wl,-Bstatic -lweft -Wl,-Bdynamic -Wl,--as-needed $(pkg-config --static --libs weft)
if readelf -d "$work/sum_static" | grep -q 'NEEDED.*libweft'; then
  echo "FAIL: the static program still needs libweft.so"; status=1
fi
check "static program" 2 "${mpi[@]}" "$work/sum_static"

# The trainer's library.
cc -std=c99 -Wall -Werror "$here/trainer_error.c" -o "$work/trainer_error" \
  $(pkg-config --cflags --libs weft-trainer)
"$work/trainer_error" || { echo "FAIL: the trainer program"; status=1; }

# Python, from the installed package only.
site=$(echo "$prefix"/lib/python3*/dist-packages)
check "python" 2 env PYTHONPATH="$site" "${mpi[@]}" /usr/bin/python3 -c "
import weft, numpy as np
assert weft.__file__.startswith('$site'), weft.__file__
weft.init()
n = weft.size()
y = weft.allreduce(np.full(3, weft.rank() + 1.0), average=False)
print('python rank %d: %s' % (weft.rank(), 'ok' if (y == n * (n + 1) / 2).all() else 'WRONG'))
"

# Go, from the installed module: pkg-config finds weft; no generation step (SWIG's layer
# is part of the module), no environment but the prefix's pkg-config files.
gosrc=$TEST_TMPDIR/go/src
mkdir -p "$TEST_TMPDIR/go"
cp -r "$prefix/share/weft/go" "$gosrc"
if (cd "$gosrc" && env -i PATH=/usr/bin:/bin HOME="$TEST_TMPDIR/go" \
      GOCACHE="$TEST_TMPDIR/go/cache" GOPATH="$TEST_TMPDIR/go/path" GOFLAGS= GOPROXY=off \
      GO111MODULE=on GOENV=off CGO_ENABLED=1 PKG_CONFIG_PATH="$PKG_CONFIG_PATH" \
      sh -c 'go vet ./... && go build -o ../consensus ./examples/consensus'); then
  check "go example" 0 "${mpi[@]}" "$TEST_TMPDIR/go/consensus" -steps 4
else
  echo "FAIL: the installed Go module does not vet and build"; status=1
fi

# The tools.
check "weftrun" 2 "$prefix/bin/weftrun" -np 2 --mpi-args \
  "--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo" \
  "$work/sum_shared"
"$prefix/bin/weft-plan" --model vit-b16 --machines 1 --devices 8 > "$work/plan.txt" ||
  { echo "FAIL: weft-plan"; status=1; }
grep -q "static pipeline: K 8" "$work/plan.txt" || { echo "FAIL: weft-plan printed no plan"; cat "$work/plan.txt"; status=1; }
[[ $status == 0 ]] && echo "PASS: installed under $prefix and used from C (shared, static," \
  "trainer), Python, weftrun and weft-plan"
exit "$status"
