/* The public header alone, compiled as strict C99 (-std=c99 -pedantic -Werror): it must
 * not need anything but the C standard library and DLPack. Running it checks that the
 * option initializers fill the fields they should. */
#include <weft/trainer.h> /* and weft.h */

int main(void) {
  weft_neighbor_allreduce_options nar = WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_INIT;
  weft_neighbor_allgather_options nag = WEFT_NEIGHBOR_ALLGATHER_OPTIONS_INIT;
  weft_hierarchical_options hier = WEFT_HIERARCHICAL_OPTIONS_INIT;
  weft_pipe_trainer_options trainer = WEFT_PIPE_TRAINER_OPTIONS_INIT;
  weft_pipe_epoch_metrics metrics = WEFT_PIPE_EPOCH_METRICS_INIT;
  weft_status status = WEFT_OK;
  if (nar.version != WEFT_NEIGHBOR_ALLREDUCE_OPTIONS_VERSION || nar.has_weights != 0 ||
      nar.enable_topo_check != 1 || nar.src_ranks != NULL) {
    return 1;
  }
  if (nag.version != WEFT_NEIGHBOR_ALLGATHER_OPTIONS_VERSION || nag.has_ranks != 0) return 2;
  if (hier.version != WEFT_HIERARCHICAL_OPTIONS_VERSION || hier.has_dst != 0) return 3;
  if (trainer.version != WEFT_PIPE_TRAINER_OPTIONS_VERSION || trainer.freeze != 1 ||
      trainer.freeze_every_epochs != 1 || trainer.autopipe != 1 || trainer.autodp != 1 ||
      trainer.cache != 0 || trainer.cache_dir != NULL ||
      trainer.schedule != WEFT_PIPE_SCHEDULE_GPIPE || trainer.batch_size != 64 ||
      trainer.seed != 1 || trainer.optimizer != WEFT_PIPE_OPTIMIZER_ADAM ||
      trainer.lr != 1e-3 || trainer.loss != WEFT_PIPE_LOSS_CROSS_ENTROPY ||
      trainer.name != NULL) {
    return 5;
  }
  if (metrics.version != WEFT_PIPE_EPOCH_METRICS_VERSION || metrics.transition_bytes != 0) {
    return 6;
  }
  if (WEFT_VERSION_NUMBER != WEFT_VERSION_MAJOR * 10000 + WEFT_VERSION_MINOR * 100 +
                                 WEFT_VERSION_PATCH) {
    return 4;
  }
  return (int)status;
}
