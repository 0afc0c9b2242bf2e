#include "pipe/cache/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/codec.h"
#include "core/config.h"
#include "core/logging.h"

namespace weft {
namespace pipe {
namespace {

const config::IntSetting kCacheBytes(
    "WEFT_CACHE_BYTES", int64_t{1} << 30,
    "AutoCache: bytes of frozen-prefix activations kept in host memory per cache, least "
    "recently used evicted first (to the spill directory when one is set). 0 keeps nothing "
    "in memory.",
    /*min=*/0);

// Spill file, version 1, little-endian:
//   "WFTC" | u32 version | i64 sample | i32 depth | u8 dtype | 3 zero bytes | u32 ndim |
//   i64 shape[ndim] | u64 nbytes | u32 CRC-32 of the payload | u32 CRC-32 of the header
//   so far | payload (nbytes, row-major).
// Two checksums, so that neither the writer nor the reader copies the payload to
// checksum header and payload together.
constexpr char kMagic[4] = {'W', 'F', 'T', 'C'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxDims = 64;
constexpr char kSuffix[] = ".wact";

std::atomic<uint64_t> g_temp_counter{0};

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

// Product of the dims times itemsize, or nullopt on a negative dim or overflow.
std::optional<uint64_t> ByteCount(const std::vector<int64_t>& shape, size_t itemsize) {
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

// Copies a (possibly strided) tensor element by element, row-major order; strides in
// elements. The contiguous case is one memcpy.
void CopyStrided(const uint8_t* src, const std::vector<int64_t>& src_strides, uint8_t* dst,
                 const std::vector<int64_t>& dst_strides, const std::vector<int64_t>& shape,
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

// mkdir -p; returns the errno of the first failure (0 on success).
int MakeDirs(const std::string& path) {
  if (path.empty()) return ENOENT;
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty() || partial == "/") continue;
    if (mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST) return errno;
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  return 0;
}

bool WriteAll(int fd, const uint8_t* data, size_t size, int* err) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool IsDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Names in `dir` (without "." and ".."); empty if it cannot be opened.
std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  closedir(d);
  return names;
}

// The depth of a spill file name "<depth>.wact", or -1.
int DepthOfFileName(const std::string& name) {
  const size_t suffix_len = sizeof(kSuffix) - 1;
  if (name.size() <= suffix_len || name.compare(name.size() - suffix_len, suffix_len, kSuffix) != 0) {
    return -1;
  }
  std::string digits = name.substr(0, name.size() - suffix_len);
  int depth;
  if (!IsDigits(digits) || !absl::SimpleAtoi(digits, &depth)) return -1;
  return depth;
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
    if (int err = MakeDirs(dir)) {
      return FailedPrecondition("AutoCache spill directory \"", dir,
                                "\" cannot be created: ", ErrnoText(err), advice);
    }
    std::string probe = absl::StrCat(dir, "/.weft-probe.", getpid(), ".",
                                      g_temp_counter.fetch_add(1));
    int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int err = 0;
    const uint8_t byte = 0;
    if (fd < 0) {
      err = errno;
    } else {
      WriteAll(fd, &byte, 1, &err);  // sets err on failure
      if (close(fd) != 0 && err == 0) err = errno;
      unlink(probe.c_str());
    }
    if (err != 0) {
      return FailedPrecondition("AutoCache spill directory \"", dir, "\" is not writable: ",
                                ErrnoText(err), advice);
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
  return absl::StrCat(spill_dir_, "/", sample, "/", depth, kSuffix);
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
  std::optional<uint64_t> nbytes = ByteCount(activation.shape(), activation.itemsize());
  if (!nbytes.has_value() || *nbytes == 0) {
    return InvalidArgument("ActivationCache::Put(sample ", sample, ", depth ", depth,
                           "): expected a non-empty activation, found ",
                           activation.ToString());
  }
  if (!enabled()) return OkStatus();

  Entry entry;
  entry.depth = depth;
  entry.dtype = activation.dtype();
  entry.shape = activation.shape();
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
      for (const std::string& name : ListDir(absl::StrCat(spill_dir_, "/", key.first))) {
        int d = DepthOfFileName(name);
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
  const std::string sample_dir = absl::StrCat(spill_dir_, "/", key.first);
  if (mkdir(sample_dir.c_str(), 0777) != 0 && errno != EEXIST) {
    return Internal("cannot create spill directory \"", sample_dir, "\": ", ErrnoText(errno),
                    "; entry (sample ", key.first, ", depth ", key.second, ") dropped");
  }
  std::string header;
  codec::Writer w(&header);
  w.Bytes(kMagic, 4);
  w.Put(kVersion);
  w.Put(static_cast<uint64_t>(key.first));
  w.Put(static_cast<uint32_t>(key.second));
  w.Put(static_cast<uint8_t>(entry.dtype));
  w.Bytes("\0\0\0", 3);
  w.Put(static_cast<uint32_t>(entry.shape.size()));
  for (int64_t d : entry.shape) w.Put(static_cast<uint64_t>(d));
  w.Put(static_cast<uint64_t>(entry.nbytes()));
  w.Put(codec::Crc32(entry.data(), entry.nbytes()));
  w.Put(codec::Crc32(header.data(), header.size()));

  const std::string path = SpillPath(key.first, key.second);
  const std::string temp = absl::StrCat(sample_dir, "/.", key.second, kSuffix, ".tmp.",
                                        getpid(), ".", g_temp_counter.fetch_add(1));
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Internal("cannot create spill file \"", temp, "\": ", ErrnoText(errno),
                    "; entry dropped");
  }
  int err = 0;
  bool ok = WriteAll(fd, reinterpret_cast<const uint8_t*>(header.data()), header.size(), &err) &&
            WriteAll(fd, static_cast<const uint8_t*>(entry.data()), entry.nbytes(), &err);
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  // rename() is atomic: a reader sees the old file, no file, or the whole new one.
  if (ok && rename(temp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    unlink(temp.c_str());
    return Internal("cannot write spill file \"", path, "\": ", ErrnoText(err),
                    "; entry dropped");
  }
  ++stats_.spills;
  reported_corrupt_.erase(path);
  return OkStatus();
}

std::optional<ActivationCache::Entry> ActivationCache::ReadSpill(const Key& key) {
  const std::string path = SpillPath(key.first, key.second);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;  // absent: an ordinary miss
  std::vector<uint8_t> file;
  struct stat st;
  bool read_ok = fstat(fd, &st) == 0 && st.st_size >= 0;
  if (read_ok) {
    file.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < file.size()) {
      ssize_t n = read(fd, file.data() + got, file.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    file.resize(got);
  }
  close(fd);

  auto corrupt = [&](const std::string& why) -> std::optional<Entry> {
    ++stats_.corrupt_files;
    if (reported_corrupt_.insert(path).second) {
      WEFT_LOG(Warning) << "AutoCache: ignoring spill file \"" << path << "\" (" << why
                        << "); treated as a miss, it is rewritten when the entry is next "
                           "spilled";
    }
    return std::nullopt;
  };
  if (!read_ok) return corrupt("cannot stat it");
  codec::Reader in(absl::string_view(reinterpret_cast<const char*>(file.data()), file.size()),
                   "spill file");
  char magic[4];
  uint32_t version = 0, depth = 0, ndim = 0, payload_crc = 0, header_crc = 0;
  uint64_t sample = 0, nbytes = 0;
  uint8_t dtype = 0;
  char pad[3];
  Status read = in.Bytes("the magic", magic, 4);
  if (read.ok() && std::memcmp(magic, kMagic, 4) != 0) {
    return corrupt("not a weft cache file: bad magic");
  }
  if (read.ok()) read = in.Get("the version", &version);
  if (read.ok() && version != kVersion) {
    return corrupt(absl::StrCat("version ", version, ", expected ", kVersion));
  }
  if (read.ok()) read = in.Get("the sample", &sample);
  if (read.ok()) read = in.Get("the depth", &depth);
  if (read.ok()) read = in.Get("the dtype", &dtype);
  if (read.ok()) read = in.Bytes("the padding", pad, 3);
  if (read.ok()) read = in.Count("ndim", 8, 8 + 4 + 4, &ndim);
  if (!read.ok()) return corrupt(std::string(read.message()));
  if (static_cast<int64_t>(sample) != key.first || static_cast<int>(depth) != key.second) {
    return corrupt(absl::StrCat("holds sample ", static_cast<int64_t>(sample), " depth ",
                                static_cast<int>(depth)));
  }
  if (dtype >= kNumDTypes || pad[0] != 0 || pad[1] != 0 || pad[2] != 0) {
    return corrupt("bad dtype");
  }
  if (ndim > kMaxDims) return corrupt(absl::StrCat(ndim, " dims"));
  Entry entry;
  entry.depth = static_cast<int>(depth);
  entry.dtype = static_cast<DType>(dtype);
  entry.shape.resize(ndim);
  for (int64_t& d : entry.shape) {
    if (read.ok()) read = in.Get("a dim", &d);
  }
  if (read.ok()) read = in.Get("the byte count", &nbytes);
  if (read.ok()) read = in.Get("the payload checksum", &payload_crc);
  const size_t header_size = in.pos();
  if (read.ok()) read = in.Get("the header checksum", &header_crc);
  if (!read.ok()) return corrupt(std::string(read.message()));
  if (codec::Crc32(file.data(), header_size) != header_crc) {
    return corrupt("header checksum mismatch");
  }
  std::optional<uint64_t> expected = ByteCount(entry.shape, DTypeSize(entry.dtype));
  if (!expected.has_value() || *expected != nbytes || nbytes == 0) {
    return corrupt("shape, dtype and byte count disagree");
  }
  if (in.remaining() != nbytes) {
    return corrupt(
        absl::StrCat("truncated or padded: ", file.size(), " bytes, expected ", in.pos() + nbytes));
  }
  if (codec::Crc32(file.data() + in.pos(), nbytes) != payload_crc) {
    return corrupt("payload checksum mismatch");
  }
  // Reuse the buffer read from the file (no second copy of the payload).
  file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(in.pos()));
  entry.bytes = std::make_shared<const std::vector<uint8_t>>(std::move(file));
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
  for (const std::string& name : ListDir(sample_dir)) {
    if (DepthOfFileName(name) >= 0) unlink(absl::StrCat(sample_dir, "/", name).c_str());
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
  for (const std::string& sample : ListDir(spill_dir_)) {
    if (!IsDigits(sample)) continue;
    const std::string sample_dir = absl::StrCat(spill_dir_, "/", sample);
    for (const std::string& name : ListDir(sample_dir)) {
      if (DepthOfFileName(name) >= 0) unlink(absl::StrCat(sample_dir, "/", name).c_str());
    }
    rmdir(sample_dir.c_str());
  }
}

}  // namespace pipe
}  // namespace weft
