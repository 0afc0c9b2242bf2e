#!/usr/bin/env bash
# Lays out a built weft under a prefix, the way C, Python and Go users consume it:
#
#   tools/install.sh --prefix DIR [--outputs DIR] [--sources DIR]
#
#   DIR/include/weft/weft.h, trainer.h
#   DIR/lib/libweft.so.X.Y.Z (+ libweft.so.X, libweft.so links), libweft.a, and the same
#       for libweft_trainer
#   DIR/lib/pkgconfig/weft.pc, weft-trainer.pc
#   DIR/lib/python3.N/dist-packages/weft/        the Python package (PYTHONPATH)
#   DIR/bin/weftrun, DIR/bin/weft-plan
#   DIR/share/weft/go/                           the Go module (weft.dev/weft), SWIG's
#                                                layer included: go build needs no SWIG
#
# --outputs is where Bazel left the build (default: bazel-bin of this checkout), --sources
# the checkout (default: this one). ./tools/weft.sh install builds everything first; the
# test //tests:install_test runs this on its runfiles.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix= outputs= sources=$here
while (($#)); do
  case $1 in
    --prefix) prefix=$2; shift ;;
    --outputs) outputs=$2; shift ;;
    --sources) sources=$2; shift ;;
    *) echo "usage: $0 --prefix DIR [--outputs DIR] [--sources DIR]" >&2; exit 2 ;;
  esac
  shift
done
[[ -n "$prefix" ]] || { echo "install.sh: --prefix DIR is required" >&2; exit 2; }
outputs=${outputs:-$sources/bazel-bin}
for f in capi/libweft.so capi/libweft_trainer.so capi/libweft.a capi/libweft_trainer.a \
         capi/libweft.link capi/libweft_trainer.link pipe/planner/weft-plan \
         bindings/python/weft/__init__.py; do
  [[ -e "$outputs/$f" ]] || {
    echo "install.sh: $outputs/$f is missing; build first (./tools/weft.sh install does)" >&2
    exit 1
  }
done
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

header=$sources/capi/include/weft/weft.h
version=$(awk '/#define WEFT_VERSION_(MAJOR|MINOR|PATCH) /{v[$2]=$3}
  END{print v["WEFT_VERSION_MAJOR"] "." v["WEFT_VERSION_MINOR"] "." v["WEFT_VERSION_PATCH"]}' "$header")
major=${version%%.*}

install -d "$prefix/include/weft" "$prefix/lib/pkgconfig" "$prefix/bin" "$prefix/share/weft"
install -m 644 "$sources"/capi/include/weft/*.h "$prefix/include/weft/"

# Shared libraries: the file carries the full version, the soname link the major, the
# development link none.
for lib in libweft libweft_trainer; do
  install -m 755 "$outputs/capi/$lib.so" "$prefix/lib/$lib.so.$version"
  ln -sf "$lib.so.$version" "$prefix/lib/$lib.so.$major"
  ln -sf "$lib.so.$major" "$prefix/lib/$lib.so"
  install -m 644 "$outputs/capi/$lib.a" "$prefix/lib/$lib.a"
done

# pkg-config: Libs for the shared libraries (with a run path, since the prefix is rarely on
# the loader's path); Libs.private, what a static link adds, from the build's own link
# flags.
private() { tr '\n' ' ' < "$outputs/capi/$1.link" | sed 's/ *$//'; }
cat > "$prefix/lib/pkgconfig/weft.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: weft
Description: communication-efficient distributed training: collectives, neighbor ops, windows (C ABI)
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lweft
Libs.private: $(private libweft) -lstdc++ -lm -pthread
EOF
cat > "$prefix/lib/pkgconfig/weft-trainer.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: weft-trainer
Description: weft's elastic pipeline trainer (C ABI, runs LibTorch)
Version: $version
Requires: weft = $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lweft_trainer
Libs.private: $(private libweft_trainer)
EOF

# The Python package, for the interpreter the build used (Debian's python3).
py=$(/usr/bin/python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
site=$prefix/lib/$py/dist-packages
rm -rf "$site/weft"
install -d "$site/weft"
# The files the wheel holds too (build_backend.py): the modules, the SWIG extensions and
# the libraries under their sonames, not the linker's leftovers (*.params, *.runfiles).
package=$outputs/bindings/python/weft
install -m 644 "$package"/*.py "$site/weft/"
install -m 755 "$package"/*.so "$package"/*.so.[0-9]* "$site/weft/"

install -m 755 "$sources/tools/weftrun" "$prefix/bin/weftrun"
install -m 755 "$outputs/pipe/planner/weft-plan" "$prefix/bin/weft-plan"

# The Go module's sources, the checked-in SWIG layers included (its README says how to
# build against this prefix).
go=$prefix/share/weft/go
rm -rf "$go"
(cd "$sources/bindings/go" && find -L . -type f \( -name '*.go' -o -name '*.c' -o \
  -name '*.i' -o -name go.mod -o -name generate.sh -o -name README.md \) \
  ! -name '*_test.go' ! -path './bench/*' -print0) |
  while IFS= read -r -d '' f; do
    install -d "$go/$(dirname "$f")"
    install -m 644 "$sources/bindings/go/$f" "$go/$f"
  done
chmod 755 "$go/generate.sh"

echo "weft $version installed under $prefix:"
echo "  C:      cc prog.c \$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs weft)"
echo "  Python: PYTHONPATH=$site"
echo "  tools:  $prefix/bin/weftrun, $prefix/bin/weft-plan"
