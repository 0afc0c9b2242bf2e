/* The public header alone, compiled as strict C99 (-std=c99 -pedantic -Werror): it must
 * not need anything but the C standard library and DLPack. Running it checks that the
 * option initializers fill the fields they should. */
#include <weft/weft.h>

int main(void) {
  weft_neighbor_allreduce_options nar = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT;
  weft_neighbor_allgather_options nag = WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT;
  weft_hierarchical_options hier = WEFT_HIERARCHICAL_OPTIONS_INIT;
  weft_status status = WEFT_OK;
  if (nar.version != WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION || nar.has_weights != 0 ||
      nar.enable_topo_check != 1 || nar.src_ranks != NULL) {
    return 1;
  }
  if (nag.version != WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION || nag.has_ranks != 0) return 2;
  if (hier.version != WEFT_HIERARCHICAL_OPTIONS_VERSION || hier.has_dst != 0) return 3;
  if (WEFT_VERSION_NUMBER != WEFT_VERSION_MAJOR * 10000 + WEFT_VERSION_MINOR * 100 +
                                 WEFT_VERSION_PATCH) {
    return 4;
  }
  return (int)status;
}
