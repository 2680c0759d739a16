/* Allocation traces (the format bench/traces/gen_training_trace.py
 * describes, which CUBERT_MEMORY_TRACE and tools/record-torch-trace.py
 * write): loading, gzip-compressed or not, and the check that the events
 * pair up. Shared by bench_memory and the tests; header only.
 *
 *   # comments (the first one is kept as the trace's header)
 *   a <id> <bytes>   allocate <bytes> bytes as buffer <id> (1..2^32-1)
 *   f <id>           free buffer <id>
 *
 * A file whose name ends in ".gz" is read through zlib when the build has
 * it (BENCH_HAVE_ZLIB); without zlib it is refused with a message saying
 * to decompress it first. */
#ifndef CUBE_BENCH_TRACE_FILE_H
#define CUBE_BENCH_TRACE_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef BENCH_HAVE_ZLIB
#include <zlib.h>
#endif

typedef struct trace_op {
    uint32_t id;   /* 1.. */
    uint32_t free; /* 1: free, 0: allocate */
    uint64_t size;
} trace_op;

typedef struct trace {
    trace_op *ops;
    size_t count;
    uint32_t max_id;
    char header[1024];
} trace;

/* A line source: zlib's reader (which also reads plain files) or stdio. */
typedef struct trace_reader {
#ifdef BENCH_HAVE_ZLIB
    gzFile gz;
#else
    FILE *f;
#endif
} trace_reader;

static int trace_reader_open(trace_reader *r, const char *path)
{
#ifdef BENCH_HAVE_ZLIB
    r->gz = gzopen(path, "rb");
    if (r->gz)
        gzbuffer(r->gz, 1u << 20);
    return r->gz ? 0 : -1;
#else
    size_t n = strlen(path);
    if (n > 3 && strcmp(path + n - 3, ".gz") == 0) {
        fprintf(stderr,
                "trace: %s is compressed and this build has no zlib "
                "(install zlib1g-dev and rebuild, or decompress it with "
                "gzip -dk)\n",
                path);
        return -1;
    }
    r->f = fopen(path, "r");
    return r->f ? 0 : -1;
#endif
}

static char *trace_reader_line(trace_reader *r, char *line, int size)
{
#ifdef BENCH_HAVE_ZLIB
    return gzgets(r->gz, line, size);
#else
    return fgets(line, size, r->f);
#endif
}

static void trace_reader_close(trace_reader *r)
{
#ifdef BENCH_HAVE_ZLIB
    gzclose(r->gz);
#else
    fclose(r->f);
#endif
}

/* Loads `path` into *t (free t->ops after). Returns 0, or 1 with the
 * reason printed. */
static int trace_load(const char *path, trace *t)
{
    memset(t, 0, sizeof *t);
    trace_reader f;
    if (trace_reader_open(&f, path) != 0) {
        fprintf(stderr, "trace: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 0;
    char line[1024];
    unsigned long lineno = 0;
    int rc = 1;
    while (trace_reader_line(&f, line, sizeof line)) {
        lineno++;
        if (line[0] == '#') {
            if (!t->header[0]) {
                snprintf(t->header, sizeof t->header, "%s", line);
                t->header[strcspn(t->header, "\n")] = '\0';
            }
            /* The rest of a comment longer than the buffer. */
            while (!strchr(line, '\n') &&
                   trace_reader_line(&f, line, sizeof line))
                ;
            continue;
        }
        if (line[0] == '\n' || line[0] == '\0')
            continue;
        trace_op op = {0, 0, 0};
        char *end = NULL;
        if ((line[0] != 'a' && line[0] != 'f') || line[1] != ' ')
            goto bad;
        op.free = line[0] == 'f';
        unsigned long long id = strtoull(line + 2, &end, 10);
        if (end == line + 2 || id == 0 || id > UINT32_MAX)
            goto bad;
        op.id = (uint32_t)id;
        if (!op.free) {
            char *p = end;
            op.size = strtoull(p, &end, 10);
            if (end == p || op.size == 0)
                goto bad;
        }
        if (t->count == cap) {
            cap = cap ? cap * 2 : 4096;
            trace_op *grown = realloc(t->ops, cap * sizeof *grown);
            if (!grown) {
                fprintf(stderr, "trace: out of host memory\n");
                goto done;
            }
            t->ops = grown;
        }
        t->ops[t->count++] = op;
        if (op.id > t->max_id)
            t->max_id = op.id;
    }
    rc = 0;
    goto done;
bad:
    fprintf(stderr, "trace: %s:%lu: not 'a <id> <bytes>' or 'f <id>'\n", path,
            lineno);
done:
    trace_reader_close(&f);
    if (rc) {
        free(t->ops);
        t->ops = NULL;
    }
    return rc;
}

/* What trace_check found. */
typedef struct trace_summary {
    size_t allocs, frees;
    size_t left_live; /* allocated and never freed */
    uint64_t peak_live_bytes;
} trace_summary;

/* Checks that the events pair up: an id is allocated once, a free names
 * a live id. Returns 0, or 1 with the first mistake printed. */
static int trace_check(const char *path, const trace *t, trace_summary *out)
{
    memset(out, 0, sizeof *out);
    uint64_t *size = calloc((size_t)t->max_id + 1, sizeof *size);
    uint8_t *seen = calloc((size_t)t->max_id + 1, 1);
    int rc = 1;
    if (!size || !seen) {
        fprintf(stderr, "trace: out of host memory\n");
        goto done;
    }
    uint64_t live = 0;
    for (size_t i = 0; i < t->count; i++) {
        const trace_op *op = &t->ops[i];
        if (op->free) {
            if (seen[op->id] != 1) {
                fprintf(stderr,
                        "trace: %s: op %zu frees %u, which is not "
                        "live\n",
                        path, i, op->id);
                goto done;
            }
            seen[op->id] = 2;
            live -= size[op->id];
            out->frees++;
            continue;
        }
        if (seen[op->id]) {
            fprintf(stderr, "trace: %s: op %zu allocates %u a second time\n",
                    path, i, op->id);
            goto done;
        }
        seen[op->id] = 1;
        size[op->id] = op->size;
        live += op->size;
        if (live > out->peak_live_bytes)
            out->peak_live_bytes = live;
        out->allocs++;
    }
    out->left_live = out->allocs - out->frees;
    rc = 0;
done:
    free(size);
    free(seen);
    return rc;
}

#endif /* CUBE_BENCH_TRACE_FILE_H */
