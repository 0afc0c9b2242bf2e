#include "comm/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace weft {
namespace comm {

std::unique_ptr<SharedSegment> SharedSegment::Map(
    MPI_Comm local, int local_rank, size_t bytes, const char* purpose, bool wanted,
    std::string* why, const std::function<void(char* memory)>& prepare) {
  int ok = wanted ? 1 : 0;
  char name[96] = {};
  void* memory = MAP_FAILED;
  if (local_rank == 0 && ok) {
    // Unique among the processes alive on this host (the pid), and across inits and a dead
    // job's leftover of the same pid (the clock; O_EXCL refuses a name that exists).
    int fd = -1;
    for (int attempt = 0; attempt < 3 && fd < 0; ++attempt) {
      std::snprintf(name, sizeof(name), "/weft-%s-%ld-%llx", purpose, static_cast<long>(getpid()),
                    static_cast<unsigned long long>(
                        std::chrono::steady_clock::now().time_since_epoch().count()));
      fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
      *why = absl::StrCat("shm_open(", name, "): ", std::strerror(errno));
      name[0] = '\0';
    } else {
      // tmpfs reserves no memory for a file's size: a full /dev/shm would end the job with
      // SIGBUS at the first write into an untouched page. Reserve it now, or fail.
      int reserved = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
      if (reserved == 0) reserved = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (reserved != 0) {
        *why =
            absl::StrCat("reserving ", bytes, " bytes for ", name, ": ", std::strerror(reserved));
      } else {
        memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (memory == MAP_FAILED) *why = absl::StrCat("mmap(", name, "): ", std::strerror(errno));
      }
      close(fd);
    }
    if (memory == MAP_FAILED) {
      if (name[0] != '\0') shm_unlink(name);
      name[0] = '\0';
      ok = 0;
    } else if (prepare) {
      prepare(static_cast<char*>(memory));
    }
  }
  MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, local);
  if (local_rank != 0 && ok && name[0] != '\0') {
    const int fd = shm_open(name, O_RDWR, 0);
    struct stat st;
    if (fd < 0) {
      *why = absl::StrCat("shm_open(", name, "): ", std::strerror(errno));
    } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      *why = absl::StrCat(name, " is not the segment local rank 0 made");
    } else {
      memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (memory == MAP_FAILED) *why = absl::StrCat("mmap(", name, "): ", std::strerror(errno));
    }
    if (fd >= 0) close(fd);
    if (memory == MAP_FAILED) ok = 0;
  }
  // Every rank of the machine has mapped it, or none uses it.
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, local);
  if (local_rank == 0 && name[0] != '\0') shm_unlink(name);
  if (!ok) {
    if (memory != MAP_FAILED) munmap(memory, bytes);
    return nullptr;
  }
  return std::unique_ptr<SharedSegment>(new SharedSegment(memory, bytes));
}

SharedSegment::~SharedSegment() { munmap(memory_, bytes_); }

}  // namespace comm
}  // namespace weft
