// Package trainer trains a TorchScript model with elastic pipelining (weft/trainer.h):
// AutoFreeze, AutoPipe, AutoDP and AutoCache. It is a package of its own because its C
// library, libweft_trainer.so, loads LibTorch: programs that only communicate import weft
// alone and never load it. Unlike weft's pipe computations, a trainer communicates: every
// rank creates it and calls each method, in the same order, after weft.Init.
package trainer

import (
	"fmt"
	"runtime"
	"unsafe"

	"weft.dev/weft"
	"weft.dev/weft/internal/callorder"
	"weft.dev/weft/internal/cconv"
	"weft.dev/weft/internal/cwefttrainer"
)

// weft_pipe_epoch_metrics' version (WEFT_PIPE_EPOCH_METRICS_VERSION) this package fills.
const metricsVersion = 1

// weft_pipe_plan_info's version (WEFT_PIPE_PLAN_INFO_VERSION) this package fills.
const planInfoVersion = 1

// call runs one C call and turns a failure into a *weft.Error. weft_last_error() is
// thread-local, so the goroutine stays on its thread until the message has been read.
func call(f func() int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := weft.Status(f()); st != weft.OK {
		return &weft.Error{Status: st, Message: cwefttrainer.Weftgo_trainer_last_error()}
	}
	return nil
}

// ordered is call through package internal/callorder: a trainer's steps contain unnamed
// ops (barriers), which the C library matches by their order on one thread.
func ordered(f func() int) error { return callorder.Run(func() error { return call(f) }) }

func invalid(format string, args ...any) error {
	return &weft.Error{Status: weft.InvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// checkInts fails when a value does not fit the C int it is passed as.
func checkInts(fn string, namesAndValues ...any) error {
	if problem := cconv.CheckInts(fn, namesAndValues...); problem != "" {
		return invalid("%s", problem)
	}
	return nil
}

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

// Options configure a Trainer; the zero value is the C defaults.
type Options struct {
	K0                int     // the initial pipeline length; 0: min(world size, layers)
	DisableFreeze     bool    // no AutoFreeze (by default a freeze point ends each interval)
	Alpha             float64 // the freeze schedule's alpha in (0, 1]; 0: 1/3
	GradientAware     bool    // the gradient-aware freeze policy
	FreezeEveryEpochs int     // a freeze point every this many epochs; 0: 1
	DisableAutoPipe   bool    // K stays K0
	DisableAutoDP     bool    // freed ranks stay idle
	Cache             bool    // AutoCache of the frozen prefix's output
	CacheDir          string  // the cache's spill directory; "": none
	Schedule          weft.ScheduleKind
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
func TensorOf[T weft.Element](data []T, shape ...int64) Tensor {
	return Tensor{Data: data, Shape: shape}
}

// args flattens the tensor for a weftgo_* call (checking the shape against the slice).
func (t Tensor) args(fn, what string) (data unsafe.Pointer, code, bits int, shape []int64, err error) {
	var n int
	switch d := t.Data.(type) {
	case []float32:
		data, code, bits, n = cconv.Data(d), cconv.DLFloat, 32, len(d)
	case []float64:
		data, code, bits, n = cconv.Data(d), cconv.DLFloat, 64, len(d)
	case []int32:
		data, code, bits, n = cconv.Data(d), cconv.DLInt, 32, len(d)
	case []int64:
		data, code, bits, n = cconv.Data(d), cconv.DLInt, 64, len(d)
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

type trainerHandle = cwefttrainer.SwigcptrStruct_SS_weft_pipe_trainer

// Trainer is an elastic pipeline trainer over a TorchScript model. Close frees it (a
// finalizer does so if Close is forgotten). It must not be used by two goroutines at once.
type Trainer struct {
	h trainerHandle // 0 once closed
}

// New loads the TorchScript file at path (torch.jit.save of a module whose children,
// in order, are the layers, e.g. a scripted torch.nn.Sequential) on every rank and makes the
// trainer. Collective; errors name the path.
func New(path string, opts Options) (*Trainer, error) {
	const fn = "trainer.New"
	if err := checkInts(fn, "K0", opts.K0, "FreezeEveryEpochs", opts.FreezeEveryEpochs,
		"MicroBatches", opts.MicroBatches, "Schedule", int(opts.Schedule)); err != nil {
		return nil, err
	}
	// Zero values stand for the library's defaults (weft_pipe_trainer_options_init).
	n := cwefttrainer.Numbers{
		BatchSize:         int64(opts.BatchSize),
		Seed:              opts.Seed,
		Alpha:             opts.Alpha,
		LR:                opts.LR,
		Momentum:          opts.Momentum,
		WeightDecay:       opts.WeightDecay,
		K0:                int32(opts.K0),
		Freeze:            int32(cconv.Bool(!opts.DisableFreeze)),
		GradientAware:     int32(cconv.Bool(opts.GradientAware)),
		FreezeEveryEpochs: int32(opts.FreezeEveryEpochs),
		AutoPipe:          int32(cconv.Bool(!opts.DisableAutoPipe)),
		AutoDP:            int32(cconv.Bool(!opts.DisableAutoDP)),
		Cache:             int32(cconv.Bool(opts.Cache)),
		Schedule:          int32(opts.Schedule),
		MicroBatches:      int32(opts.MicroBatches),
		Loss:              int32(cwefttrainer.Weftgo_trainer_loss(int(opts.Loss))),
	}
	if opts.Optimizer < OptimizerAdam || opts.Optimizer > OptimizerAdamW {
		return nil, invalid("%s: Optimizer is %d; expected trainer.OptimizerAdam, "+
			"OptimizerSGD or OptimizerAdamW", fn, int(opts.Optimizer))
	}
	n.Optimizer = int32(cwefttrainer.Weftgo_trainer_optimizer(int(opts.Optimizer)))
	if opts.Loss != LossCrossEntropy && opts.Loss != LossMSE {
		return nil, invalid("%s: Loss is %d; expected trainer.LossCrossEntropy or LossMSE", fn,
			int(opts.Loss))
	}
	if opts.Decentralized {
		n.Decentralized = 1
	}
	var h trainerHandle
	// The trainer's steps include unnamed barriers: like every unnamed op they run on the
	// Init thread (ordered).
	if err := ordered(func() int {
		return cwefttrainer.Weftgo_trainer_create(&h, path, &n, opts.CacheDir, opts.Name)
	}); err != nil {
		return nil, err
	}
	t := &Trainer{h: h}
	runtime.SetFinalizer(t, (*Trainer).Close)
	return t, nil
}

func (t *Trainer) handle(method string) (trainerHandle, error) {
	if t == nil || t.h == 0 {
		return 0, &weft.Error{Status: weft.FailedPrecondition,
			Message: "trainer.Trainer." + method + ": the trainer was closed"}
	}
	return t.h, nil
}

// TrainEpoch trains one epoch over the whole training set (the same on every rank; inputs
// float32 or float64, targets int64/int32 class indices for LossCrossEntropy or floats for
// LossMSE), then runs the freeze point's transition. Collective.
func (t *Trainer) TrainEpoch(inputs, targets Tensor) (EpochMetrics, error) {
	const fn = "trainer.Trainer.TrainEpoch"
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
	m := cwefttrainer.EpochMetrics{Version: metricsVersion}
	if err := ordered(func() int {
		return cwefttrainer.Weftgo_trainer_train_epoch(h, x, xc, xb, xs, y, yc, yb, ys, &m)
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
	const fn = "trainer.Trainer.Evaluate"
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
	err = ordered(func() int {
		return cwefttrainer.Weftgo_trainer_evaluate(h, x, xc, xb, xs, y, yc, yb, ys, &accuracy)
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
	if err := call(func() int {
		return cwefttrainer.Weftgo_trainer_last_line(h, nil, &needed)
	}); err != nil {
		return "", err
	}
	buf := make([]byte, needed)
	if err := call(func() int {
		return cwefttrainer.Weftgo_trainer_last_line(h, buf, &needed)
	}); err != nil {
		return "", err
	}
	return string(buf[:needed-1]), nil
}

// Role is this rank's role in the current plan (idle: both -1).
func (t *Trainer) Role() (weft.Role, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("Role")
	if err != nil {
		return weft.Role{Replica: -1, Stage: -1}, err
	}
	var replica, stage int32
	if err := call(func() int {
		return cwefttrainer.Weftgo_trainer_role(h, &replica, &stage)
	}); err != nil {
		return weft.Role{Replica: -1, Stage: -1}, err
	}
	return weft.Role{Replica: int(replica), Stage: int(stage)}, nil
}

// Plan is the current plan's summary (what the next epoch trains with).
func (t *Trainer) Plan() (weft.PlanInfo, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("Plan")
	if err != nil {
		return weft.PlanInfo{}, err
	}
	info := cwefttrainer.PlanInfo{Version: planInfoVersion}
	if err := call(func() int { return cwefttrainer.Weftgo_trainer_plan_info(h, &info) }); err != nil {
		return weft.PlanInfo{}, err
	}
	return weft.PlanInfo{Frozen: int(info.Frozen), K: int(info.K), Replicas: int(info.Replicas),
		MicroBatches: int(info.MicroBatches), World: int(info.World), M0: info.M0,
		MaxCost: info.MaxCost}, nil
}

// Close frees the trainer (not collective); later calls fail. Closing twice is fine.
func (t *Trainer) Close() {
	if t == nil || t.h == 0 {
		return
	}
	cwefttrainer.Weftgo_trainer_destroy(t.h)
	t.h = 0
	runtime.SetFinalizer(t, nil)
}
