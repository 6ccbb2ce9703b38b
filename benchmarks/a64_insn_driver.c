/*
 * Driver for benchmarks/a64_insn_count.py: loads one backend library with dlopen and runs training steps
 * on synthetic name-like batches, with no Python in the process, so QEMU's instruction log holds only the
 * library's work (plus the libc/libm code it calls). Prints the mappings first (QEMU's -dfilter ranges).
 * Usage: a64_insn_driver <library.so> <d_model> <n_heads> <batch> <steps>
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eemicrogpt.h"

typedef int (*create_fn)(int, int, int, emg_session **);
typedef int (*train_fn)(emg_session *, int, int, const uint8_t *, const uint8_t *, const float *, float *);

static void *need(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "a64_insn_driver: %s missing: %s\n", name, dlerror());
        exit(2);
    }
    return f;
}

/* For the library, libc and libm: each executable mapping ("text <name> <lo> <hi>") and the load base (the
 * address of file offset 0, "base <name> <addr>"), so that a logged PC maps to an ELF virtual address. */
static void print_mappings(const char *path) {
    const char *names[] = {strrchr(path, '/') ? strrchr(path, '/') + 1 : path, "/libc.so.6", "/libm.so.6"};
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[1024];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long lo, hi, offset;
        char perms[8], file[768] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %767s", &lo, &hi, perms, &offset, file) < 4) continue;
        for (int i = 0; i < 3; i++) {
            const char *at = strstr(file, names[i]);
            if (!at || at[strlen(names[i])] != '\0') continue;
            if (offset == 0) printf("base %s 0x%lx\n", file, lo);
            if (perms[2] == 'x') printf("text %s 0x%lx 0x%lx\n", file, lo, hi);
        }
    }
    if (maps) fclose(maps);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s <library.so> <d_model> <n_heads> <batch> <steps>\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "a64_insn_driver: %s\n", dlerror());
        return 2;
    }
    print_mappings(argv[1]);
    const int d = atoi(argv[2]), h = atoi(argv[3]), batch = atoi(argv[4]), steps = atoi(argv[5]);
    create_fn create = (create_fn)need(lib, "emg_create");
    train_fn train = (train_fn)need(lib, "emg_train_steps");
    emg_session *s = NULL;
    int status = create(d, h, batch, &s);
    if (status) {
        fprintf(stderr, "a64_insn_driver: emg_create(%d, %d, %d) = %d\n", d, h, batch, status);
        return 2;
    }
    uint8_t *tokens = calloc((size_t)batch * EMG_MAX_SEQ, 1), *lengths = calloc((size_t)batch, 1);
    unsigned seed = 12345;
    for (int b = 0; b < batch; b++) { /* names of 2..10 letters between boundary tokens, like names.txt */
        const int len = 4 + (b * 5) % 9;
        lengths[b] = (uint8_t)len;
        for (int t = 0; t < EMG_MAX_SEQ; t++) {
            seed = seed * 1103515245u + 12345u;
            tokens[b * EMG_MAX_SEQ + t] = (t == 0 || t >= len - 1) ? EMG_BOUNDARY : (uint8_t)((seed >> 16) % 26);
        }
    }
    const float lr = 1e-2f;
    float loss = 0;
    for (int i = 0; i < steps; i++) { /* one call per step, as the trainer's default does */
        status = train(s, 1, batch, tokens, lengths, &lr, &loss);
        if (status) {
            fprintf(stderr, "a64_insn_driver: emg_train_steps = %d\n", status);
            return 1;
        }
    }
    printf("loss %.4f after %d steps\n", loss, steps);
    return 0;
}
