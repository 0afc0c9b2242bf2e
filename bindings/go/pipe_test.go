package weft_test

import (
	"math"
	"reflect"
	"testing"

	"weft.dev/weft"
)

// Elastic pipelining's pure computations (pipe/README.md): freezing, partitions, AutoPipe/AutoDP
// plans and schedules. Plain data: every rank runs the same checks, with no communication.

func closeTo(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func allCloseTo(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !closeTo(a[i], b[i]) {
			return false
		}
	}
	return true
}

// ceilBound is ceil(L (1 - (1 - num/den)^t)) in exact integer arithmetic.
func ceilBound(layers, num, den, t int) int {
	keep, all := 1, 1
	for i := 0; i < t; i++ {
		keep *= den - num
		all *= den
	}
	return (layers*(all-keep) + all - 1) / all
}

func TestFreezeBound(t *testing.T) {
	// L = 12, alpha = 1/3: ceil(12 (1 - (2/3)^t)) = 0, 4, 7 (6.67), 9 (8.44), 10 (9.63), 11.
	want := []int{0, 4, 7, 9, 10, 11}
	for step, w := range want {
		if got := ceilBound(12, 1, 3, step); got != w {
			t.Fatalf("by hand, t = %d: %d, want %d", step, got, w)
		}
		got, err := weft.FreezeBound(12, 1.0/3.0, step)
		must(t, err, "FreezeBound")
		if got != w {
			t.Errorf("FreezeBound(12, 1/3, %d) = %d, want %d", step, got, w)
		}
	}
	// Exact at integers: 8 (1 - 1/2) is 4, not 5; 10 (1 - 0.7) is 3.
	for _, c := range []struct {
		layers int
		alpha  float64
		t      int
		want   int
	}{{8, 0.5, 1, 4}, {8, 0.5, 3, 7}, {10, 0.3, 1, 3}, {12, 1, 1, 12}} {
		got, err := weft.FreezeBound(c.layers, c.alpha, c.t)
		must(t, err, "FreezeBound")
		if got != c.want {
			t.Errorf("FreezeBound(%d, %v, %d) = %d, want %d", c.layers, c.alpha, c.t, got,
				c.want)
		}
	}
	_, err := weft.FreezeBound(12, 0, 1)
	expectStatus(t, "alpha 0", err, weft.InvalidArgument, "alpha")
	_, err = weft.FreezeBound(12, 1.5, 1)
	expectStatus(t, "alpha 1.5", err, weft.InvalidArgument, "alpha")
	_, err = weft.FreezeBound(0, 0.5, 1)
	expectStatus(t, "no layers", err, weft.InvalidArgument, "layer")
	_, err = weft.FreezeBound(12, 0.5, -1)
	expectStatus(t, "t = -1", err, weft.InvalidArgument, "-1")
	_, err = weft.FreezeBound(1<<40, 0.5, 1)
	expectStatus(t, "layers beyond a C int", err, weft.InvalidArgument, "does not fit a C int")
}

func TestNextFrozen(t *testing.T) {
	next := func(layers, step, previous int, norms []float64, o weft.FreezeOptions) int {
		t.Helper()
		f, err := weft.NextFrozen(layers, step, previous, norms, o)
		must(t, err, "NextFrozen")
		return f
	}
	schedule := weft.FreezeOptions{}
	if f := next(12, 2, 4, nil, schedule); f != 7 {
		t.Errorf("the schedule: %d, want the bound 7", f)
	}
	if f := next(12, 1, 9, nil, schedule); f != 9 {
		t.Errorf("layers never unfreeze: %d, want 9", f)
	}
	if f := next(12, 1, 0, nil, weft.FreezeOptions{Alpha: 1}); f != 11 {
		t.Errorf("the last layer keeps training: %d, want 11", f)
	}
	if f := next(12, 1, 0, nil, weft.FreezeOptions{Alpha: 1, FreezeLast: true}); f != 12 {
		t.Errorf("FreezeLast: %d, want 12", f)
	}
	// A run's frozen counts, point after point.
	frozen, seen := 0, []int{}
	for step := 1; step <= 6; step++ {
		frozen = next(12, step, frozen, nil, schedule)
		seen = append(seen, frozen)
	}
	if !reflect.DeepEqual(seen, []int{4, 7, 9, 10, 11, 11}) {
		t.Errorf("frozen counts %v", seen)
	}

	// Gradient-aware: min(bound, 1 + the trainable layer with the smallest norm).
	aware := weft.FreezeOptions{GradientAware: true}
	norms := make([]float64, 12)
	for i := range norms {
		norms[i] = 10 + float64(i)
	}
	norms[5] = 1
	norms[2] = 0.5 // already frozen (below previous = 4): not a candidate
	if f := next(12, 2, 4, norms, aware); f != 6 {
		t.Errorf("smallest norm at layer 5: %d, want 6", f)
	}
	norms[5], norms[9] = 10, 1 // 1 + 9 is above the bound 7
	if f := next(12, 2, 4, norms, aware); f != 7 {
		t.Errorf("smallest norm at layer 9: %d, want the bound 7", f)
	}
	norms[6], norms[9] = 0.25, 0.25 // a tie: the earliest
	norms[4] = 0.25
	if f := next(12, 2, 4, norms, aware); f != 5 {
		t.Errorf("a tie at layers 4, 6 and 9: %d, want 5", f)
	}
	if f := next(12, 2, 4, norms, schedule); f != 7 {
		t.Errorf("norms without the policy: %d, want 7", f)
	}

	_, err := weft.NextFrozen(12, 2, 4, nil, aware)
	expectStatus(t, "no norms", err, weft.InvalidArgument, "12")
	_, err = weft.NextFrozen(12, 2, 4, norms[:5], aware)
	expectStatus(t, "5 norms", err, weft.InvalidArgument, "5")
	bad := append([]float64(nil), norms...)
	bad[8] = -1
	_, err = weft.NextFrozen(12, 2, 4, bad, aware)
	expectStatus(t, "a negative norm", err, weft.InvalidArgument, "layer 8")
	_, err = weft.NextFrozen(12, 2, 13, nil, schedule)
	expectStatus(t, "previous 13", err, weft.InvalidArgument, "13")
	_, err = weft.NextFrozen(12, 2, 4, nil, weft.FreezeOptions{Alpha: -0.5})
	expectStatus(t, "alpha -0.5", err, weft.InvalidArgument, "alpha")
	_, err = weft.NextFrozen(12, 1<<33, 4, nil, schedule)
	expectStatus(t, "t beyond a C int", err, weft.InvalidArgument, "does not fit a C int")
}

func TestParameterCosts(t *testing.T) {
	costs, err := weft.ParameterCosts([]float64{6, 12, 18, 24, 30, 36}, 2, 1.0/6.0)
	must(t, err, "ParameterCosts")
	if !allCloseTo(costs, []float64{1, 2, 18, 24, 30, 36}) {
		t.Errorf("costs %v", costs)
	}
	_, err = weft.ParameterCosts([]float64{1, -1, 1}, 0, 1.0/6.0)
	expectStatus(t, "a negative size", err, weft.InvalidArgument, "layer 1")
	_, err = weft.ParameterCosts([]float64{1, 1}, 3, 1.0/6.0)
	expectStatus(t, "frozen 3 of 2", err, weft.InvalidArgument, "3")
	_, err = weft.ParameterCosts([]float64{1, 1}, 0, 2)
	expectStatus(t, "lambda 2", err, weft.InvalidArgument, "lambda")
}

func TestPartitionLayers(t *testing.T) {
	c := []float64{1, 2, 3, 4, 5}
	part := func(stages int, s weft.Strategy) weft.Partition {
		t.Helper()
		p, err := weft.PartitionLayers(c, stages, s)
		must(t, err, "PartitionLayers "+s.String())
		return p
	}
	// Two stages: cutting after 1, 2, 3 or 4 layers gives largest stages 14, 12, 9, 10.
	if p := part(2, weft.StrategyOptimal); !reflect.DeepEqual(p.Boundaries, []int{0, 3, 5}) ||
		p.MaxCost != 9 || !allCloseTo(p.StageCosts, []float64{6, 9}) || p.Stages() != 2 {
		t.Errorf("2 stages: %+v", p)
	}
	// Three stages: 1 + 2 + 3 = 6, then 4 and 5 alone.
	p := part(3, weft.StrategyOptimal)
	if !reflect.DeepEqual(p.Boundaries, []int{0, 3, 4, 5}) || p.MaxCost != 6 {
		t.Errorf("3 stages: %+v", p)
	}
	if first, end := p.Layers(1); first != 3 || end != 4 {
		t.Errorf("stage 1 holds [%d, %d), want [3, 4)", first, end)
	}
	// Even: the first L mod K stages get one layer more.
	if p := part(3, weft.StrategyEven); !reflect.DeepEqual(p.Boundaries, []int{0, 2, 4, 5}) ||
		p.MaxCost != 7 {
		t.Errorf("even: %+v", p)
	}
	// Greedy: contiguous, never better than the optimum; it may leave stages empty.
	g := part(3, weft.StrategyGreedy)
	if len(g.Boundaries) != 4 || g.Boundaries[0] != 0 || g.Boundaries[3] != 5 || g.MaxCost < 6 {
		t.Errorf("greedy: %+v", g)
	}
	if g := part(6, weft.StrategyGreedy); len(g.Boundaries) != 7 || g.Boundaries[6] != 5 {
		t.Errorf("greedy, 6 stages for 5 layers: %+v", g)
	}
	// More stages than the first buffer holds (the count query path).
	many := make([]float64, 40)
	for i := range many {
		many[i] = 1
	}
	if p, err := weft.PartitionLayers(many, 20, weft.StrategyOptimal); err != nil ||
		len(p.Boundaries) != 21 || p.MaxCost != 2 {
		t.Errorf("40 layers on 20 stages: %+v, %v", p, err)
	}

	for _, e := range []struct {
		what     string
		costs    []float64
		stages   int
		strategy weft.Strategy
		fragment string
	}{
		{"K = 0", c, 0, weft.StrategyOptimal, "stages"},
		{"K < 0", c, -3, weft.StrategyOptimal, "stages"},
		{"more stages than layers", c, 6, weft.StrategyOptimal, "6 stages for 5 layers"},
		{"even, more stages than layers", c, 6, weft.StrategyEven, "6 stages for 5 layers"},
		{"a negative cost", []float64{1, -1, 1}, 2, weft.StrategyOptimal, "layer 1"},
		{"no layers", nil, 2, weft.StrategyOptimal, "no layers"},
		{"an unknown strategy", c, 2, weft.Strategy(7), "strategy"},
	} {
		_, err := weft.PartitionLayers(e.costs, e.stages, e.strategy)
		expectStatus(t, e.what, err, weft.InvalidArgument, e.fragment)
	}
}

// 12 equal layers on 1 machine of 8 devices, k0 = 8.
var pipeSizes = []float64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}

func roles(replicas, k int) []weft.Role {
	out := []weft.Role{}
	for r := 0; r < replicas; r++ {
		for s := 0; s < k; s++ {
			out = append(out, weft.Role{Replica: r, Stage: s})
		}
	}
	return out
}

func planInfo(frozen, k, replicas, microBatches, world int, m0, maxCost float64) weft.PlanInfo {
	return weft.PlanInfo{Frozen: frozen, K: k, Replicas: replicas, MicroBatches: microBatches,
		World: world, M0: m0, MaxCost: maxCost}
}

func checkPlan(t *testing.T, p *weft.Plan, want weft.PlanInfo, boundaries []int,
	stageCosts []float64, newlyActive []int, wantRoles []weft.Role) {
	t.Helper()
	info, err := p.Info()
	must(t, err, "Info")
	if info.Frozen != want.Frozen || info.K != want.K || info.Replicas != want.Replicas ||
		info.MicroBatches != want.MicroBatches || info.World != want.World ||
		!closeTo(info.M0, want.M0) || !closeTo(info.MaxCost, want.MaxCost) {
		t.Errorf("F = %d: info %+v, want %+v", want.Frozen, info, want)
	}
	b, err := p.Boundaries()
	must(t, err, "Boundaries")
	if !reflect.DeepEqual(b, boundaries) {
		t.Errorf("F = %d: boundaries %v, want %v", want.Frozen, b, boundaries)
	}
	c, err := p.StageCosts()
	must(t, err, "StageCosts")
	if !allCloseTo(c, stageCosts) {
		t.Errorf("F = %d: stage costs %v, want %v", want.Frozen, c, stageCosts)
	}
	n, err := p.NewlyActive()
	must(t, err, "NewlyActive")
	if len(n) != len(newlyActive) || (len(n) > 0 && !reflect.DeepEqual(n, newlyActive)) {
		t.Errorf("F = %d: newly active %v, want %v", want.Frozen, n, newlyActive)
	}
	for r, w := range wantRoles {
		got, err := p.Role(r)
		must(t, err, "Role")
		if got != w {
			t.Errorf("F = %d: rank %d has role %+v, want %+v", want.Frozen, r, got, w)
		}
	}
}

func TestPlansAsLayersFreeze(t *testing.T) {
	plan := func(frozen int, previous *weft.Plan) *weft.Plan {
		t.Helper()
		p, err := weft.MakePlan(pipeSizes, frozen, weft.PlanOptions{}, previous)
		must(t, err, "MakePlan")
		t.Cleanup(p.Close)
		return p
	}
	// F = 0: K = 8, one replica; M0 = ceil(12 / 8) = 2; the smallest boundaries first.
	p0 := plan(0, nil)
	checkPlan(t, p0, planInfo(0, 8, 1, 32, 8, 2, 2), []int{0, 1, 2, 3, 4, 6, 8, 10, 12},
		[]float64{1, 1, 1, 1, 2, 2, 2, 2}, nil, roles(1, 8))
	// F = 4: 4/6 + 8 does not fit 4 stages of 2: K stays 8.
	p4 := plan(4, p0)
	checkPlan(t, p4, planInfo(4, 8, 1, 32, 8, 2, 4.0/6+1),
		[]int{0, 5, 6, 7, 8, 9, 10, 11, 12}, []float64{4.0/6 + 1, 1, 1, 1, 1, 1, 1, 1}, nil,
		roles(1, 8))
	// F = 7: K halves to 4, the replicas double, ranks 4-7 become active.
	p7 := plan(7, p4)
	checkPlan(t, p7, planInfo(7, 4, 2, 16, 8, 2, 2), []int{0, 1, 8, 10, 12},
		[]float64{1.0 / 6, 2, 2, 2}, []int{4, 5, 6, 7}, roles(2, 4))
	// F = 9: 9/6 + 3 does not fit 2 stages: no change, nobody new.
	p9 := plan(9, p7)
	checkPlan(t, p9, planInfo(9, 4, 2, 16, 8, 2, 8.0/6), []int{0, 8, 10, 11, 12},
		[]float64{8.0 / 6, 1.0/6 + 1, 1, 1}, nil, roles(2, 4))
	// F = 10: K = 2, 4 replicas; replicas 2 and 3 (ranks 4-7) are new.
	p10 := plan(10, p9)
	checkPlan(t, p10, planInfo(10, 2, 4, 8, 8, 2, 2), []int{0, 10, 12},
		[]float64{10.0 / 6, 2}, []int{4, 5, 6, 7}, roles(4, 2))
	bubble, cycles, err := p10.ScheduleBubble(weft.ScheduleGPipe)
	must(t, err, "Plan.ScheduleBubble")
	if !closeTo(bubble, 1.0/9) || cycles != 18 {
		t.Errorf("K = 2, M = 8: bubble %v over %d cycles, want 1/9 over 18", bubble, cycles)
	}

	// Errors with a previous plan, and of a closed plan.
	_, err = weft.MakePlan(pipeSizes, 8, weft.PlanOptions{}, p9)
	expectStatus(t, "frozen going down", err, weft.InvalidArgument, "never")
	_, err = weft.MakePlan(pipeSizes, 10, weft.PlanOptions{Machines: 2}, p9)
	expectStatus(t, "another world", err, weft.InvalidArgument, "16")
	_, err = p10.Role(8)
	expectStatus(t, "rank 8", err, weft.InvalidArgument, "8")
	_, err = p10.Role(-1)
	expectStatus(t, "rank -1", err, weft.InvalidArgument, "-1")
	closed := plan(0, nil)
	closed.Close()
	closed.Close() // twice is fine
	_, err = closed.Info()
	expectStatus(t, "Info of a closed plan", err, weft.FailedPrecondition, "closed")
	_, err = weft.MakePlan(pipeSizes, 4, weft.PlanOptions{}, closed)
	expectStatus(t, "a closed previous plan", err, weft.FailedPrecondition, "closed")
}

func TestPlanOptions(t *testing.T) {
	p, err := weft.MakePlan(pipeSizes, 0,
		weft.PlanOptions{DevicesPerMachine: 6, K0: 4, MicroBatches: 6}, nil)
	must(t, err, "MakePlan")
	defer p.Close()
	idle := weft.Role{Replica: -1, Stage: -1}
	checkPlan(t, p, planInfo(0, 4, 1, 6, 6, 3, 3), []int{0, 3, 6, 9, 12},
		[]float64{3, 3, 3, 3}, nil, append(roles(1, 4), idle, idle))
	if r, _ := p.Role(5); r.Active() {
		t.Errorf("rank 5 should be idle: %+v", r)
	}
	// Lambda 0: frozen layers cost nothing, and the 6 trainable layers of F = 6 fit 4
	// stages of M0 = 2 but not 2: K = 4.
	zero := 0.0
	p0, err := weft.MakePlan(pipeSizes, 0, weft.PlanOptions{Lambda: &zero}, nil)
	must(t, err, "MakePlan")
	defer p0.Close()
	p6, err := weft.MakePlan(pipeSizes, 6, weft.PlanOptions{Lambda: &zero}, p0)
	must(t, err, "MakePlan")
	defer p6.Close()
	if info, _ := p6.Info(); info.K != 4 || info.Replicas != 2 || info.MaxCost != 2 {
		t.Errorf("lambda 0, F = 6: %+v", info)
	}

	bad := append([]float64(nil), pipeSizes...)
	bad[3] = -1
	for _, e := range []struct {
		what     string
		sizes    []float64
		frozen   int
		opts     weft.PlanOptions
		fragment string
	}{
		{"a negative size", bad, 0, weft.PlanOptions{}, "sizes[3]"},
		{"more stages than layers", pipeSizes[:4], 0, weft.PlanOptions{}, "stages"},
		{"frozen 13", pipeSizes, 13, weft.PlanOptions{}, "13"},
		{"no layers", nil, 0, weft.PlanOptions{}, "layer"},
		{"k0 = -1", pipeSizes, 0, weft.PlanOptions{K0: -1}, "k0"},
		{"k0 = 9", pipeSizes, 0, weft.PlanOptions{K0: 9}, "k0"},
		{"micro-batches -1", pipeSizes, 0, weft.PlanOptions{MicroBatches: -1}, "micro_batches"},
		{"machines -1", pipeSizes, 0, weft.PlanOptions{Machines: -1}, "machine"},
		{"an unknown strategy", pipeSizes, 0, weft.PlanOptions{Strategy: 9}, "strategy"},
		{"k0 beyond a C int", pipeSizes, 0, weft.PlanOptions{K0: 1 << 40}, "does not fit"},
	} {
		p, err := weft.MakePlan(e.sizes, e.frozen, e.opts, nil)
		if p != nil {
			t.Errorf("%s: got a plan with the error %v", e.what, err)
		}
		expectStatus(t, e.what, err, weft.InvalidArgument, e.fragment)
	}
}

func TestScheduleBubble(t *testing.T) {
	// (K - 1) / (M + K - 1) idle, 2 (M + K - 1) clock cycles, for both kinds.
	for _, kind := range []weft.ScheduleKind{weft.ScheduleGPipe, weft.Schedule1F1B} {
		bubble, cycles, err := weft.ScheduleBubble(kind, 4, 8)
		must(t, err, "ScheduleBubble "+kind.String())
		if !closeTo(bubble, 3.0/11) || cycles != 22 {
			t.Errorf("%v, K = 4, M = 8: %v over %d cycles, want 3/11 over 22", kind, bubble,
				cycles)
		}
	}
	if b, c, err := weft.ScheduleBubble(weft.ScheduleGPipe, 1, 5); err != nil || b != 0 ||
		c != 10 {
		t.Errorf("K = 1: %v, %d, %v", b, c, err)
	}
	_, _, err := weft.ScheduleBubble(weft.ScheduleGPipe, 0, 8)
	expectStatus(t, "K = 0", err, weft.InvalidArgument, "K = 0")
	_, _, err = weft.ScheduleBubble(weft.Schedule1F1B, 4, 0)
	expectStatus(t, "M = 0", err, weft.InvalidArgument, "M = 0")
	_, _, err = weft.ScheduleBubble(weft.ScheduleKind(5), 4, 8)
	expectStatus(t, "kind 5", err, weft.InvalidArgument, "kind")
	if weft.StrategyGreedy.String() != "greedy" || weft.Schedule1F1B.String() != "1f1b" {
		t.Errorf("names: %v %v", weft.StrategyGreedy, weft.Schedule1F1B)
	}
}
