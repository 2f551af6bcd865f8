/*
 * replay_main.c -- runs one fuzz target without libFuzzer, as part of the
 * suite: the target's own valid seeds, thousands of deterministic
 * mutations of them, then every file of its corpus directory (inputs kept
 * from `make fuzz` campaigns). Linked with each tests/fuzz/fuzz_*.c by the
 * Makefile into build/tests/fuzz/<target>; under the ASan+UBSan build a
 * memory error or undefined behaviour in the parser fails the suite.
 *
 *   fuzz_<name> [corpus-dir]   (default tests/fuzz/corpus-<name>)
 *   fuzz_<name> --seeds DIR    write the seeds into DIR (`make fuzz` starts
 *                              each campaign from them)
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_target.h"
#include "mutate.h"

#define MAX_IN (1u << 20)
#define MAX_SEEDS 64
#define ROUNDS 5000

static uint8_t *seed[MAX_SEEDS];
static size_t seed_len[MAX_SEEDS], n_seeds;

static void keep_seed(const uint8_t *b, size_t n)
{
    if (n_seeds == MAX_SEEDS || n > MAX_IN) return;
    if (!(seed[n_seeds] = malloc(n ? n : 1))) abort();
    memcpy(seed[n_seeds], b, n);
    seed_len[n_seeds++] = n;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;

int main(int argc, char **argv)
{
    static uint8_t buf[MAX_IN];
    char dflt[256];
    snprintf(dflt, sizeof dflt, "tests/fuzz/corpus-%s", fuzz_target_name);
    const char *dir = argc > 1 ? argv[1] : dflt;

    fuzz_target_seeds(keep_seed);
    if (n_seeds == 0) {
        fprintf(stderr, "%s: the target made no seeds\n", fuzz_target_name);
        return 1;
    }
    if (argc > 2 && strcmp(argv[1], "--seeds") == 0) {
        for (size_t i = 0; i < n_seeds; i++) {
            char path[1024];
            snprintf(path, sizeof path, "%s/seed-%zu", argv[2], i);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(seed[i], 1, seed_len[i], f) != seed_len[i] || fclose(f) != 0) {
                perror(path);
                return 1;
            }
        }
        return 0;
    }
    for (size_t i = 0; i < n_seeds; i++) LLVMFuzzerTestOneInput(seed[i], seed_len[i]);
    for (int r = 0; r < ROUNDS; r++) {
        size_t i = mut_next(&rng) % n_seeds, len = seed_len[i];
        memcpy(buf, seed[i], len);
        for (int m = 1 + (int)(mut_next(&rng) % 4); m > 0; m--)
            mut_one(&rng, buf, &len, MAX_IN);
        LLVMFuzzerTestOneInput(buf, len);
    }
    size_t files = 0;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            char path[1024];
            if (e->d_name[0] == '.') continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            FILE *f = fopen(path, "rb");
            if (!f) continue;
            size_t len = fread(buf, 1, sizeof buf, f);
            fclose(f);
            LLVMFuzzerTestOneInput(buf, len);
            files++;
        }
        closedir(d);
    }
    for (size_t i = 0; i < n_seeds; i++) free(seed[i]);
    fuzz_target_done();
    printf("%s: %zu seeds, %d mutations, %zu corpus files: no fault\n", fuzz_target_name,
           n_seeds, ROUNDS, files);
    return 0;
}
