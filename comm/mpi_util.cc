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

MPI_Datatype MpiSumType(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kInt16:
      return MPI_DATATYPE_NULL;
    default:
      return BuiltinMpiType(dtype);
  }
}

void MpiProgress() {
  int found = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &found, MPI_STATUS_IGNORE);
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

namespace {

bool ReadMpiYieldsWhenIdle() {
  // Open MPI 4.1's MPI_T_init_thread sets MPI's own thread level to the one it is asked
  // for: asked for less than MPI_THREAD_MULTIPLE, it left MPI_Query_thread saying so, and
  // the next init() refused to run. So it is asked for the level MPI runs at.
  int level = MPI_THREAD_SINGLE, provided = 0;
  MPI_Query_thread(&level);
  if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return false;
  bool yields = false;
  int index = -1;
  if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS) {
    int name_length = 0, description_length = 0, verbosity = 0, bind = 0, scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype;
    int size = 0;
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_get_info(index, nullptr, &name_length, &verbosity, &type, &enumtype, nullptr,
                            &description_length, &bind, &scope) == MPI_SUCCESS &&
        bind == MPI_T_BIND_NO_OBJECT && MPI_Type_size(type, &size) == MPI_SUCCESS && size > 0 &&
        size <= 8 && MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      // A bool in Open MPI 4 (one byte); any integer type reads the same way.
      unsigned char value[8] = {};
      if (count == 1 && MPI_T_cvar_read(handle, value) == MPI_SUCCESS) {
        yields = std::any_of(value, value + size, [](unsigned char b) { return b != 0; });
      }
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return yields;
}

}  // namespace

bool MpiYieldsWhenIdle() {
  // MPI_T_init_thread took 218-285 ms in Open MPI 4.1 (it registers every component's
  // variables), and the answer cannot change while MPI is initialized: asked once.
  static const bool yields = ReadMpiYieldsWhenIdle();
  return yields;
}

}  // namespace comm
}  // namespace weft
