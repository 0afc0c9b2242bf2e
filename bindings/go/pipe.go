package weft

import (
	"fmt"
	"runtime"
	"unsafe"

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
	for i := 0; i+1 < len(namesAndValues); i += 2 {
		v := namesAndValues[i+1].(int)
		if !fitsCInt(v) {
			return invalid("%s: %s = %d does not fit a C int", fn, namesAndValues[i], v)
		}
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
	o := cweft.PipeFreezeOptions{
		Version:       uint32(cweft.WEFT_PIPE_FREEZE_OPTIONS_VERSION),
		Alpha:         opts.Alpha,
		GradientAware: int32(boolInt(opts.GradientAware)),
		FreezeLast:    int32(boolInt(opts.FreezeLast)),
	}
	if o.Alpha == 0 {
		o.Alpha = 1.0 / 3.0
	}
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
	o := cweft.PipePlanOptions{
		Version:           uint32(cweft.WEFT_PIPE_PLAN_OPTIONS_VERSION),
		Machines:          1,
		DevicesPerMachine: 8,
		K0:                8,
		Lambda:            1.0 / 6.0,
		Strategy:          int32(opts.Strategy),
	}
	if err := checkInts(fn, "frozen", frozen, "Machines", opts.Machines, "DevicesPerMachine",
		opts.DevicesPerMachine, "K0", opts.K0, "MicroBatches", opts.MicroBatches,
		"Strategy", int(opts.Strategy)); err != nil {
		return nil, err
	}
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
	var info cweft.PipePlanInfo
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

// ---- the elastic pipeline trainer ----------------------------------------------------------
//
// Trainer trains a TorchScript model with elastic pipelining (weft_pipe_trainer_* of
// weft.h): AutoFreeze, AutoPipe, AutoDP and AutoCache. Unlike the computations above, it
// communicates: every rank creates the trainer and calls each method, in the same order,
// after Init.

// Optimizer is the per-layer optimizer a Trainer makes.
type Optimizer int

// The optimizers; the zero value is Adam.
const (
	OptimizerAdam  Optimizer = iota // LR, WeightDecay (L2 added to the gradient)
	OptimizerSGD                    // LR, Momentum, WeightDecay
	OptimizerAdamW                  // LR, WeightDecay (decoupled)
)

// Loss is the training loss of a Trainer.
type Loss int

// The losses; the zero value is cross-entropy.
const (
	// LossCrossEntropy: outputs [N, C] logits, targets [N] class indices (int64 or int32).
	LossCrossEntropy Loss = 0
	// LossMSE: float targets shaped like the outputs.
	LossMSE Loss = 1
)

// TrainerOptions configure a Trainer; the zero value is the C defaults.
type TrainerOptions struct {
	K0                int     // the initial pipeline length; 0: min(world size, layers)
	DisableFreeze     bool    // no AutoFreeze (by default a freeze point ends each interval)
	Alpha             float64 // the freeze schedule's alpha in (0, 1]; 0: 1/3
	GradientAware     bool    // the gradient-aware freeze policy
	FreezeEveryEpochs int     // a freeze point every this many epochs; 0: 1
	DisableAutoPipe   bool    // K stays K0
	DisableAutoDP     bool    // freed ranks stay idle
	Cache             bool    // AutoCache of the frozen prefix's output
	CacheDir          string  // the cache's spill directory; "": none
	Schedule          ScheduleKind
	MicroBatches      int    // per replica mini-batch; 0: 2 K
	BatchSize         int    // samples per optimizer step over all replicas; 0: 64
	Seed              uint64 // the epochs' sample orders; 0: 1
	Optimizer         Optimizer
	LR                float64 // 0: 1e-3
	Momentum          float64 // OptimizerSGD only
	WeightDecay       float64
	Loss              Loss
	Name              string // the op name prefix; "": "pipe" (two live trainers need two)
	// Replicas average parameters with one peer replica per step instead of allreducing
	// gradients (pipe/README.md).
	Decentralized bool
}

// Tensor is a dense, row-major CPU tensor over a Go slice ([]float32, []float64, []int32 or
// []int64), lent to weft for one call. Dim 0 is the sample. TensorOf makes one.
type Tensor struct {
	Data  any
	Shape []int64
}

// TensorOf is the tensor of shape shape (nil: 1-D of len(data)) over data.
func TensorOf[T Element](data []T, shape ...int64) Tensor {
	return Tensor{Data: data, Shape: shape}
}

// args flattens the tensor for a weftgo_* call (checking the shape against the slice).
func (t Tensor) args(fn, what string) (data unsafe.Pointer, code, bits int, shape []int64, err error) {
	var n int
	switch d := t.Data.(type) {
	case []float32:
		data, code, bits, n = dataOf(d), dlFloat, 32, len(d)
	case []float64:
		data, code, bits, n = dataOf(d), dlFloat, 64, len(d)
	case []int32:
		data, code, bits, n = dataOf(d), dlInt, 32, len(d)
	case []int64:
		data, code, bits, n = dataOf(d), dlInt, 64, len(d)
	default:
		return nil, 0, 0, nil, invalid("%s: %s.Data is a %T; expected []float32, []float64, "+
			"[]int32 or []int64", fn, what, t.Data)
	}
	shape = t.Shape
	if len(shape) == 0 {
		shape = []int64{int64(n)}
	}
	numel := int64(1)
	for _, s := range shape {
		if s < 0 {
			return nil, 0, 0, nil, invalid("%s: %s.Shape %v has a negative dimension", fn, what,
				shape)
		}
		numel *= s
	}
	if numel != int64(n) {
		return nil, 0, 0, nil, invalid("%s: %s.Shape %v holds %d elements but the slice has %d",
			fn, what, shape, numel, n)
	}
	return data, code, bits, shape, nil
}

// EpochMetrics are one epoch's: the configuration it trained with (Frozen, K, Replicas,
// MicroBatches), its throughput, and the transition at its end (Transitioned; the Next* and
// Transition* fields are 0 when none ran). Line is the machine-readable "PIPE epoch=..."
// line, which also has the per-stage layers and costs and the newly active ranks.
type EpochMetrics struct {
	Epoch             int
	Frozen            int
	K                 int
	Replicas          int
	MicroBatches      int
	BubbleFraction    float64
	TrainSeconds      float64
	Samples           int64
	SamplesPerSecond  float64
	Loss              float64
	SyncsPerSecond    float64
	CacheHitRate      float64
	Transitioned      bool
	NextFrozen        int
	NextK             int
	NextReplicas      int
	TransitionSeconds float64
	TransitionBytes   int64
	Line              string
}

type trainerHandle = cweft.SwigcptrStruct_SS_weft_pipe_trainer

// Trainer is an elastic pipeline trainer over a TorchScript model. Close frees it (a
// finalizer does so if Close is forgotten). It must not be used by two goroutines at once.
type Trainer struct {
	h trainerHandle // 0 once closed
}

// NewTrainer loads the TorchScript file at path (torch.jit.save of a module whose children,
// in order, are the layers, e.g. a scripted torch.nn.Sequential) on every rank and makes the
// trainer. Collective; errors name the path.
func NewTrainer(path string, opts TrainerOptions) (*Trainer, error) {
	const fn = "weft.NewTrainer"
	if err := checkInts(fn, "K0", opts.K0, "FreezeEveryEpochs", opts.FreezeEveryEpochs,
		"MicroBatches", opts.MicroBatches, "Schedule", int(opts.Schedule)); err != nil {
		return nil, err
	}
	n := cweft.PipeTrainerNumbers{
		BatchSize:         64,
		Seed:              1,
		Alpha:             1.0 / 3.0,
		LR:                1e-3,
		Momentum:          opts.Momentum,
		WeightDecay:       opts.WeightDecay,
		K0:                int32(opts.K0),
		Freeze:            int32(boolInt(!opts.DisableFreeze)),
		GradientAware:     int32(boolInt(opts.GradientAware)),
		FreezeEveryEpochs: 1,
		AutoPipe:          int32(boolInt(!opts.DisableAutoPipe)),
		AutoDP:            int32(boolInt(!opts.DisableAutoDP)),
		Cache:             int32(boolInt(opts.Cache)),
		Schedule:          int32(opts.Schedule),
		MicroBatches:      int32(opts.MicroBatches),
		Loss:              int32(opts.Loss),
	}
	switch opts.Optimizer {
	case OptimizerAdam:
		n.Optimizer = int32(cweft.WEFT_PIPE_OPTIMIZER_ADAM)
	case OptimizerSGD:
		n.Optimizer = int32(cweft.WEFT_PIPE_OPTIMIZER_SGD)
	case OptimizerAdamW:
		n.Optimizer = int32(cweft.WEFT_PIPE_OPTIMIZER_ADAMW)
	default:
		return nil, invalid("%s: Optimizer is %d; expected weft.OptimizerAdam, "+
			"OptimizerSGD or OptimizerAdamW", fn, int(opts.Optimizer))
	}
	if opts.Loss != LossCrossEntropy && opts.Loss != LossMSE {
		return nil, invalid("%s: Loss is %d; expected weft.LossCrossEntropy or LossMSE", fn,
			int(opts.Loss))
	}
	if opts.BatchSize != 0 {
		n.BatchSize = int64(opts.BatchSize)
	}
	if opts.Seed != 0 {
		n.Seed = opts.Seed
	}
	if opts.Alpha != 0 {
		n.Alpha = opts.Alpha
	}
	if opts.LR != 0 {
		n.LR = opts.LR
	}
	if opts.FreezeEveryEpochs != 0 {
		n.FreezeEveryEpochs = int32(opts.FreezeEveryEpochs)
	}
	if opts.Decentralized {
		n.Decentralized = 1
	}
	var h trainerHandle
	// The trainer's steps include unnamed barriers: like every unnamed op they run on the
	// Init thread (ordered).
	if err := ordered("", func() cstatus {
		return cweft.Weftgo_pipe_trainer_create(&h, path, &n, opts.CacheDir, opts.Name)
	}); err != nil {
		return nil, err
	}
	t := &Trainer{h: h}
	runtime.SetFinalizer(t, (*Trainer).Close)
	return t, nil
}

func (t *Trainer) handle(method string) (trainerHandle, error) {
	if t == nil || t.h == 0 {
		return 0, &Error{Status: FailedPrecondition,
			Message: "weft.Trainer." + method + ": the trainer was closed"}
	}
	return t.h, nil
}

// TrainEpoch trains one epoch over the whole training set (the same on every rank; inputs
// float32 or float64, targets int64/int32 class indices for LossCrossEntropy or floats for
// LossMSE), then runs the freeze point's transition. Collective.
func (t *Trainer) TrainEpoch(inputs, targets Tensor) (EpochMetrics, error) {
	const fn = "weft.Trainer.TrainEpoch"
	defer runtime.KeepAlive(t)
	h, err := t.handle("TrainEpoch")
	if err != nil {
		return EpochMetrics{}, err
	}
	x, xc, xb, xs, err := inputs.args(fn, "inputs")
	if err != nil {
		return EpochMetrics{}, err
	}
	y, yc, yb, ys, err := targets.args(fn, "targets")
	if err != nil {
		return EpochMetrics{}, err
	}
	m := cweft.PipeEpochMetrics{Version: uint32(cweft.WEFT_PIPE_EPOCH_METRICS_VERSION)}
	if err := ordered("", func() cstatus {
		return cweft.Weftgo_pipe_trainer_train_epoch(h, x, xc, xb, xs, y, yc, yb, ys, &m)
	}); err != nil {
		return EpochMetrics{}, err
	}
	runtime.KeepAlive(inputs.Data)
	runtime.KeepAlive(targets.Data)
	line, err := t.Line()
	if err != nil {
		return EpochMetrics{}, err
	}
	return EpochMetrics{Epoch: int(m.Epoch), Frozen: int(m.Frozen), K: int(m.K),
		Replicas: int(m.Replicas), MicroBatches: int(m.MicroBatches),
		BubbleFraction: m.BubbleFraction, TrainSeconds: m.TrainSeconds, Samples: m.Samples,
		SamplesPerSecond: m.SamplesPerSecond, Loss: m.Loss, SyncsPerSecond: m.SyncsPerSecond,
		CacheHitRate: m.CacheHitRate, Transitioned: m.Transitioned != 0,
		NextFrozen: int(m.NextFrozen), NextK: int(m.NextK), NextReplicas: int(m.NextReplicas),
		TransitionSeconds: m.TransitionSeconds, TransitionBytes: m.TransitionBytes,
		Line: line}, nil
}

// Evaluate is the fraction of the samples whose argmax output is the target (class
// indices; a LossCrossEntropy trainer). Collective.
func (t *Trainer) Evaluate(inputs, targets Tensor) (float64, error) {
	const fn = "weft.Trainer.Evaluate"
	defer runtime.KeepAlive(t)
	h, err := t.handle("Evaluate")
	if err != nil {
		return 0, err
	}
	x, xc, xb, xs, err := inputs.args(fn, "inputs")
	if err != nil {
		return 0, err
	}
	y, yc, yb, ys, err := targets.args(fn, "targets")
	if err != nil {
		return 0, err
	}
	var accuracy float64
	err = ordered("", func() cstatus {
		return cweft.Weftgo_pipe_trainer_evaluate(h, x, xc, xb, xs, y, yc, yb, ys, &accuracy)
	})
	runtime.KeepAlive(inputs.Data)
	runtime.KeepAlive(targets.Data)
	return accuracy, err
}

// Line is the last epoch's "PIPE epoch=..." line ("" before the first).
func (t *Trainer) Line() (string, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("Line")
	if err != nil {
		return "", err
	}
	var needed uint64
	if err := call(func() cstatus {
		return cweft.Weft_pipe_trainer_last_line(h, nil, &needed)
	}); err != nil {
		return "", err
	}
	buf := make([]byte, needed)
	if err := call(func() cstatus {
		return cweft.Weft_pipe_trainer_last_line(h, buf, &needed)
	}); err != nil {
		return "", err
	}
	return string(buf[:needed-1]), nil
}

// Role is this rank's role in the current plan (idle: both -1).
func (t *Trainer) Role() (Role, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("Role")
	if err != nil {
		return Role{-1, -1}, err
	}
	var replica, stage int32
	if err := call(func() cstatus {
		return cweft.Weft_pipe_trainer_role(h, &replica, &stage)
	}); err != nil {
		return Role{-1, -1}, err
	}
	return Role{Replica: int(replica), Stage: int(stage)}, nil
}

// Plan is the current plan's summary (what the next epoch trains with).
func (t *Trainer) Plan() (PlanInfo, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("Plan")
	if err != nil {
		return PlanInfo{}, err
	}
	var info cweft.PipePlanInfo
	if err := call(func() cstatus { return cweft.Weft_pipe_trainer_plan_info(h, &info) }); err != nil {
		return PlanInfo{}, err
	}
	return PlanInfo{Frozen: int(info.Frozen), K: int(info.K), Replicas: int(info.Replicas),
		MicroBatches: int(info.MicroBatches), World: int(info.World), M0: info.M0,
		MaxCost: info.MaxCost}, nil
}

// Close frees the trainer (not collective); later calls fail. Closing twice is fine.
func (t *Trainer) Close() {
	if t == nil || t.h == 0 {
		return
	}
	cweft.Weft_pipe_trainer_destroy(t.h)
	t.h = 0
	runtime.SetFinalizer(t, nil)
}
