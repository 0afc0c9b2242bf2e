package trainer_test

import (
	"fmt"
	"math"
	"math/rand"
	"os"
	"strings"
	"testing"

	"weft.dev/weft"
	"weft.dev/weft/internal/testutil"
	"weft.dev/weft/trainer"
)

var size int

// Every rank runs every test in the same order, inside one weft session.
func TestMain(m *testing.M) {
	if err := weft.Init(); err != nil {
		fmt.Fprintf(os.Stderr, "weft.Init: %v\n", err)
		os.Exit(1)
	}
	size = weft.Size()
	code := m.Run()
	if code != 0 {
		// The ranks may be out of step: end without a collective Shutdown (mpirun stops
		// the others).
		os.Exit(code)
	}
	if err := weft.Finalize(); err != nil {
		fmt.Fprintf(os.Stderr, "weft.Finalize: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// wantStatus: see testutil.WantStatus.
var wantStatus = testutil.WantStatus

// The elastic pipeline trainer on the TorchScript model of //tests/capi:trainer_model (a
// scripted nn.Sequential of 7 layers, 6 features, 4 classes), whose path
// go_binding_test.sh passes in GO_TEST_TRAINER_MODEL. Collective: every rank runs every
// call, on the same data.

const trainerFeatures, trainerClasses = 6, 4

func trainerModel(t *testing.T) string {
	path := os.Getenv("GO_TEST_TRAINER_MODEL")
	if path == "" {
		t.Skip("GO_TEST_TRAINER_MODEL is not set (go_binding_test.sh sets it)")
	}
	return path
}

// clusters are Gaussian clusters, the same on every rank.
func clusters(n int) (x []float32, y []int64) {
	rng := rand.New(rand.NewSource(11))
	centers := make([]float64, trainerClasses*trainerFeatures)
	for i := range centers {
		centers[i] = 3 * rng.NormFloat64()
	}
	x = make([]float32, n*trainerFeatures)
	y = make([]int64, n)
	for i := 0; i < n; i++ {
		y[i] = int64(i % trainerClasses)
		for f := 0; f < trainerFeatures; f++ {
			x[i*trainerFeatures+f] = float32(centers[int(y[i])*trainerFeatures+f] + rng.NormFloat64())
		}
	}
	return x, y
}

func TestTrainsAndTransitions(t *testing.T) {
	path := trainerModel(t)
	const n = 512
	k0 := size
	if k0 > 7 {
		k0 = 7
	}
	x, y := clusters(n)
	inputs := trainer.TensorOf(x, n, trainerFeatures)
	targets := trainer.TensorOf(y)
	tr, err := trainer.New(path, trainer.Options{Alpha: 0.5, BatchSize: 32,
		MicroBatches: 2, LR: 1e-2, Name: "go.train"})
	if err != nil {
		t.Fatalf("trainer.New: %v", err)
	}
	defer tr.Close()
	if plan, err := tr.Plan(); err != nil || plan.Frozen != 0 || plan.K != k0 || plan.World != size {
		t.Fatalf("Plan before training: %+v, %v; want frozen 0, K %d, world %d", plan, err, k0, size)
	}
	var m [2]trainer.EpochMetrics
	for e := range m {
		if m[e], err = tr.TrainEpoch(inputs, targets); err != nil {
			t.Fatalf("TrainEpoch %d: %v", e, err)
		}
		got := m[e]
		if got.Epoch != e || got.Samples != n || !(got.Loss > 0) || got.MicroBatches != 2 ||
			got.K*got.Replicas > size || !got.Transitioned || !(got.SamplesPerSecond > 0) ||
			math.Abs(got.BubbleFraction-float64(got.K-1)/float64(got.MicroBatches+got.K-1)) > 1e-9 ||
			!strings.HasPrefix(got.Line, "PIPE epoch=") {
			t.Fatalf("epoch %d: unexpected metrics %+v", e, got)
		}
	}
	if m[0].Frozen != 0 || m[0].K != k0 || m[1].Frozen != m[0].NextFrozen ||
		m[1].K != m[0].NextK || m[1].Replicas != m[0].NextReplicas || m[1].Frozen != 4 ||
		!(m[1].K < m[0].K || m[1].Frozen > m[0].Frozen) || !(m[1].Loss < m[0].Loss) {
		t.Fatalf("epochs: %+v then %+v", m[0], m[1])
	}
	if line, err := tr.Line(); err != nil || line != m[1].Line ||
		!strings.HasPrefix(line, "PIPE epoch=1 frozen=4 ") {
		t.Fatalf("Line: %q, %v", line, err)
	}
	role, err := tr.Role()
	if err != nil || role.Replica < -1 || role.Stage < -1 || (size == 1 && role != weft.Role{}) {
		t.Fatalf("Role: %+v, %v", role, err)
	}
	// float64 inputs work too (converted to the model's float32).
	x64 := make([]float64, len(x))
	for i, v := range x {
		x64[i] = float64(v)
	}
	accuracy, err := tr.Evaluate(trainer.TensorOf(x64, n, trainerFeatures), targets)
	if err != nil || !(accuracy > 0.6) {
		t.Fatalf("Evaluate: %v, %v; want above 0.6 (chance is 0.25)", accuracy, err)
	}
	tr.Close()
	if _, err := tr.TrainEpoch(inputs, targets); weft.StatusOf(err) != weft.FailedPrecondition {
		t.Fatalf("TrainEpoch after Close: %v", err)
	}
	tr.Close() // twice is fine
}

// Replicas gossip parameters with one peer replica per step; the run still learns.
func TestDecentralized(t *testing.T) {
	path := trainerModel(t)
	const n = 512
	x, y := clusters(n)
	inputs, targets := trainer.TensorOf(x, n, trainerFeatures), trainer.TensorOf(y)
	tr, err := trainer.New(path, trainer.Options{Alpha: 0.5, BatchSize: 32,
		MicroBatches: 2, LR: 1e-2, Name: "go.gossip", Decentralized: true})
	if err != nil {
		t.Fatalf("trainer.New: %v", err)
	}
	defer tr.Close()
	for e := 0; e < 3; e++ {
		if _, err := tr.TrainEpoch(inputs, targets); err != nil {
			t.Fatalf("TrainEpoch %d: %v", e, err)
		}
	}
	if accuracy, err := tr.Evaluate(inputs, targets); err != nil || !(accuracy > 0.6) {
		t.Fatalf("Evaluate: %v, %v; want above 0.6 (chance is 0.25)", accuracy, err)
	}
}

func TestErrors(t *testing.T) {
	path := trainerModel(t)
	var problems []string
	_, err := trainer.New("/nonexistent/go-model.pt", trainer.Options{})
	problems = append(problems, wantStatus("missing file", err, weft.NotFound,
		"weft_pipe_trainer_create", "/nonexistent/go-model.pt"))
	_, err = trainer.New(path, trainer.Options{Alpha: 1.5})
	problems = append(problems, wantStatus("alpha", err, weft.InvalidArgument, "alpha"))
	_, err = trainer.New(path, trainer.Options{K0: size + 1})
	problems = append(problems, wantStatus("k0", err, weft.InvalidArgument, "k0"))
	_, err = trainer.New(path, trainer.Options{Optimizer: 9})
	problems = append(problems, wantStatus("optimizer", err, weft.InvalidArgument, "Optimizer"))
	tr, err := trainer.New(path, trainer.Options{Loss: trainer.LossMSE,
		Optimizer: trainer.OptimizerSGD, Momentum: 0.9, LR: 0.05, DisableFreeze: true,
		Schedule: weft.Schedule1F1B, BatchSize: 16, Name: "go.mse"})
	if err != nil {
		t.Fatalf("trainer.New (MSE): %v", err)
	}
	defer tr.Close()
	x, y := clusters(64)
	onehot := make([]float32, 64*trainerClasses)
	for i, c := range y {
		onehot[i*trainerClasses+int(c)] = 1
	}
	m, err := tr.TrainEpoch(trainer.TensorOf(x, 64, trainerFeatures),
		trainer.TensorOf(onehot, 64, trainerClasses))
	if err != nil || m.Samples != 64 || m.Transitioned || !(m.Loss > 0) {
		t.Fatalf("TrainEpoch (MSE): %+v, %v", m, err)
	}
	_, err = tr.TrainEpoch(trainer.TensorOf(x, 64, trainerFeatures), trainer.TensorOf(y))
	problems = append(problems, wantStatus("MSE with class indices", err, weft.InvalidArgument, "MSE"))
	_, err = tr.TrainEpoch(trainer.TensorOf(x, 64, 5), trainer.TensorOf(y))
	problems = append(problems, wantStatus("shape", err, weft.InvalidArgument, "Shape"))
	_, err = tr.TrainEpoch(trainer.Tensor{Data: []string{"x"}}, trainer.TensorOf(y))
	problems = append(problems, wantStatus("data type", err, weft.InvalidArgument, "[]string"))
	_, err = tr.Evaluate(trainer.TensorOf(x, 64, trainerFeatures), trainer.TensorOf(y))
	problems = append(problems, wantStatus("evaluate MSE", err, weft.FailedPrecondition, "MSE"))
	for _, p := range problems {
		if p != "" {
			t.Error(p)
		}
	}
}
