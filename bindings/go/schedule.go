package weft

import (
	"runtime"

	"weft.dev/weft/internal/cweft"
)

type scheduleHandle = cweft.SwigcptrStruct_SS_weft_schedule

// Schedule is a dynamic topology: an infinite sequence of steps, each the ranks to send to
// and the ranks to receive from (pass them to NeighborAllreduce as DstWeights and
// Weights.Src, or to NeighborAllgather). It lives in C memory: Close frees it (a finalizer
// does so if Close is forgotten). Not safe for concurrent use.
type Schedule struct {
	h scheduleHandle // 0 once closed
}

func newSchedule(create func(out *scheduleHandle) cstatus) (*Schedule, error) {
	var h scheduleHandle
	if err := call(func() cstatus { return create(&h) }); err != nil {
		return nil, err
	}
	s := &Schedule{h: h}
	runtime.SetFinalizer(s, (*Schedule).Close)
	return s, nil
}

// OnePeerSchedule talks to one peer per step over t (copied): rank's out-neighbors sorted
// clockwise from rank; at step k rank sends to the k-th (mod out-degree) and receives from
// every rank whose step-k target is rank.
func OnePeerSchedule(t *Topology, rank int) (*Schedule, error) {
	defer runtime.KeepAlive(t)
	h, err := t.handle("OnePeerSchedule")
	if err != nil {
		return nil, err
	}
	return newSchedule(func(out *scheduleHandle) cstatus {
		return cweft.Weft_schedule_one_peer(out, h, rank)
	})
}

// MachineExponentialTwoSchedule is at machine level (ranks are machine indices): at step k,
// with d = 2^(k mod (floor(log2(machineSize-1)) + 1)), send to machine (m + d) mod M and
// receive from (m - d) mod M.
func MachineExponentialTwoSchedule(machineSize, machineRank int) (*Schedule, error) {
	return newSchedule(func(out *scheduleHandle) cstatus {
		return cweft.Weft_schedule_machine_exponential_two(out, machineSize, machineRank)
	})
}

// InnerOuterRingSchedule: per step, one local rank talks to the same local rank on the
// neighboring machines of a ring; the others exchange inside their machine.
func InnerOuterRingSchedule(worldSize, localSize, rank int) (*Schedule, error) {
	return newSchedule(func(out *scheduleHandle) cstatus {
		return cweft.Weft_schedule_inner_outer_ring(out, worldSize, localSize, rank)
	})
}

// InnerOuterExponentialTwoSchedule is InnerOuterRingSchedule with machine-level
// exponential-2 steps between machines.
func InnerOuterExponentialTwoSchedule(worldSize, localSize, rank int) (*Schedule, error) {
	return newSchedule(func(out *scheduleHandle) cstatus {
		return cweft.Weft_schedule_inner_outer_exponential_two(out, worldSize, localSize, rank)
	})
}

// Next advances to the next step (the first call yields step 0) and returns its ranks.
func (s *Schedule) Next() (send, recv []int, err error) {
	defer runtime.KeepAlive(s)
	if s == nil || s.h == 0 {
		return nil, nil, &Error{Status: FailedPrecondition,
			Message: "weft.Schedule.Next: the schedule was closed"}
	}
	h := s.h
	if err := call(func() cstatus { return cweft.Weft_schedule_next(h) }); err != nil {
		return nil, nil, err
	}
	send, err = fetchRanks(func(buf []int32, count *uint64) cstatus {
		return cweft.Weft_schedule_send_ranks(buf, count, h)
	})
	if err != nil {
		return nil, nil, err
	}
	recv, err = fetchRanks(func(buf []int32, count *uint64) cstatus {
		return cweft.Weft_schedule_recv_ranks(buf, count, h)
	})
	if err != nil {
		return nil, nil, err
	}
	return send, recv, nil
}

// Close frees the schedule; Next then fails. Closing twice is fine.
func (s *Schedule) Close() {
	if s == nil || s.h == 0 {
		return
	}
	cweft.Weft_schedule_destroy(s.h)
	s.h = 0
	runtime.SetFinalizer(s, nil)
}
