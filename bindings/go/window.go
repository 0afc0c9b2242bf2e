package weft

import (
	"fmt"
	"sync"
	"unsafe"

	"weft.dev/weft/internal/cconv"
	"weft.dev/weft/internal/cweft"
)

// ---- one-sided windows ------------------------------------------------------------------
//
// A window associates a tensor with a name (comm/comm.h, "windows"):
// every rank holds one receive buffer per in-neighbor (of the topology in force when the
// window was created) and exposes its tensor to the others' gets. Puts and gets are
// one-sided: the other rank calls nothing. SetTopology fails while windows exist.
//
// weft keeps a pointer to the window's tensor from WinCreate until the window is freed
// (gets read it, updates and puts with a self weight write it in place), which cgo forbids
// for Go memory. So a Window owns C memory holding the tensor: WinCreate copies x in, Data
// copies it out, Set copies a new value in. That memory is reference-counted in C: the
// Window holds one reference until Free has freed the window in weft, every call one for
// its duration and every nonblocking op one until it has completed and its Request is freed
// (weft_request_keep_alive), so it is never freed under a running op.

// WinPutOptions are the options of Put and Accumulate; the zero value means the defaults.
type WinPutOptions struct {
	// SelfWeight, when not nil, multiplies this rank's tensor (and its associated p) after
	// the put. nil: 1, the tensor is unchanged.
	SelfWeight *float64
	// DstWeights: destination rank -> weight; each destination receives weight * x. nil:
	// every out-neighbor with weight 1. Non-nil and empty: no destination (the put only
	// applies SelfWeight). A destination must be an out-neighbor in the window's topology.
	DstWeights map[int]float64
	// RequireMutex holds the destinations' window mutexes around the put.
	RequireMutex bool
}

// WinGetOptions are the options of Get.
type WinGetOptions struct {
	// SrcWeights: source rank -> weight; the buffer for j receives weight * x_j. nil: every
	// in-neighbor with weight 1. A source must be an in-neighbor in the window's topology.
	SrcWeights map[int]float64
	// RequireMutex holds the sources' window mutexes around the get.
	RequireMutex bool
}

// WinUpdateOptions are the options of Update.
type WinUpdateOptions struct {
	// Weights: x <- Self*x + sum over j of Src[j] * buffer_j (Src keys: in-neighbors). nil:
	// the topology's receive weights if it was set weighted, else the uniform average over
	// x and every buffer.
	Weights *Weights
	// Reset zeroes the buffers used.
	Reset bool
	// RequireMutex holds this rank's own window mutex.
	RequireMutex bool
}

// Window is a one-sided window over a tensor of T held in C memory (see WinCreate). Its
// methods may be called from several goroutines; weft orders the operations.
type Window[T Element] struct {
	core   *winCore
	shape  []int64
	n      int
	layout layout
}

// winCore is the part of a window that the registry of live windows refers to.
type winCore struct {
	name string
	mu   sync.Mutex
	data unsafe.Pointer // shared C memory; nil once released
}

// liveWindows maps each window name to the Window that created it in weft, so that Free
// and WinFreeAll know whether weft still uses the memory: after Shutdown (which frees
// every window in weft) and a new WinCreate of the same name, the old Window must not free
// the new one.
var liveWindows = struct {
	sync.Mutex
	byName map[string]*winCore
}{byName: map[string]*winCore{}}

// WinCreate creates the window name over a copy of x (collective: every rank calls it with
// the same name, dtype and shape). The receive buffers start as copies of this rank's x, or
// zeros with zeroInit. shape describes x as a tensor (none: 1-D of its length).
//
// The Window must be freed with Free (or WinFreeAll), collectively: weft uses its memory
// until then, so there is no finalizer, and a dropped Window leaks its C memory.
func WinCreate[T Element](name string, x []T, zeroInit bool, shape ...int64) (*Window[T], error) {
	return WinCreateWith(name, x, WinCreateOptions{ZeroInit: zeroInit, Shape: shape})
}

// WinCreateOptions are WinCreate's choices: ZeroInit starts the buffers at zero instead of
// copies of x; Transport is "mpi" or "ucx" ("" takes WEFT_TRANSPORT), the same on every
// rank; Shape as in WinCreate.
type WinCreateOptions struct {
	ZeroInit  bool
	Transport string
	Shape     []int64
}

// WinCreateWith is WinCreate with every option.
func WinCreateWith[T Element](name string, x []T, opts WinCreateOptions) (*Window[T], error) {
	const fn = "weft.WinCreate"
	zeroInit, shape := opts.ZeroInit, opts.Shape
	if len(shape) == 0 {
		shape = nil
	}
	l, err := layoutOf[T](fn, len(x), shape)
	if err != nil {
		return nil, err
	}
	l.shape = append([]int64(nil), l.shape...)
	nbytes := len(x) * sizeOf[T]()
	data := cweft.Weftgo_shared_alloc(int64(nbytes))
	if data == nil {
		return nil, &Error{Status: ResourceExhausted,
			Message: fmt.Sprintf("%s: cannot allocate %d bytes of C memory", fn, nbytes)}
	}
	copy(unsafe.Slice((*T)(data), len(x)), x)
	err = call(func() cstatus {
		return cweft.Weftgo_win_create(data, l.code, l.bits, l.shape, name, cconv.Bool(zeroInit),
			opts.Transport)
	})
	if err != nil {
		cweft.Weftgo_shared_unref(data)
		return nil, err
	}
	c := &winCore{name: name, data: data}
	liveWindows.Lock()
	liveWindows.byName[name] = c
	liveWindows.Unlock()
	return &Window[T]{core: c, shape: l.shape, n: len(x), layout: l}, nil
}

// Name is the window's name.
func (w *Window[T]) Name() string { return w.core.name }

// Len is the number of elements of the window's tensor.
func (w *Window[T]) Len() int { return w.n }

// Shape is the window's tensor shape (a copy).
func (w *Window[T]) Shape() []int64 { return append([]int64(nil), w.shape...) }

// ref returns the window's memory with one more reference (drop it with unref), or an error
// once the window has been freed.
func (w *Window[T]) ref(method string) (unsafe.Pointer, error) {
	c := w.core
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data == nil {
		return nil, &Error{Status: FailedPrecondition, Message: fmt.Sprintf(
			"weft.Window.%s: the window '%s' has been freed", method, c.name)}
	}
	cweft.Weftgo_shared_ref(c.data)
	return c.data, nil
}

func unref(data unsafe.Pointer) { cweft.Weftgo_shared_unref(data) }

// Data returns a copy of the window's tensor as it is now. (A copy, not a view: a view of C
// memory would dangle after Free, and weft writes the tensor in place during Update and
// during Put with a SelfWeight.)
func (w *Window[T]) Data() ([]T, error) {
	data, err := w.ref("Data")
	if err != nil {
		return nil, err
	}
	defer unref(data)
	out := make([]T, w.n)
	copy(out, unsafe.Slice((*T)(data), w.n))
	return out, nil
}

// Set copies x (of the window's length) into the window's tensor. Other ranks' gets read
// the tensor at any time: Set is not atomic with respect to them (guard both with the
// window's mutex if that matters).
func (w *Window[T]) Set(x []T) error {
	if len(x) != w.n {
		return invalid("weft.Window.Set: x has %d elements but the window '%s' holds %d",
			len(x), w.core.name, w.n)
	}
	data, err := w.ref("Set")
	if err != nil {
		return err
	}
	defer unref(data)
	copy(unsafe.Slice((*T)(data), w.n), x)
	return nil
}

// Put writes weight * x (this window's tensor) into each destination's buffer for this
// rank, then multiplies the tensor by SelfWeight (see WinPutOptions).
func (w *Window[T]) Put(opts ...WinPutOptions) error {
	return w.put("Put", false, nil, opts)
}

// Accumulate is Put adding into the destinations' buffers (atomically per element).
func (w *Window[T]) Accumulate(opts ...WinPutOptions) error {
	return w.put("Accumulate", true, nil, opts)
}

// PutNonblocking starts Put. The tensor is read when the op runs (not copied at the
// start): do not Set or Update it before the Request has completed.
func (w *Window[T]) PutNonblocking(opts ...WinPutOptions) (*Request, error) {
	return w.startPut("PutNonblocking", false, opts)
}

// AccumulateNonblocking starts Accumulate (see PutNonblocking).
func (w *Window[T]) AccumulateNonblocking(opts ...WinPutOptions) (*Request, error) {
	return w.startPut("AccumulateNonblocking", true, opts)
}

func (w *Window[T]) startPut(method string, accumulate bool, opts []WinPutOptions) (*Request, error) {
	var h reqHandle
	if err := w.put(method, accumulate, &h, opts); err != nil {
		return nil, err
	}
	// The op holds its own reference to the memory (weftgo_win_put): nothing to copy back.
	return newRequest(h, nil, nil), nil
}

func (w *Window[T]) put(method string, accumulate bool, req *reqHandle, opts []WinPutOptions) error {
	fn := "weft.Window." + method
	o, err := single(fn, opts)
	if err != nil {
		return err
	}
	self := 1.0
	if o.SelfWeight != nil {
		self = *o.SelfWeight
	}
	var dst []cweft.RankWeight
	if o.DstWeights != nil {
		if dst, err = rankWeights(fn, "DstWeights", o.DstWeights); err != nil {
			return err
		}
	}
	data, err := w.ref(method)
	if err != nil {
		return err
	}
	defer unref(data)
	l := w.layout
	return call(func() cstatus {
		return cweft.Weftgo_win_put(req, cconv.Bool(accumulate), data, l.code, l.bits, l.shape,
			w.core.name, self, cconv.Bool(o.DstWeights != nil), dst, cconv.Bool(o.RequireMutex))
	})
}

// Get reads weight * x_j of each source j into this rank's buffer for j (see
// WinGetOptions); Update then combines the buffers.
func (w *Window[T]) Get(opts ...WinGetOptions) error {
	return w.get("Get", nil, opts)
}

// GetNonblocking starts Get.
func (w *Window[T]) GetNonblocking(opts ...WinGetOptions) (*Request, error) {
	var h reqHandle
	if err := w.get("GetNonblocking", &h, opts); err != nil {
		return nil, err
	}
	return newRequest(h, nil, nil), nil
}

func (w *Window[T]) get(method string, req *reqHandle, opts []WinGetOptions) error {
	fn := "weft.Window." + method
	o, err := single(fn, opts)
	if err != nil {
		return err
	}
	var src []cweft.RankWeight
	if o.SrcWeights != nil {
		if src, err = rankWeights(fn, "SrcWeights", o.SrcWeights); err != nil {
			return err
		}
	}
	data, err := w.ref(method) // only to fail clearly on a freed Window
	if err != nil {
		return err
	}
	defer unref(data)
	return call(func() cstatus {
		return cweft.Weftgo_win_get(req, w.core.name, cconv.Bool(o.SrcWeights != nil), src,
			cconv.Bool(o.RequireMutex))
	})
}

// SetWinAssociatedPOps sets whether updates and a put's self weight also apply to the
// push-sum scalar p, for every window of the process (default true).
func SetWinAssociatedPOps(on bool) {
	v := 0
	if on {
		v = 1
	}
	cweft.Weft_win_set_associated_p_ops(v)
}

// WinAssociatedPOps reports the setting of SetWinAssociatedPOps.
func WinAssociatedPOps() bool { return cweft.Weft_win_associated_p_ops() != 0 }

// Update combines the receive buffers into the window's tensor, in place (local: no other
// rank takes part): by default the topology's receive weights if it was set weighted, else
// the uniform average over the tensor and every buffer.
func (w *Window[T]) Update(opts ...WinUpdateOptions) error {
	const fn = "weft.Window.Update"
	o, err := single(fn, opts)
	if err != nil {
		return err
	}
	wa, err := weightArgs(fn, o.Weights, nil)
	if err != nil {
		return err
	}
	data, err := w.ref("Update")
	if err != nil {
		return err
	}
	defer unref(data)
	return call(func() cstatus {
		return cweft.Weftgo_win_update(w.core.name, wa.has, wa.self, wa.src, cconv.Bool(o.Reset),
			cconv.Bool(o.RequireMutex))
	})
}

// UpdateThenCollect adds every receive buffer into the window's tensor (a sum, not an
// average: x <- x + sum over j of buffer_j), then zeroes the buffers. Local.
// requireMutex holds this rank's own window mutex.
func (w *Window[T]) UpdateThenCollect(requireMutex ...bool) error {
	if len(requireMutex) > 1 {
		return invalid("weft.Window.UpdateThenCollect: pass at most one requireMutex (got %d)",
			len(requireMutex))
	}
	data, err := w.ref("UpdateThenCollect")
	if err != nil {
		return err
	}
	defer unref(data)
	mutex := len(requireMutex) == 1 && requireMutex[0]
	return call(func() cstatus {
		return cweft.Weft_win_update_then_collect(w.core.name, cconv.Bool(mutex))
	})
}

// Versions maps each in-neighbor to the number of puts (and gets) into its buffer since
// the buffer was last updated.
func (w *Window[T]) Versions() (map[int]int64, error) {
	data, err := w.ref("Versions")
	if err != nil {
		return nil, err
	}
	defer unref(data)
	pairs, err := fetch(func(buf []cweft.RankVersion, count *uint64) cstatus {
		return cweft.Weft_win_version(buf, count, w.core.name)
	})
	if err != nil {
		return nil, err
	}
	out := make(map[int]int64, len(pairs))
	for _, p := range pairs {
		out[int(p.Rank)] = p.Version
	}
	return out, nil
}

// AssociatedP is the scalar p that follows the tensor's weights (push-sum); it starts at 1.
func (w *Window[T]) AssociatedP() (float64, error) {
	data, err := w.ref("AssociatedP")
	if err != nil {
		return 0, err
	}
	defer unref(data)
	var p float64
	err = call(func() cstatus { return cweft.Weft_win_associated_p(&p, w.core.name) })
	return p, err
}

// MutexAcquire takes the window mutexes of ranks (none: this rank's own), in rank order,
// waiting while another rank holds one. Release them with MutexRelease.
func (w *Window[T]) MutexAcquire(ranks ...int) error {
	return w.mutex("MutexAcquire", ranks, cweft.Weft_win_mutex_acquire)
}

// MutexRelease releases the window mutexes of ranks (none: this rank's own).
func (w *Window[T]) MutexRelease(ranks ...int) error {
	return w.mutex("MutexRelease", ranks, cweft.Weft_win_mutex_release)
}

func (w *Window[T]) mutex(method string, ranks []int, f func(string, []int32) cstatus) error {
	fn := "weft.Window." + method
	r, err := toInt32s(fn, "ranks", ranks)
	if err != nil {
		return err
	}
	data, err := w.ref(method)
	if err != nil {
		return err
	}
	defer unref(data)
	return call(func() cstatus { return f(w.core.name, r) })
}

// Free frees the window (collective) and then its C memory (at once, or when the last
// nonblocking op on it has completed and its Request is freed). Freeing a freed Window is
// a FailedPrecondition error. After Shutdown, which frees every window in weft, Free only
// releases the memory and returns nil.
func (w *Window[T]) Free() error {
	c := w.core
	c.mu.Lock()
	freed := c.data == nil
	c.mu.Unlock()
	if freed {
		return &Error{Status: FailedPrecondition, Message: fmt.Sprintf(
			"weft.Window.Free: the window '%s' has been freed already", c.name)}
	}
	liveWindows.Lock()
	live := liveWindows.byName[c.name] == c
	liveWindows.Unlock()
	if live && IsInitialized() {
		err := call(func() cstatus { return cweft.Weft_win_free(c.name) })
		// NotFound: weft has no such window any more (a Shutdown and Init since).
		if err != nil && StatusOf(err) != NotFound {
			return err
		}
	}
	c.release()
	return nil
}

// WinFreeAll frees every window (collective), as Free does for each.
func WinFreeAll() error {
	if IsInitialized() {
		if err := call(func() cstatus { return cweft.Weft_win_free("") }); err != nil {
			return err
		}
	}
	liveWindows.Lock()
	cores := make([]*winCore, 0, len(liveWindows.byName))
	for _, c := range liveWindows.byName {
		cores = append(cores, c)
	}
	liveWindows.Unlock()
	for _, c := range cores {
		c.release()
	}
	return nil
}

// release drops the Window's reference to its memory and its registration.
func (c *winCore) release() {
	liveWindows.Lock()
	if liveWindows.byName[c.name] == c {
		delete(liveWindows.byName, c.name)
	}
	liveWindows.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.data != nil {
		cweft.Weftgo_shared_unref(c.data)
		c.data = nil
	}
}
