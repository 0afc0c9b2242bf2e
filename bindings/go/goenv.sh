# Sourced: a hermetic go command for building against a built weft (no user environment, no
# network, no HOME needed).  source goenv.sh WORK_DIR WEFT_INCLUDE_DIR LIBWEFT_DIR
# The package finds weft through pkg-config (#cgo pkg-config: weft-trainer), so this writes
# weft.pc and weft-trainer.pc for the given directories (as ./tools/weft.sh install does for
# an installed prefix) and puts them first on PKG_CONFIG_PATH.
mkdir -p "$1/cache" "$1/path" "$1/tmp" "$1/pkgconfig"
cat > "$1/pkgconfig/weft.pc" <<PC
Name: weft
Description: weft's C ABI (the build tree)
Version: 0
Cflags: -I$2
Libs: -L$3 -Wl,-rpath,$3 -lweft
PC
cat > "$1/pkgconfig/weft-trainer.pc" <<PC
Name: weft-trainer
Description: weft's trainer (the build tree)
Version: 0
Requires: weft
Libs: -L$3 -lweft_trainer
PC
export GOCACHE=$1/cache GOPATH=$1/path GOTMPDIR=$1/tmp GOENV=off GOFLAGS= \
  GO111MODULE=on GOPROXY=off GOWORK=off CGO_ENABLED=1
export PKG_CONFIG_PATH="$1/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export CGO_CFLAGS="-O2"
unset CGO_LDFLAGS
export HOME=${HOME:-$1}
