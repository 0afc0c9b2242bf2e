// AutoCache's spill files: one activation per file, "<dir>/<sample>/<depth>.wact", written
// atomically (a temporary file renamed into place) and checked when read. Version 1,
// little-endian (core/codec.h):
//   "WFTC" | u32 version | i64 sample | i32 depth | u8 dtype | 3 zero bytes | u32 ndim |
//   i64 shape[ndim] | u64 nbytes | u32 CRC-32 of the payload | u32 CRC-32 of the header
//   so far | payload (nbytes, row-major).
// Two checksums, so that neither the writer nor the reader copies the payload to checksum
// header and payload together. Pure file handling: the cache's state stays in cache.cc.
#ifndef WEFT_PIPE_CACHE_SPILL_FILE_H_
#define WEFT_PIPE_CACHE_SPILL_FILE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace weft {
namespace pipe {
namespace spill {

// "<depth>.wact".
std::string FileName(int depth);
// The depth in a spill file's name, or -1 for any other name.
int DepthOfFileName(const std::string& name);
// Whether a directory entry's name is a sample id (all digits).
bool IsSampleName(const std::string& name);
// The names in `dir` ("." and ".." aside); empty when it cannot be read.
std::vector<std::string> ListDir(const std::string& dir);

// Creates `dir` (and its parents) and checks that a file can be written in it; the
// FailedPrecondition says which of the two failed, with the system's reason.
Status PrepareDir(const std::string& dir);

// Writes the file `path` in `sample_dir` (created if needed) for (sample, depth). The
// Internal error names the file and the system's reason; nothing is left half written.
Status Write(const std::string& sample_dir, const std::string& path, int64_t sample, int depth,
             DType dtype, const std::vector<int64_t>& shape, const void* data, size_t nbytes);

struct Contents {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::shared_ptr<const std::vector<uint8_t>> bytes;  // the payload
};
// Reads and checks the file for (sample, depth): NotFound when there is none, DataLoss
// saying what is wrong when it is damaged, truncated or holds another entry.
StatusOr<Contents> Read(const std::string& path, int64_t sample, int depth);

// Product of the dims times itemsize, or nullopt on a negative dim or overflow.
std::optional<uint64_t> ByteCount(absl::Span<const int64_t> shape, size_t itemsize);

}  // namespace spill
}  // namespace pipe
}  // namespace weft

#endif  // WEFT_PIPE_CACHE_SPILL_FILE_H_
