// Package cweft is the low-level layer of the Go binding: SWIG's wrapping of weft's C ABI
// (capi/include/weft/weft.h) through bindings/go/weft.i. Its other files (cweft.go and
// weft_wrap.c) are generated, not checked in: run generate.sh (or `go generate ./...`) in
// bindings/go first. Use package weft (weft.dev/weft) instead of this one.
package cweft

//go:generate ../../generate.sh
