// AutoCache storage: the output of the frozen prefix, per sample and frozen depth.
//
// While layers 0 .. F-1 are frozen, a sample's activation after them is the same every
// epoch (when its input is), so it can be computed once and reused. When more layers
// freeze (F grows), GetDeepestAtMost(sample, F) returns the deepest cached depth d <= F and
// the caller runs only layers d .. F-1 on it before Put(sample, F, ...).
//
//   ActivationCache::Options options;
//   options.spill_dir = "/local/scratch/weft-cache";   // optional
//   WEFT_ASSIGN_OR_RETURN(auto cache, ActivationCache::Create(options));
//   WEFT_ASSIGN_OR_RETURN(auto hit, cache->GetDeepestAtMost(sample, frozen));
//   ... run layers (hit ? hit->depth : 0) .. frozen - 1, then
//   WEFT_RETURN_IF_ERROR(cache->Put(sample, frozen, activation));
//
// Storage: host memory up to a byte budget (WEFT_CACHE_BYTES), least recently used
// entries evicted first; evicted entries are written to the spill directory when one is
// set (one file per entry, written atomically), else dropped. Lookups check memory, then
// the spill directory, where files written by any cache on the machine count: replicas on
// one machine share entries by giving their caches the same spill directory.
//
// Pure C++ over core/: no LibTorch, no MPI. Entries are bytes with a dtype and shape.
#ifndef WEFT_PIPE_CACHE_CACHE_H_
#define WEFT_PIPE_CACHE_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace pipe {

// The value of WEFT_CACHE_BYTES (default 1 GiB), or an error if it is negative.
StatusOr<size_t> DefaultCacheBudgetBytes();

class ActivationCache {
 public:
  enum class OnAugmentation {
    kRefuse,  // Create fails: caching would return another epoch's activations
    kBypass,  // Create succeeds with a cache that never stores and never hits
  };

  struct Options {
    // Bytes of activation data kept in memory (headers and bookkeeping not counted).
    // Unset: WEFT_CACHE_BYTES. 0: nothing in memory; the cache is disabled, or spill-only
    // when spill_dir is set (every Put writes a file, every Get reads one).
    std::optional<size_t> budget_bytes;
    // Directory for evicted entries, created if missing; empty: no spilling.
    std::string spill_dir;
    // With spill_dir: every Put also writes its file at once (not only on eviction), so
    // that the other caches sharing the directory (the replicas on this machine) find the
    // entry right away. Costs a file write per Put.
    bool write_through = false;
    // Set when the data pipeline applies random augmentation before (or inside) the frozen
    // prefix: a sample's frozen-prefix output then differs every epoch.
    bool random_augmentation = false;
    OnAugmentation on_augmentation = OnAugmentation::kRefuse;
  };

  // A cached activation. The bytes are immutable and shared: an entry stays valid after
  // the cache evicts or drops it (the budget counts only what the cache holds).
  struct Entry {
    int depth = 0;  // frozen depth the activation was computed at
    DType dtype = DType::kFloat32;
    std::vector<int64_t> shape;
    std::shared_ptr<const std::vector<uint8_t>> bytes;  // row-major, contiguous

    size_t nbytes() const { return bytes ? bytes->size() : 0; }
    const void* data() const { return bytes ? bytes->data() : nullptr; }
    // A read-only CPU view of the bytes (do not write through it); valid while this entry
    // (or a copy of it) lives.
    TensorView view() const;
    // Copies into `dst`: a CPU view of the same dtype and shape, any strides.
    Status CopyTo(const TensorView& dst) const;
  };

  struct Stats {
    int64_t hits = 0;          // Get/GetDeepestAtMost calls that found an entry
    int64_t misses = 0;        // ... that found none
    int64_t disk_hits = 0;     // hits served from the spill directory (included in hits)
    int64_t evictions = 0;     // entries removed from memory to stay within the budget
    int64_t spills = 0;        // spill files written
    int64_t corrupt_files = 0; // spill files found corrupt or truncated (read as misses)
    int64_t entries_in_memory = 0;
    size_t bytes_in_memory = 0;
    double hit_rate() const {
      return hits + misses == 0 ? 0.0
                                : static_cast<double>(hits) / static_cast<double>(hits + misses);
    }
  };

  // Validates the options: a negative WEFT_CACHE_BYTES, a spill directory that cannot be
  // created or written, or random augmentation with kRefuse are errors here, not later.
  static StatusOr<std::unique_ptr<ActivationCache>> Create(Options options);

  ~ActivationCache();
  ActivationCache(const ActivationCache&) = delete;
  ActivationCache& operator=(const ActivationCache&) = delete;

  // Stores a copy of `activation` (a defined, non-empty CPU view; any strides) as the
  // output of the first `depth` layers for `sample`, replacing an earlier entry for that
  // key. Errors: negative sample or depth, an undefined, empty or non-CPU view. A spill
  // write that fails (disk full) is a logged warning and the entry is dropped: a cache may
  // always forget. A bypassed or disabled cache accepts and discards.
  Status Put(int64_t sample, int depth, const TensorView& activation);

  // The entry for exactly (sample, depth), or nullopt.
  StatusOr<std::optional<Entry>> Get(int64_t sample, int depth);
  // The entry for the deepest cached depth <= `depth` (memory or spill directory), or
  // nullopt; Entry::depth says which.
  StatusOr<std::optional<Entry>> GetDeepestAtMost(int64_t sample, int depth);

  // Drops the entries of `sample` (every depth, or one), in memory and in the spill
  // directory (which other caches sharing the directory then miss too).
  void Invalidate(int64_t sample);
  void Invalidate(int64_t sample, int depth);
  // Drops every entry, in memory and the spill files of the spill directory.
  void Clear();

  Stats stats() const;
  bool bypassed() const { return bypassed_; }
  // False when nothing can ever be stored: bypassed, or budget 0 with no spill directory.
  bool enabled() const;
  size_t budget_bytes() const { return budget_bytes_; }
  const std::string& spill_dir() const { return spill_dir_; }

  // The spill file of (sample, depth): <spill_dir>/<sample>/<depth>.wact ("" without a
  // spill directory). For tests and tools.
  std::string SpillPath(int64_t sample, int depth) const;

 private:
  using Key = std::pair<int64_t, int>;  // (sample, depth)
  struct Slot {
    Entry entry;
    bool on_disk = false;  // a spill file with these bytes exists: eviction need not write
    std::list<Key>::iterator lru;  // position in lru_ (front: most recently used)
  };

  ActivationCache(size_t budget_bytes, std::string spill_dir, bool bypassed,
                  bool write_through = false);

  // All private members below expect mu_ held.
  std::optional<Entry> Lookup(const Key& key, bool exact);
  void Touch(Slot& slot);
  // Inserts into memory (or, when larger than the budget, only onto disk) and evicts
  // least recently used entries until bytes_in_memory_ <= budget_bytes_.
  // A failed spill write is a warning: the entry is dropped, as without a spill directory.
  void Insert(const Key& key, Entry entry, bool on_disk);
  void EvictToBudget();
  void EraseFromMemory(std::map<Key, Slot>::iterator it);
  Status WriteSpill(const Key& key, const Entry& entry);
  // A miss (nullopt) when the file is absent, unreadable, corrupt or truncated.
  std::optional<Entry> ReadSpill(const Key& key);
  void RemoveSpill(const Key& key);

  const size_t budget_bytes_;
  const std::string spill_dir_;
  const bool bypassed_;
  const bool write_through_;

  mutable std::mutex mu_;
  std::map<Key, Slot> memory_;
  std::list<Key> lru_;
  size_t bytes_in_memory_ = 0;
  Stats stats_;
  std::set<std::string> reported_corrupt_;  // files already warned about
  uint64_t temp_counter_ = 0;
};

}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_CACHE_CACHE_H_
