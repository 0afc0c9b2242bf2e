#include "comm/mpi_util.h"

#include <algorithm>
#include <string>

namespace weft {
namespace comm {

MPI_Datatype BuiltinMpiType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kInt8:
      return MPI_INT8_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
    case DType::kInt16:
      return MPI_INT16_T;
    case DType::kFloat16:
    case DType::kBFloat16:
      return MPI_DATATYPE_NULL;
  }
  return MPI_DATATYPE_NULL;
}

Status MpiCheck(int code, const char* what) {
  if (code == MPI_SUCCESS) return OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return Internal(what, " failed: ", std::string(text, len));
}

StatusOr<std::vector<std::string>> AllgatherBytes(MPI_Comm comm, const void* data, size_t length) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  int len = static_cast<int>(length);
  std::vector<int> lens(size), displs(size);
  WEFT_RETURN_IF_ERROR(
      MpiCheck(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm), "MPI_Allgather"));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
  WEFT_RETURN_IF_ERROR(MpiCheck(
      MPI_Allgatherv(data, len, MPI_BYTE, all.data(), lens.data(), displs.data(), MPI_BYTE, comm),
      "MPI_Allgatherv"));
  std::vector<std::string> out(size);
  for (int r = 0; r < size; ++r) out[r].assign(all.data() + displs[r], lens[r]);
  return out;
}

}  // namespace comm
}  // namespace weft
