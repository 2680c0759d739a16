/* Helpers shared by the benchmark programs: medians and the machine line.
 * Header-only (static functions): each benchmark is one program. */
#ifndef CUBE_BENCH_UTIL_H
#define CUBE_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0, n); sorts v. */
static double median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The processor's model name from /proc/cpuinfo, or "unknown". */
static void bench_cpu_model(char *out, size_t cap)
{
    snprintf(out, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (colon) {
            colon++;
            while (*colon == ' ' || *colon == '\t')
                colon++;
            snprintf(out, cap, "%s", colon);
            out[strcspn(out, "\n")] = '\0';
        }
        break;
    }
    fclose(f);
}

#endif /* CUBE_BENCH_UTIL_H */
