// Tests of the Go binding. They run under mpirun with any number of ranks
// (go_binding_test.sh; Bazel runs 1, 2 and 4): every rank runs every test in the same
// order, and expectations are computed from Rank() and Size(), so that one binary checks
// exact results at every size.
package weft_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"weft.dev/weft"
	"weft.dev/weft/internal/testutil"
)

var rank, size int

// Problems found before Init, reported by TestCallsBeforeInit (the process can only be
// uninitialized before TestMain calls Init).
var beforeInitProblems []string

func TestMain(m *testing.M) {
	beforeInitProblems = checkBeforeInit()
	if err := weft.Init(); err != nil {
		fmt.Fprintf(os.Stderr, "weft.Init: %v\n", err)
		os.Exit(1)
	}
	rank, size = weft.Rank(), weft.Size()
	if code := m.Run(); code != 0 {
		// The ranks may be out of step now, and a collective Shutdown could wait for ever:
		// end at once without finalizing MPI, and mpirun stops the other ranks.
		fmt.Fprintf(os.Stderr, "[rank %d] FAIL\n", rank)
		os.Exit(code)
	}
	code := 0
	if problems := checkShutdownAndReinit(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "[rank %d] shutdown/re-init: %s\n", rank, p)
		}
		code = 1
	}
	// MPI must be finalized before the process ends (see weft.Finalize).
	if err := weft.Finalize(); err != nil {
		fmt.Fprintf(os.Stderr, "[rank %d] weft.Finalize: %v\n", rank, err)
		code = 1
	}
	os.Exit(code)
}

// wantStatus: see testutil.WantStatus.
var wantStatus = testutil.WantStatus

func checkBeforeInit() []string {
	var problems []string
	add := func(p string) {
		if p != "" {
			problems = append(problems, p)
		}
	}
	if weft.IsInitialized() {
		add("IsInitialized() is true before Init")
	}
	for name, v := range map[string]int{"Rank": weft.Rank(), "Size": weft.Size(),
		"LocalRank": weft.LocalRank(), "LocalSize": weft.LocalSize(),
		"MachineRank": weft.MachineRank(), "MachineSize": weft.MachineSize()} {
		if v != -1 {
			add(fmt.Sprintf("%s() = %d before Init, want -1", name, v))
		}
	}
	add(wantStatus("Barrier before Init", weft.Barrier(), weft.FailedPrecondition, "init"))
	x := []float32{1, 2}
	add(wantStatus("Allreduce before Init", weft.Allreduce(x, x), weft.FailedPrecondition, "init"))
	_, err := weft.AllreduceNonblocking(x, x)
	add(wantStatus("AllreduceNonblocking before Init", err, weft.FailedPrecondition))
	_, err = weft.Allgather(x)
	add(wantStatus("Allgather before Init", err, weft.FailedPrecondition))
	_, err = weft.InNeighborRanks()
	add(wantStatus("InNeighborRanks before Init", err, weft.FailedPrecondition, "init"))
	_, err = weft.LoadTopology()
	add(wantStatus("LoadTopology before Init", err, weft.FailedPrecondition, "init"))
	add(wantStatus("TimelineStart before Init", weft.TimelineStart(os.DevNull),
		weft.FailedPrecondition))
	if !errors.Is(weft.Barrier(), weft.ErrFailedPrecondition) {
		add("errors.Is(Barrier(), ErrFailedPrecondition) is false before Init")
	}
	// Topologies are plain data: usable before Init.
	topo, err := weft.ExponentialTwoGraph(4)
	if err != nil {
		add(fmt.Sprintf("ExponentialTwoGraph(4) before Init: %v", err))
	} else {
		defer topo.Close()
		if out, err := topo.OutNeighbors(0); err != nil || fmt.Sprint(out) != "[1 2]" {
			add(fmt.Sprintf("OutNeighbors(0) before Init = %v, %v; want [1 2]", out, err))
		}
	}
	return problems
}

func TestCallsBeforeInit(t *testing.T) {
	for _, p := range beforeInitProblems {
		t.Error(p)
	}
}

// checkShutdownAndReinit: ops fail after Shutdown, and Init works again.
func checkShutdownAndReinit() []string {
	var problems []string
	add := func(p string) {
		if p != "" {
			problems = append(problems, p)
		}
	}
	// A window left alive: Shutdown frees it in weft, and the Window then only releases
	// its memory.
	w, err := weft.WinCreate("reinit.win", []float64{1, 2}, false)
	if err != nil {
		return []string{fmt.Sprintf("WinCreate: %v", err)}
	}
	if err := weft.Shutdown(); err != nil {
		return []string{fmt.Sprintf("Shutdown: %v", err)}
	}
	if weft.IsInitialized() || weft.Rank() != -1 {
		add("still initialized after Shutdown")
	}
	add(wantStatus("Barrier after Shutdown", weft.Barrier(), weft.FailedPrecondition))
	if err := weft.Init(); err != nil {
		return append(problems, fmt.Sprintf("Init after Shutdown: %v", err))
	}
	add(wantStatus("a second Init", weft.Init(), weft.FailedPrecondition))
	add(wantStatus("Put to a window that Shutdown freed", w.Put(), weft.NotFound,
		"no window named 'reinit.win'"))
	if err := w.Free(); err != nil {
		add(fmt.Sprintf("Free of a window that Shutdown freed: %v", err))
	}
	_, err = w.Data()
	add(wantStatus("Data after Free", err, weft.FailedPrecondition, "freed"))
	x := []int64{int64(weft.Rank() + 1)}
	if err := weft.Allreduce(x, x, weft.AllreduceOptions{Op: weft.Sum}); err != nil {
		add(fmt.Sprintf("Allreduce after re-Init: %v", err))
	} else if n := int64(weft.Size()); x[0] != n*(n+1)/2 {
		add(fmt.Sprintf("Allreduce after re-Init = %d, want %d", x[0], n*(n+1)/2))
	}
	if err := weft.Shutdown(); err != nil {
		add(fmt.Sprintf("second Shutdown: %v", err))
	}
	return problems
}

// ---- helpers ------------------------------------------------------------------------------

// must fails the test at once on an error, naming the rank.
func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("rank %d: %s: %v", rank, what, err)
	}
}

func expectStatus(t *testing.T, what string, err error, want weft.Status, fragments ...string) {
	t.Helper()
	if p := wantStatus(what, err, want, fragments...); p != "" {
		t.Errorf("rank %d: %s", rank, p)
	}
}

// value is element i of rank r's input: distinct per rank and index, and a multiple of 12
// so that every average the tests compute (over 1..4 values, and halves) is an integer,
// exact in every element type.
func value(r, i int) float64 { return float64(12*(r+1) + 1200*i) }

func fill[T weft.Element](r, n int) []T {
	s := make([]T, n)
	for i := range s {
		s[i] = T(value(r, i))
	}
	return s
}

// near compares with a tolerance for the float types and exactly for the integer ones (whose
// expected values are integers by construction: want is rounded only to undo the error of
// computing it with weights such as 1/3).
func near[T weft.Element](got T, want float64) bool {
	switch any(got).(type) {
	case float32:
		return math.Abs(float64(got)-want) <= 1e-5*math.Max(1, math.Abs(want))
	case float64:
		return math.Abs(float64(got)-want) <= 1e-12*math.Max(1, math.Abs(want))
	default:
		return float64(got) == math.Round(want)
	}
}

func expectValues[T weft.Element](t *testing.T, what string, got []T, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("rank %d: %s: got %d elements %v, want %d %v", rank, what, len(got), got,
			len(want), want)
		return
	}
	for i := range got {
		if !near(got[i], want[i]) {
			t.Errorf("rank %d: %s: element %d is %v, want %v (all: %v)", rank, what, i, got[i],
				want[i], got)
			return
		}
	}
}

func typeName[T weft.Element]() string { return fmt.Sprintf("%T", *new(T)) }

// forEachType runs a generic test once per element type, as subtests (in the same order on
// every rank).
func forEachType(t *testing.T, f32 func(*testing.T), f64 func(*testing.T),
	i32 func(*testing.T), i64 func(*testing.T)) {
	t.Run("float32", f32)
	t.Run("float64", f64)
	t.Run("int32", i32)
	t.Run("int64", i64)
}

// ---- process model, errors, config, timeline --------------------------------------------

func TestProcessModel(t *testing.T) {
	if !weft.IsInitialized() {
		t.Fatal("not initialized")
	}
	if rank < 0 || rank >= size {
		t.Fatalf("Rank() = %d, Size() = %d", rank, size)
	}
	ls, lr, ms, mr := weft.LocalSize(), weft.LocalRank(), weft.MachineSize(), weft.MachineRank()
	if lr < 0 || lr >= ls || mr < 0 || mr >= ms || ls*ms != size {
		t.Errorf("rank %d: local %d/%d, machine %d/%d for %d ranks", rank, lr, ls, mr, ms, size)
	}
	if !weft.IsHomogeneous() || weft.TimelineActive() {
		t.Errorf("IsHomogeneous() = %v, TimelineActive() = %v", weft.IsHomogeneous(),
			weft.TimelineActive())
	}
	if _, err := weft.UnifiedMpiWindowModel(); err != nil {
		t.Errorf("UnifiedMpiWindowModel: %v", err)
	}
	_ = weft.NcclBuilt()
	if !weft.WinAssociatedPOps() {
		t.Error("WinAssociatedPOps() = false by default")
	}
	weft.SetWinAssociatedPOps(false)
	if weft.WinAssociatedPOps() {
		t.Error("SetWinAssociatedPOps(false) did not turn it off")
	}
	weft.SetWinAssociatedPOps(true)
	if weft.Version() != "0.1.0" || weft.VersionNumber() != 100 {
		t.Errorf("Version() = %q, VersionNumber() = %d", weft.Version(), weft.VersionNumber())
	}
}

func TestErrorValues(t *testing.T) {
	err := weft.Broadcast([]float64{1}, []float64{0}, size+3, weft.BroadcastOptions{Name: "err.root"})
	var werr *weft.Error
	if !errors.As(err, &werr) {
		t.Fatalf("rank %d: Broadcast to root %d: %v is not a *weft.Error", rank, size+3, err)
	}
	if werr.Status != weft.InvalidArgument || werr.Message == "" {
		t.Errorf("rank %d: got %+v", rank, werr)
	}
	if !errors.Is(err, weft.ErrInvalidArgument) || errors.Is(err, weft.ErrFailedPrecondition) {
		t.Errorf("rank %d: errors.Is does not follow the status of %v", rank, err)
	}
	wrapped := fmt.Errorf("step 3: %w", err)
	if !errors.Is(wrapped, weft.ErrInvalidArgument) || weft.StatusOf(wrapped) != weft.InvalidArgument {
		t.Errorf("rank %d: a wrapped error loses its status", rank)
	}
	if weft.StatusOf(nil) != weft.OK || weft.StatusOf(errors.New("x")) != weft.Unknown {
		t.Error("StatusOf of nil or a foreign error")
	}
	if s := weft.InvalidArgument.String(); s != "invalid argument" {
		t.Errorf("InvalidArgument.String() = %q", s)
	}
	if !strings.HasPrefix(err.Error(), "weft: invalid argument: ") {
		t.Errorf("Error() = %q", err.Error())
	}
}

func TestConfig(t *testing.T) {
	const name = "WEFT_FUSION_THRESHOLD_BYTES"
	before, err := weft.ConfigGet(name)
	must(t, err, "ConfigGet")
	if before == "" {
		t.Errorf("ConfigGet(%s) is empty", name)
	}
	must(t, weft.ConfigSet(name, "12345"), "ConfigSet")
	got, err := weft.ConfigGet(name)
	must(t, err, "ConfigGet after ConfigSet")
	if got != "12345" {
		t.Errorf("ConfigGet after ConfigSet = %q, want 12345", got)
	}
	must(t, weft.ConfigUnset(name), "ConfigUnset")
	if got, _ := weft.ConfigGet(name); got != before {
		t.Errorf("ConfigGet after ConfigUnset = %q, want %q", got, before)
	}
	if err := weft.ConfigSet("WEFT_NO_SUCH_SETTING", "1"); err == nil ||
		!strings.Contains(err.Error(), "WEFT_NO_SUCH_SETTING") {
		t.Errorf("ConfigSet of an unknown setting: %v", err)
	}
	expectStatus(t, "ConfigSet of a bad value", weft.ConfigSet(name, "lots"),
		weft.InvalidArgument, name)
	if err := weft.ConfigUnset("WEFT_NO_SUCH_SETTING"); err == nil {
		t.Error("ConfigUnset of an unknown setting succeeded")
	}
	if d := weft.ConfigDescribe(); !strings.Contains(d, name) ||
		!strings.Contains(d, "WEFT_STALL_TIMEOUT_SECONDS") {
		t.Errorf("ConfigDescribe lacks the settings: %q", d)
	}
}

func TestTimeline(t *testing.T) {
	dir := t.TempDir()
	must(t, weft.TimelineStart(dir+"/trace.json"), "TimelineStart")
	expectStatus(t, "a second TimelineStart", weft.TimelineStart(dir+"/other.json"),
		weft.FailedPrecondition)
	must(t, weft.TimelineStartActivity("timeline.x", "forward"), "TimelineStartActivity")
	x := fill[float32](rank, 4)
	must(t, weft.Allreduce(x, x, weft.AllreduceOptions{Name: "timeline.x"}), "Allreduce")
	must(t, weft.TimelineEndActivity("timeline.x"), "TimelineEndActivity")
	expectStatus(t, "an empty activity", weft.TimelineStartActivity("timeline.x", ""),
		weft.InvalidArgument)
	must(t, weft.TimelineStop(), "TimelineStop")
	must(t, weft.TimelineStop(), "a second TimelineStop")
	entries, err := os.ReadDir(dir)
	must(t, err, "ReadDir")
	if len(entries) != 1 {
		t.Fatalf("rank %d: the trace directory holds %d files, want 1", rank, len(entries))
	}
	trace, err := os.ReadFile(dir + "/" + entries[0].Name())
	must(t, err, "ReadFile")
	if !strings.Contains(string(trace), "forward") || !strings.Contains(string(trace), "timeline.x") {
		t.Errorf("rank %d: the trace lacks the activity: %.300s", rank, trace)
	}
}
