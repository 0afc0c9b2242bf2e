// The public header from C++ (extern "C", no warnings under -Wall -Wextra -Werror).
#include <weft/trainer.h> /* and weft.h */

#include <type_traits>

static_assert(std::is_same<decltype(&weft_init), weft_status (*)()>::value,
              "weft_init keeps its signature");

int main() {
  weft_neighbor_allreduce_options options = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT;
  return options.version == WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION ? 0 : 1;
}
