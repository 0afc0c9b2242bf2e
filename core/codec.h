// The one byte codec of weft's wire and file formats: fixed-width little-endian values
// (Writer, Reader), the CRC-32 that guards messages and files, and a 64-bit FNV-1a
// fingerprint that is the same on every process and platform (unlike std::hash). Used by
// the engine's negotiation protocol (comm/protocol.cc), the elastic trainer's transition
// message (pipe/plan) and AutoCache's spill files (pipe/cache).
#ifndef WEFT_CORE_CODEC_H_
#define WEFT_CORE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/status.h"

namespace weft {
namespace codec {

namespace internal {
// The unsigned integer a value travels as: integers and enums as themselves, bool as one
// byte, float and double as their IEEE-754 bits.
template <typename T>
using Bits = std::conditional_t<sizeof(T) == 1, uint8_t,
                                std::conditional_t<sizeof(T) == 2, uint16_t,
                                                   std::conditional_t<sizeof(T) == 4, uint32_t,
                                                                      uint64_t>>>;
template <typename T>
Bits<T> ToBits(T v) {
  static_assert(std::is_arithmetic<T>::value || std::is_enum<T>::value,
                "codec: integers, enums, bool and floating point only");
  static_assert(sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8,
                "codec: 1, 2, 4 or 8 bytes");
  Bits<T> bits;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}
template <typename T>
T FromBits(Bits<T> bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
}  // namespace internal

// Appends values to a byte string.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  template <typename T>
  void Put(T v) {
    const auto bits = internal::ToBits(v);
    for (size_t i = 0; i < sizeof(T); ++i) {
      out_->push_back(static_cast<char>((bits >> (8 * i)) & 0xFFu));
    }
  }
  void Bytes(const void* data, size_t size) {
    out_->append(static_cast<const char*>(data), size);
  }
  // A u32 length, then the bytes.
  void Str(absl::string_view s) {
    Put(static_cast<uint32_t>(s.size()));
    out_->append(s.data(), s.size());
  }
  // A u32 count, then each element (of a std::vector or absl::InlinedVector).
  template <typename C>
  void Vec(const C& v) {
    Put(static_cast<uint32_t>(v.size()));
    for (const auto& x : v) Put(x);
  }

 private:
  std::string* out_;
};

// Reads what a Writer wrote. A read past the end, a string or vector longer than what
// remains, and trailing bytes are InvalidArgument errors naming the message (`what`), the
// field and the offset.
class Reader {
 public:
  Reader(absl::string_view bytes, const char* what) : bytes_(bytes), what_(what) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  Status Get(const char* field, T* v) {
    if (remaining() < sizeof(T)) {
      *v = T();                       // defined on failure too
      return Need(field, sizeof(T));  // the error
    }
    Decode(v);
    return OkStatus();
  }
  Status Bytes(const char* field, void* data, size_t size);
  Status Str(const char* field, std::string* s);
  template <typename C>
  Status Vec(const char* field, C* v) {
    using T = typename C::value_type;
    uint32_t n = 0;
    WEFT_RETURN_IF_ERROR(Count(field, sizeof(T), /*reserve=*/0, &n));
    v->resize(n);
    for (T& x : *v) Decode(&x);  // Count checked that all n fit
    return OkStatus();
  }
  // A count (uint32_t, or int32_t where the format writes it signed: a negative one is an
  // error) of elements of at least `element_size` bytes each, which must fit in what
  // remains after keeping `reserve` bytes for what follows: garbage cannot turn into a huge
  // allocation.
  template <typename T>
  Status Count(const char* field, size_t element_size, size_t reserve, T* n) {
    static_assert(std::is_same<T, uint32_t>::value || std::is_same<T, int32_t>::value,
                  "codec: counts are uint32_t or int32_t");
    WEFT_RETURN_IF_ERROR(Get(field, n));
    if constexpr (std::is_signed<T>::value) {
      if (*n < 0) {
        return InvalidArgument("corrupt ", what_, ": ", field, " is ", *n,
                               ", expected a count >= 0");
      }
    }
    return Fits(field, static_cast<uint64_t>(*n), element_size, reserve);
  }
  // OK when every byte was read.
  Status Done() const;

 private:
  // Reads one value at pos_, which the caller checked fits.
  template <typename T>
  void Decode(T* v) {
    internal::Bits<T> bits = 0;
    for (size_t i = 0; i < sizeof(T); ++i) {
      bits |= static_cast<internal::Bits<T>>(static_cast<unsigned char>(bytes_[pos_ + i]))
              << (8 * i);
    }
    pos_ += sizeof(T);
    if constexpr (std::is_same<T, bool>::value) {
      *v = bits != 0;  // any other byte would not be a valid bool
    } else {
      *v = internal::FromBits<T>(bits);
    }
  }
  Status Need(const char* field, size_t n) const;
  Status Fits(const char* field, uint64_t n, size_t element_size, size_t reserve) const;

  absl::string_view bytes_;
  const char* what_;
  size_t pos_ = 0;
};

// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320: zlib's crc32()).
uint32_t Crc32(const void* data, size_t size);

// 64-bit FNV-1a over values as a Writer would encode them.
class Fingerprint {
 public:
  template <typename T>
  Fingerprint& Put(T v) {
    const auto bits = internal::ToBits(v);
    for (size_t i = 0; i < sizeof(T); ++i) Byte(static_cast<unsigned char>(bits >> (8 * i)));
    return *this;
  }
  Fingerprint& Bytes(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) Byte(p[i]);
    return *this;
  }
  // The bytes alone (no length): callers separate strings themselves where it matters.
  Fingerprint& Str(absl::string_view s) { return Bytes(s.data(), s.size()); }
  uint64_t value() const { return hash_; }

 private:
  void Byte(unsigned char b) {
    hash_ ^= b;
    hash_ *= 1099511628211ull;
  }
  uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace codec
}  // namespace weft

#endif  // WEFT_CORE_CODEC_H_
