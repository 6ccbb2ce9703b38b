/* The training step (step.c) as the backend hooks (session.c) call it: the step compiled for the session's
 * width behind the shared layer's loss_and_grad, train_step and params_changed hooks. */
#ifndef EMG_X86_STEP_H
#define EMG_X86_STEP_H

#include <stdint.h>

struct emg_session;
struct emg_x86_kernel;

/* The step for d_model (a multiple of 16 up to EMG_MAX_D_MODEL: compiled for 16..256, run-time width above),
 * or NULL. */
const struct emg_x86_kernel *emg_x86_find_kernel(int d_model);
#define STEP_WIDE_MIN 272 /* the narrowest width of the run-time-width step (step_wide.c) */

/* The mean loss of an already validated batch; with want_grads its gradient in s->core.grads. */
float emg_x86_loss_and_grad(struct emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths,
                            int want_grads);

/* The shared layer's fused train_step hook (emg_backend.h): forward, backward, the finiteness gate, Adam
 * (which also judges the parameters it writes) and the transposed copies in one pool region; returns the
 * verdict (enum emg_step_verdict). */
int emg_x86_train_step(struct emg_session *s, int batch, const uint8_t *tokens, const uint16_t *lengths, float lr,
                       float *loss);

/* Rebuild the transposed weight copies from params (after every parameter change). */
void emg_x86_sync_transposed(struct emg_session *s);

#endif /* EMG_X86_STEP_H */
