/* A program with a big buffer of known contents, for incremental checkpoints.
 *
 * usage: mem_phases MIB PERCENT CONTROL_FILE [scatter]
 *
 * The buffer (MIB MiB, 1 MiB aligned) holds in each 64-bit word a value
 * that depends on the word's index and on a phase.  Every 10 ms the program
 * reads CONTROL_FILE ("SEQ CMD"); on a SEQ it has not seen:
 *   w  the first PERCENT of the buffer is rewritten with the next phase
 *      ("wrote SEQ PHASE"); with "scatter", one word in each of PERCENT
 *      pages in a hundred, spread over the whole buffer, instead
 *   c  every word is checked against the phase it should hold
 *      ("check SEQ ok PHASE" or "check SEQ bad WORD")
 * The phase and the last SEQ live in the program's memory, so after a
 * restart they are those of the generation restored.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define ALIGN (1UL << 20)

static uint64_t word(size_t i, unsigned phase) {
    uint64_t x = (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ULL;
    return x ^ ((uint64_t)phase * 0xD1B54A32D192ED03ULL);
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: mem_phases MIB PERCENT CONTROL_FILE [scatter]\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[1]) << 20;
    size_t words = bytes / sizeof(uint64_t);
    size_t changed = words / 100 * (size_t)atol(argv[2]);
    /* scattered: the first word of every stride-th page */
    size_t stride = atol(argv[2]) > 0 ? 100 / (size_t)atol(argv[2]) * (4096 / sizeof(uint64_t)) : 0;
    int scatter = argc == 5 && stride > 0;
    char *raw = mmap(NULL, bytes + ALIGN, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    uint64_t *buf = (uint64_t *)(((uintptr_t)raw + ALIGN - 1) & ~(ALIGN - 1));
    unsigned phase = 0;
    long seen = 0;
    for (size_t i = 0; i < words; i++)
        buf[i] = word(i, 0);
    printf("ready\n");
    fflush(stdout);
    struct timespec pause = {0, 10 * 1000 * 1000};
    for (;;) {
        nanosleep(&pause, NULL);
        char text[64] = {0};
        int fd = open(argv[3], O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t n = read(fd, text, sizeof text - 1);
        close(fd);
        long seq;
        char cmd;
        if (n <= 0 || sscanf(text, "%ld %c", &seq, &cmd) != 2 || seq <= seen)
            continue;
        seen = seq;
        if (cmd == 'w') {
            phase++;
            if (scatter)
                for (size_t i = 0; i < words; i += stride)
                    buf[i] = word(i, phase);
            else
                for (size_t i = 0; i < changed; i++)
                    buf[i] = word(i, phase);
            printf("wrote %ld %u\n", seq, phase);
        } else if (cmd == 'c') {
            size_t bad = words;
            for (size_t i = 0; i < words && bad == words; i++)
                if (buf[i] != word(i, (scatter ? i % stride == 0 : i < changed) ? phase : 0))
                    bad = i;
            if (bad == words)
                printf("check %ld ok %u\n", seq, phase);
            else
                printf("check %ld bad %zu\n", seq, bad);
        }
        fflush(stdout);
    }
}
