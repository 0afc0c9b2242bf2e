# Sourced: a hermetic go command for building against libweft.so (no user environment, no
# network, no HOME needed).  source goenv.sh WORK_DIR WEFT_INCLUDE_DIR LIBWEFT_DIR
mkdir -p "$1/cache" "$1/path" "$1/tmp"
export GOCACHE=$1/cache GOPATH=$1/path GOTMPDIR=$1/tmp GOENV=off GOFLAGS= \
  GO111MODULE=on GOPROXY=off GOWORK=off CGO_ENABLED=1
export CGO_CFLAGS="-I$2 -O2"
export CGO_LDFLAGS="-L$3 -Wl,-rpath,$3"
export HOME=${HOME:-$1}
