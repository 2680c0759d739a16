/* The barrier pass's output (barrier_pass_internal.h): the analysed body
 * as C text, its uniform structure kept and each region wrapped in loops
 * over the units. */
#include "backends/cpu/barrier_pass_internal.h"

#ifdef CUBE_HAVE_LIBCLANG

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- the text */

static void bp_printf(barrier_pass *bp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void bp_printf(barrier_pass *bp, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        text_buf_append(&bp->out, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        bp->out.failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    text_buf_append(&bp->out, big, (size_t)n);
    free(big);
}

/* ----------------------------------------------------- loops over units */

static void bp_text(barrier_pass *bp, unsigned a, unsigned b)
{
    if (a < b && b <= bp->srclen)
        text_buf_append(&bp->out, bp->src + a, b - a);
}

/* Source text [a, b) of region `r`, its returns turned into jumps to the
 * end of the unit. */
static void bp_region_text(barrier_pass *bp, int r, unsigned a, unsigned b)
{
    unsigned at = a;
    for (int i = 0; i < bp->nn; i++) {
        const bp_node *n = &bp->n[i];
        if (n->kind != CXCursor_ReturnStmt || n->start < at || n->start >= b)
            continue;
        bp_text(bp, at, n->start);
        bp_printf(bp, "goto cube__done_%d", r);
        at = n->start + 6; /* "return" */
    }
    bp_text(bp, at, b);
}

/* Opens the loops over the units (x innermost), or one unit's block when
 * `only` >= 0, with cube__u the unit's positions and cube__i its index.
 * An axis a with fixed[a] set runs only the position cube__f<axis> (which
 * the caller declared and checked). */
static void bp_open_units_at(barrier_pass *bp, int only, const int *fixed)
{
    if (only < 0) {
        for (int a = 2; a >= 0; a--) {
            char c = "xyz"[a];
            if (fixed && fixed[a] >= 0)
                bp_printf(
                    bp,
                    "for (unsigned int cube__%c = (unsigned int)cube__f%c;"
                    " cube__%c < (unsigned int)cube__f%c + 1u; "
                    "cube__%c++)\n",
                    c, c, c, c, c);
            else
                bp_printf(bp,
                          "for (unsigned int cube__%c = 0; cube__%c < %uu; "
                          "cube__%c++)\n",
                          c, c, bp->dim[a], c);
        }
        bp_printf(bp,
                  "{\nconst size_t cube__i = (size_t)cube__x + (size_t)%uu * "
                  "((size_t)cube__y + (size_t)%uu * cube__z);\n",
                  bp->dim[0], bp->dim[1]);
    } else {
        bp_printf(bp,
                  "{\nconst unsigned int cube__z = 0, cube__y = 0, cube__x = "
                  "%du;\nconst size_t cube__i = %d;\n",
                  only, only);
    }
    bp_printf(bp, "cube__unit cube__w = cube__c;\n"
                  "cube__w.ux = cube__x;\ncube__w.uy = cube__y;\n"
                  "cube__w.uz = cube__z;\ncube__w.ax = cube__c.ax + cube__x;\n"
                  "cube__w.ay = cube__c.ay + cube__y;\n"
                  "cube__w.az = cube__c.az + cube__z;\n"
                  "{\nconst cube__unit cube__u = cube__w;\n(void)cube__u;\n"
                  "(void)cube__i;\n");
}

static void bp_open_units(barrier_pass *bp, int only)
{
    bp_open_units_at(bp, only, NULL);
}

static void bp_close_units(barrier_pass *bp)
{
    bp_printf(bp, "}\n}\n");
}

/* Whether subtree `i` names local `v`. */
static int bp_uses(const barrier_pass *bp, int i, int v)
{
    if (bp->n[i].kind == CXCursor_DeclRefExpr && bp->n[i].var == v &&
        bp->n[i].ref == BP_REF_LOCAL)
        return 1;
    for (int c = bp->n[i].first; c >= 0; c = bp->n[c].next)
        if (bp_uses(bp, c, v))
            return 1;
    return 0;
}

/* Whether region `r` uses local `v`. */
static int bp_region_uses(const barrier_pass *bp, int r, int v)
{
    for (int i = 0; i < bp->nn; i++)
        if (bp->n[i].region == r && bp->n[i].kind == CXCursor_DeclRefExpr &&
            bp->n[i].ref == BP_REF_LOCAL && bp->n[i].var == v)
            return 1;
    return 0;
}

/* What region `r` needs at its top: the context values it uses that other
 * regions made, and the recomputed values (with what they are made of). */
static void bp_prologue(barrier_pass *bp, int r, unsigned char *need)
{
    memset(need, 0, (size_t)bp->nv);
    for (int i = 0; i < bp->nv; i++) {
        const bp_var *v = &bp->v[i];
        if ((v->cls == BP_CLS_CTX || v->cls == BP_CLS_RECOMPUTE) &&
            bp->n[v->decl].region != r && bp_region_uses(bp, r, i))
            need[i] = 1;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < bp->nv; i++) {
            if (!need[i] || bp->v[i].cls != BP_CLS_RECOMPUTE)
                continue;
            for (int j = 0; j < bp->nv; j++)
                if (!need[j] && bp->v[j].cls == BP_CLS_RECOMPUTE &&
                    bp_uses(bp, bp->v[i].init, j)) {
                    need[j] = 1;
                    changed = 1;
                }
        }
    }
    for (int i = 0; i < bp->nv; i++) {
        const bp_var *v = &bp->v[i];
        if (!need[i])
            continue;
        if (v->cls == BP_CLS_CTX) {
            bp_printf(bp, "__typeof__(%s__ctx[0]) %s = %s__ctx[cube__i];\n",
                      v->name, v->name, v->name);
        } else {
            bp_printf(bp, "%s %s = ", v->type, v->name);
            bp_text(bp, bp->n[v->init].start, bp->n[v->init].end);
            bp_printf(bp, ";\n");
        }
    }
}

/* Stores the context values of `need` (decl_region < 0) or those region
 * `r` declares. */
static void bp_stores(barrier_pass *bp, int r, const unsigned char *need)
{
    for (int i = 0; i < bp->nv; i++) {
        const bp_var *v = &bp->v[i];
        if (v->cls != BP_CLS_CTX)
            continue;
        if (need ? need[i] : bp->n[v->decl].region == r)
            bp_printf(bp, "%s__ctx[cube__i] = %s;\n", v->name, v->name);
    }
}

/* --------------------------------------- statements for some units only */

/* A run of a region's statements (first..last, siblings) and the unit
 * positions it runs for: all, or, on each axis a with fix[a] >= 0, only
 * the position equal to that (uniform, integer) expression. */
typedef struct bp_piece {
    int first, last;
    int fix[3];
} bp_piece;

/* The unit axis (0 x, 1 y, 2 z) whose position expression `i` holds
 * exactly, or -1: the position itself, through parentheses and integer
 * conversions to 4 bytes or more, or (when `local`) a local of such a
 * type, never changed, initialised from one. */
static int bp_unit_axis(const barrier_pass *bp, int i, int local)
{
    for (int guard = 0; i >= 0 && guard < 16; guard++) {
        const bp_node *n = &bp->n[i];
        if (n->kind == CXCursor_ParenExpr ||
            n->kind == CXCursor_UnexposedExpr ||
            n->kind == CXCursor_CStyleCastExpr) {
            if (!n->int_type || n->tsize < 4)
                return -1;
            i = n->last;
            continue;
        }
        if (n->kind == CXCursor_MemberRefExpr) {
            if (!bp_reads_unit(bp, n) || n->name[0] != 'u' || !n->name[1] ||
                !strchr("xyz", n->name[1]) || n->name[2])
                return -1;
            return n->name[1] - 'x';
        }
        if (n->kind == CXCursor_DeclRefExpr && n->ref == BP_REF_LOCAL &&
            local) {
            const bp_var *v = &bp->v[n->var];
            if (!v->pospure || !v->is_int || v->size < 4 || v->init < 0)
                return -1;
            return bp_unit_axis(bp, v->init, 0);
        }
        return -1;
    }
    return -1;
}

/* The axes condition `c` fixes: each `position == value` of a chain of
 * `&&` (value uniform, of an integer type) sets fix[axis] to the value's
 * node. Whenever the condition holds, each such axis's position equals
 * its value. Returns how many axes it fixed. */
static int bp_guard_fixes(const barrier_pass *bp, int c, int fix[3])
{
    c = bp_strip_parens(bp, c);
    if (c < 0 || bp->n[c].kind != CXCursor_BinaryOperator ||
        bp->n[c].nkids != 2)
        return 0;
    int l = bp->n[c].first, r = bp->n[l].next;
    if (strcmp(bp->n[c].op, "&&") == 0)
        return bp_guard_fixes(bp, l, fix) + bp_guard_fixes(bp, r, fix);
    if (strcmp(bp->n[c].op, "==") != 0)
        return 0;
    int a = bp_unit_axis(bp, l, 1), k = r;
    if (a < 0) {
        a = bp_unit_axis(bp, r, 1);
        k = l;
    }
    if (a < 0 || fix[a] >= 0 || !bp->n[k].int_type || !bp_uniform(bp, k, 0))
        return 0;
    fix[a] = k;
    return 1;
}

/* Marks in `re` the locals piece statements [a, b) use that an earlier
 * piece of region `r` declares (recomputed at the piece's top), and those
 * their values are made of. 0 when one of them cannot be recomputed. */
static int bp_piece_needs(const barrier_pass *bp, int r, unsigned a, unsigned b,
                          unsigned char *re)
{
    memset(re, 0, (size_t)bp->nv);
    for (int i = 0; i < bp->nn; i++) {
        const bp_node *n = &bp->n[i];
        if (n->kind == CXCursor_DeclRefExpr && n->ref == BP_REF_LOCAL &&
            n->start >= a && n->start < b) {
            const bp_node *d = &bp->n[bp->v[n->var].decl];
            if (d->region == r && d->start < a)
                re[n->var] = 1;
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int v = 0; v < bp->nv; v++) {
            if (re[v] != 1)
                continue;
            const bp_var *w = &bp->v[v];
            if (!w->pospure || bp_name_declared_twice(bp, w->init) >= 0)
                return 0;
            int same = 0;
            for (int j = 0; j < bp->nv; j++)
                same += strcmp(bp->v[j].name, w->name) == 0;
            if (same != 1)
                return 0;
            re[v] = 2;
            changed = 1;
            for (int j = 0; j < bp->nv; j++)
                if (!re[j] && bp->n[bp->v[j].decl].region == r &&
                    bp_uses(bp, w->init, j))
                    re[j] = 1;
        }
    }
    return 1;
}

/* Whether piece `p` runs for some units only. */
static int bp_piece_fixed(const bp_piece *p)
{
    return p->fix[0] >= 0 || p->fix[1] >= 0 || p->fix[2] >= 0;
}

/* Whether statement `n` is an `if` without else, written in the source
 * itself, whose condition fixes unit positions (into fix[]). */
static int bp_unit_guard(const barrier_pass *bp, const bp_node *n, int fix[3])
{
    return n->kind == CXCursor_IfStmt && !n->in_macro && n->nkids == 2 &&
           bp_guard_fixes(bp, n->first, fix) > 0;
}

/* Whether the order between the units of region `r` may change across
 * pieces of it: it neither returns nor is a grid-stride loop, calls no
 * function but math (atomics, helpers keep their order) and neither makes
 * nor uses a context value (whose loads and stores keep theirs). */
static int bp_region_may_split(const barrier_pass *bp, int r)
{
    const bp_region *rg = &bp->r[r];
    if (rg->has_return || rg->swap >= 0)
        return 0;
    for (int i = 0; i < bp->nn; i++)
        if (bp->n[i].region == r && bp->n[i].kind == CXCursor_CallExpr &&
            !bp_math_function(bp->n[i].name))
            return 0;
    for (int v = 0; v < bp->nv; v++)
        if (bp->v[v].cls == BP_CLS_CTX &&
            (bp->n[bp->v[v].decl].region == r || bp_region_uses(bp, r, v)))
            return 0;
    return 1;
}

/* Splits region `r` where an `if` without else holds statements for the
 * units of a row, a column or a single unit (`if (tx == 0)`, tx a unit
 * position): those run in a loop over those units only, the rest in loops
 * over all units, in the statements' order. Each unit still runs its
 * statements in order; only the order between units changes, which no
 * kernel may depend on between two barriers. Not done (returns 0) when a
 * value made in one piece would have to be kept for a later one (only
 * values of positions are recomputed), when a piece would change the
 * order of calls (atomics, helpers) or of context values, or when the
 * region returns. Otherwise fills `p` (one per statement at most) and
 * returns how many pieces. */
static int bp_split_region(barrier_pass *bp, int r, bp_piece *p,
                           unsigned char *re)
{
    const bp_region *rg = &bp->r[r];
    if (!bp_region_may_split(bp, r))
        return 0;
    int np = 0, peeled = 0;
    unsigned prev = 0;
    for (int s = rg->first; s >= 0; s = s == rg->last ? -1 : bp->n[s].next) {
        const bp_node *n = &bp->n[s];
        if (n->start < prev)
            return 0; /* statements out of order (macros) */
        prev = n->end;
        int fix[3] = {-1, -1, -1};
        int guarded = bp_unit_guard(bp, n, fix);
        if (!guarded && np > 0 && !bp_piece_fixed(&p[np - 1])) {
            p[np - 1].last = s;
            continue;
        }
        p[np].first = p[np].last = s;
        memcpy(p[np].fix, fix, sizeof fix);
        np++;
        peeled += guarded;
    }
    if (!peeled)
        return 0;
    for (int k = 1; k < np; k++) {
        unsigned a = bp->n[p[k].first].start;
        unsigned b = k + 1 < np ? bp->n[p[k + 1].first].start : rg->tend;
        if (!bp_piece_needs(bp, r, a, b, re))
            return 0;
    }
    return np;
}

/* Region `r` as the pieces of bp_split_region. */
static void bp_emit_pieces(barrier_pass *bp, int r, const bp_piece *p, int np,
                           unsigned char *need, unsigned char *re)
{
    const bp_region *rg = &bp->r[r];
    for (int k = 0; k < np; k++) {
        unsigned a = k ? bp->n[p[k].first].start : rg->tstart;
        unsigned b = k + 1 < np ? bp->n[p[k + 1].first].start : rg->tend;
        int fixed = bp_piece_fixed(&p[k]);
        if (fixed) {
            bp_printf(bp, "{\n/* only the units the condition allows */\n");
            for (int ax = 0; ax < 3; ax++) {
                int e = p[k].fix[ax];
                if (e < 0)
                    continue;
                bp_printf(bp, "const long long cube__f%c = (long long)(",
                          "xyz"[ax]);
                bp_text(bp, bp->n[e].start, bp->n[e].end);
                bp_printf(bp, ");\n");
            }
            const char *join = "if (";
            for (int ax = 0; ax < 3; ax++)
                if (p[k].fix[ax] >= 0) {
                    bp_printf(bp, "%scube__f%c >= 0 && cube__f%c < %uLL", join,
                              "xyz"[ax], "xyz"[ax], bp -> dim[ax]);
                    join = " && ";
                }
            bp_printf(bp, ") {\n");
        }
        bp_open_units_at(bp, -1, p[k].fix);
        bp_prologue(bp, r, need);
        if (k > 0) {
            bp_piece_needs(bp, r, a, b, re);
            for (int v = 0; v < bp->nv; v++) {
                if (!re[v])
                    continue;
                bp_printf(bp, "%s %s = ", bp->v[v].type, bp->v[v].name);
                bp_text(bp, bp->n[bp->v[v].init].start,
                        bp->n[bp->v[v].init].end);
                bp_printf(bp, ";\n");
            }
        }
        bp_printf(bp, "{\n");
        bp_region_text(bp, r, a, b);
        bp_printf(bp, "\n}\n");
        bp_close_units(bp);
        if (fixed)
            bp_printf(bp, "}\n}\n");
    }
}

static void bp_emit_region(barrier_pass *bp, int r, unsigned char *need)
{
    const bp_region *rg = &bp->r[r];
    bp_piece *p = malloc(sizeof *p * (size_t)(bp->nn + 1));
    unsigned char *re = malloc((size_t)bp->nv + 1);
    int np = p && re ? bp_split_region(bp, r, p, re) : 0;
    if (np > 0)
        bp_emit_pieces(bp, r, p, np, need, re);
    else if (!p || !re)
        bp->oom = 1;
    free(p);
    free(re);
    if (np > 0 || bp->oom)
        return;
    bp_open_units(bp, -1);
    bp_prologue(bp, r, need);
    bp_printf(bp, "{\n");
    bp_region_text(bp, r, rg->tstart, rg->tend);
    bp_printf(bp, "\n");
    if (rg->has_return)
        bp_printf(bp, "cube__done_%d:;\n", r);
    bp_stores(bp, r, NULL);
    bp_printf(bp, "}\n");
    bp_stores(bp, r, need);
    bp_close_units(bp);
}

/* How far ahead of a grid-stride loop's step its buffers are prefetched,
 * in bytes of the steps' runs: far enough to cover the memory's latency
 * when each step reads one short run (a cube's units) of a distant window. */
#define BP_PREFETCH_AHEAD 16384u

/* The buffer parameters the body of grid-stride loop `s` indexes with its
 * counter itself (CUBE_AT(buf, i)), at most `cap` of them, into `out`
 * (node indices of the names); returns how many. Each unit's counter is
 * the first unit's plus its x position, so a step reads one contiguous run
 * of dim[0] elements of each. */
static int bp_stride_reads(const barrier_pass *bp, int s, int *out, int cap)
{
    bp_for f;
    bp_split_for(bp, s, &f);
    int var = bp->n[bp->n[f.init].first].var, count = 0;
    for (int i = 0; i < bp->nn && count < cap; i++) {
        if (bp->n[i].kind != CXCursor_ArraySubscriptExpr ||
            bp->n[i].nkids != 2 || !bp_within(bp, i, f.body))
            continue;
        int base = bp_strip_parens(bp, bp->n[i].first);
        int index = bp_strip_parens(bp, bp->n[bp->n[i].first].next);
        if (base < 0 || index < 0 || bp->n[base].kind != CXCursor_DeclRefExpr ||
            bp->n[base].ref != BP_REF_PARAM_PTR ||
            bp->n[index].kind != CXCursor_DeclRefExpr ||
            bp->n[index].var != var)
            continue;
        int seen = 0;
        for (int k = 0; k < count; k++)
            seen |= strcmp(bp->n[out[k]].name, bp->n[base].name) == 0;
        if (!seen)
            out[count++] = base;
    }
    return count;
}

/* A grid-stride loop, step-major: each step runs every unit (all in range:
 * no test; near the end: each unit tested, until every unit is done). */
static void bp_emit_stride(barrier_pass *bp, int r, unsigned char *need)
{
    int s = bp->r[r].swap;
    bp_for f;
    bp_split_for(bp, s, &f);
    int d = bp->n[f.init].first;
    const bp_var *v = &bp->v[bp->n[d].var];
    const bp_node *in = &bp->n[f.inc];
    /* i for step cube__k: start + k * step, in the counter's type. */
    bp_buf saved = bp->out;
    bp_buf ik = {0};
    bp->out = ik;
    bp_printf(bp, "%s %s = (%s)((", v->type, v->name, v->type);
    bp_text(bp, bp->n[v->init].start, bp->n[v->init].end);
    bp_printf(bp, ") + (%s)cube__k * (%s)(", v->type, v->type);
    if (in->kind == CXCursor_UnaryOperator)
        bp_printf(bp, "1");
    else
        bp_text(bp, bp->n[bp->n[in->first].next].start,
                bp->n[bp->n[in->first].next].end);
    bp_printf(bp, "));\n");
    ik = bp->out;
    bp->out = saved;
    if (ik.failed) {
        free(ik.data);
        bp->out.failed = 1;
        return;
    }
    unsigned cs = bp->n[f.cond].start, ce = bp->n[f.cond].end;
    unsigned bs = bp->n[f.body].start, be = bp_stmt_end(bp, f.body);
    bp_printf(bp,
              "{\nunsigned char cube__done[%u] = {0};\nint cube__ended = 0;\n"
              "for (unsigned long long cube__k = 0;; cube__k++) {\n"
              "int cube__all = 0;\n%s cube__i0 = 0, cube__i1 = 0;\n"
              "if (!cube__ended) {\nint cube__c0 = 0, cube__c1 = 0;\n",
              bp->dim[0], v->type);
    for (int side = 0; side < 2; side++) {
        bp_open_units(bp, side ? (int)bp->dim[0] - 1 : 0);
        text_buf_append(&bp->out, ik.data, ik.len);
        bp_printf(bp, "cube__i%d = %s;\ncube__c%d = (", side, v->name, side);
        bp_text(bp, cs, ce);
        bp_printf(bp, ");\n");
        bp_close_units(bp);
    }
    bp_printf(bp, "cube__all = cube__c0 && cube__c1 && cube__i0 <= cube__i1 "
                  "&& !(cube__i0 < 0);\n}\nif (cube__all) {\n");
    /* The runs of later steps, into L2 (a prefetch never faults; the
     * address is computed as an integer, past the buffer's end too). */
    int reads[4];
    int nreads = bp_stride_reads(bp, s, reads, 4);
    for (int k = 0; k < nreads; k++) {
        const char *b = bp->n[reads[k]].name;
        bp_printf(bp,
                  "{\nconst unsigned long long cube__run = %uull * "
                  "sizeof((%s)[0]);\n"
                  "const unsigned long long cube__ahead = cube__run * 2 >= "
                  "%uu ? 2 : %uu / cube__run;\n"
                  "const unsigned long long cube__at = "
                  "(unsigned long long)(__UINTPTR_TYPE__)(%s) + "
                  "((unsigned long long)cube__i0 + cube__ahead * "
                  "(unsigned long long)(",
                  bp->dim[0], b, BP_PREFETCH_AHEAD, BP_PREFETCH_AHEAD, b);
        if (in->kind == CXCursor_UnaryOperator)
            bp_printf(bp, "1");
        else
            bp_text(bp, bp->n[bp->n[in->first].next].start,
                    bp->n[bp->n[in->first].next].end);
        bp_printf(bp,
                  ")) * sizeof((%s)[0]);\n"
                  "for (unsigned long long cube__l = 0; cube__l < cube__run; "
                  "cube__l += 64)\n"
                  "__builtin_prefetch((const void *)(__UINTPTR_TYPE__)"
                  "(cube__at + cube__l), 0, 1);\n}\n",
                  b);
    }
    bp_open_units(bp, -1);
    bp_prologue(bp, r, need);
    bp_printf(bp, "{\n");
    text_buf_append(&bp->out, ik.data, ik.len);
    bp_text(bp, bs, be);
    bp_printf(bp, "\n}\n");
    bp_stores(bp, r, need);
    bp_close_units(bp);
    bp_printf(bp, "} else {\nint cube__active = 0;\ncube__ended = 1;\n");
    bp_open_units(bp, -1);
    bp_printf(bp, "if (!cube__done[cube__i]) {\n");
    bp_prologue(bp, r, need);
    bp_printf(bp, "{\n");
    text_buf_append(&bp->out, ik.data, ik.len);
    bp_printf(bp, "if (");
    bp_text(bp, cs, ce);
    bp_printf(bp, ") {\ncube__active = 1;\n");
    bp_text(bp, bs, be);
    bp_printf(bp, "\n} else {\ncube__done[cube__i] = 1;\n}\n}\n");
    bp_stores(bp, r, need);
    bp_printf(bp, "}\n");
    bp_close_units(bp);
    bp_printf(bp, "if (!cube__active)\nbreak;\n}\n}\n}\n");
    free(ik.data);
}

static void bp_emit_list(barrier_pass *bp, int list, unsigned char *need);

static void bp_emit_structure(barrier_pass *bp, int s, unsigned char *need)
{
    const bp_node *n = &bp->n[s];
    switch (n->kind) {
    case CXCursor_CallExpr: bp_printf(bp, "/* cube_sync() */\n"); return;
    case CXCursor_CompoundStmt:
        bp_printf(bp, "{\n");
        bp_emit_list(bp, s, need);
        bp_printf(bp, "}\n");
        return;
    case CXCursor_IfStmt: {
        int then = bp_kid(bp, s, 1), other = bp_kid(bp, s, 2);
        bp_text(bp, n->start, bp->n[then].start);
        bp_printf(bp, "{\n");
        bp_emit_list(bp, then, need);
        bp_printf(bp, "}\n");
        if (other >= 0) {
            bp_printf(bp, "else {\n");
            bp_emit_list(bp, other, need);
            bp_printf(bp, "}\n");
        }
        return;
    }
    case CXCursor_WhileStmt: {
        int body = bp_kid(bp, s, 1);
        bp_text(bp, n->start, bp->n[body].start);
        bp_printf(bp, "{\n");
        bp_emit_list(bp, body, need);
        bp_printf(bp, "}\n");
        return;
    }
    case CXCursor_ForStmt: {
        bp_for f;
        bp_split_for(bp, s, &f);
        bp_text(bp, n->start, bp->n[f.body].start);
        bp_printf(bp, "{\n");
        bp_emit_list(bp, f.body, need);
        bp_printf(bp, "}\n");
        return;
    }
    case CXCursor_DoStmt: {
        int body = bp_kid(bp, s, 0), cond = bp_kid(bp, s, 1);
        bp_printf(bp, "do {\n");
        bp_emit_list(bp, body, need);
        bp_printf(bp, "} while (");
        bp_text(bp, bp->n[cond].start, bp->n[cond].end);
        bp_printf(bp, ");\n");
        return;
    }
    default: return;
    }
}

static void bp_emit_list(barrier_pass *bp, int list, unsigned char *need)
{
    int single = bp->n[list].kind != CXCursor_CompoundStmt;
    for (int s = single ? list : bp->n[list].first; s >= 0;
         s = single ? -1 : bp->n[s].next) {
        if (bp->n[s].barrier) {
            bp_emit_structure(bp, s, need);
        } else if (bp_serial_decl(bp, s) || bp_uniform_update(bp, s)) {
            bp_text(bp, bp->n[s].start, bp_stmt_end(bp, s));
            bp_printf(bp, "\n");
        } else {
            int r = bp->n[s].region;
            if (r < 0 || bp->r[r].first != s)
                continue;
            if (bp->r[r].swap >= 0)
                bp_emit_stride(bp, r, need);
            else
                bp_emit_region(bp, r, need);
        }
    }
}

void bp_emit(barrier_pass *bp)
{
    const bp_macro *km = &bp->m[bp->kernel_macro];
    unsigned char *need = malloc((size_t)bp->nv + 1);
    if (!need) {
        bp->oom = 1;
        return;
    }
    bp_printf(bp,
              "\n/* %s with its units as loops between barriers */\n"
              "CUBE__EXPORT const unsigned int cube__cubes_dim_%s[3] = "
              "{%u, %u, %u};\nCUBE__CUBES",
              bp->kname, bp->kname, bp->dim[0], bp->dim[1], bp->dim[2]);
    bp_text(bp, km->start + (unsigned)strlen("CUBE_KERNEL"), km->end);
    bp_printf(bp,
              "\n{\ncube__unit cube__c = cube__p;\ncube__c.dx = %uu;\n"
              "cube__c.dy = %uu;\ncube__c.dz = %uu;\ncube__c.ux = 0;\n"
              "cube__c.uy = 0;\ncube__c.uz = 0;\n"
              "cube__c.ax = cube__c.cx * %uu;\ncube__c.ay = cube__c.cy * %uu;\n"
              "cube__c.az = cube__c.cz * %uu;\n"
              /* The runtime runs a launch whose absolute positions would
               * wrap as fibers: within a cube they never do. */
              "if (cube__c.ax > 0xFFFFFFFFu - %uu || cube__c.ay > "
              "0xFFFFFFFFu - %uu || cube__c.az > 0xFFFFFFFFu - %uu)\n"
              "__builtin_unreachable();\n{\n"
              "const cube__unit cube__u = cube__c;\n(void)cube__u;\n",
              bp->dim[0], bp->dim[1], bp->dim[2], bp->dim[0], bp->dim[1],
              bp->dim[2], bp->dim[0], bp->dim[1], bp->dim[2]);
    for (int i = 0; i < bp->nv; i++)
        if (bp->v[i].cls == BP_CLS_CTX)
            bp_printf(bp, "__typeof__((%s)0) %s__ctx[%u];\n", bp->v[i].type,
                      bp->v[i].name, bp->dim[0] * bp->dim[1] * bp->dim[2]);
    bp_emit_list(bp, bp->body, need);
    bp_printf(bp, "}\n}\n");
    free(need);
}

#endif /* CUBE_HAVE_LIBCLANG */
