// Package cconv holds the conversions that packages weft and weft/trainer share on the way
// from Go values to the C ABI's arguments.
package cconv

import (
	"fmt"
	"math"
	"unsafe"
)

// DLPack type codes (dlpack.h).
const (
	DLInt   = 0
	DLFloat = 2
)

// Data is the address of a slice's first element, nil for an empty slice.
func Data[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

// Bool is a C boolean (1 or 0).
func Bool(b bool) int {
	if b {
		return 1
	}
	return 0
}

// FitsCInt says whether v survives the conversion to a C int.
func FitsCInt(v int) bool { return v >= math.MinInt32 && v <= math.MaxInt32 }

// CheckInts takes (name, value int) pairs and describes the first value that does not fit
// a C int ("" when all do).
func CheckInts(fn string, namesAndValues ...any) string {
	for i := 0; i+1 < len(namesAndValues); i += 2 {
		if v := namesAndValues[i+1].(int); !FitsCInt(v) {
			return fmt.Sprintf("%s: %s = %d does not fit a C int", fn, namesAndValues[i], v)
		}
	}
	return ""
}
