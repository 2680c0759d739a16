/* The barrier pass (see barrier_pass.h).
 *
 * The kernel's translation unit is parsed with libclang and the body of
 * <name>__body is copied into a tree of its own (bp_node): kinds, file
 * offsets rounded out to whole macro invocations, what each name refers
 * to. The analysis and the rewriting then work on that tree and on the
 * source text.
 *
 * The body is a list of statements. A statement that holds a barrier is
 * structure: a barrier itself, a block, or an if/for/while/do whose
 * condition (and a for's init and step) is uniform, kept as control flow
 * run once per cube, its own lists processed the same way. A run of
 * statements without a barrier between two pieces of structure is a
 * region, run for every unit of the cube in a loop (x innermost) before
 * the next piece starts. A declaration of uniform variables only is
 * structure too (run once per cube). A for loop in a region whose unit
 * position starts it and whose step is uniform (a grid-stride loop) is a
 * region of its own, run step by step with all units per step. An `if`
 * of a region whose condition fixes a unit position (`if (tx == 0)`, tx a
 * unit position) runs, in the statements' order, in a loop over the units
 * where it can hold only, so that the loops over all units have no branch
 * on the unit and vectorize.
 *
 * A local variable used in more than one region is recomputed at the top
 * of each (when its value is made of positions and uniform values only
 * and never changes), else kept in an array with one element per unit,
 * loaded at the top of each region that uses it and stored at the end.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "backends/cpu/barrier_pass.h"
#include "backends/cpu/cpu_libclang.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CUBE_HAVE_LIBCLANG

cpu_barrier_pass_status cpu_barrier_pass_transform(const char *source,
                                                   const char *name,
                                                   const unsigned dim[3],
                                                   char **out, char *why,
                                                   size_t why_len)
{
    (void)source;
    (void)name;
    (void)dim;
    *out = NULL;
    snprintf(why, why_len, "cubert was built without libclang's headers");
    return CPU_BARRIER_PASS_REFUSED;
}

#else

#include <pthread.h>

/* The most bytes of per-unit arrays a cube may keep across barriers. */
#define BP_MAX_CONTEXT ((long long)256 * 1024)

/* What a name refers to. */
enum {
    BP_REF_NONE = 0,
    BP_REF_LOCAL,        /* a local variable of the body */
    BP_REF_PARAM_SCALAR, /* a scalar parameter (const) */
    BP_REF_PARAM_LEN,    /* a buffer's length companion */
    BP_REF_PARAM_PTR,    /* a buffer or shared array */
    BP_REF_UNIT,         /* cube__u, the unit's positions */
    BP_REF_SYNC,         /* cube__sync_fn */
    BP_REF_FUNC,         /* a function */
    BP_REF_ENUM,         /* an enumerator */
    BP_REF_OTHER
};

/* How a variable used across regions is carried. */
enum { BP_CLS_PLAIN = 0, BP_CLS_UNIFORM, BP_CLS_RECOMPUTE, BP_CLS_CTX };

typedef struct bp_node {
    int kind;
    int parent, first, last, next, nkids;
    unsigned start, end;   /* file offsets, rounded out to whole macros */
    unsigned sstart, send; /* spelling offsets */
    int in_macro;          /* starts inside a macro expansion */
    int ref, var;          /* DeclRefExpr: BP_REF_*, and the local's index */
    int barrier;           /* a barrier in the subtree */
    int list_stmt;         /* a statement of a list of the structure */
    int region;            /* region index, or -1 (run once per cube) */
    long long tsize;       /* an expression's type size */
    int int_type;          /* an expression of an integer type */
    char name[64];
    char op[4]; /* an operator's spelling; "" when not known */
} bp_node;

typedef struct bp_var {
    CXCursor cursor;
    int decl, init;
    char name[64];
    char type[160];
    long long size;
    int scalar, is_int, is_static, is_volatile, is_array;
    int modified, modified_outside_inc, modified_in_expr, addressed;
    int for_stmt;   /* the for loop with a barrier whose init declares it */
    int list_level; /* its declaration is a statement of a list */
    int uniform, pospure, crossing, cls;
} bp_var;

typedef struct bp_macro {
    unsigned start, end;
    char name[32];
} bp_macro;

typedef struct bp_region {
    int first, last; /* statements (siblings) */
    unsigned tstart, tend;
    int swap; /* a grid-stride for loop run step-major, or -1 */
    int has_return;
} bp_region;

typedef struct bp_buf {
    char *data;
    size_t len, cap;
    int failed;
} bp_buf;

typedef struct barrier_pass {
    const cpu_libclang *lc;
    CXTranslationUnit tu;
    const char *src;
    size_t srclen;
    const char *kname;
    unsigned dim[3];
    bp_node *n;
    int nn, ncap;
    bp_var *v;
    int nv, vcap;
    bp_macro *m;
    int nm, mcap;
    bp_region *r;
    int nr, rcap;
    CXCursor body_fn;
    int have_body;
    int helper_sync; /* a function other than a body calls cube_sync() */
    int kernel_macro;
    int body;
    int has_local_array;
    char *why;
    size_t why_len;
    int refused, oom;
    bp_buf out;
} barrier_pass;

/* ------------------------------------------------------------ helpers */

static int bp_refuse(barrier_pass *bp, const char *fmt, ...)
{
    if (!bp->refused && !bp->oom) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(bp->why, bp->why_len, fmt, ap);
        va_end(ap);
    }
    bp->refused = 1;
    return 0;
}

static int bp_grow(barrier_pass *bp, void **p, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return 1;
    int c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *g = realloc(*p, (size_t)c * size);
    if (!g) {
        bp->oom = 1;
        return 0;
    }
    *p = g;
    *cap = c;
    return 1;
}

static void bp_put(bp_buf *b, const char *s, size_t len)
{
    if (b->failed)
        return;
    if (b->len + len + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->len + len + 1)
            c *= 2;
        char *g = realloc(b->data, c);
        if (!g) {
            b->failed = 1;
            return;
        }
        b->data = g;
        b->cap = c;
    }
    memcpy(b->data + b->len, s, len);
    b->len += len;
    b->data[b->len] = '\0';
}

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
        bp_put(&bp->out, small, (size_t)n);
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
    bp_put(&bp->out, big, (size_t)n);
    free(big);
}

static void bp_copy_string(barrier_pass *bp, CXString s, char *dst, size_t cap)
{
    const char *c = bp->lc->getCString(s);
    snprintf(dst, cap, "%s", c ? c : "");
    bp->lc->disposeString(s);
}

static unsigned bp_offset(barrier_pass *bp, CXSourceLocation loc, int spelling)
{
    unsigned off = 0;
    if (spelling)
        bp->lc->getSpellingLocation(loc, NULL, NULL, NULL, &off);
    else
        bp->lc->getExpansionLocation(loc, NULL, NULL, NULL, &off);
    return off;
}

static int bp_is_expr(int kind)
{
    return kind >= CXCursor_FirstExpr && kind <= CXCursor_LastExpr;
}

/* The i-th child of node `p` (or -1). */
static int bp_kid(const barrier_pass *bp, int p, int i)
{
    int c = bp->n[p].first;
    while (c >= 0 && i-- > 0)
        c = bp->n[c].next;
    return c;
}

static int bp_strip_parens(const barrier_pass *bp, int i)
{
    while (i >= 0 &&
           (bp->n[i].kind == CXCursor_ParenExpr ||
            bp->n[i].kind == CXCursor_UnexposedExpr) &&
           bp->n[i].nkids == 1)
        i = bp->n[i].first;
    return i;
}

/* Whether `anc` is `i` or one of its ancestors. */
static int bp_within(const barrier_pass *bp, int i, int anc)
{
    for (; i >= 0; i = bp->n[i].parent)
        if (i == anc)
            return 1;
    return 0;
}

/* The outermost macro expansion holding file offset `o`, or -1. */
static int bp_macro_at(const barrier_pass *bp, unsigned o)
{
    int best = -1;
    for (int i = 0; i < bp->nm; i++)
        if (bp->m[i].start <= o && o < bp->m[i].end &&
            (best < 0 || bp->m[i].start < bp->m[best].start))
            best = i;
    return best;
}

/* The prelude's macros that expand to expressions without side effects. */
static int bp_pure_macro(const char *name)
{
    static const char *const pure[] = {
        "UNIT_POS_X",     "UNIT_POS_Y",     "UNIT_POS_Z",     "CUBE_POS_X",
        "CUBE_POS_Y",     "CUBE_POS_Z",     "CUBE_DIM_X",     "CUBE_DIM_Y",
        "CUBE_DIM_Z",     "CUBE_COUNT_X",   "CUBE_COUNT_Y",   "CUBE_COUNT_Z",
        "ABSOLUTE_POS_X", "ABSOLUTE_POS_Y", "ABSOLUTE_POS_Z", "UNIT_POS",
        "CUBE_DIM",       "CUBE_POS",       "CUBE_COUNT",     "ABSOLUTE_POS",
        "CUBE_LEN",       "CUBE_AT",        "CUBE_MIN",       "CUBE_MAX"};
    for (size_t i = 0; i < sizeof pure / sizeof pure[0]; i++)
        if (strcmp(name, pure[i]) == 0)
            return 1;
    return 0;
}

/* Whether node `i` comes from one of those macros. */
static int bp_in_pure_macro(const barrier_pass *bp, int i)
{
    if (!bp->n[i].in_macro)
        return 0;
    int m = bp_macro_at(bp, bp->n[i].start);
    return m >= 0 && bp_pure_macro(bp->m[m].name);
}

static int bp_math_function(const char *name)
{
    static const char *const math[] = {
        "sqrtf", "sqrt",   "fabsf", "fabs",   "fminf", "fmin",   "fmaxf",
        "fmax",  "floorf", "floor", "ceilf",  "ceil",  "expf",   "exp",
        "logf",  "log",    "powf",  "pow",    "sinf",  "sin",    "cosf",
        "cos",   "tanhf",  "tanh",  "roundf", "round", "truncf", "trunc",
        "log2f", "log2",   "exp2f", "exp2",   "fmaf",  "fma"};
    for (size_t i = 0; i < sizeof math / sizeof math[0]; i++)
        if (strcmp(name, math[i]) == 0)
            return 1;
    return 0;
}

/* ---------------------------------------------------------- the tree */

static int bp_find_var(barrier_pass *bp, CXCursor c)
{
    for (int i = 0; i < bp->nv; i++)
        if (bp->lc->equalCursors(bp->v[i].cursor, c))
            return i;
    return -1;
}

static void bp_add_var(barrier_pass *bp, CXCursor c, int node)
{
    if (!bp_grow(bp, (void **)&bp->v, &bp->vcap, bp->nv + 1, sizeof *bp->v))
        return;
    bp_var *v = &bp->v[bp->nv];
    memset(v, 0, sizeof *v);
    v->cursor = c;
    v->decl = node;
    v->init = -1;
    v->for_stmt = -1;
    snprintf(v->name, sizeof v->name, "%s", bp->n[node].name);
    CXType t = bp->lc->getCursorType(c);
    bp_copy_string(bp, bp->lc->getTypeSpelling(t), v->type, sizeof v->type);
    CXType canon = bp->lc->getCanonicalType(t);
    v->size = bp->lc->Type_getSizeOf(canon);
    v->scalar =
        (canon.kind >= CXType_Bool && canon.kind <= CXType_LongDouble) ||
        canon.kind == CXType_Pointer || canon.kind == CXType_Enum;
    v->is_int = canon.kind >= CXType_Bool && canon.kind <= CXType_Int128;
    v->is_array = canon.kind == CXType_ConstantArray ||
                  canon.kind == CXType_VariableArray ||
                  canon.kind == CXType_IncompleteArray;
    if (canon.kind == CXType_VariableArray)
        bp_refuse(bp, "a variable-length array");
    if (v->is_array)
        bp->has_local_array = 1;
    v->is_volatile = (int)bp->lc->isVolatileQualifiedType(t);
    enum CX_StorageClass sc = bp->lc->Cursor_getStorageClass(c);
    v->is_static = sc == CX_SC_Static || sc == CX_SC_Extern;
    bp->nv++;
}

static int bp_add_node(barrier_pass *bp, CXCursor c, int parent)
{
    if (!bp_grow(bp, (void **)&bp->n, &bp->ncap, bp->nn + 1, sizeof *bp->n))
        return -1;
    int i = bp->nn++;
    bp_node *n = &bp->n[i];
    memset(n, 0, sizeof *n);
    n->kind = bp->lc->getCursorKind(c);
    n->parent = parent;
    n->first = n->last = n->next = -1;
    n->var = -1;
    n->region = -1;
    if (parent >= 0) {
        bp_node *p = &bp->n[parent];
        if (p->last >= 0)
            bp->n[p->last].next = i;
        else
            p->first = i;
        p->last = i;
        p->nkids++;
    }
    CXSourceRange ext = bp->lc->getCursorExtent(c);
    CXSourceLocation b = bp->lc->getRangeStart(ext);
    CXSourceLocation e = bp->lc->getRangeEnd(ext);
    n->start = bp_offset(bp, b, 0);
    n->end = bp_offset(bp, e, 0);
    n->sstart = bp_offset(bp, b, 1);
    n->send = bp_offset(bp, e, 1);
    n->in_macro = n->sstart != n->start;
    if (n->kind == CXCursor_DeclRefExpr || n->kind == CXCursor_MemberRefExpr ||
        n->kind == CXCursor_CallExpr || n->kind == CXCursor_VarDecl)
        bp_copy_string(bp, bp->lc->getCursorSpelling(c), n->name,
                       sizeof n->name);
    if (bp_is_expr(n->kind)) {
        CXType t = bp->lc->getCanonicalType(bp->lc->getCursorType(c));
        n->tsize = bp->lc->Type_getSizeOf(t);
        n->int_type = t.kind >= CXType_Bool && t.kind <= CXType_Int128;
    }
    if (n->kind == CXCursor_VarDecl) {
        bp_add_var(bp, c, i);
        n->var = bp->nv - 1;
    } else if (n->kind == CXCursor_DeclRefExpr) {
        CXCursor ref = bp->lc->getCursorReferenced(c);
        switch (bp->lc->getCursorKind(ref)) {
        case CXCursor_VarDecl:
            n->var = bp_find_var(bp, ref);
            n->ref = n->var >= 0                             ? BP_REF_LOCAL
                     : strcmp(n->name, "cube__sync_fn") == 0 ? BP_REF_SYNC
                                                             : BP_REF_OTHER;
            break;
        case CXCursor_ParmDecl: {
            size_t l = strlen(n->name);
            CXType t = bp->lc->getCanonicalType(bp->lc->getCursorType(ref));
            if (strcmp(n->name, "cube__u") == 0)
                n->ref = BP_REF_UNIT;
            else if (t.kind == CXType_Pointer)
                n->ref = BP_REF_PARAM_PTR;
            else if (l > 5 && strcmp(n->name + l - 5, "__len") == 0)
                n->ref = BP_REF_PARAM_LEN;
            else
                n->ref = BP_REF_PARAM_SCALAR;
            break;
        }
        case CXCursor_FunctionDecl: n->ref = BP_REF_FUNC; break;
        case CXCursor_EnumConstantDecl: n->ref = BP_REF_ENUM; break;
        default: n->ref = BP_REF_OTHER;
        }
    }
    return i;
}

typedef struct bp_visit {
    barrier_pass *bp;
    int parent;
} bp_visit;

static enum CXChildVisitResult bp_visit_fn(CXCursor c, CXCursor parent,
                                           CXClientData data)
{
    (void)parent;
    bp_visit *vs = data;
    barrier_pass *bp = vs->bp;
    int i = bp_add_node(bp, c, vs->parent);
    if (i < 0)
        return CXChildVisit_Break;
    bp_visit child = {bp, i};
    bp->lc->visitChildren(c, bp_visit_fn, &child);
    return bp->oom ? CXChildVisit_Break : CXChildVisit_Continue;
}

/* Whether a function's body names cube__sync_fn. */
static enum CXChildVisitResult bp_find_sync_fn(CXCursor c, CXCursor parent,
                                               CXClientData data)
{
    (void)parent;
    barrier_pass *bp = ((bp_visit *)data)->bp;
    if (bp->lc->getCursorKind(c) == CXCursor_DeclRefExpr) {
        char name[64];
        bp_copy_string(bp, bp->lc->getCursorSpelling(c), name, sizeof name);
        if (strcmp(name, "cube__sync_fn") == 0) {
            ((bp_visit *)data)->parent = 1;
            return CXChildVisit_Break;
        }
    }
    return CXChildVisit_Recurse;
}

static enum CXChildVisitResult bp_top_fn(CXCursor c, CXCursor parent,
                                         CXClientData data)
{
    (void)parent;
    barrier_pass *bp = data;
    enum CXCursorKind k = bp->lc->getCursorKind(c);
    if (k == CXCursor_MacroExpansion) {
        CXSourceRange ext = bp->lc->getCursorExtent(c);
        if (!bp->lc->Location_isFromMainFile(bp->lc->getRangeStart(ext)))
            return CXChildVisit_Continue;
        if (!bp_grow(bp, (void **)&bp->m, &bp->mcap, bp->nm + 1, sizeof *bp->m))
            return CXChildVisit_Break;
        bp_macro *m = &bp->m[bp->nm++];
        m->start = bp_offset(bp, bp->lc->getRangeStart(ext), 0);
        m->end = bp_offset(bp, bp->lc->getRangeEnd(ext), 0);
        bp_copy_string(bp, bp->lc->getCursorSpelling(c), m->name,
                       sizeof m->name);
    } else if (k == CXCursor_FunctionDecl && bp->lc->isCursorDefinition(c)) {
        char name[256], want[256];
        bp_copy_string(bp, bp->lc->getCursorSpelling(c), name, sizeof name);
        snprintf(want, sizeof want, "%s__body", bp->kname);
        size_t l = strlen(name);
        if (strcmp(name, want) == 0) {
            bp->body_fn = c;
            bp->have_body = 1;
        } else if (!(l > 6 && strcmp(name + l - 6, "__body") == 0)) {
            bp_visit vs = {bp, 0};
            bp->lc->visitChildren(c, bp_find_sync_fn, &vs);
            if (vs.parent)
                bp->helper_sync = 1;
        }
    }
    return CXChildVisit_Continue;
}

static int bp_is_barrier_call(const barrier_pass *bp, int i)
{
    return bp->n[i].kind == CXCursor_CallExpr &&
           strcmp(bp->n[i].name, "cube__sync_fn") == 0;
}

/* The operator of a unary, binary or compound assignment node, from the
 * text between its operands; "" when that text is not in the file (the
 * operator comes from inside a macro). */
static void bp_find_op(barrier_pass *bp, int i)
{
    bp_node *n = &bp->n[i];
    unsigned a, b;
    int l = n->first, r = l >= 0 ? bp->n[l].next : -1;
    if (n->kind == CXCursor_UnaryOperator) {
        if (l < 0)
            return;
        if (n->start < bp->n[l].start) { /* prefix */
            a = n->start;
            b = bp->n[l].start;
        } else {
            a = bp->n[l].end;
            b = n->end;
        }
    } else {
        if (l < 0 || r < 0)
            return;
        a = bp->n[l].end;
        b = bp->n[r].start;
    }
    if (a >= b || b > bp->srclen || b - a > 16)
        return;
    char t[4];
    size_t k = 0;
    for (unsigned p = a; p < b; p++) {
        char c = bp->src[p];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
            continue;
        if (!strchr("+-*/%<>=!&|^~,", c) || k >= 3)
            return;
        t[k++] = c;
    }
    t[k] = '\0';
    memcpy(n->op, t, k + 1);
}

/* Rounds every node's offsets out to whole macro invocations, then finds
 * the operators. */
static void bp_finish_tree(barrier_pass *bp)
{
    for (int i = 0; i < bp->nn; i++) {
        bp_node *n = &bp->n[i];
        int m = bp_macro_at(bp, n->start);
        if (m >= 0)
            n->start = bp->m[m].start;
        m = bp_macro_at(bp, n->end);
        if (m >= 0)
            n->end = bp->m[m].end;
        if (n->end < n->start)
            n->end = n->start;
    }
    for (int i = 0; i < bp->nn; i++) {
        int k = bp->n[i].kind;
        if (k == CXCursor_UnaryOperator || k == CXCursor_BinaryOperator ||
            k == CXCursor_CompoundAssignOperator)
            bp_find_op(bp, i);
    }
    /* Barriers, up the tree. */
    for (int i = 0; i < bp->nn; i++)
        if (bp_is_barrier_call(bp, i))
            for (int p = i; p >= 0 && !bp->n[p].barrier; p = bp->n[p].parent)
                bp->n[p].barrier = 1;
}

/* ------------------------------------------------------ the analysis */

static int bp_uniform(const barrier_pass *bp, int i, int pos);

static int bp_kids_uniform(const barrier_pass *bp, int i, int pos, int skip)
{
    for (int c = bp->n[i].first; c >= 0; c = bp->n[c].next)
        if (skip-- <= 0 && bp_is_expr(bp->n[c].kind) && !bp_uniform(bp, c, pos))
            return 0;
    return 1;
}

/* Whether expression `i` has the same value in every unit of a cube (with
 * `pos`: is made of positions and such values only), with no side
 * effects. */
static int bp_uniform(const barrier_pass *bp, int i, int pos)
{
    const bp_node *n = &bp->n[i];
    switch (n->kind) {
    case CXCursor_IntegerLiteral:
    case CXCursor_FloatingLiteral:
    case CXCursor_CharacterLiteral:
    case CXCursor_UnaryExpr: /* sizeof, _Alignof: not evaluated */ return 1;
    case CXCursor_ParenExpr:
    case CXCursor_UnexposedExpr:
    case CXCursor_CStyleCastExpr:
    case CXCursor_ConditionalOperator: return bp_kids_uniform(bp, i, pos, 0);
    case CXCursor_BinaryOperator:
        if (n->op[0] ? strcmp(n->op, "=") == 0 : !bp_in_pure_macro(bp, i))
            return 0;
        return bp_kids_uniform(bp, i, pos, 0);
    case CXCursor_UnaryOperator:
        if (n->op[0] ? !(strcmp(n->op, "-") == 0 || strcmp(n->op, "+") == 0 ||
                         strcmp(n->op, "!") == 0 || strcmp(n->op, "~") == 0)
                     : !bp_in_pure_macro(bp, i))
            return 0;
        return bp_kids_uniform(bp, i, pos, 0);
    case CXCursor_DeclRefExpr:
        switch (n->ref) {
        case BP_REF_PARAM_SCALAR:
        case BP_REF_PARAM_LEN:
        case BP_REF_ENUM: return 1;
        case BP_REF_LOCAL: {
            const bp_var *v = &bp->v[n->var];
            /* A value recomputed later must not read a uniform variable
             * that statements change meanwhile (a loop's counter does not
             * change within the body that declares the value). */
            if (pos && v->uniform && v->modified && v->for_stmt < 0)
                return 0;
            return v->uniform || (pos && v->pospure);
        }
        default: return 0;
        }
    case CXCursor_MemberRefExpr: {
        int base = bp_strip_parens(bp, n->first);
        if (base < 0 || bp->n[base].kind != CXCursor_DeclRefExpr ||
            bp->n[base].ref != BP_REF_UNIT || strlen(n->name) != 2)
            return 0;
        if (strchr("dnc", n->name[0]))
            return 1;
        return pos && strchr("ua", n->name[0]);
    }
    case CXCursor_CallExpr:
        return bp_math_function(n->name) && bp_kids_uniform(bp, i, pos, 1);
    default: return 0;
    }
}

/* A for loop's step: a uniform update of its own counters. */
static int bp_uniform_step(const barrier_pass *bp, int i, int for_stmt)
{
    const bp_node *n = &bp->n[i];
    int first = n->first;
    int target = bp_strip_parens(bp, first);
    int counter = target >= 0 && bp->n[target].kind == CXCursor_DeclRefExpr &&
                  bp->n[target].ref == BP_REF_LOCAL &&
                  bp->v[bp->n[target].var].for_stmt == for_stmt;
    if (n->kind == CXCursor_CompoundAssignOperator ||
        (n->kind == CXCursor_BinaryOperator && strcmp(n->op, "=") == 0))
        return counter && bp_uniform(bp, bp->n[first].next, 0);
    if (n->kind == CXCursor_UnaryOperator &&
        (strcmp(n->op, "++") == 0 || strcmp(n->op, "--") == 0))
        return counter;
    if (n->kind == CXCursor_BinaryOperator && strcmp(n->op, ",") == 0)
        return bp_uniform_step(bp, first, for_stmt) &&
               bp_uniform_step(bp, bp->n[first].next, for_stmt);
    return bp_uniform(bp, i, 0);
}

/* A for loop's parts, found from the tokens of its header: init, cond and
 * inc (-1 where absent) and body. */
typedef struct bp_for {
    int init, cond, inc, body;
} bp_for;

static int bp_split_for(const barrier_pass *bp, int f, bp_for *out)
{
    out->init = out->cond = out->inc = out->body = -1;
    const bp_node *n = &bp->n[f];
    if (n->in_macro)
        return 0;
    unsigned p = n->start + 3, semi[2] = {0, 0}, close = 0;
    int depth = 0, ns = 0;
    while (p < bp->srclen && bp->src[p] != '(')
        p++;
    /* Comments and strings are not expected in a loop header with a
     * barrier loop; a header whose text does not split is refused. */
    for (; p < n->end && p < bp->srclen; p++) {
        char c = bp->src[p];
        if (c == '(')
            depth++;
        else if (c == ')' && --depth == 0) {
            close = p;
            break;
        } else if (c == ';' && depth == 1 && ns < 2)
            semi[ns++] = p;
        else if (c == '"' || c == '\'' ||
                 (c == '/' && p + 1 < bp->srclen &&
                  (bp->src[p + 1] == '*' || bp->src[p + 1] == '/')))
            return 0;
    }
    if (ns != 2 || !close)
        return 0;
    for (int c = n->first; c >= 0; c = bp->n[c].next) {
        unsigned s = bp->n[c].start;
        if (s < semi[0])
            out->init = c;
        else if (s < semi[1])
            out->cond = c;
        else if (s < close)
            out->inc = c;
        else
            out->body = c;
    }
    return out->body >= 0;
}

/* The end of statement `s` including its closing ';' when it has one. */
static unsigned bp_stmt_end(const barrier_pass *bp, int s)
{
    unsigned e = bp->n[s].end;
    unsigned p = e;
    while (p < bp->srclen && strchr(" \t\r\n", bp->src[p]))
        p++;
    if (p < bp->srclen && bp->src[p] == ';')
        return p + 1;
    return e;
}

/* Where the statements of a list (a block, or one statement) end. */
static unsigned bp_list_end(const barrier_pass *bp, int list)
{
    if (bp->n[list].kind == CXCursor_CompoundStmt)
        return bp->n[list].end - 1;
    return bp_stmt_end(bp, list);
}

/* Pass A: the structure. Marks declarations that are statements of a list,
 * the counters of for loops with barriers, and refuses barriers in places
 * the pass does not handle. */
static void bp_scan_stmt(barrier_pass *bp, int s);

static void bp_scan_list(barrier_pass *bp, int list)
{
    if (bp->n[list].kind != CXCursor_CompoundStmt) {
        bp_scan_stmt(bp, list);
        return;
    }
    unsigned prev = 0;
    for (int s = bp->n[list].first; s >= 0; s = bp->n[s].next) {
        if (bp->n[s].start < prev && bp->n[list].barrier)
            bp_refuse(bp, "a macro spans statements around cube_sync()");
        prev = bp->n[s].end;
        bp_scan_stmt(bp, s);
    }
}

static void bp_scan_stmt(barrier_pass *bp, int s)
{
    bp_node *n = &bp->n[s];
    n->list_stmt = 1;
    if (n->kind == CXCursor_DeclStmt)
        for (int c = n->first; c >= 0; c = bp->n[c].next)
            if (bp->n[c].kind == CXCursor_VarDecl)
                bp->v[bp->n[c].var].list_level = 1;
    if (!n->barrier)
        return;
    switch (n->kind) {
    case CXCursor_CallExpr:
        if (!bp_is_barrier_call(bp, s))
            bp_refuse(bp, "cube_sync() inside an expression");
        return;
    case CXCursor_CompoundStmt: bp_scan_list(bp, s); return;
    case CXCursor_IfStmt:
    case CXCursor_WhileStmt:
    case CXCursor_DoStmt:
        if (n->in_macro)
            bp_refuse(bp, "a macro expands to control flow around cube_sync()");
        for (int c = bp_kid(bp, s, n->kind == CXCursor_DoStmt ? 0 : 1); c >= 0;
             c = bp->n[c].next)
            if (!bp_is_expr(bp->n[c].kind))
                bp_scan_list(bp, c);
        return;
    case CXCursor_ForStmt: {
        bp_for f;
        if (!bp_split_for(bp, s, &f)) {
            bp_refuse(bp, "a for loop with cube_sync() whose header the pass "
                          "cannot read");
            return;
        }
        if (f.init >= 0) {
            if (bp->n[f.init].kind != CXCursor_DeclStmt) {
                bp_refuse(bp, "a for loop with cube_sync() whose init is not a "
                              "declaration");
                return;
            }
            for (int c = bp->n[f.init].first; c >= 0; c = bp->n[c].next)
                if (bp->n[c].kind == CXCursor_VarDecl)
                    bp->v[bp->n[c].var].for_stmt = s;
        }
        bp_scan_list(bp, f.body);
        return;
    }
    case CXCursor_SwitchStmt:
        bp_refuse(bp, "cube_sync() inside a switch");
        return;
    case CXCursor_LabelStmt:
        bp_refuse(bp, "goto or a label in a kernel with cube_sync()");
        return;
    default:
        bp_refuse(bp, "cube_sync() inside an expression or a statement of "
                      "another kind");
    }
}

/* Modifications and addresses of locals and parameters. */
static void bp_scan_uses(barrier_pass *bp)
{
    for (int i = 0; i < bp->nn; i++) {
        bp_node *n = &bp->n[i];
        if (n->kind != CXCursor_DeclRefExpr ||
            !(n->ref == BP_REF_LOCAL || n->ref == BP_REF_PARAM_SCALAR ||
              n->ref == BP_REF_PARAM_LEN || n->ref == BP_REF_PARAM_PTR))
            continue;
        int c = i, p = n->parent;
        while (p >= 0 && bp->n[p].kind == CXCursor_ParenExpr) {
            c = p;
            p = bp->n[p].parent;
        }
        if (p < 0)
            continue;
        const bp_node *pn = &bp->n[p];
        int first = pn->first == c, modified = 0, addressed = 0;
        int pure = bp_in_pure_macro(bp, p);
        if (pn->kind == CXCursor_UnaryOperator) {
            if (strcmp(pn->op, "++") == 0 || strcmp(pn->op, "--") == 0)
                modified = 1;
            else if (strcmp(pn->op, "&") == 0)
                addressed = 1;
            else if (!pn->op[0] && !pure)
                modified = addressed = 1;
        } else if (pn->kind == CXCursor_CompoundAssignOperator && first) {
            modified = 1;
        } else if (pn->kind == CXCursor_BinaryOperator && first) {
            if (strcmp(pn->op, "=") == 0 || (!pn->op[0] && !pure))
                modified = 1;
        }
        /* A local array used other than through a subscript (or
         * sizeof) gives away its address. */
        if (n->ref == BP_REF_LOCAL && bp->v[n->var].is_array &&
            !((pn->kind == CXCursor_ArraySubscriptExpr ||
               pn->kind == CXCursor_UnexposedExpr) &&
              first) &&
            pn->kind != CXCursor_UnaryExpr)
            addressed = 1;
        if (n->ref == BP_REF_LOCAL && bp->v[n->var].is_array &&
            pn->kind == CXCursor_UnexposedExpr) {
            /* The decay to a pointer: fine as a subscript's base. */
            int q = pn->parent;
            if (q < 0 || bp->n[q].kind != CXCursor_ArraySubscriptExpr ||
                bp->n[q].first != p)
                addressed = 1;
        }
        if (!modified && !addressed)
            continue;
        if (n->ref != BP_REF_LOCAL) {
            bp_refuse(bp,
                      "the kernel assigns or takes the address of its "
                      "parameter '%s'",
                      n->name);
            continue;
        }
        bp_var *v = &bp->v[n->var];
        v->addressed |= addressed;
        /* Its address could outlive the unit's loop iteration (in a
         * pointer, in memory): fibers keep every unit's locals. */
        if (addressed)
            bp_refuse(bp,
                      "the address of the local '%s' is taken in a kernel "
                      "with cube_sync()",
                      v->name);
        if (modified) {
            v->modified = 1;
            /* The step of the for loop that declares it. */
            int inc_of = 0, ds = bp->n[v->decl].parent;
            int fs = ds >= 0 ? bp->n[ds].parent : -1;
            if (fs >= 0 && bp->n[fs].kind == CXCursor_ForStmt) {
                bp_for f;
                if (bp_split_for(bp, fs, &f) && f.init == ds && f.inc >= 0 &&
                    bp_within(bp, i, f.inc))
                    inc_of = 1;
            }
            if (!inc_of)
                v->modified_outside_inc = 1;
            if (!bp->n[p].list_stmt)
                v->modified_in_expr = 1;
        }
    }
}

/* The local a list statement `i` assigns, increments or decrements, or
 * -1. */
static int bp_update_target(const barrier_pass *bp, int i)
{
    const bp_node *n = &bp->n[i];
    if (!n->list_stmt)
        return -1;
    int k = n->kind;
    if (!(k == CXCursor_CompoundAssignOperator ||
          k == CXCursor_BinaryOperator || k == CXCursor_UnaryOperator))
        return -1;
    int t = n->first;
    while (t >= 0 && bp->n[t].kind == CXCursor_ParenExpr)
        t = bp->n[t].first;
    if (t < 0 || bp->n[t].kind != CXCursor_DeclRefExpr ||
        bp->n[t].ref != BP_REF_LOCAL)
        return -1;
    return bp->n[t].var;
}

/* Whether list statement `i` is `x op= uniform`, `x = uniform`, `x++`,
 * `x--`, `++x` or `--x` for a uniform local x. */
static int bp_uniform_update(const barrier_pass *bp, int i)
{
    const bp_node *n = &bp->n[i];
    int t = bp_update_target(bp, i);
    if (t < 0 || !bp->v[t].uniform)
        return 0;
    if (n->kind == CXCursor_UnaryOperator)
        return strcmp(n->op, "++") == 0 || strcmp(n->op, "--") == 0;
    if (n->kind == CXCursor_BinaryOperator && strcmp(n->op, "=") != 0)
        return 0;
    int rhs = bp->n[n->first].next;
    return rhs >= 0 && bp_uniform(bp, rhs, 0);
}

/* Which locals are uniform (one value per cube, kept as a plain variable
 * run once per cube) and which are made of positions and uniform values. */
static void bp_classify_values(barrier_pass *bp)
{
    for (int i = 0; i < bp->nv; i++) {
        bp_var *v = &bp->v[i];
        int dn = v->decl;
        for (int c = bp->n[dn].first; c >= 0; c = bp->n[c].next)
            if (bp_is_expr(bp->n[c].kind))
                v->init = c;
        int ok = v->scalar && !v->is_static && !v->is_volatile &&
                 !v->addressed && v->init >= 0;
        /* A loop's counter changed only by its step, or a variable of a
         * list changed only by whole statements of lists (checked below:
         * uniform updates). */
        v->uniform =
            ok && ((v->for_stmt >= 0 && !v->modified_outside_inc) ||
                   (v->list_level && v->for_stmt < 0 && !v->modified_in_expr));
        v->pospure = ok && !v->modified;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        /* A statement that changes a uniform variable must be a uniform
         * update of it (run once per cube). */
        for (int i = 0; i < bp->nn; i++) {
            int t = bp_update_target(bp, i);
            if (t >= 0 && bp->v[t].uniform && bp->v[t].for_stmt < 0 &&
                !bp_uniform_update(bp, i)) {
                bp->v[t].uniform = 0;
                changed = 1;
            }
        }
        for (int i = 0; i < bp->nv; i++) {
            bp_var *v = &bp->v[i];
            if (v->uniform && !bp_uniform(bp, v->init, 0)) {
                v->uniform = 0;
                changed = 1;
            }
            if (v->pospure && !bp_uniform(bp, v->init, 1)) {
                v->pospure = 0;
                changed = 1;
            }
            /* A declaration runs once per cube only when all it declares
             * is uniform. */
            if (v->uniform && v->for_stmt < 0) {
                int ds = bp->n[v->decl].parent;
                for (int c = bp->n[ds].first; c >= 0; c = bp->n[c].next)
                    if (bp->n[c].kind == CXCursor_VarDecl &&
                        !bp->v[bp->n[c].var].uniform) {
                        v->uniform = 0;
                        changed = 1;
                    }
            }
        }
    }
}

/* Pass B: conditions and steps of the structure are uniform. */
static void bp_check_structure(barrier_pass *bp, int s);

static void bp_check_list(barrier_pass *bp, int list)
{
    if (bp->n[list].kind != CXCursor_CompoundStmt) {
        bp_check_structure(bp, list);
        return;
    }
    for (int s = bp->n[list].first; s >= 0; s = bp->n[s].next)
        bp_check_structure(bp, s);
}

static void bp_check_structure(barrier_pass *bp, int s)
{
    bp_node *n = &bp->n[s];
    if (!n->barrier || bp->refused)
        return;
    switch (n->kind) {
    case CXCursor_CompoundStmt: bp_check_list(bp, s); return;
    case CXCursor_IfStmt:
    case CXCursor_WhileStmt:
    case CXCursor_DoStmt: {
        int cond = n->kind == CXCursor_DoStmt ? bp_kid(bp, s, 1) : n->first;
        if (cond < 0 || !bp_uniform(bp, cond, 0)) {
            bp_refuse(bp,
                      "the condition of %s around cube_sync() may differ "
                      "between units",
                      n->kind == CXCursor_IfStmt ? "an if" : "a loop");
            return;
        }
        for (int c = bp_kid(bp, s, n->kind == CXCursor_DoStmt ? 0 : 1); c >= 0;
             c = bp->n[c].next)
            if (!bp_is_expr(bp->n[c].kind))
                bp_check_list(bp, c);
        return;
    }
    case CXCursor_ForStmt: {
        bp_for f;
        bp_split_for(bp, s, &f);
        if (f.init >= 0)
            for (int c = bp->n[f.init].first; c >= 0; c = bp->n[c].next)
                if (bp->n[c].kind == CXCursor_VarDecl &&
                    !bp->v[bp->n[c].var].uniform) {
                    bp_refuse(bp,
                              "the counter '%s' of a loop around "
                              "cube_sync() may differ between units",
                              bp->v[bp->n[c].var].name);
                    return;
                }
        if ((f.cond >= 0 && !bp_uniform(bp, f.cond, 0)) ||
            (f.inc >= 0 && !bp_uniform_step(bp, f.inc, s))) {
            bp_refuse(bp, "the condition or step of a loop around cube_sync() "
                          "may differ between units");
            return;
        }
        bp_check_list(bp, f.body);
        return;
    }
    default: return;
    }
}

/* A grid-stride loop: `for (T i = <unit x position> [+ uniform];
 * i < uniform; i += uniform)` in a 1-D cube, whose body leaves `i` alone
 * and never leaves the loop early. */
static int bp_stride_loop(barrier_pass *bp, int s)
{
    if (bp->n[s].kind != CXCursor_ForStmt || bp->dim[1] != 1 || bp->dim[2] != 1)
        return 0;
    bp_for f;
    if (!bp_split_for(bp, s, &f) || f.init < 0 || f.cond < 0 || f.inc < 0)
        return 0;
    int d = bp->n[f.init].first;
    if (d < 0 || bp->n[d].next >= 0 || bp->n[d].kind != CXCursor_VarDecl)
        return 0;
    bp_var *v = &bp->v[bp->n[d].var];
    if (v->init < 0 || !v->scalar || v->is_static || v->is_volatile ||
        v->addressed || v->modified_outside_inc || v->size < 4)
        return 0;
    /* The start: the unit's x position, widened, plus a uniform value. */
    int e = bp_strip_parens(bp, v->init);
    int found = 0;
    for (int guard = 0; e >= 0 && guard < 8; guard++) {
        if (bp->n[e].kind == CXCursor_CStyleCastExpr && bp->n[e].tsize < 4)
            return 0;
        if (bp->n[e].kind == CXCursor_CStyleCastExpr ||
            bp->n[e].kind == CXCursor_UnexposedExpr ||
            bp->n[e].kind == CXCursor_ParenExpr) {
            e = bp->n[e].last;
            continue;
        }
        if (bp->n[e].kind == CXCursor_BinaryOperator &&
            strcmp(bp->n[e].op, "+") == 0) {
            int a = bp->n[e].first, b = bp->n[a].next;
            if (bp_uniform(bp, a, 0)) {
                e = b;
                continue;
            }
            if (bp_uniform(bp, b, 0)) {
                e = a;
                continue;
            }
            return 0;
        }
        if (bp->n[e].kind == CXCursor_MemberRefExpr &&
            (strcmp(bp->n[e].name, "ax") == 0 ||
             strcmp(bp->n[e].name, "ux") == 0)) {
            int base = bp_strip_parens(bp, bp->n[e].first);
            found = base >= 0 && bp->n[base].ref == BP_REF_UNIT;
        }
        break;
    }
    if (!found)
        return 0;
    /* The bound and the step. */
    const bp_node *c = &bp->n[f.cond];
    if (c->kind != CXCursor_BinaryOperator || strcmp(c->op, "<") != 0)
        return 0;
    int l = bp_strip_parens(bp, c->first);
    if (l < 0 || bp->n[l].kind != CXCursor_DeclRefExpr ||
        bp->n[l].var != v - bp->v || !bp_uniform(bp, bp->n[c->first].next, 0))
        return 0;
    const bp_node *in = &bp->n[f.inc];
    int t = bp_strip_parens(bp, in->first);
    if (t < 0 || bp->n[t].kind != CXCursor_DeclRefExpr ||
        bp->n[t].var != v - bp->v)
        return 0;
    if (!((in->kind == CXCursor_CompoundAssignOperator &&
           strcmp(in->op, "+=") == 0 &&
           bp_uniform(bp, bp->n[in->first].next, 0)) ||
          (in->kind == CXCursor_UnaryOperator && strcmp(in->op, "++") == 0)))
        return 0;
    /* The body never leaves early. */
    for (int i = 0; i < bp->nn; i++) {
        int k = bp->n[i].kind;
        if ((k == CXCursor_BreakStmt || k == CXCursor_ContinueStmt ||
             k == CXCursor_ReturnStmt) &&
            bp_within(bp, i, f.body)) {
            /* A break or continue of a loop inside the body is fine. */
            int p = bp->n[i].parent, inner = 0;
            for (; p >= 0 && p != s; p = bp->n[p].parent) {
                int pk = bp->n[p].kind;
                if (pk == CXCursor_ForStmt || pk == CXCursor_WhileStmt ||
                    pk == CXCursor_DoStmt ||
                    (pk == CXCursor_SwitchStmt && k == CXCursor_BreakStmt)) {
                    inner = 1;
                    break;
                }
            }
            if (!inner || k == CXCursor_ReturnStmt)
                return 0;
        }
    }
    return 1;
}

/* Pass C: the regions. */
static int bp_new_region(barrier_pass *bp, int first)
{
    if (!bp_grow(bp, (void **)&bp->r, &bp->rcap, bp->nr + 1, sizeof *bp->r))
        return -1;
    bp_region *r = &bp->r[bp->nr];
    memset(r, 0, sizeof *r);
    r->first = r->last = first;
    r->swap = -1;
    return bp->nr++;
}

static void bp_mark(barrier_pass *bp, int s, int region)
{
    bp->n[s].region = region;
    for (int c = bp->n[s].first; c >= 0; c = bp->n[c].next)
        bp_mark(bp, c, region);
}

/* Whether statement `s` is a declaration run once per cube. */
static int bp_serial_decl(const barrier_pass *bp, int s)
{
    if (bp->n[s].kind != CXCursor_DeclStmt || bp->n[s].first < 0)
        return 0;
    for (int c = bp->n[s].first; c >= 0; c = bp->n[c].next)
        if (bp->n[c].kind != CXCursor_VarDecl || !bp->v[bp->n[c].var].uniform)
            return 0;
    return 1;
}

static void bp_regions_stmt(barrier_pass *bp, int s);

static void bp_regions_list(barrier_pass *bp, int list)
{
    int single = bp->n[list].kind != CXCursor_CompoundStmt;
    int cur = -1;
    for (int s = single ? list : bp->n[list].first; s >= 0;
         s = single ? -1 : bp->n[s].next) {
        if (bp->n[s].barrier) {
            cur = -1;
            bp_regions_stmt(bp, s);
        } else if (bp_serial_decl(bp, s) || bp_uniform_update(bp, s)) {
            cur = -1;
        } else if (bp_stride_loop(bp, s)) {
            int r = bp_new_region(bp, s);
            if (r < 0)
                return;
            bp->r[r].swap = s;
            bp->r[r].tstart = bp->n[s].start;
            bp->r[r].tend = bp_stmt_end(bp, s);
            bp_mark(bp, s, r);
            cur = -1;
        } else {
            if (cur < 0) {
                cur = bp_new_region(bp, s);
                if (cur < 0)
                    return;
                bp->r[cur].tstart = bp->n[s].start;
            }
            bp->r[cur].last = s;
            int nx = single ? -1 : bp->n[s].next;
            bp->r[cur].tend = nx >= 0 ? bp->n[nx].start : bp_list_end(bp, list);
            bp_mark(bp, s, cur);
        }
    }
}

static void bp_regions_stmt(barrier_pass *bp, int s)
{
    bp_node *n = &bp->n[s];
    switch (n->kind) {
    case CXCursor_CompoundStmt: bp_regions_list(bp, s); return;
    case CXCursor_IfStmt:
    case CXCursor_WhileStmt:
    case CXCursor_DoStmt:
        for (int c = bp_kid(bp, s, n->kind == CXCursor_DoStmt ? 0 : 1); c >= 0;
             c = bp->n[c].next)
            if (!bp_is_expr(bp->n[c].kind))
                bp_regions_list(bp, c);
        return;
    case CXCursor_ForStmt: {
        bp_for f;
        bp_split_for(bp, s, &f);
        bp_regions_list(bp, f.body);
        return;
    }
    default: return;
    }
}

/* Returns, breaks and continues that would leave a region. */
static void bp_check_jumps(barrier_pass *bp)
{
    /* The last region of the body's own list, when nothing with a barrier
     * follows it: a return there only ends its unit. */
    int last = -1;
    for (int s = bp->n[bp->body].first; s >= 0; s = bp->n[s].next)
        last = bp->n[s].barrier ? -1 : bp->n[s].region;
    for (int i = 0; i < bp->nn; i++) {
        int k = bp->n[i].kind;
        if (k == CXCursor_ReturnStmt) {
            int r = bp->n[i].region;
            if (r < 0 || r != last || bp->r[r].swap >= 0 || bp->n[i].in_macro)
                bp_refuse(bp, "a return before a cube_sync()");
            else
                bp->r[r].has_return = 1;
        } else if (k == CXCursor_BreakStmt || k == CXCursor_ContinueStmt) {
            for (int p = bp->n[i].parent; p >= 0; p = bp->n[p].parent) {
                int pk = bp->n[p].kind;
                if (pk == CXCursor_ForStmt || pk == CXCursor_WhileStmt ||
                    pk == CXCursor_DoStmt ||
                    (pk == CXCursor_SwitchStmt && k == CXCursor_BreakStmt)) {
                    if (bp->n[p].barrier)
                        bp_refuse(bp, "a %s out of a loop with cube_sync()",
                                  k == CXCursor_BreakStmt ? "break"
                                                          : "continue");
                    break;
                }
            }
        } else if (k == CXCursor_GotoStmt || k == CXCursor_IndirectGotoStmt ||
                   k == CXCursor_LabelStmt) {
            bp_refuse(bp, "goto or a label in a kernel with cube_sync()");
        } else if (k == CXCursor_GCCAsmStmt || k == CXCursor_MSAsmStmt) {
            bp_refuse(bp, "inline assembly in a kernel with cube_sync()");
        } else if (k == CXCursor_VarDecl && bp->v[bp->n[i].var].is_static) {
            bp_refuse(bp, "a static local variable");
        }
    }
}

/* Marks the positions-only variables `init` uses as recomputed too. */
static void bp_mark_deps(barrier_pass *bp, int i)
{
    const bp_node *n = &bp->n[i];
    if (n->kind == CXCursor_DeclRefExpr && n->ref == BP_REF_LOCAL) {
        bp_var *w = &bp->v[n->var];
        if (!w->uniform && w->cls != BP_CLS_RECOMPUTE) {
            w->cls = BP_CLS_RECOMPUTE;
            w->crossing = 1;
            bp_mark_deps(bp, w->init);
        }
    }
    for (int c = n->first; c >= 0; c = bp->n[c].next)
        bp_mark_deps(bp, c);
}

/* The first name expression `i` uses that is declared more often than
 * once (a local) or at all (a parameter's name hidden by a local): the
 * node, or -1 when every name means the same anywhere in the body. */
static int bp_name_declared_twice(const barrier_pass *bp, int i)
{
    const bp_node *n = &bp->n[i];
    if (n->kind == CXCursor_DeclRefExpr &&
        (n->ref == BP_REF_LOCAL || n->ref == BP_REF_PARAM_SCALAR ||
         n->ref == BP_REF_PARAM_LEN)) {
        int same = 0;
        for (int j = 0; j < bp->nv; j++)
            same += strcmp(bp->v[j].name, n->name) == 0;
        if (same > (n->ref == BP_REF_LOCAL ? 1 : 0))
            return i;
    }
    for (int c = n->first; c >= 0; c = bp->n[c].next) {
        int k = bp_name_declared_twice(bp, c);
        if (k >= 0)
            return k;
    }
    return -1;
}

/* The names an expression recomputed elsewhere uses must mean the same
 * there: a parameter no local hides, or a local declared once. */
static void bp_check_names(barrier_pass *bp, int i)
{
    int k = bp_name_declared_twice(bp, i);
    if (k >= 0)
        bp_refuse(bp, "the name '%s' is declared twice", bp->n[k].name);
}

/* Pass D: variables used across regions. */
static void bp_classify_crossing(barrier_pass *bp)
{
    for (int i = 0; i < bp->nn; i++) {
        const bp_node *n = &bp->n[i];
        if (n->kind != CXCursor_DeclRefExpr || n->ref != BP_REF_LOCAL)
            continue;
        bp_var *v = &bp->v[n->var];
        if (v->uniform)
            v->cls = BP_CLS_UNIFORM;
        else if (n->region != bp->n[v->decl].region)
            v->crossing = 1;
    }
    long long context = 0;
    for (int i = 0; i < bp->nv; i++) {
        bp_var *v = &bp->v[i];
        if (!v->crossing || v->cls == BP_CLS_UNIFORM)
            continue;
        if (v->pospure) {
            if (v->cls != BP_CLS_RECOMPUTE) {
                v->cls = BP_CLS_RECOMPUTE;
                bp_mark_deps(bp, v->init);
            }
            continue;
        }
        if (v->is_array || !v->scalar || v->size <= 0)
            bp_refuse(bp,
                      "the local '%s' (not a scalar) lives across "
                      "cube_sync()",
                      v->name);
        else if (v->addressed)
            bp_refuse(bp,
                      "the address of '%s' is taken and it lives across "
                      "cube_sync()",
                      v->name);
        else if (v->is_static || v->is_volatile)
            bp_refuse(bp, "the local '%s' is static or volatile", v->name);
        else if (strchr(v->type, '*') && bp->has_local_array)
            bp_refuse(bp,
                      "the pointer '%s' lives across cube_sync() in a "
                      "kernel with local arrays",
                      v->name);
        else if (!v->list_level)
            bp_refuse(bp,
                      "the local '%s' lives across cube_sync() but is "
                      "not declared at the level of its block",
                      v->name);
        v->cls = BP_CLS_CTX;
        context += v->size;
    }
    if ((unsigned long long)context * bp->dim[0] * bp->dim[1] * bp->dim[2] >
        (unsigned long long)BP_MAX_CONTEXT)
        bp_refuse(bp, "over %lld bytes of per-unit values across cube_sync()",
                  BP_MAX_CONTEXT);
    /* A name declared twice could bind differently where it is reloaded or
     * recomputed. */
    for (int i = 0; i < bp->nv; i++) {
        if (!bp->v[i].crossing)
            continue;
        for (int j = 0; j < bp->nv; j++)
            if (j != i && strcmp(bp->v[i].name, bp->v[j].name) == 0)
                bp_refuse(bp, "the name '%s' is declared twice", bp->v[i].name);
        if (bp->v[i].cls == BP_CLS_RECOMPUTE)
            bp_check_names(bp, bp->v[i].init);
    }
}

/* ------------------------------------------------------- the output */

static void bp_text(barrier_pass *bp, unsigned a, unsigned b)
{
    if (a < b && b <= bp->srclen)
        bp_put(&bp->out, bp->src + a, b - a);
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

/* ------------------------------------ statements for some units only */

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
            int base = bp_strip_parens(bp, n->first);
            if (base < 0 || bp->n[base].kind != CXCursor_DeclRefExpr ||
                bp->n[base].ref != BP_REF_UNIT || n->name[0] != 'u' ||
                !n->name[1] || !strchr("xyz", n->name[1]) || n->name[2])
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
    int np = 0, peeled = 0;
    unsigned prev = 0;
    for (int s = rg->first; s >= 0; s = s == rg->last ? -1 : bp->n[s].next) {
        const bp_node *n = &bp->n[s];
        if (n->start < prev)
            return 0; /* statements out of order (macros) */
        prev = n->end;
        int fix[3] = {-1, -1, -1};
        int guarded = n->kind == CXCursor_IfStmt && !n->in_macro &&
                      n->nkids == 2 && bp_guard_fixes(bp, n->first, fix) > 0;
        if (!guarded && np > 0 && p[np - 1].fix[0] < 0 &&
            p[np - 1].fix[1] < 0 && p[np - 1].fix[2] < 0) {
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
        int fixed = p[k].fix[0] >= 0 || p[k].fix[1] >= 0 || p[k].fix[2] >= 0;
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
        bp_put(&bp->out, ik.data, ik.len);
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
    bp_put(&bp->out, ik.data, ik.len);
    bp_text(bp, bs, be);
    bp_printf(bp, "\n}\n");
    bp_stores(bp, r, need);
    bp_close_units(bp);
    bp_printf(bp, "} else {\nint cube__active = 0;\ncube__ended = 1;\n");
    bp_open_units(bp, -1);
    bp_printf(bp, "if (!cube__done[cube__i]) {\n");
    bp_prologue(bp, r, need);
    bp_printf(bp, "{\n");
    bp_put(&bp->out, ik.data, ik.len);
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

static void bp_emit(barrier_pass *bp)
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

/* ------------------------------------------------------- the driver */

static enum CXChildVisitResult bp_find_compound(CXCursor c, CXCursor parent,
                                                CXClientData data)
{
    (void)parent;
    barrier_pass *bp = data;
    if (bp->lc->getCursorKind(c) == CXCursor_CompoundStmt) {
        bp->body = bp_add_node(bp, c, -1);
        if (bp->body >= 0) {
            bp_visit vs = {bp, bp->body};
            bp->lc->visitChildren(c, bp_visit_fn, &vs);
        }
        return CXChildVisit_Break;
    }
    return CXChildVisit_Continue;
}

/* Parses `source` and analyses the body; fills u->out on success. */
static void bp_run(barrier_pass *bp, CXIndex index)
{
    const cpu_libclang *lc = bp->lc;
    static const char path[] = "/cubert/kernel.c";
    struct CXUnsavedFile file = {path, bp->src, (unsigned long)bp->srclen};
    const char *const args[] = {"-x", "c", "-std=c11", "-DCUBE_CHECKED=0",
                                "-w"};
    enum CXErrorCode ec = lc->parseTranslationUnit2(
        index, path, args, (int)(sizeof args / sizeof args[0]), &file, 1,
        CXTranslationUnit_DetailedPreprocessingRecord, &bp->tu);
    if (ec != CXError_Success || !bp->tu) {
        bp_refuse(bp, "libclang could not parse the kernel (error %d)",
                  (int)ec);
        return;
    }
    unsigned nd = lc->getNumDiagnostics(bp->tu);
    for (unsigned i = 0; i < nd && !bp->refused; i++) {
        CXDiagnostic d = lc->getDiagnostic(bp->tu, i);
        if (lc->getDiagnosticSeverity(d) >= CXDiagnostic_Error) {
            char msg[200];
            bp_copy_string(bp, lc->getDiagnosticSpelling(d), msg, sizeof msg);
            bp_refuse(bp, "libclang reports an error: %s", msg);
        }
        lc->disposeDiagnostic(d);
    }
    if (bp->refused)
        return;
    lc->visitChildren(lc->getTranslationUnitCursor(bp->tu), bp_top_fn, bp);
    if (bp->oom)
        return;
    if (!bp->have_body) {
        bp_refuse(bp, "no body for the kernel found");
        return;
    }
    if (bp->helper_sync) {
        bp_refuse(bp, "cube_sync() in a helper function");
        return;
    }
    /* The kernel's CUBE_KERNEL(...) header, whose arguments the new entry
     * repeats: the invocation where the body function begins. */
    CXSourceRange ext = lc->getCursorExtent(bp->body_fn);
    unsigned fstart = bp_offset(bp, lc->getRangeStart(ext), 0);
    bp->kernel_macro = -1;
    for (int i = 0; i < bp->nm; i++)
        if (bp->m[i].start == fstart &&
            strcmp(bp->m[i].name, "CUBE_KERNEL") == 0)
            bp->kernel_macro = i;
    if (bp->kernel_macro < 0) {
        bp_refuse(bp, "the kernel's CUBE_KERNEL(...) is not in the source "
                      "itself");
        return;
    }
    bp->body = -1;
    lc->visitChildren(bp->body_fn, bp_find_compound, bp);
    if (bp->oom || bp->refused)
        return;
    if (bp->body < 0) {
        bp_refuse(bp, "no body for the kernel found");
        return;
    }
    if (bp->n[bp->body].in_macro) {
        bp_refuse(bp, "the kernel's body comes from a macro");
        return;
    }
    bp_finish_tree(bp);
    bp_scan_list(bp, bp->body);
    bp_scan_uses(bp);
    if (bp->refused)
        return;
    bp_classify_values(bp);
    bp_check_structure(bp, bp->body);
    if (bp->refused)
        return;
    bp_regions_list(bp, bp->body);
    if (bp->oom)
        return;
    bp_check_jumps(bp);
    if (bp->refused)
        return;
    bp_classify_crossing(bp);
    if (bp->refused)
        return;
    bp_emit(bp);
}

/* libclang's index: created one at a time, its crash recovery (signal
 * handlers of its own, for the whole process) turned off at once. */
static pthread_mutex_t bp_index_lock = PTHREAD_MUTEX_INITIALIZER;

cpu_barrier_pass_status cpu_barrier_pass_transform(const char *source,
                                                   const char *name,
                                                   const unsigned dim[3],
                                                   char **out, char *why,
                                                   size_t why_len)
{
    *out = NULL;
    if (why_len)
        why[0] = '\0';
    const char *lwhy = "";
    const cpu_libclang *lc = cpu_libclang_get(&lwhy);
    if (!lc) {
        snprintf(why, why_len, "libclang is not available: %s", lwhy);
        return CPU_BARRIER_PASS_REFUSED;
    }
    barrier_pass bp;
    memset(&bp, 0, sizeof bp);
    bp.lc = lc;
    bp.src = source;
    bp.srclen = strlen(source);
    bp.kname = name;
    memcpy(bp.dim, dim, sizeof bp.dim);
    bp.why = why;
    bp.why_len = why_len;
    pthread_mutex_lock(&bp_index_lock);
    CXIndex index = lc->createIndex(0, 0);
    if (index)
        lc->toggleCrashRecovery(0);
    pthread_mutex_unlock(&bp_index_lock);
    if (!index) {
        snprintf(why, why_len, "libclang cannot create an index");
        return CPU_BARRIER_PASS_REFUSED;
    }
    bp_run(&bp, index);
    if (bp.tu)
        lc->disposeTranslationUnit(bp.tu);
    lc->disposeIndex(index);
    cpu_barrier_pass_status st = CPU_BARRIER_PASS_DONE;
    if (bp.oom || bp.out.failed)
        st = CPU_BARRIER_PASS_NO_MEMORY;
    else if (bp.refused)
        st = CPU_BARRIER_PASS_REFUSED;
    if (st == CPU_BARRIER_PASS_DONE)
        *out = bp.out.data;
    else
        free(bp.out.data);
    if (st == CPU_BARRIER_PASS_NO_MEMORY)
        snprintf(why, why_len, "out of memory");
    free(bp.n);
    free(bp.v);
    free(bp.m);
    free(bp.r);
    return st;
}

#endif /* CUBE_HAVE_LIBCLANG */
