#include "pipe/cache/spill_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/codec.h"

namespace weft {
namespace pipe {
namespace spill {
namespace {

constexpr char kMagic[4] = {'W', 'F', 'T', 'C'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxDims = 64;
constexpr char kSuffix[] = ".wact";

std::atomic<uint64_t> g_temp_counter{0};

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

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

Status Corrupt(const std::string& why) { return absl::DataLossError(why); }

}  // namespace

std::string FileName(int depth) { return absl::StrCat(depth, kSuffix); }

int DepthOfFileName(const std::string& name) {
  const size_t suffix_len = sizeof(kSuffix) - 1;
  if (name.size() <= suffix_len ||
      name.compare(name.size() - suffix_len, suffix_len, kSuffix) != 0) {
    return -1;
  }
  const std::string digits = name.substr(0, name.size() - suffix_len);
  int depth;
  if (!IsSampleName(digits) || !absl::SimpleAtoi(digits, &depth)) return -1;
  return depth;
}

bool IsSampleName(const std::string& name) {
  return !name.empty() &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  return names;
}

Status PrepareDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec && !std::filesystem::is_directory(dir, ec) && !ec) {
    ec = std::make_error_code(std::errc::not_a_directory);
  }
  if (ec) {
    return FailedPrecondition("AutoCache spill directory \"", dir,
                              "\" cannot be created: ", ErrnoText(ec.value()));
  }
  const std::string probe =
      absl::StrCat(dir, "/.weft-probe.", getpid(), ".", g_temp_counter.fetch_add(1));
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
    return FailedPrecondition("AutoCache spill directory \"", dir,
                              "\" is not writable: ", ErrnoText(err));
  }
  return OkStatus();
}

std::optional<uint64_t> ByteCount(absl::Span<const int64_t> shape, size_t itemsize) {
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

Status Write(const std::string& sample_dir, const std::string& path, int64_t sample, int depth,
             DType dtype, const std::vector<int64_t>& shape, const void* data, size_t nbytes) {
  if (mkdir(sample_dir.c_str(), 0777) != 0 && errno != EEXIST) {
    return Internal("cannot create spill directory \"", sample_dir, "\": ", ErrnoText(errno),
                    "; entry (sample ", sample, ", depth ", depth, ") dropped");
  }
  std::string header;
  codec::Writer w(&header);
  w.Bytes(kMagic, 4);
  w.Put(kVersion);
  w.Put(static_cast<uint64_t>(sample));
  w.Put(static_cast<uint32_t>(depth));
  w.Put(static_cast<uint8_t>(dtype));
  w.Bytes("\0\0\0", 3);
  w.Put(static_cast<uint32_t>(shape.size()));
  for (int64_t d : shape) w.Put(static_cast<uint64_t>(d));
  w.Put(static_cast<uint64_t>(nbytes));
  w.Put(codec::Crc32(data, nbytes));
  w.Put(codec::Crc32(header.data(), header.size()));

  const std::string temp = absl::StrCat(sample_dir, "/.", depth, kSuffix, ".tmp.", getpid(), ".",
                                        g_temp_counter.fetch_add(1));
  int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Internal("cannot create spill file \"", temp, "\": ", ErrnoText(errno),
                    "; entry dropped");
  }
  int err = 0;
  bool ok = WriteAll(fd, reinterpret_cast<const uint8_t*>(header.data()), header.size(), &err) &&
            WriteAll(fd, static_cast<const uint8_t*>(data), nbytes, &err);
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
    return Internal("cannot write spill file \"", path, "\": ", ErrnoText(err), "; entry dropped");
  }
  return OkStatus();
}

StatusOr<Contents> Read(const std::string& path, int64_t sample, int depth) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(path);  // absent: an ordinary miss
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
  if (!read_ok) return Corrupt("cannot stat it");
  codec::Reader in(absl::string_view(reinterpret_cast<const char*>(file.data()), file.size()),
                   "spill file");
  char magic[4];
  uint32_t version = 0, file_depth = 0, ndim = 0, payload_crc = 0, header_crc = 0;
  uint64_t file_sample = 0, nbytes = 0;
  uint8_t dtype = 0;
  char pad[3];
  Status read = in.Bytes("the magic", magic, 4);
  if (read.ok() && std::memcmp(magic, kMagic, 4) != 0) {
    return Corrupt("not a weft cache file: bad magic");
  }
  if (read.ok()) read = in.Get("the version", &version);
  if (read.ok() && version != kVersion) {
    return Corrupt(absl::StrCat("version ", version, ", expected ", kVersion));
  }
  if (read.ok()) read = in.Get("the sample", &file_sample);
  if (read.ok()) read = in.Get("the depth", &file_depth);
  if (read.ok()) read = in.Get("the dtype", &dtype);
  if (read.ok()) read = in.Bytes("the padding", pad, 3);
  if (read.ok()) read = in.Count("ndim", 8, 8 + 4 + 4, &ndim);
  if (!read.ok()) return absl::DataLossError(read.message());
  if (static_cast<int64_t>(file_sample) != sample || static_cast<int>(file_depth) != depth) {
    return Corrupt(absl::StrCat("holds sample ", static_cast<int64_t>(file_sample), " depth ",
                                static_cast<int>(file_depth)));
  }
  if (dtype >= kNumDTypes || pad[0] != 0 || pad[1] != 0 || pad[2] != 0) {
    return Corrupt("bad dtype");
  }
  if (ndim > kMaxDims) return Corrupt(absl::StrCat(ndim, " dims"));
  Contents entry;
  entry.dtype = static_cast<DType>(dtype);
  entry.shape.resize(ndim);
  for (int64_t& d : entry.shape) {
    if (read.ok()) read = in.Get("a dim", &d);
  }
  if (read.ok()) read = in.Get("the byte count", &nbytes);
  if (read.ok()) read = in.Get("the payload checksum", &payload_crc);
  const size_t header_size = in.pos();
  if (read.ok()) read = in.Get("the header checksum", &header_crc);
  if (!read.ok()) return absl::DataLossError(read.message());
  if (codec::Crc32(file.data(), header_size) != header_crc) {
    return Corrupt("header checksum mismatch");
  }
  std::optional<uint64_t> expected = ByteCount(entry.shape, DTypeSize(entry.dtype));
  if (!expected.has_value() || *expected != nbytes || nbytes == 0) {
    return Corrupt("shape, dtype and byte count disagree");
  }
  if (in.remaining() != nbytes) {
    return Corrupt(
        absl::StrCat("truncated or padded: ", file.size(), " bytes, expected ", in.pos() + nbytes));
  }
  if (codec::Crc32(file.data() + in.pos(), nbytes) != payload_crc) {
    return Corrupt("payload checksum mismatch");
  }
  // Reuse the buffer read from the file (no second copy of the payload).
  file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(in.pos()));
  entry.bytes = std::make_shared<const std::vector<uint8_t>>(std::move(file));
  return entry;
}

}  // namespace spill
}  // namespace pipe
}  // namespace weft
