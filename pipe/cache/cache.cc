#include "pipe/cache/cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/logging.h"
#include "pipe/cache/spill_file.h"

namespace weft {
namespace pipe {
namespace {

const config::IntSetting kCacheBytes(
    "WEFT_CACHE_BYTES", int64_t{1} << 30,
    "AutoCache: bytes of frozen-prefix activations kept in host memory per cache, least "
    "recently used evicted first (to the spill directory when one is set). 0 keeps nothing "
    "in memory.",
    /*min=*/0);

// Copies a (possibly strided) tensor element by element, row-major order; strides in
// elements. The contiguous case is one memcpy.
void CopyStrided(const uint8_t* src, absl::Span<const int64_t> src_strides, uint8_t* dst,
                 absl::Span<const int64_t> dst_strides, absl::Span<const int64_t> shape,
                 size_t itemsize, size_t nbytes, bool src_contiguous, bool dst_contiguous) {
  if (src_contiguous && dst_contiguous) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  const int ndim = static_cast<int>(shape.size());
  std::vector<int64_t> index(ndim, 0);
  const int64_t item = static_cast<int64_t>(itemsize);
  const size_t count = nbytes / itemsize;
  for (size_t n = 0; n < count; ++n) {
    int64_t src_off = 0, dst_off = 0;
    for (int i = 0; i < ndim; ++i) {
      src_off += index[i] * src_strides[i];
      dst_off += index[i] * dst_strides[i];
    }
    std::memcpy(dst + dst_off * item, src + src_off * item, itemsize);
    for (int i = ndim - 1; i >= 0; --i) {
      if (++index[i] < shape[i]) break;
      index[i] = 0;
    }
  }
}

Status CheckKey(const char* what, int64_t sample, int depth) {
  if (sample < 0) {
    return InvalidArgument(what, ": sample id must be >= 0, found ", sample,
                           ": pass the dataset index of the sample");
  }
  if (depth < 0) {
    return InvalidArgument(what, ": depth must be >= 0 (the number of frozen layers the "
                           "activation comes out of), found ", depth);
  }
  return OkStatus();
}

}  // namespace

StatusOr<size_t> DefaultCacheBudgetBytes() {
  int64_t bytes = kCacheBytes.Get();
  if (bytes < 0) {
    return InvalidArgument("WEFT_CACHE_BYTES must be >= 0 (bytes of activations kept in "
                           "memory; 0 keeps none), found ", bytes);
  }
  return static_cast<size_t>(bytes);
}

// ---------------------------------------------------------------------------------------
// Entry

TensorView ActivationCache::Entry::view() const {
  return TensorView(const_cast<void*>(data()), dtype, shape);
}

Status ActivationCache::Entry::CopyTo(const TensorView& dst) const {
  if (dst.device() != Device::CPU()) {
    return InvalidArgument("cached activation: the destination must be a CPU view, found ",
                           dst.ToString(), ": copy into host memory, then to the device");
  }
  if (dst.dtype() != dtype || dst.shape() != shape) {
    return InvalidArgument("cached activation (depth ", depth, "): expected a destination of ",
                           DTypeName(dtype), ShapeToString(shape), ", found ",
                           DTypeName(dst.dtype()), ShapeToString(dst.shape()));
  }
  if (nbytes() == 0) return OkStatus();
  if (dst.data() == nullptr || static_cast<int>(dst.strides().size()) != dst.ndim()) {
    return InvalidArgument("cached activation: the destination view is undefined (",
                           dst.ToString(), ")");
  }
  CopyStrided(bytes->data(), ContiguousStrides(shape), static_cast<uint8_t*>(dst.data()),
              dst.strides(), shape, DTypeSize(dtype), nbytes(), true, dst.is_contiguous());
  return OkStatus();
}

// ---------------------------------------------------------------------------------------
// Creation

StatusOr<std::unique_ptr<ActivationCache>> ActivationCache::Create(Options options) {
  if (options.random_augmentation) {
    if (options.on_augmentation == OnAugmentation::kRefuse) {
      return FailedPrecondition(
          "AutoCache refused: the data pipeline declares random augmentation, so a "
          "sample's frozen-prefix output differs every epoch and a cached activation would "
          "feed the trainable layers another epoch's input. Set "
          "Options::on_augmentation = kBypass to train without the cache, or apply the "
          "augmentation after the frozen prefix (or disable it) and clear "
          "Options::random_augmentation");
    }
    WEFT_LOG(Warning) << "AutoCache bypassed: the data pipeline declares random "
                         "augmentation, so frozen-prefix outputs are recomputed every epoch";
    return std::unique_ptr<ActivationCache>(new ActivationCache(0, "", /*bypassed=*/true));
  }

  size_t budget;
  if (options.budget_bytes.has_value()) {
    budget = *options.budget_bytes;
  } else {
    WEFT_ASSIGN_OR_RETURN(budget, DefaultCacheBudgetBytes());
  }

  std::string dir = options.spill_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!dir.empty()) {
    const std::string advice =
        ": set Options::spill_dir to a writable directory on local disk, or leave it empty "
        "to drop evicted entries instead of spilling them";
    if (Status prepared = spill::PrepareDir(dir); !prepared.ok()) {
      return FailedPrecondition(prepared.message(), advice);
    }
  }
  return std::unique_ptr<ActivationCache>(
      new ActivationCache(budget, dir, false, options.write_through && !dir.empty()));
}

ActivationCache::ActivationCache(size_t budget_bytes, std::string spill_dir, bool bypassed,
                                 bool write_through)
    : budget_bytes_(budget_bytes),
      spill_dir_(std::move(spill_dir)),
      bypassed_(bypassed),
      write_through_(write_through) {}

ActivationCache::~ActivationCache() = default;

bool ActivationCache::enabled() const {
  return !bypassed_ && (budget_bytes_ > 0 || !spill_dir_.empty());
}

std::string ActivationCache::SpillPath(int64_t sample, int depth) const {
  if (spill_dir_.empty()) return "";
  return absl::StrCat(spill_dir_, "/", sample, "/", spill::FileName(depth));
}

ActivationCache::Stats ActivationCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.entries_in_memory = static_cast<int64_t>(memory_.size());
  s.bytes_in_memory = bytes_in_memory_;
  return s;
}

// ---------------------------------------------------------------------------------------
// Put / Get

Status ActivationCache::Put(int64_t sample, int depth, const TensorView& activation) {
  WEFT_RETURN_IF_ERROR(CheckKey("ActivationCache::Put", sample, depth));
  if (activation.data() == nullptr) {
    return InvalidArgument("ActivationCache::Put(sample ", sample, ", depth ", depth,
                           "): the activation view is undefined (no data): pass the frozen "
                           "prefix's output");
  }
  if (activation.device() != Device::CPU()) {
    return InvalidArgument("ActivationCache::Put(sample ", sample, ", depth ", depth,
                           "): expected a CPU view, found ", activation.ToString(),
                           ": the cache holds host memory; copy the activation to the host");
  }
  if (static_cast<int>(activation.strides().size()) != activation.ndim()) {
    return InvalidArgument("ActivationCache::Put: the view has ", activation.ndim(),
                           " dims but ", activation.strides().size(), " strides");
  }
  std::optional<uint64_t> nbytes = spill::ByteCount(activation.shape(), activation.itemsize());
  if (!nbytes.has_value() || *nbytes == 0) {
    return InvalidArgument("ActivationCache::Put(sample ", sample, ", depth ", depth,
                           "): expected a non-empty activation, found ",
                           activation.ToString());
  }
  if (!enabled()) return OkStatus();

  Entry entry;
  entry.depth = depth;
  entry.dtype = activation.dtype();
  entry.shape.assign(activation.shape().begin(), activation.shape().end());
  auto bytes = std::make_shared<std::vector<uint8_t>>(*nbytes);
  CopyStrided(static_cast<const uint8_t*>(activation.data()), activation.strides(),
              bytes->data(), ContiguousStrides(entry.shape), entry.shape,
              activation.itemsize(), *nbytes, activation.is_contiguous(), true);
  entry.bytes = std::move(bytes);

  std::lock_guard<std::mutex> lock(mu_);
  const Key key(sample, depth);
  auto it = memory_.find(key);
  if (it != memory_.end()) {
    // Replaced: a spill file holding the old bytes is stale.
    if (it->second.on_disk) RemoveSpill(key);
    EraseFromMemory(it);
  }
  bool on_disk = false;
  if (write_through_) {
    // A failed write only loses sharing: warn and keep the entry in memory.
    const Status status = WriteSpill(key, entry);
    if (!status.ok()) WEFT_LOG(Warning) << "AutoCache: " << status.message();
    on_disk = status.ok();
  }
  Insert(key, std::move(entry), on_disk);
  return OkStatus();
}

StatusOr<std::optional<ActivationCache::Entry>> ActivationCache::Get(int64_t sample,
                                                                     int depth) {
  WEFT_RETURN_IF_ERROR(CheckKey("ActivationCache::Get", sample, depth));
  if (bypassed_) return std::optional<Entry>();
  std::lock_guard<std::mutex> lock(mu_);
  return Lookup(Key(sample, depth), /*exact=*/true);
}

StatusOr<std::optional<ActivationCache::Entry>> ActivationCache::GetDeepestAtMost(
    int64_t sample, int depth) {
  WEFT_RETURN_IF_ERROR(CheckKey("ActivationCache::GetDeepestAtMost", sample, depth));
  if (bypassed_) return std::optional<Entry>();
  std::lock_guard<std::mutex> lock(mu_);
  return Lookup(Key(sample, depth), /*exact=*/false);
}

std::optional<ActivationCache::Entry> ActivationCache::Lookup(const Key& key, bool exact) {
  // Deepest entry in memory at or below key.second.
  std::map<Key, Slot>::iterator in_memory = memory_.end();
  auto after = memory_.upper_bound(key);
  if (after != memory_.begin()) {
    auto prev = std::prev(after);
    if (prev->first.first == key.first && (!exact || prev->first.second == key.second)) {
      in_memory = prev;
    }
  }
  const int memory_depth = in_memory == memory_.end() ? -1 : in_memory->first.second;

  // A deeper entry may sit in the spill directory (evicted, or written by another cache).
  if (!spill_dir_.empty() && memory_depth != key.second) {
    std::vector<int> candidates;
    if (exact) {
      candidates.push_back(key.second);
    } else {
      for (const std::string& name : spill::ListDir(absl::StrCat(spill_dir_, "/", key.first))) {
        int d = spill::DepthOfFileName(name);
        if (d > memory_depth && d <= key.second) candidates.push_back(d);
      }
      std::sort(candidates.rbegin(), candidates.rend());
    }
    for (int d : candidates) {
      std::optional<Entry> entry = ReadSpill(Key(key.first, d));
      if (!entry.has_value()) continue;
      ++stats_.hits;
      ++stats_.disk_hits;
      // Promote; an entry larger than the budget stays on disk only.
      Insert(Key(key.first, d), *entry, /*on_disk=*/true);
      return entry;
    }
  }
  if (in_memory != memory_.end()) {
    ++stats_.hits;
    Touch(in_memory->second);
    return in_memory->second.entry;
  }
  ++stats_.misses;
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------
// Memory and eviction

void ActivationCache::Touch(Slot& slot) { lru_.splice(lru_.begin(), lru_, slot.lru); }

void ActivationCache::Insert(const Key& key, Entry entry, bool on_disk) {
  const size_t nbytes = entry.nbytes();
  if (nbytes > budget_bytes_) {
    // Never held in memory: it would evict everything and still not fit.
    if (!on_disk && !spill_dir_.empty()) {
      Status status = WriteSpill(key, entry);
      if (!status.ok()) WEFT_LOG(Warning) << "AutoCache: " << status.message();
    }
    return;
  }
  auto existing = memory_.find(key);
  if (existing != memory_.end()) EraseFromMemory(existing);
  lru_.push_front(key);
  Slot slot;
  slot.entry = std::move(entry);
  slot.on_disk = on_disk;
  slot.lru = lru_.begin();
  memory_.emplace(key, std::move(slot));
  bytes_in_memory_ += nbytes;
  EvictToBudget();
}

void ActivationCache::EvictToBudget() {
  while (bytes_in_memory_ > budget_bytes_ && !lru_.empty()) {
    const Key victim = lru_.back();
    auto it = memory_.find(victim);
    if (!it->second.on_disk && !spill_dir_.empty()) {
      // A failed spill only loses a cache entry: warn and drop it.
      Status status = WriteSpill(victim, it->second.entry);
      if (!status.ok()) WEFT_LOG(Warning) << "AutoCache: " << status.message();
    }
    ++stats_.evictions;
    EraseFromMemory(it);
  }
}

void ActivationCache::EraseFromMemory(std::map<Key, Slot>::iterator it) {
  bytes_in_memory_ -= it->second.entry.nbytes();
  lru_.erase(it->second.lru);
  memory_.erase(it);
}

// ---------------------------------------------------------------------------------------
// Spill files

Status ActivationCache::WriteSpill(const Key& key, const Entry& entry) {
  const std::string path = SpillPath(key.first, key.second);
  WEFT_RETURN_IF_ERROR(spill::Write(absl::StrCat(spill_dir_, "/", key.first), path, key.first,
                                    key.second, entry.dtype, entry.shape, entry.data(),
                                    entry.nbytes()));
  ++stats_.spills;
  reported_corrupt_.erase(path);
  return OkStatus();
}

std::optional<ActivationCache::Entry> ActivationCache::ReadSpill(const Key& key) {
  const std::string path = SpillPath(key.first, key.second);
  StatusOr<spill::Contents> contents = spill::Read(path, key.first, key.second);
  if (contents.status().code() == absl::StatusCode::kNotFound) return std::nullopt;  // a miss
  if (!contents.ok()) {
    ++stats_.corrupt_files;
    if (reported_corrupt_.insert(path).second) {
      WEFT_LOG(Warning) << "AutoCache: ignoring spill file \"" << path << "\" ("
                        << contents.status().message()
                        << "); treated as a miss, it is rewritten when the entry is next "
                           "spilled";
    }
    return std::nullopt;
  }
  Entry entry;
  entry.depth = key.second;
  entry.dtype = contents->dtype;
  entry.shape = std::move(contents->shape);
  entry.bytes = std::move(contents->bytes);
  return entry;
}

void ActivationCache::RemoveSpill(const Key& key) {
  if (spill_dir_.empty()) return;
  unlink(SpillPath(key.first, key.second).c_str());
}

// ---------------------------------------------------------------------------------------
// Invalidation

void ActivationCache::Invalidate(int64_t sample) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = memory_.lower_bound(Key(sample, 0));
  while (it != memory_.end() && it->first.first == sample) EraseFromMemory(it++);
  if (spill_dir_.empty() || sample < 0) return;
  const std::string sample_dir = absl::StrCat(spill_dir_, "/", sample);
  for (const std::string& name : spill::ListDir(sample_dir)) {
    if (spill::DepthOfFileName(name) >= 0) unlink(absl::StrCat(sample_dir, "/", name).c_str());
  }
  rmdir(sample_dir.c_str());  // fails harmlessly if another cache is writing into it
}

void ActivationCache::Invalidate(int64_t sample, int depth) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = memory_.find(Key(sample, depth));
  if (it != memory_.end()) EraseFromMemory(it);
  if (sample >= 0 && depth >= 0) RemoveSpill(Key(sample, depth));
}

void ActivationCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  memory_.clear();
  lru_.clear();
  bytes_in_memory_ = 0;
  if (spill_dir_.empty()) return;
  for (const std::string& sample : spill::ListDir(spill_dir_)) {
    if (!spill::IsSampleName(sample)) continue;
    const std::string sample_dir = absl::StrCat(spill_dir_, "/", sample);
    for (const std::string& name : spill::ListDir(sample_dir)) {
      if (spill::DepthOfFileName(name) >= 0) unlink(absl::StrCat(sample_dir, "/", name).c_str());
    }
    rmdir(sample_dir.c_str());
  }
}

}  // namespace pipe
}  // namespace weft
