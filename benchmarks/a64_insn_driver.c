/*
 * Driver for benchmarks/a64_insn_count.py: loads one backend library with dlopen and runs training steps
 * on synthetic name-like batches, with no Python in the process, so QEMU's instruction log holds only the
 * library's work (plus the libc/libm code it calls). Prints the mappings first (QEMU's -dfilter ranges).
 * Usage: a64_insn_driver <library.so> <d_model> <n_heads> <n_layers> <vocab> <context> <batch> <steps>
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eemicrogpt.h"

typedef int (*create_fn)(const emg_shape *, int, emg_session **);
typedef int (*train_fn)(emg_session *, int, int, const uint8_t *, const uint16_t *, const float *, float *);

static void *need(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "a64_insn_driver: %s missing: %s\n", name, dlerror());
        exit(2);
    }
    return f;
}

/* The mappings are parsed by the driver's own code (not counted), never by libc's string functions:
 * QEMU's /proc/self/maps differs a little between runs, and memchr over it would count as step work. */
static char maps_text[1 << 20];
static _Alignas(64) char name[4096];

static unsigned long hex_field(const char **p) {
    unsigned long v = 0;
    for (;; (*p)++) {
        const char c = **p;
        const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) return v;
        v = v * 16 + (unsigned long)digit;
    }
}

static const char *skip_field(const char *p) {
    while (*p && *p != ' ' && *p != '\n') p++;
    while (*p == ' ') p++;
    return p;
}

static int ends_with(const char *s, size_t len, const char *suffix) {
    size_t n = 0;
    while (suffix[n]) n++;
    if (n > len) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[len - n + i] != suffix[i]) return 0;
    return 1;
}

/* For the library, libc and libm: each executable mapping ("text <name> <lo> <hi>") and the load base (the
 * address of file offset 0, "base <name> <addr>"), so that a logged PC maps to an ELF virtual address. */
static void print_mappings(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *names[] = {slash ? slash : path, "/libc.so.6", "/libm.so.6"};
    const int fd = open("/proc/self/maps", O_RDONLY);
    size_t size = 0;
    ssize_t got;
    while (fd >= 0 && (got = read(fd, maps_text + size, sizeof maps_text - 1 - size)) > 0) size += (size_t)got;
    if (fd >= 0) close(fd);
    maps_text[size] = '\0';
    /* lines: "<lo>-<hi> <perms> <offset> <dev> <inode> <file>" */
    for (const char *line = maps_text; *line;) {
        const char *p = line;
        const unsigned long lo = hex_field(&p);
        p++;
        const unsigned long hi = hex_field(&p);
        p = skip_field(p);
        const int executable = p[2] == 'x';
        p = skip_field(p);
        const unsigned long offset = hex_field(&p);
        p = skip_field(skip_field(skip_field(p)));
        const char *file = p, *end = p;
        while (*end && *end != '\n') end++;
        const size_t len = (size_t)(end - file);
        for (int i = 0; i < 3; i++) {
            if (!ends_with(file, len, names[i]) || len >= sizeof name) continue;
            for (size_t j = 0; j < len; j++) name[j] = file[j]; /* same alignment in every run, for printf */
            name[len] = '\0';
            if (offset == 0) printf("base %s 0x%lx\n", name, lo);
            if (executable) printf("text %s 0x%lx 0x%lx\n", name, lo, hi);
        }
        line = *end ? end + 1 : end;
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 9) {
        fprintf(stderr, "usage: %s <library.so> <d_model> <n_heads> <n_layers> <vocab> <context> <batch> <steps>\n",
                argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "a64_insn_driver: %s\n", dlerror());
        return 2;
    }
    print_mappings(argv[1]);
    const emg_shape shape = {atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6])};
    const int batch = atoi(argv[7]), steps = atoi(argv[8]);
    create_fn create = (create_fn)need(lib, "emg_create");
    train_fn train = (train_fn)need(lib, "emg_train_steps");
    emg_session *s = NULL;
    int status = create(&shape, batch, &s);
    if (status) {
        fprintf(stderr, "a64_insn_driver: emg_create(d_model %d, n_heads %d, n_layers %d, vocab %d, context %d, "
                "max_batch %d) = %d\n", shape.d_model, shape.n_heads, shape.n_layers, shape.vocab, shape.context,
                batch, status);
        return 2;
    }
    /* Name-like rows: random symbols between boundary tokens (the last token), lengths spread over
     * [C/4, 3C/4] + 1 tokens for context C. At context 16 that is 2..10 letters, like names.txt. */
    const int seq = shape.context + 1, boundary = shape.vocab - 1;
    const int shortest = shape.context / 4 > 2 ? shape.context / 4 : 2, spread = shape.context / 2 + 1;
    uint8_t *tokens = calloc((size_t)batch * seq, 1);
    uint16_t *lengths = calloc((size_t)batch, sizeof *lengths);
    unsigned seed = 12345;
    for (int b = 0; b < batch; b++) {
        const int len = shortest + (b * 5) % spread;
        lengths[b] = (uint16_t)len;
        for (int t = 0; t < seq; t++) {
            seed = seed * 1103515245u + 12345u;
            const int symbol = (int)((seed >> 16) % (unsigned)boundary);
            tokens[b * seq + t] = (uint8_t)((t == 0 || t >= len - 1) ? boundary : symbol);
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
    /* Nothing after the steps may depend on their results: printf("%f", loss) runs a different number of libc
     * instructions per value, which the subtraction of two runs would count as step work. */
    if (!(loss > 0.0f && loss < 100.0f)) {
        fputs("a64_insn_driver: training gave a non-finite or implausible loss\n", stderr);
        return 1;
    }
    puts("trained");
    return 0;
}
