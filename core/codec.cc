#include "core/codec.h"

#include <array>

namespace weft {
namespace codec {

Status Reader::Need(const char* field, size_t n) const {
  if (remaining() < n) {
    return InvalidArgument("truncated ", what_, ": expected ", n, " bytes for ", field,
                           " at offset ", pos_, ", found ", remaining(), " (", bytes_.size(),
                           " bytes in all)");
  }
  return OkStatus();
}

Status Reader::Bytes(const char* field, void* data, size_t size) {
  WEFT_RETURN_IF_ERROR(Need(field, size));
  if (size > 0) std::memcpy(data, bytes_.data() + pos_, size);
  pos_ += size;
  return OkStatus();
}

Status Reader::Str(const char* field, std::string* s) {
  uint32_t n = 0;
  WEFT_RETURN_IF_ERROR(Count(field, 1, /*reserve=*/0, &n));
  s->assign(bytes_.data() + pos_, n);
  pos_ += n;
  return OkStatus();
}

Status Reader::Fits(const char* field, uint64_t n, size_t element_size, size_t reserve) const {
  const size_t room = remaining() >= reserve ? (remaining() - reserve) / element_size : 0;
  if (n > room) {
    return InvalidArgument("truncated or corrupt ", what_, ": ", field, " is ", n, " but only ",
                           remaining(), " bytes remain at offset ", pos_, " (room for ", room,
                           " entries of ", element_size, " bytes and what follows)");
  }
  return OkStatus();
}

Status Reader::Done() const {
  if (remaining() != 0) {
    return InvalidArgument("corrupt ", what_, ": ", remaining(), " trailing byte(s) after ",
                           pos_, " (", bytes_.size(), " bytes in all)");
  }
  return OkStatus();
}

namespace {

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}

}  // namespace

uint32_t Crc32(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

}  // namespace codec
}  // namespace weft
