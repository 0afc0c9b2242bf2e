package weft

import (
	"fmt"
	"runtime"

	"weft.dev/weft/internal/cconv"
	"weft.dev/weft/internal/cweft"
)

// ---- elastic pipelining: freezing, partitions, AutoPipe/AutoDP plans ----------------------
//
// The pure computations behind PipeTransformer-style training (pipe/README.md), the
// weft_pipe_* calls of weft.h: no Init needed, nothing communicated (every rank computes the
// same answers). Layers are indexed from 0, and a frozen count F means layers 0 .. F-1 are
// frozen.

// Strategy is how layers are partitioned into pipeline stages (weft_pipe_strategy).
type Strategy int

// The partitioning strategies.
const (
	// StrategyOptimal minimizes the largest stage, never leaves a stage empty, and takes
	// the lexicographically smallest boundaries among the optimal partitions.
	StrategyOptimal Strategy = 0
	// StrategyGreedy is PipeTransformer's greedy walk, for comparison with the paper: it
	// can leave stages empty or overloaded.
	StrategyGreedy Strategy = 1
	// StrategyEven gives every stage the same number of layers (the first L mod K one
	// more), ignoring costs.
	StrategyEven Strategy = 2
)

// String is "optimal", "greedy" or "even".
func (s Strategy) String() string {
	switch s {
	case StrategyOptimal:
		return "optimal"
	case StrategyGreedy:
		return "greedy"
	case StrategyEven:
		return "even"
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// ScheduleKind is a micro-batch schedule (weft_pipe_schedule_kind).
type ScheduleKind int

// The schedules.
const (
	ScheduleGPipe ScheduleKind = 0 // fill-drain: all forwards, then all backwards
	Schedule1F1B  ScheduleKind = 1 // one forward, one backward after the warm-up
)

// String is "gpipe" or "1f1b".
func (k ScheduleKind) String() string {
	switch k {
	case ScheduleGPipe:
		return "gpipe"
	case Schedule1F1B:
		return "1f1b"
	}
	return fmt.Sprintf("ScheduleKind(%d)", int(k))
}

// checkInts rejects a Go int that a C int cannot hold (it would wrap to another value);
// names and values alternate.
func checkInts(fn string, namesAndValues ...any) error {
	if problem := cconv.CheckInts(fn, namesAndValues...); problem != "" {
		return invalid("%s", problem)
	}
	return nil
}

// ---- AutoFreeze ----------------------------------------------------------------------------

// FreezeBound is the AutoFreeze schedule bound after freeze point t: ceil(L (1 - (1 -
// alpha)^t)), exact at integers (L = 8, alpha = 1/2, t = 1 is 4). alpha in (0, 1], layers
// >= 1, t >= 0.
func FreezeBound(layers int, alpha float64, t int) (int, error) {
	if err := checkInts("weft.FreezeBound", "layers", layers, "t", t); err != nil {
		return 0, err
	}
	var frozen int32
	err := call(func() cstatus { return cweft.Weft_pipe_freeze_bound(&frozen, layers, alpha, t) })
	return int(frozen), err
}

// FreezeOptions are the freeze policy's knobs; the zero value is the paper's schedule.
type FreezeOptions struct {
	// Alpha is the fraction of the trainable layers frozen at each point, in (0, 1]; 0
	// means 1/3, the paper's.
	Alpha float64
	// GradientAware: the frozen count is at most 1 + the trainable layer whose accumulated
	// gradient norm is the smallest (NextFrozen's gradNorms), not only the schedule bound.
	GradientAware bool
	// FreezeLast allows the last layer to freeze (by default at most layers - 1 are).
	FreezeLast bool
}

// NextFrozen is the frozen count after freeze point t, given the count before it
// (previous). gradNorms (one per layer, summed over the interval) are needed only with
// opts.GradientAware (nil otherwise). Never below previous: layers never unfreeze.
func NextFrozen(layers, t, previous int, gradNorms []float64, opts FreezeOptions) (int, error) {
	if err := checkInts("weft.NextFrozen", "layers", layers, "t", t, "previous",
		previous); err != nil {
		return 0, err
	}
	var o cweft.PipeFreezeOptions // the library's defaults, then the caller's choices
	if err := call(func() cstatus {
		return cweft.Weft_pipe_freeze_options_init(&o, uint(cweft.WEFT_PIPE_FREEZE_OPTIONS_VERSION))
	}); err != nil {
		return 0, err
	}
	if opts.Alpha != 0 {
		o.Alpha = opts.Alpha
	}
	o.GradientAware = int32(cconv.Bool(opts.GradientAware))
	o.FreezeLast = int32(cconv.Bool(opts.FreezeLast))
	var frozen int32
	err := call(func() cstatus {
		return cweft.Weft_pipe_next_frozen(&frozen, layers, t, previous, gradNorms, &o)
	})
	return int(frozen), err
}

// ---- load balancing ------------------------------------------------------------------------

// ParameterCosts are per-layer costs from parameter counts: a trainable layer costs its
// count, each of the first frozen layers lambda times it (frozen layers run forward only;
// the paper's lambda is 1/6).
func ParameterCosts(sizes []float64, frozen int, lambda float64) ([]float64, error) {
	if err := checkInts("weft.ParameterCosts", "frozen", frozen); err != nil {
		return nil, err
	}
	costs := make([]float64, len(sizes))
	var count uint64
	err := call(func() cstatus {
		return cweft.Weft_pipe_parameter_costs(costs, &count, sizes, frozen, lambda)
	})
	if err != nil {
		return nil, err
	}
	return costs[:count:count], nil
}

// Partition is a contiguous partition of layers into stages: stage s holds layers
// Boundaries[s] .. Boundaries[s+1]-1 (len(Boundaries) == stages + 1), StageCosts[s] is its
// cost and MaxCost the largest.
type Partition struct {
	Boundaries []int
	StageCosts []float64
	MaxCost    float64
}

// Stages is the number of stages.
func (p Partition) Stages() int { return len(p.StageCosts) }

// Layers is the half-open range [first, end) of layers of stage s.
func (p Partition) Layers(s int) (first, end int) { return p.Boundaries[s], p.Boundaries[s+1] }

// PartitionLayers partitions the layers, one cost each, into stages contiguous stages.
// StrategyOptimal and StrategyEven need at least as many layers as stages;
// StrategyGreedy may leave stages empty.
func PartitionLayers(costs []float64, stages int, strategy Strategy) (Partition, error) {
	if err := checkInts("weft.PartitionLayers", "stages", stages); err != nil {
		return Partition{}, err
	}
	var maxCost float64
	boundaries, err := fetch(func(buf []int32, count *uint64) cstatus {
		return cweft.Weft_pipe_partition(buf, count, &maxCost, costs, stages,
			cweft.Enum_SS_weft_pipe_strategy(strategy))
	})
	if err != nil {
		return Partition{}, err
	}
	p := Partition{Boundaries: make([]int, len(boundaries)), MaxCost: maxCost}
	for i, b := range boundaries {
		p.Boundaries[i] = int(b)
	}
	if len(p.Boundaries) > 0 {
		p.StageCosts = make([]float64, len(p.Boundaries)-1)
		for s := range p.StageCosts {
			for _, c := range costs[p.Boundaries[s]:p.Boundaries[s+1]] {
				p.StageCosts[s] += c
			}
		}
	}
	return p, nil
}

// ---- AutoPipe/AutoDP plans -----------------------------------------------------------------

// PlanOptions describe the cluster and the pipeline; zero fields mean the defaults.
type PlanOptions struct {
	Machines          int      // 0: 1
	DevicesPerMachine int      // 0: 8
	K0                int      // the initial pipeline length; 0: 8
	Lambda            *float64 // the cost of a frozen layer per parameter; nil: 1/6
	Strategy          Strategy // the zero value is StrategyOptimal
	MicroBatches      int      // micro-batches per mini-batch; 0: 4 K
}

// PlanInfo is a plan's summary.
type PlanInfo struct {
	Frozen       int     // leading layers frozen
	K            int     // the pipeline length
	Replicas     int     // pipeline replicas (the data-parallel width)
	MicroBatches int     // per mini-batch
	World        int     // ranks: machines * devices per machine
	M0           float64 // the largest stage of the initial partition: what a device holds
	MaxCost      float64 // the largest stage of this plan's partition
}

// Role is what a rank does in a plan: stage Stage of pipeline replica Replica, or idle
// (both -1).
type Role struct {
	Replica int
	Stage   int
}

// Active is false for an idle rank.
func (r Role) Active() bool { return r.Replica >= 0 }

type planHandle = cweft.SwigcptrStruct_SS_weft_pipe_plan

// Plan is an AutoPipe/AutoDP plan: pipeline length K, the partition of every layer (frozen
// ones at Lambda) into K stages, the replicas and each rank's role. It is plain data held in
// C memory: Close frees it (a finalizer does so if Close is forgotten). Its methods may be
// called from several goroutines.
type Plan struct {
	h planHandle // 0 once closed
}

// MakePlan is the plan for the first frozen layers of a model whose layers have sizes
// parameters. previous nil: the initial plan (K = K0; M0, the largest stage of the
// partition of all layers on K0 stages, stands for what one device holds). Otherwise K
// starts from previous's and halves while the balanced partition on K/2 stages still fits
// under M0, and the ranks of the replicas this adds are NewlyActive. Use the same sizes and
// options for every plan of a run.
func MakePlan(sizes []float64, frozen int, opts PlanOptions, previous *Plan) (*Plan, error) {
	const fn = "weft.MakePlan"
	defer runtime.KeepAlive(previous)
	if err := checkInts(fn, "frozen", frozen, "Machines", opts.Machines, "DevicesPerMachine",
		opts.DevicesPerMachine, "K0", opts.K0, "MicroBatches", opts.MicroBatches,
		"Strategy", int(opts.Strategy)); err != nil {
		return nil, err
	}
	var o cweft.PipePlanOptions // the library's defaults, then the caller's choices
	if err := call(func() cstatus {
		return cweft.Weft_pipe_plan_options_init(&o, uint(cweft.WEFT_PIPE_PLAN_OPTIONS_VERSION))
	}); err != nil {
		return nil, err
	}
	o.Strategy = int32(opts.Strategy)
	if opts.Machines != 0 {
		o.Machines = int32(opts.Machines)
	}
	if opts.DevicesPerMachine != 0 {
		o.DevicesPerMachine = int32(opts.DevicesPerMachine)
	}
	if opts.K0 != 0 {
		o.K0 = int32(opts.K0)
	}
	if opts.Lambda != nil {
		o.Lambda = *opts.Lambda
	}
	o.MicroBatches = int32(opts.MicroBatches)
	var prev cweft.Struct_SS_weft_pipe_plan = planHandle(0)
	if previous != nil {
		h, err := previous.handle("MakePlan (previous)")
		if err != nil {
			return nil, err
		}
		prev = h
	}
	var h planHandle
	if err := call(func() cstatus {
		return cweft.Weft_pipe_plan_create(&h, sizes, frozen, &o, prev)
	}); err != nil {
		return nil, err
	}
	p := &Plan{h: h}
	runtime.SetFinalizer(p, (*Plan).Close)
	return p, nil
}

// handle returns the C handle, or an error once closed. Callers keep p alive (KeepAlive)
// until their C call has returned, so that the finalizer cannot free it mid-call.
func (p *Plan) handle(method string) (planHandle, error) {
	if p == nil || p.h == 0 {
		return 0, &Error{Status: FailedPrecondition,
			Message: "weft.Plan." + method + ": the plan was closed"}
	}
	return p.h, nil
}

// Info is the plan's summary.
func (p *Plan) Info() (PlanInfo, error) {
	defer runtime.KeepAlive(p)
	h, err := p.handle("Info")
	if err != nil {
		return PlanInfo{}, err
	}
	info := cweft.PipePlanInfo{Version: uint32(cweft.WEFT_PIPE_PLAN_INFO_VERSION)}
	if err := call(func() cstatus { return cweft.Weft_pipe_plan_get_info(&info, h) }); err != nil {
		return PlanInfo{}, err
	}
	return PlanInfo{Frozen: int(info.Frozen), K: int(info.K), Replicas: int(info.Replicas),
		MicroBatches: int(info.MicroBatches), World: int(info.World), M0: info.M0,
		MaxCost: info.MaxCost}, nil
}

// Boundaries are K + 1 layer indices: stage s holds layers Boundaries[s] ..
// Boundaries[s+1]-1.
func (p *Plan) Boundaries() ([]int, error) {
	defer runtime.KeepAlive(p)
	h, err := p.handle("Boundaries")
	if err != nil {
		return nil, err
	}
	return fetchRanks(func(buf []int32, count *uint64) cstatus {
		return cweft.Weft_pipe_plan_boundaries(buf, count, h)
	})
}

// StageCosts are the K stages' costs.
func (p *Plan) StageCosts() ([]float64, error) {
	defer runtime.KeepAlive(p)
	h, err := p.handle("StageCosts")
	if err != nil {
		return nil, err
	}
	return fetch(func(buf []float64, count *uint64) cstatus {
		return cweft.Weft_pipe_plan_stage_costs(buf, count, h)
	})
}

// NewlyActive are the ranks (sorted) active in a replica that the previous plan did not
// have, or idle before: they receive their layers from an existing replica. Empty for an
// initial plan.
func (p *Plan) NewlyActive() ([]int, error) {
	defer runtime.KeepAlive(p)
	h, err := p.handle("NewlyActive")
	if err != nil {
		return nil, err
	}
	return fetchRanks(func(buf []int32, count *uint64) cstatus {
		return cweft.Weft_pipe_plan_newly_active(buf, count, h)
	})
}

// Role is the role of rank (in [0, World)).
func (p *Plan) Role(rank int) (Role, error) {
	defer runtime.KeepAlive(p)
	h, err := p.handle("Role")
	if err != nil {
		return Role{-1, -1}, err
	}
	if err := checkInts("weft.Plan.Role", "rank", rank); err != nil {
		return Role{-1, -1}, err
	}
	var replica, stage int32
	if err := call(func() cstatus {
		return cweft.Weft_pipe_plan_role(&replica, &stage, h, rank)
	}); err != nil {
		return Role{-1, -1}, err
	}
	return Role{Replica: int(replica), Stage: int(stage)}, nil
}

// ScheduleBubble is ScheduleBubble(kind, K, MicroBatches) of this plan.
func (p *Plan) ScheduleBubble(kind ScheduleKind) (bubble float64, cycles int, err error) {
	info, err := p.Info()
	if err != nil {
		return 0, 0, err
	}
	return ScheduleBubble(kind, info.K, info.MicroBatches)
}

// Close frees the plan; later calls on it fail. Closing twice is fine.
func (p *Plan) Close() {
	if p == nil || p.h == 0 {
		return
	}
	cweft.Weft_pipe_plan_destroy(p.h)
	p.h = 0
	runtime.SetFinalizer(p, nil)
}

// ---- micro-batch schedules -----------------------------------------------------------------

// ScheduleBubble is the idle fraction of the stage-slots of a schedule of stages stages and
// microBatches micro-batches with unit time per forward and backward, (K - 1) / (M + K -
// 1) for both kinds, and its length in clock cycles, 2 (M + K - 1).
func ScheduleBubble(kind ScheduleKind, stages, microBatches int) (bubble float64, cycles int, err error) {
	if err := checkInts("weft.ScheduleBubble", "stages", stages, "microBatches",
		microBatches, "kind", int(kind)); err != nil {
		return 0, 0, err
	}
	var c int32
	err = call(func() cstatus {
		return cweft.Weft_pipe_schedule_bubble(&bubble, &c,
			cweft.Enum_SS_weft_pipe_schedule_kind(kind), stages, microBatches)
	})
	if err != nil {
		return 0, 0, err
	}
	return bubble, int(c), nil
}
