package trainer

import (
	"testing"
	"unsafe"

	"weft.dev/weft/internal/cwefttrainer"
)

// The trainer's structs cross into C by pointer as weftgo_pipe_trainer_numbers,
// weft_pipe_epoch_metrics and weft_pipe_plan_info (trainer.i checks the C side), and its
// enums map to the header's.
func TestStructLayoutsAndEnums(t *testing.T) {
	var n cwefttrainer.Numbers
	if unsafe.Sizeof(n) != 96 || unsafe.Offsetof(n.Alpha) != 16 || unsafe.Offsetof(n.K0) != 48 ||
		unsafe.Offsetof(n.Loss) != 88 {
		t.Fatalf("Numbers: size %d, K0 at %d; trainer.i expects 96 and 48",
			unsafe.Sizeof(n), unsafe.Offsetof(n.K0))
	}
	var m cwefttrainer.EpochMetrics
	if unsafe.Sizeof(m) != 112 || unsafe.Offsetof(m.BubbleFraction) != 24 ||
		unsafe.Offsetof(m.Samples) != 40 || unsafe.Offsetof(m.Transitioned) != 80 ||
		unsafe.Offsetof(m.TransitionBytes) != 104 {
		t.Fatalf("EpochMetrics: size %d, Samples at %d; trainer.i expects 112 and 40",
			unsafe.Sizeof(m), unsafe.Offsetof(m.Samples))
	}
	var p cwefttrainer.PlanInfo
	if unsafe.Sizeof(p) != 40 || unsafe.Offsetof(p.World) != 20 || unsafe.Offsetof(p.M0) != 24 ||
		unsafe.Offsetof(p.MaxCost) != 32 {
		t.Fatalf("PlanInfo: size %d, M0 at %d; trainer.i expects 40 and 24", unsafe.Sizeof(p),
			unsafe.Offsetof(p.M0))
	}
	for _, o := range []Optimizer{OptimizerAdam, OptimizerSGD, OptimizerAdamW} {
		if cwefttrainer.Weftgo_trainer_optimizer(int(o)) < 0 {
			t.Fatalf("Optimizer %d has no C value", o)
		}
	}
	if cwefttrainer.Weftgo_trainer_loss(int(LossCrossEntropy)) < 0 ||
		cwefttrainer.Weftgo_trainer_loss(int(LossMSE)) < 0 {
		t.Fatal("a Loss has no C value")
	}
}
