// Package weft is the Go binding of weft, a library for communication-efficient
// distributed training: decentralized averaging over a virtual topology of ranks
// (neighbor_allreduce and friends) next to the usual collectives.
//
// A program calls Init once, runs the same sequence of ops on every rank, and calls
// Shutdown; it is started on many processes by Open MPI's mpirun (see README.md). Ops are
// matched across ranks by name (the Name option), or by call order when the name is empty.
//
// The package sits on weft's stable C ABI (libweft.so) through a SWIG-generated layer;
// every call is safe from any goroutine after Init. Failures are *Error values carrying
// the library's Status and message.
package weft

import (
	"weft.dev/weft/internal/cweft"
)

// Version is the version of the libweft.so loaded at run time ("0.1.0").
func Version() string { return cweft.Weft_version() }

// VersionNumber is major*10000 + minor*100 + patch of the loaded library.
func VersionNumber() int { return cweft.Weft_version_number() }

// Init starts MPI (unless the program already did) and weft's engine. The topology is then
// ExponentialGraph(Size(), 2). Calling it twice is an error; Init after Shutdown works.
func Init() error { return onInitThread(func() error { return call(cweft.Weft_init) }) }

// Shutdown waits until every rank has called it; ops that cannot complete then fail.
func Shutdown() error { return call(cweft.Weft_shutdown) }

// IsInitialized reports whether Init has succeeded and Shutdown has not been called since.
func IsInitialized() bool { return cweft.Weft_is_initialized() != 0 }

// Rank is this process's rank in [0, Size()); -1 before Init.
func Rank() int { return cweft.Weft_rank() }

// Size is the number of ranks; -1 before Init.
func Size() int { return cweft.Weft_size() }

// LocalRank is this process's index among the ranks on its machine; -1 before Init.
func LocalRank() int { return cweft.Weft_local_rank() }

// LocalSize is the number of ranks on this machine; -1 before Init.
func LocalSize() int { return cweft.Weft_local_size() }

// MachineRank is the index of this process's machine; -1 before Init.
func MachineRank() int { return cweft.Weft_machine_rank() }

// MachineSize is the number of machines; -1 before Init.
func MachineSize() int { return cweft.Weft_machine_size() }

// IsHomogeneous reports whether every machine runs the same number of ranks and each
// machine's ranks are consecutive; false before Init.
func IsHomogeneous() bool { return cweft.Weft_is_homogeneous() == 1 }

// UnifiedMpiWindowModel reports whether MPI windows use MPI's unified memory model. Needs
// Init; not collective.
func UnifiedMpiWindowModel() (bool, error) {
	var result int32
	err := call(func() cstatus { return cweft.Weft_unified_mpi_window_model(&result) })
	return result != 0, err
}

// NcclBuilt reports whether this build runs CUDA tensors on NCCL.
func NcclBuilt() bool { return cweft.Weft_nccl_built() != 0 }

// Finalize finalizes MPI if weft started it, after Shutdown when weft is still initialized
// (then it is collective); Init fails afterwards. A program started by mpirun calls it last.
//
// Why: weft finalizes MPI by itself in a C atexit handler, but a Go program never runs those
// (returning from main and os.Exit end the process directly), so without Finalize mpirun
// would report every rank as having exited without MPI_Finalize.
func Finalize() error {
	return call(func() cstatus { return cweft.Weft_finalize() })
}

// ---- configuration (WEFT_* settings) ----------------------------------------------------

// ConfigSet overrides a WEFT_* setting in this process (it wins over the environment). The
// value is validated at once; most settings take effect at the next Init.
func ConfigSet(name, value string) error {
	return call(func() cstatus { return cweft.Weft_config_set(name, value) })
}

// ConfigUnset drops an override made with ConfigSet.
func ConfigUnset(name string) error {
	return call(func() cstatus { return cweft.Weft_config_unset(name) })
}

// ConfigGet returns the value of a setting in force, as text.
func ConfigGet(name string) (string, error) {
	var value string
	err := call(func() cstatus { return cweft.Weft_config_get(&value, name) })
	return value, err
}

// ConfigDescribe returns a table of every setting: value in force, default, description.
func ConfigDescribe() string { return cweft.Weft_config_describe() }

// ---- timeline (Chrome trace) -----------------------------------------------------------

// TimelineStart starts writing this rank's trace to path (one file per rank when Size() > 1,
// named as for WEFT_TIMELINE). Needs Init; fails if a timeline is already being written.
// Ops already started show only the phases that begin after it.
func TimelineStart(path string) error {
	return call(func() cstatus { return cweft.Weft_timeline_start(path) })
}

// TimelineStop finishes and closes the trace; it does nothing when none is being written.
func TimelineStop() error { return call(cweft.Weft_timeline_stop) }

// TimelineStartActivity starts a user span (e.g. "forward") on the row of tensorName.
func TimelineStartActivity(tensorName, activity string) error {
	return call(func() cstatus { return cweft.Weft_timeline_start_activity(tensorName, activity) })
}

// TimelineEndActivity ends the span started on the row of tensorName.
func TimelineEndActivity(tensorName string) error {
	return call(func() cstatus { return cweft.Weft_timeline_end_activity(tensorName) })
}

// TimelineActive reports whether a timeline is being written.
func TimelineActive() bool { return cweft.Weft_timeline_active() != 0 }
