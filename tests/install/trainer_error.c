/* Built with pkg-config weft-trainer: the trainer library links and reports a missing model
 * file as an error naming it. */
#include <stdio.h>
#include <string.h>

#include <weft/trainer.h>

int main(void) {
  weft_pipe_trainer* trainer = NULL;
  weft_status s;
  if (weft_init() != WEFT_OK) return 1;
  s = weft_pipe_trainer_create(&trainer, "/nonexistent/model.pt", NULL);
  printf("trainer: %s: %s\n", weft_status_string(s), weft_last_error());
  weft_finalize();
  return s != WEFT_OK && trainer == NULL && strstr(weft_last_error(), "/nonexistent/model.pt") ? 0 : 1;
}
