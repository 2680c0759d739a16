/* The barrier pass (see cpu_unitloop.h).
 *
 * The kernel's translation unit is parsed with libclang and the body of
 * <name>__body is copied into a tree of its own (ul_node): kinds, file
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

#include "backends/cpu/cpu_unitloop.h"
#include "backends/cpu/cpu_libclang.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CUBE_HAVE_LIBCLANG

cpu_unitloop_status cpu_unitloop_transform(const char *source, const char *name,
                                           const unsigned dim[3], char **out,
                                           char *why, size_t why_len)
{
    (void)source;
    (void)name;
    (void)dim;
    *out = NULL;
    snprintf(why, why_len, "cubert was built without libclang's headers");
    return CPU_UNITLOOP_REFUSED;
}

#else

#include <pthread.h>

/* The most bytes of per-unit arrays a cube may keep across barriers. */
#define UL_MAX_CONTEXT ((long long)256 * 1024)

/* What a name refers to. */
enum {
    R_NONE = 0,
    R_LOCAL,        /* a local variable of the body */
    R_PARAM_SCALAR, /* a scalar parameter (const) */
    R_PARAM_LEN,    /* a buffer's length companion */
    R_PARAM_PTR,    /* a buffer or shared array */
    R_UNIT,         /* cube__u, the unit's positions */
    R_SYNC,         /* cube__sync_fn */
    R_FUNC,         /* a function */
    R_ENUM,         /* an enumerator */
    R_OTHER
};

/* How a variable used across regions is carried. */
enum { CLS_PLAIN = 0, CLS_UNIFORM, CLS_RECOMPUTE, CLS_CTX };

typedef struct ul_node {
    int kind;
    int parent, first, last, next, nkids;
    unsigned start, end;   /* file offsets, rounded out to whole macros */
    unsigned sstart, send; /* spelling offsets */
    int in_macro;          /* starts inside a macro expansion */
    int ref, var;          /* DeclRefExpr: R_*, and the local's index */
    int barrier;           /* a barrier in the subtree */
    int list_stmt;         /* a statement of a list of the structure */
    int region;            /* region index, or -1 (run once per cube) */
    long long tsize;       /* an expression's type size */
    int int_type;          /* an expression of an integer type */
    char name[64];
    char op[4]; /* an operator's spelling; "" when not known */
} ul_node;

typedef struct ul_var {
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
} ul_var;

typedef struct ul_macro {
    unsigned start, end;
    char name[32];
} ul_macro;

typedef struct ul_region {
    int first, last; /* statements (siblings) */
    unsigned tstart, tend;
    int swap; /* a grid-stride for loop run step-major, or -1 */
    int has_return;
} ul_region;

typedef struct ul_buf {
    char *data;
    size_t len, cap;
    int failed;
} ul_buf;

typedef struct ul {
    const cpu_libclang *lc;
    CXTranslationUnit tu;
    const char *src;
    size_t srclen;
    const char *kname;
    unsigned dim[3];
    ul_node *n;
    int nn, ncap;
    ul_var *v;
    int nv, vcap;
    ul_macro *m;
    int nm, mcap;
    ul_region *r;
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
    ul_buf out;
} ul;

/* ------------------------------------------------------------ helpers */

static int ul_refuse(ul *u, const char *fmt, ...)
{
    if (!u->refused && !u->oom) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(u->why, u->why_len, fmt, ap);
        va_end(ap);
    }
    u->refused = 1;
    return 0;
}

static int ul_grow(ul *u, void **p, int *cap, int need, size_t size)
{
    if (need <= *cap)
        return 1;
    int c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *g = realloc(*p, (size_t)c * size);
    if (!g) {
        u->oom = 1;
        return 0;
    }
    *p = g;
    *cap = c;
    return 1;
}

static void ul_put(ul_buf *b, const char *s, size_t len)
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

static void ul_printf(ul *u, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void ul_printf(ul *u, const char *fmt, ...)
{
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        ul_put(&u->out, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        u->out.failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    ul_put(&u->out, big, (size_t)n);
    free(big);
}

static void ul_copy_string(ul *u, CXString s, char *dst, size_t cap)
{
    const char *c = u->lc->getCString(s);
    snprintf(dst, cap, "%s", c ? c : "");
    u->lc->disposeString(s);
}

static unsigned ul_offset(ul *u, CXSourceLocation loc, int spelling)
{
    unsigned off = 0;
    if (spelling)
        u->lc->getSpellingLocation(loc, NULL, NULL, NULL, &off);
    else
        u->lc->getExpansionLocation(loc, NULL, NULL, NULL, &off);
    return off;
}

static int ul_is_expr(int kind)
{
    return kind >= CXCursor_FirstExpr && kind <= CXCursor_LastExpr;
}

/* The i-th child of node `p` (or -1). */
static int ul_kid(const ul *u, int p, int i)
{
    int c = u->n[p].first;
    while (c >= 0 && i-- > 0)
        c = u->n[c].next;
    return c;
}

static int ul_strip_parens(const ul *u, int i)
{
    while (i >= 0 &&
           (u->n[i].kind == CXCursor_ParenExpr ||
            u->n[i].kind == CXCursor_UnexposedExpr) &&
           u->n[i].nkids == 1)
        i = u->n[i].first;
    return i;
}

/* Whether `anc` is `i` or one of its ancestors. */
static int ul_within(const ul *u, int i, int anc)
{
    for (; i >= 0; i = u->n[i].parent)
        if (i == anc)
            return 1;
    return 0;
}

/* The outermost macro expansion holding file offset `o`, or -1. */
static int ul_macro_at(const ul *u, unsigned o)
{
    int best = -1;
    for (int i = 0; i < u->nm; i++)
        if (u->m[i].start <= o && o < u->m[i].end &&
            (best < 0 || u->m[i].start < u->m[best].start))
            best = i;
    return best;
}

/* The prelude's macros that expand to expressions without side effects. */
static int ul_pure_macro(const char *name)
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
static int ul_in_pure_macro(const ul *u, int i)
{
    if (!u->n[i].in_macro)
        return 0;
    int m = ul_macro_at(u, u->n[i].start);
    return m >= 0 && ul_pure_macro(u->m[m].name);
}

static int ul_math_function(const char *name)
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

static int ul_find_var(ul *u, CXCursor c)
{
    for (int i = 0; i < u->nv; i++)
        if (u->lc->equalCursors(u->v[i].cursor, c))
            return i;
    return -1;
}

static void ul_add_var(ul *u, CXCursor c, int node)
{
    if (!ul_grow(u, (void **)&u->v, &u->vcap, u->nv + 1, sizeof *u->v))
        return;
    ul_var *v = &u->v[u->nv];
    memset(v, 0, sizeof *v);
    v->cursor = c;
    v->decl = node;
    v->init = -1;
    v->for_stmt = -1;
    snprintf(v->name, sizeof v->name, "%s", u->n[node].name);
    CXType t = u->lc->getCursorType(c);
    ul_copy_string(u, u->lc->getTypeSpelling(t), v->type, sizeof v->type);
    CXType canon = u->lc->getCanonicalType(t);
    v->size = u->lc->Type_getSizeOf(canon);
    v->scalar =
        (canon.kind >= CXType_Bool && canon.kind <= CXType_LongDouble) ||
        canon.kind == CXType_Pointer || canon.kind == CXType_Enum;
    v->is_int = canon.kind >= CXType_Bool && canon.kind <= CXType_Int128;
    v->is_array = canon.kind == CXType_ConstantArray ||
                  canon.kind == CXType_VariableArray ||
                  canon.kind == CXType_IncompleteArray;
    if (canon.kind == CXType_VariableArray)
        ul_refuse(u, "a variable-length array");
    if (v->is_array)
        u->has_local_array = 1;
    v->is_volatile = (int)u->lc->isVolatileQualifiedType(t);
    enum CX_StorageClass sc = u->lc->Cursor_getStorageClass(c);
    v->is_static = sc == CX_SC_Static || sc == CX_SC_Extern;
    u->nv++;
}

static int ul_add_node(ul *u, CXCursor c, int parent)
{
    if (!ul_grow(u, (void **)&u->n, &u->ncap, u->nn + 1, sizeof *u->n))
        return -1;
    int i = u->nn++;
    ul_node *n = &u->n[i];
    memset(n, 0, sizeof *n);
    n->kind = u->lc->getCursorKind(c);
    n->parent = parent;
    n->first = n->last = n->next = -1;
    n->var = -1;
    n->region = -1;
    if (parent >= 0) {
        ul_node *p = &u->n[parent];
        if (p->last >= 0)
            u->n[p->last].next = i;
        else
            p->first = i;
        p->last = i;
        p->nkids++;
    }
    CXSourceRange ext = u->lc->getCursorExtent(c);
    CXSourceLocation b = u->lc->getRangeStart(ext);
    CXSourceLocation e = u->lc->getRangeEnd(ext);
    n->start = ul_offset(u, b, 0);
    n->end = ul_offset(u, e, 0);
    n->sstart = ul_offset(u, b, 1);
    n->send = ul_offset(u, e, 1);
    n->in_macro = n->sstart != n->start;
    if (n->kind == CXCursor_DeclRefExpr || n->kind == CXCursor_MemberRefExpr ||
        n->kind == CXCursor_CallExpr || n->kind == CXCursor_VarDecl)
        ul_copy_string(u, u->lc->getCursorSpelling(c), n->name, sizeof n->name);
    if (ul_is_expr(n->kind)) {
        CXType t = u->lc->getCanonicalType(u->lc->getCursorType(c));
        n->tsize = u->lc->Type_getSizeOf(t);
        n->int_type = t.kind >= CXType_Bool && t.kind <= CXType_Int128;
    }
    if (n->kind == CXCursor_VarDecl) {
        ul_add_var(u, c, i);
        n->var = u->nv - 1;
    } else if (n->kind == CXCursor_DeclRefExpr) {
        CXCursor ref = u->lc->getCursorReferenced(c);
        switch (u->lc->getCursorKind(ref)) {
        case CXCursor_VarDecl:
            n->var = ul_find_var(u, ref);
            n->ref = n->var >= 0                             ? R_LOCAL
                     : strcmp(n->name, "cube__sync_fn") == 0 ? R_SYNC
                                                             : R_OTHER;
            break;
        case CXCursor_ParmDecl: {
            size_t l = strlen(n->name);
            CXType t = u->lc->getCanonicalType(u->lc->getCursorType(ref));
            if (strcmp(n->name, "cube__u") == 0)
                n->ref = R_UNIT;
            else if (t.kind == CXType_Pointer)
                n->ref = R_PARAM_PTR;
            else if (l > 5 && strcmp(n->name + l - 5, "__len") == 0)
                n->ref = R_PARAM_LEN;
            else
                n->ref = R_PARAM_SCALAR;
            break;
        }
        case CXCursor_FunctionDecl: n->ref = R_FUNC; break;
        case CXCursor_EnumConstantDecl: n->ref = R_ENUM; break;
        default: n->ref = R_OTHER;
        }
    }
    return i;
}

typedef struct ul_visit {
    ul *u;
    int parent;
} ul_visit;

static enum CXChildVisitResult ul_visit_fn(CXCursor c, CXCursor parent,
                                           CXClientData data)
{
    (void)parent;
    ul_visit *vs = data;
    ul *u = vs->u;
    int i = ul_add_node(u, c, vs->parent);
    if (i < 0)
        return CXChildVisit_Break;
    ul_visit child = {u, i};
    u->lc->visitChildren(c, ul_visit_fn, &child);
    return u->oom ? CXChildVisit_Break : CXChildVisit_Continue;
}

/* Whether a function's body names cube__sync_fn. */
static enum CXChildVisitResult ul_find_sync_fn(CXCursor c, CXCursor parent,
                                               CXClientData data)
{
    (void)parent;
    ul *u = ((ul_visit *)data)->u;
    if (u->lc->getCursorKind(c) == CXCursor_DeclRefExpr) {
        char name[64];
        ul_copy_string(u, u->lc->getCursorSpelling(c), name, sizeof name);
        if (strcmp(name, "cube__sync_fn") == 0) {
            ((ul_visit *)data)->parent = 1;
            return CXChildVisit_Break;
        }
    }
    return CXChildVisit_Recurse;
}

static enum CXChildVisitResult ul_top_fn(CXCursor c, CXCursor parent,
                                         CXClientData data)
{
    (void)parent;
    ul *u = data;
    enum CXCursorKind k = u->lc->getCursorKind(c);
    if (k == CXCursor_MacroExpansion) {
        CXSourceRange ext = u->lc->getCursorExtent(c);
        if (!u->lc->Location_isFromMainFile(u->lc->getRangeStart(ext)))
            return CXChildVisit_Continue;
        if (!ul_grow(u, (void **)&u->m, &u->mcap, u->nm + 1, sizeof *u->m))
            return CXChildVisit_Break;
        ul_macro *m = &u->m[u->nm++];
        m->start = ul_offset(u, u->lc->getRangeStart(ext), 0);
        m->end = ul_offset(u, u->lc->getRangeEnd(ext), 0);
        ul_copy_string(u, u->lc->getCursorSpelling(c), m->name, sizeof m->name);
    } else if (k == CXCursor_FunctionDecl && u->lc->isCursorDefinition(c)) {
        char name[256], want[256];
        ul_copy_string(u, u->lc->getCursorSpelling(c), name, sizeof name);
        snprintf(want, sizeof want, "%s__body", u->kname);
        size_t l = strlen(name);
        if (strcmp(name, want) == 0) {
            u->body_fn = c;
            u->have_body = 1;
        } else if (!(l > 6 && strcmp(name + l - 6, "__body") == 0)) {
            ul_visit vs = {u, 0};
            u->lc->visitChildren(c, ul_find_sync_fn, &vs);
            if (vs.parent)
                u->helper_sync = 1;
        }
    }
    return CXChildVisit_Continue;
}

static int ul_is_barrier_call(const ul *u, int i)
{
    return u->n[i].kind == CXCursor_CallExpr &&
           strcmp(u->n[i].name, "cube__sync_fn") == 0;
}

/* The operator of a unary, binary or compound assignment node, from the
 * text between its operands; "" when that text is not in the file (the
 * operator comes from inside a macro). */
static void ul_find_op(ul *u, int i)
{
    ul_node *n = &u->n[i];
    unsigned a, b;
    int l = n->first, r = l >= 0 ? u->n[l].next : -1;
    if (n->kind == CXCursor_UnaryOperator) {
        if (l < 0)
            return;
        if (n->start < u->n[l].start) { /* prefix */
            a = n->start;
            b = u->n[l].start;
        } else {
            a = u->n[l].end;
            b = n->end;
        }
    } else {
        if (l < 0 || r < 0)
            return;
        a = u->n[l].end;
        b = u->n[r].start;
    }
    if (a >= b || b > u->srclen || b - a > 16)
        return;
    char t[4];
    size_t k = 0;
    for (unsigned p = a; p < b; p++) {
        char c = u->src[p];
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
static void ul_finish_tree(ul *u)
{
    for (int i = 0; i < u->nn; i++) {
        ul_node *n = &u->n[i];
        int m = ul_macro_at(u, n->start);
        if (m >= 0)
            n->start = u->m[m].start;
        m = ul_macro_at(u, n->end);
        if (m >= 0)
            n->end = u->m[m].end;
        if (n->end < n->start)
            n->end = n->start;
    }
    for (int i = 0; i < u->nn; i++) {
        int k = u->n[i].kind;
        if (k == CXCursor_UnaryOperator || k == CXCursor_BinaryOperator ||
            k == CXCursor_CompoundAssignOperator)
            ul_find_op(u, i);
    }
    /* Barriers, up the tree. */
    for (int i = 0; i < u->nn; i++)
        if (ul_is_barrier_call(u, i))
            for (int p = i; p >= 0 && !u->n[p].barrier; p = u->n[p].parent)
                u->n[p].barrier = 1;
}

/* ------------------------------------------------------ the analysis */

static int ul_uniform(const ul *u, int i, int pos);

static int ul_kids_uniform(const ul *u, int i, int pos, int skip)
{
    for (int c = u->n[i].first; c >= 0; c = u->n[c].next)
        if (skip-- <= 0 && ul_is_expr(u->n[c].kind) && !ul_uniform(u, c, pos))
            return 0;
    return 1;
}

/* Whether expression `i` has the same value in every unit of a cube (with
 * `pos`: is made of positions and such values only), with no side
 * effects. */
static int ul_uniform(const ul *u, int i, int pos)
{
    const ul_node *n = &u->n[i];
    switch (n->kind) {
    case CXCursor_IntegerLiteral:
    case CXCursor_FloatingLiteral:
    case CXCursor_CharacterLiteral:
    case CXCursor_UnaryExpr: /* sizeof, _Alignof: not evaluated */ return 1;
    case CXCursor_ParenExpr:
    case CXCursor_UnexposedExpr:
    case CXCursor_CStyleCastExpr:
    case CXCursor_ConditionalOperator: return ul_kids_uniform(u, i, pos, 0);
    case CXCursor_BinaryOperator:
        if (n->op[0] ? strcmp(n->op, "=") == 0 : !ul_in_pure_macro(u, i))
            return 0;
        return ul_kids_uniform(u, i, pos, 0);
    case CXCursor_UnaryOperator:
        if (n->op[0] ? !(strcmp(n->op, "-") == 0 || strcmp(n->op, "+") == 0 ||
                         strcmp(n->op, "!") == 0 || strcmp(n->op, "~") == 0)
                     : !ul_in_pure_macro(u, i))
            return 0;
        return ul_kids_uniform(u, i, pos, 0);
    case CXCursor_DeclRefExpr:
        switch (n->ref) {
        case R_PARAM_SCALAR:
        case R_PARAM_LEN:
        case R_ENUM: return 1;
        case R_LOCAL: {
            const ul_var *v = &u->v[n->var];
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
        int base = ul_strip_parens(u, n->first);
        if (base < 0 || u->n[base].kind != CXCursor_DeclRefExpr ||
            u->n[base].ref != R_UNIT || strlen(n->name) != 2)
            return 0;
        if (strchr("dnc", n->name[0]))
            return 1;
        return pos && strchr("ua", n->name[0]);
    }
    case CXCursor_CallExpr:
        return ul_math_function(n->name) && ul_kids_uniform(u, i, pos, 1);
    default: return 0;
    }
}

/* A for loop's step: a uniform update of its own counters. */
static int ul_uniform_step(const ul *u, int i, int for_stmt)
{
    const ul_node *n = &u->n[i];
    int first = n->first;
    int target = ul_strip_parens(u, first);
    int counter = target >= 0 && u->n[target].kind == CXCursor_DeclRefExpr &&
                  u->n[target].ref == R_LOCAL &&
                  u->v[u->n[target].var].for_stmt == for_stmt;
    if (n->kind == CXCursor_CompoundAssignOperator ||
        (n->kind == CXCursor_BinaryOperator && strcmp(n->op, "=") == 0))
        return counter && ul_uniform(u, u->n[first].next, 0);
    if (n->kind == CXCursor_UnaryOperator &&
        (strcmp(n->op, "++") == 0 || strcmp(n->op, "--") == 0))
        return counter;
    if (n->kind == CXCursor_BinaryOperator && strcmp(n->op, ",") == 0)
        return ul_uniform_step(u, first, for_stmt) &&
               ul_uniform_step(u, u->n[first].next, for_stmt);
    return ul_uniform(u, i, 0);
}

/* A for loop's parts, found from the tokens of its header: init, cond and
 * inc (-1 where absent) and body. */
typedef struct ul_for {
    int init, cond, inc, body;
} ul_for;

static int ul_split_for(const ul *u, int f, ul_for *out)
{
    out->init = out->cond = out->inc = out->body = -1;
    const ul_node *n = &u->n[f];
    if (n->in_macro)
        return 0;
    unsigned p = n->start + 3, semi[2] = {0, 0}, close = 0;
    int depth = 0, ns = 0;
    while (p < u->srclen && u->src[p] != '(')
        p++;
    /* Comments and strings are not expected in a loop header with a
     * barrier loop; a header whose text does not split is refused. */
    for (; p < n->end && p < u->srclen; p++) {
        char c = u->src[p];
        if (c == '(')
            depth++;
        else if (c == ')' && --depth == 0) {
            close = p;
            break;
        } else if (c == ';' && depth == 1 && ns < 2)
            semi[ns++] = p;
        else if (c == '"' || c == '\'' ||
                 (c == '/' && p + 1 < u->srclen &&
                  (u->src[p + 1] == '*' || u->src[p + 1] == '/')))
            return 0;
    }
    if (ns != 2 || !close)
        return 0;
    for (int c = n->first; c >= 0; c = u->n[c].next) {
        unsigned s = u->n[c].start;
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
static unsigned ul_stmt_end(const ul *u, int s)
{
    unsigned e = u->n[s].end;
    unsigned p = e;
    while (p < u->srclen && strchr(" \t\r\n", u->src[p]))
        p++;
    if (p < u->srclen && u->src[p] == ';')
        return p + 1;
    return e;
}

/* Where the statements of a list (a block, or one statement) end. */
static unsigned ul_list_end(const ul *u, int list)
{
    if (u->n[list].kind == CXCursor_CompoundStmt)
        return u->n[list].end - 1;
    return ul_stmt_end(u, list);
}

/* Pass A: the structure. Marks declarations that are statements of a list,
 * the counters of for loops with barriers, and refuses barriers in places
 * the pass does not handle. */
static void ul_scan_stmt(ul *u, int s);

static void ul_scan_list(ul *u, int list)
{
    if (u->n[list].kind != CXCursor_CompoundStmt) {
        ul_scan_stmt(u, list);
        return;
    }
    unsigned prev = 0;
    for (int s = u->n[list].first; s >= 0; s = u->n[s].next) {
        if (u->n[s].start < prev && u->n[list].barrier)
            ul_refuse(u, "a macro spans statements around cube_sync()");
        prev = u->n[s].end;
        ul_scan_stmt(u, s);
    }
}

static void ul_scan_stmt(ul *u, int s)
{
    ul_node *n = &u->n[s];
    n->list_stmt = 1;
    if (n->kind == CXCursor_DeclStmt)
        for (int c = n->first; c >= 0; c = u->n[c].next)
            if (u->n[c].kind == CXCursor_VarDecl)
                u->v[u->n[c].var].list_level = 1;
    if (!n->barrier)
        return;
    switch (n->kind) {
    case CXCursor_CallExpr:
        if (!ul_is_barrier_call(u, s))
            ul_refuse(u, "cube_sync() inside an expression");
        return;
    case CXCursor_CompoundStmt: ul_scan_list(u, s); return;
    case CXCursor_IfStmt:
    case CXCursor_WhileStmt:
    case CXCursor_DoStmt:
        if (n->in_macro)
            ul_refuse(u, "a macro expands to control flow around cube_sync()");
        for (int c = ul_kid(u, s, n->kind == CXCursor_DoStmt ? 0 : 1); c >= 0;
             c = u->n[c].next)
            if (!ul_is_expr(u->n[c].kind))
                ul_scan_list(u, c);
        return;
    case CXCursor_ForStmt: {
        ul_for f;
        if (!ul_split_for(u, s, &f)) {
            ul_refuse(u, "a for loop with cube_sync() whose header the pass "
                         "cannot read");
            return;
        }
        if (f.init >= 0) {
            if (u->n[f.init].kind != CXCursor_DeclStmt) {
                ul_refuse(u, "a for loop with cube_sync() whose init is not a "
                             "declaration");
                return;
            }
            for (int c = u->n[f.init].first; c >= 0; c = u->n[c].next)
                if (u->n[c].kind == CXCursor_VarDecl)
                    u->v[u->n[c].var].for_stmt = s;
        }
        ul_scan_list(u, f.body);
        return;
    }
    case CXCursor_SwitchStmt:
        ul_refuse(u, "cube_sync() inside a switch");
        return;
    case CXCursor_LabelStmt:
        ul_refuse(u, "goto or a label in a kernel with cube_sync()");
        return;
    default:
        ul_refuse(u, "cube_sync() inside an expression or a statement of "
                     "another kind");
    }
}

/* Modifications and addresses of locals and parameters. */
static void ul_scan_uses(ul *u)
{
    for (int i = 0; i < u->nn; i++) {
        ul_node *n = &u->n[i];
        if (n->kind != CXCursor_DeclRefExpr ||
            !(n->ref == R_LOCAL || n->ref == R_PARAM_SCALAR ||
              n->ref == R_PARAM_LEN || n->ref == R_PARAM_PTR))
            continue;
        int c = i, p = n->parent;
        while (p >= 0 && u->n[p].kind == CXCursor_ParenExpr) {
            c = p;
            p = u->n[p].parent;
        }
        if (p < 0)
            continue;
        const ul_node *pn = &u->n[p];
        int first = pn->first == c, modified = 0, addressed = 0;
        int pure = ul_in_pure_macro(u, p);
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
        if (n->ref == R_LOCAL && u->v[n->var].is_array &&
            !((pn->kind == CXCursor_ArraySubscriptExpr ||
               pn->kind == CXCursor_UnexposedExpr) &&
              first) &&
            pn->kind != CXCursor_UnaryExpr)
            addressed = 1;
        if (n->ref == R_LOCAL && u->v[n->var].is_array &&
            pn->kind == CXCursor_UnexposedExpr) {
            /* The decay to a pointer: fine as a subscript's base. */
            int q = pn->parent;
            if (q < 0 || u->n[q].kind != CXCursor_ArraySubscriptExpr ||
                u->n[q].first != p)
                addressed = 1;
        }
        if (!modified && !addressed)
            continue;
        if (n->ref != R_LOCAL) {
            ul_refuse(u,
                      "the kernel assigns or takes the address of its "
                      "parameter '%s'",
                      n->name);
            continue;
        }
        ul_var *v = &u->v[n->var];
        v->addressed |= addressed;
        /* Its address could outlive the unit's loop iteration (in a
         * pointer, in memory): fibers keep every unit's locals. */
        if (addressed)
            ul_refuse(u,
                      "the address of the local '%s' is taken in a kernel "
                      "with cube_sync()",
                      v->name);
        if (modified) {
            v->modified = 1;
            /* The step of the for loop that declares it. */
            int inc_of = 0, ds = u->n[v->decl].parent;
            int fs = ds >= 0 ? u->n[ds].parent : -1;
            if (fs >= 0 && u->n[fs].kind == CXCursor_ForStmt) {
                ul_for f;
                if (ul_split_for(u, fs, &f) && f.init == ds && f.inc >= 0 &&
                    ul_within(u, i, f.inc))
                    inc_of = 1;
            }
            if (!inc_of)
                v->modified_outside_inc = 1;
            if (!u->n[p].list_stmt)
                v->modified_in_expr = 1;
        }
    }
}

/* The local a list statement `i` assigns, increments or decrements, or
 * -1. */
static int ul_update_target(const ul *u, int i)
{
    const ul_node *n = &u->n[i];
    if (!n->list_stmt)
        return -1;
    int k = n->kind;
    if (!(k == CXCursor_CompoundAssignOperator ||
          k == CXCursor_BinaryOperator || k == CXCursor_UnaryOperator))
        return -1;
    int t = n->first;
    while (t >= 0 && u->n[t].kind == CXCursor_ParenExpr)
        t = u->n[t].first;
    if (t < 0 || u->n[t].kind != CXCursor_DeclRefExpr || u->n[t].ref != R_LOCAL)
        return -1;
    return u->n[t].var;
}

/* Whether list statement `i` is `x op= uniform`, `x = uniform`, `x++`,
 * `x--`, `++x` or `--x` for a uniform local x. */
static int ul_uniform_update(const ul *u, int i)
{
    const ul_node *n = &u->n[i];
    int t = ul_update_target(u, i);
    if (t < 0 || !u->v[t].uniform)
        return 0;
    if (n->kind == CXCursor_UnaryOperator)
        return strcmp(n->op, "++") == 0 || strcmp(n->op, "--") == 0;
    if (n->kind == CXCursor_BinaryOperator && strcmp(n->op, "=") != 0)
        return 0;
    int rhs = u->n[n->first].next;
    return rhs >= 0 && ul_uniform(u, rhs, 0);
}

/* Which locals are uniform (one value per cube, kept as a plain variable
 * run once per cube) and which are made of positions and uniform values. */
static void ul_classify_values(ul *u)
{
    for (int i = 0; i < u->nv; i++) {
        ul_var *v = &u->v[i];
        int dn = v->decl;
        for (int c = u->n[dn].first; c >= 0; c = u->n[c].next)
            if (ul_is_expr(u->n[c].kind))
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
        for (int i = 0; i < u->nn; i++) {
            int t = ul_update_target(u, i);
            if (t >= 0 && u->v[t].uniform && u->v[t].for_stmt < 0 &&
                !ul_uniform_update(u, i)) {
                u->v[t].uniform = 0;
                changed = 1;
            }
        }
        for (int i = 0; i < u->nv; i++) {
            ul_var *v = &u->v[i];
            if (v->uniform && !ul_uniform(u, v->init, 0)) {
                v->uniform = 0;
                changed = 1;
            }
            if (v->pospure && !ul_uniform(u, v->init, 1)) {
                v->pospure = 0;
                changed = 1;
            }
            /* A declaration runs once per cube only when all it declares
             * is uniform. */
            if (v->uniform && v->for_stmt < 0) {
                int ds = u->n[v->decl].parent;
                for (int c = u->n[ds].first; c >= 0; c = u->n[c].next)
                    if (u->n[c].kind == CXCursor_VarDecl &&
                        !u->v[u->n[c].var].uniform) {
                        v->uniform = 0;
                        changed = 1;
                    }
            }
        }
    }
}

/* Pass B: conditions and steps of the structure are uniform. */
static void ul_check_structure(ul *u, int s);

static void ul_check_list(ul *u, int list)
{
    if (u->n[list].kind != CXCursor_CompoundStmt) {
        ul_check_structure(u, list);
        return;
    }
    for (int s = u->n[list].first; s >= 0; s = u->n[s].next)
        ul_check_structure(u, s);
}

static void ul_check_structure(ul *u, int s)
{
    ul_node *n = &u->n[s];
    if (!n->barrier || u->refused)
        return;
    switch (n->kind) {
    case CXCursor_CompoundStmt: ul_check_list(u, s); return;
    case CXCursor_IfStmt:
    case CXCursor_WhileStmt:
    case CXCursor_DoStmt: {
        int cond = n->kind == CXCursor_DoStmt ? ul_kid(u, s, 1) : n->first;
        if (cond < 0 || !ul_uniform(u, cond, 0)) {
            ul_refuse(u,
                      "the condition of %s around cube_sync() may differ "
                      "between units",
                      n->kind == CXCursor_IfStmt ? "an if" : "a loop");
            return;
        }
        for (int c = ul_kid(u, s, n->kind == CXCursor_DoStmt ? 0 : 1); c >= 0;
             c = u->n[c].next)
            if (!ul_is_expr(u->n[c].kind))
                ul_check_list(u, c);
        return;
    }
    case CXCursor_ForStmt: {
        ul_for f;
        ul_split_for(u, s, &f);
        if (f.init >= 0)
            for (int c = u->n[f.init].first; c >= 0; c = u->n[c].next)
                if (u->n[c].kind == CXCursor_VarDecl &&
                    !u->v[u->n[c].var].uniform) {
                    ul_refuse(u,
                              "the counter '%s' of a loop around "
                              "cube_sync() may differ between units",
                              u->v[u->n[c].var].name);
                    return;
                }
        if ((f.cond >= 0 && !ul_uniform(u, f.cond, 0)) ||
            (f.inc >= 0 && !ul_uniform_step(u, f.inc, s))) {
            ul_refuse(u, "the condition or step of a loop around cube_sync() "
                         "may differ between units");
            return;
        }
        ul_check_list(u, f.body);
        return;
    }
    default: return;
    }
}

/* A grid-stride loop: `for (T i = <unit x position> [+ uniform];
 * i < uniform; i += uniform)` in a 1-D cube, whose body leaves `i` alone
 * and never leaves the loop early. */
static int ul_stride_loop(ul *u, int s)
{
    if (u->n[s].kind != CXCursor_ForStmt || u->dim[1] != 1 || u->dim[2] != 1)
        return 0;
    ul_for f;
    if (!ul_split_for(u, s, &f) || f.init < 0 || f.cond < 0 || f.inc < 0)
        return 0;
    int d = u->n[f.init].first;
    if (d < 0 || u->n[d].next >= 0 || u->n[d].kind != CXCursor_VarDecl)
        return 0;
    ul_var *v = &u->v[u->n[d].var];
    if (v->init < 0 || !v->scalar || v->is_static || v->is_volatile ||
        v->addressed || v->modified_outside_inc || v->size < 4)
        return 0;
    /* The start: the unit's x position, widened, plus a uniform value. */
    int e = ul_strip_parens(u, v->init);
    int found = 0;
    for (int guard = 0; e >= 0 && guard < 8; guard++) {
        if (u->n[e].kind == CXCursor_CStyleCastExpr && u->n[e].tsize < 4)
            return 0;
        if (u->n[e].kind == CXCursor_CStyleCastExpr ||
            u->n[e].kind == CXCursor_UnexposedExpr ||
            u->n[e].kind == CXCursor_ParenExpr) {
            e = u->n[e].last;
            continue;
        }
        if (u->n[e].kind == CXCursor_BinaryOperator &&
            strcmp(u->n[e].op, "+") == 0) {
            int a = u->n[e].first, b = u->n[a].next;
            if (ul_uniform(u, a, 0)) {
                e = b;
                continue;
            }
            if (ul_uniform(u, b, 0)) {
                e = a;
                continue;
            }
            return 0;
        }
        if (u->n[e].kind == CXCursor_MemberRefExpr &&
            (strcmp(u->n[e].name, "ax") == 0 ||
             strcmp(u->n[e].name, "ux") == 0)) {
            int base = ul_strip_parens(u, u->n[e].first);
            found = base >= 0 && u->n[base].ref == R_UNIT;
        }
        break;
    }
    if (!found)
        return 0;
    /* The bound and the step. */
    const ul_node *c = &u->n[f.cond];
    if (c->kind != CXCursor_BinaryOperator || strcmp(c->op, "<") != 0)
        return 0;
    int l = ul_strip_parens(u, c->first);
    if (l < 0 || u->n[l].kind != CXCursor_DeclRefExpr ||
        u->n[l].var != v - u->v || !ul_uniform(u, u->n[c->first].next, 0))
        return 0;
    const ul_node *in = &u->n[f.inc];
    int t = ul_strip_parens(u, in->first);
    if (t < 0 || u->n[t].kind != CXCursor_DeclRefExpr ||
        u->n[t].var != v - u->v)
        return 0;
    if (!((in->kind == CXCursor_CompoundAssignOperator &&
           strcmp(in->op, "+=") == 0 &&
           ul_uniform(u, u->n[in->first].next, 0)) ||
          (in->kind == CXCursor_UnaryOperator && strcmp(in->op, "++") == 0)))
        return 0;
    /* The body never leaves early. */
    for (int i = 0; i < u->nn; i++) {
        int k = u->n[i].kind;
        if ((k == CXCursor_BreakStmt || k == CXCursor_ContinueStmt ||
             k == CXCursor_ReturnStmt) &&
            ul_within(u, i, f.body)) {
            /* A break or continue of a loop inside the body is fine. */
            int p = u->n[i].parent, inner = 0;
            for (; p >= 0 && p != s; p = u->n[p].parent) {
                int pk = u->n[p].kind;
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
static int ul_new_region(ul *u, int first)
{
    if (!ul_grow(u, (void **)&u->r, &u->rcap, u->nr + 1, sizeof *u->r))
        return -1;
    ul_region *r = &u->r[u->nr];
    memset(r, 0, sizeof *r);
    r->first = r->last = first;
    r->swap = -1;
    return u->nr++;
}

static void ul_mark(ul *u, int s, int region)
{
    u->n[s].region = region;
    for (int c = u->n[s].first; c >= 0; c = u->n[c].next)
        ul_mark(u, c, region);
}

/* Whether statement `s` is a declaration run once per cube. */
static int ul_serial_decl(const ul *u, int s)
{
    if (u->n[s].kind != CXCursor_DeclStmt || u->n[s].first < 0)
        return 0;
    for (int c = u->n[s].first; c >= 0; c = u->n[c].next)
        if (u->n[c].kind != CXCursor_VarDecl || !u->v[u->n[c].var].uniform)
            return 0;
    return 1;
}

static void ul_regions_stmt(ul *u, int s);

static void ul_regions_list(ul *u, int list)
{
    int single = u->n[list].kind != CXCursor_CompoundStmt;
    int cur = -1;
    for (int s = single ? list : u->n[list].first; s >= 0;
         s = single ? -1 : u->n[s].next) {
        if (u->n[s].barrier) {
            cur = -1;
            ul_regions_stmt(u, s);
        } else if (ul_serial_decl(u, s) || ul_uniform_update(u, s)) {
            cur = -1;
        } else if (ul_stride_loop(u, s)) {
            int r = ul_new_region(u, s);
            if (r < 0)
                return;
            u->r[r].swap = s;
            u->r[r].tstart = u->n[s].start;
            u->r[r].tend = ul_stmt_end(u, s);
            ul_mark(u, s, r);
            cur = -1;
        } else {
            if (cur < 0) {
                cur = ul_new_region(u, s);
                if (cur < 0)
                    return;
                u->r[cur].tstart = u->n[s].start;
            }
            u->r[cur].last = s;
            int nx = single ? -1 : u->n[s].next;
            u->r[cur].tend = nx >= 0 ? u->n[nx].start : ul_list_end(u, list);
            ul_mark(u, s, cur);
        }
    }
}

static void ul_regions_stmt(ul *u, int s)
{
    ul_node *n = &u->n[s];
    switch (n->kind) {
    case CXCursor_CompoundStmt: ul_regions_list(u, s); return;
    case CXCursor_IfStmt:
    case CXCursor_WhileStmt:
    case CXCursor_DoStmt:
        for (int c = ul_kid(u, s, n->kind == CXCursor_DoStmt ? 0 : 1); c >= 0;
             c = u->n[c].next)
            if (!ul_is_expr(u->n[c].kind))
                ul_regions_list(u, c);
        return;
    case CXCursor_ForStmt: {
        ul_for f;
        ul_split_for(u, s, &f);
        ul_regions_list(u, f.body);
        return;
    }
    default: return;
    }
}

/* Returns, breaks and continues that would leave a region. */
static void ul_check_jumps(ul *u)
{
    /* The last region of the body's own list, when nothing with a barrier
     * follows it: a return there only ends its unit. */
    int last = -1;
    for (int s = u->n[u->body].first; s >= 0; s = u->n[s].next)
        last = u->n[s].barrier ? -1 : u->n[s].region;
    for (int i = 0; i < u->nn; i++) {
        int k = u->n[i].kind;
        if (k == CXCursor_ReturnStmt) {
            int r = u->n[i].region;
            if (r < 0 || r != last || u->r[r].swap >= 0 || u->n[i].in_macro)
                ul_refuse(u, "a return before a cube_sync()");
            else
                u->r[r].has_return = 1;
        } else if (k == CXCursor_BreakStmt || k == CXCursor_ContinueStmt) {
            for (int p = u->n[i].parent; p >= 0; p = u->n[p].parent) {
                int pk = u->n[p].kind;
                if (pk == CXCursor_ForStmt || pk == CXCursor_WhileStmt ||
                    pk == CXCursor_DoStmt ||
                    (pk == CXCursor_SwitchStmt && k == CXCursor_BreakStmt)) {
                    if (u->n[p].barrier)
                        ul_refuse(u, "a %s out of a loop with cube_sync()",
                                  k == CXCursor_BreakStmt ? "break"
                                                          : "continue");
                    break;
                }
            }
        } else if (k == CXCursor_GotoStmt || k == CXCursor_IndirectGotoStmt ||
                   k == CXCursor_LabelStmt) {
            ul_refuse(u, "goto or a label in a kernel with cube_sync()");
        } else if (k == CXCursor_GCCAsmStmt || k == CXCursor_MSAsmStmt) {
            ul_refuse(u, "inline assembly in a kernel with cube_sync()");
        } else if (k == CXCursor_VarDecl && u->v[u->n[i].var].is_static) {
            ul_refuse(u, "a static local variable");
        }
    }
}

/* Marks the positions-only variables `init` uses as recomputed too. */
static void ul_mark_deps(ul *u, int i)
{
    const ul_node *n = &u->n[i];
    if (n->kind == CXCursor_DeclRefExpr && n->ref == R_LOCAL) {
        ul_var *w = &u->v[n->var];
        if (!w->uniform && w->cls != CLS_RECOMPUTE) {
            w->cls = CLS_RECOMPUTE;
            w->crossing = 1;
            ul_mark_deps(u, w->init);
        }
    }
    for (int c = n->first; c >= 0; c = u->n[c].next)
        ul_mark_deps(u, c);
}

/* The first name expression `i` uses that is declared more often than
 * once (a local) or at all (a parameter's name hidden by a local): the
 * node, or -1 when every name means the same anywhere in the body. */
static int ul_name_declared_twice(const ul *u, int i)
{
    const ul_node *n = &u->n[i];
    if (n->kind == CXCursor_DeclRefExpr &&
        (n->ref == R_LOCAL || n->ref == R_PARAM_SCALAR ||
         n->ref == R_PARAM_LEN)) {
        int same = 0;
        for (int j = 0; j < u->nv; j++)
            same += strcmp(u->v[j].name, n->name) == 0;
        if (same > (n->ref == R_LOCAL ? 1 : 0))
            return i;
    }
    for (int c = n->first; c >= 0; c = u->n[c].next) {
        int k = ul_name_declared_twice(u, c);
        if (k >= 0)
            return k;
    }
    return -1;
}

/* The names an expression recomputed elsewhere uses must mean the same
 * there: a parameter no local hides, or a local declared once. */
static void ul_check_names(ul *u, int i)
{
    int k = ul_name_declared_twice(u, i);
    if (k >= 0)
        ul_refuse(u, "the name '%s' is declared twice", u->n[k].name);
}

/* Pass D: variables used across regions. */
static void ul_classify_crossing(ul *u)
{
    for (int i = 0; i < u->nn; i++) {
        const ul_node *n = &u->n[i];
        if (n->kind != CXCursor_DeclRefExpr || n->ref != R_LOCAL)
            continue;
        ul_var *v = &u->v[n->var];
        if (v->uniform)
            v->cls = CLS_UNIFORM;
        else if (n->region != u->n[v->decl].region)
            v->crossing = 1;
    }
    long long context = 0;
    for (int i = 0; i < u->nv; i++) {
        ul_var *v = &u->v[i];
        if (!v->crossing || v->cls == CLS_UNIFORM)
            continue;
        if (v->pospure) {
            if (v->cls != CLS_RECOMPUTE) {
                v->cls = CLS_RECOMPUTE;
                ul_mark_deps(u, v->init);
            }
            continue;
        }
        if (v->is_array || !v->scalar || v->size <= 0)
            ul_refuse(u,
                      "the local '%s' (not a scalar) lives across "
                      "cube_sync()",
                      v->name);
        else if (v->addressed)
            ul_refuse(u,
                      "the address of '%s' is taken and it lives across "
                      "cube_sync()",
                      v->name);
        else if (v->is_static || v->is_volatile)
            ul_refuse(u, "the local '%s' is static or volatile", v->name);
        else if (strchr(v->type, '*') && u->has_local_array)
            ul_refuse(u,
                      "the pointer '%s' lives across cube_sync() in a "
                      "kernel with local arrays",
                      v->name);
        else if (!v->list_level)
            ul_refuse(u,
                      "the local '%s' lives across cube_sync() but is "
                      "not declared at the level of its block",
                      v->name);
        v->cls = CLS_CTX;
        context += v->size;
    }
    if ((unsigned long long)context * u->dim[0] * u->dim[1] * u->dim[2] >
        (unsigned long long)UL_MAX_CONTEXT)
        ul_refuse(u, "over %lld bytes of per-unit values across cube_sync()",
                  UL_MAX_CONTEXT);
    /* A name declared twice could bind differently where it is reloaded or
     * recomputed. */
    for (int i = 0; i < u->nv; i++) {
        if (!u->v[i].crossing)
            continue;
        for (int j = 0; j < u->nv; j++)
            if (j != i && strcmp(u->v[i].name, u->v[j].name) == 0)
                ul_refuse(u, "the name '%s' is declared twice", u->v[i].name);
        if (u->v[i].cls == CLS_RECOMPUTE)
            ul_check_names(u, u->v[i].init);
    }
}

/* ------------------------------------------------------- the output */

static void ul_text(ul *u, unsigned a, unsigned b)
{
    if (a < b && b <= u->srclen)
        ul_put(&u->out, u->src + a, b - a);
}

/* Source text [a, b) of region `r`, its returns turned into jumps to the
 * end of the unit. */
static void ul_region_text(ul *u, int r, unsigned a, unsigned b)
{
    unsigned at = a;
    for (int i = 0; i < u->nn; i++) {
        const ul_node *n = &u->n[i];
        if (n->kind != CXCursor_ReturnStmt || n->start < at || n->start >= b)
            continue;
        ul_text(u, at, n->start);
        ul_printf(u, "goto cube__done_%d", r);
        at = n->start + 6; /* "return" */
    }
    ul_text(u, at, b);
}

/* Opens the loops over the units (x innermost), or one unit's block when
 * `only` >= 0, with cube__u the unit's positions and cube__i its index.
 * An axis a with fixed[a] set runs only the position cube__f<axis> (which
 * the caller declared and checked). */
static void ul_open_units_at(ul *u, int only, const int *fixed)
{
    if (only < 0) {
        for (int a = 2; a >= 0; a--) {
            char c = "xyz"[a];
            if (fixed && fixed[a] >= 0)
                ul_printf(
                    u,
                    "for (unsigned int cube__%c = (unsigned int)cube__f%c;"
                    " cube__%c < (unsigned int)cube__f%c + 1u; "
                    "cube__%c++)\n",
                    c, c, c, c, c);
            else
                ul_printf(u,
                          "for (unsigned int cube__%c = 0; cube__%c < %uu; "
                          "cube__%c++)\n",
                          c, c, u->dim[a], c);
        }
        ul_printf(u,
                  "{\nconst size_t cube__i = (size_t)cube__x + (size_t)%uu * "
                  "((size_t)cube__y + (size_t)%uu * cube__z);\n",
                  u->dim[0], u->dim[1]);
    } else {
        ul_printf(u,
                  "{\nconst unsigned int cube__z = 0, cube__y = 0, cube__x = "
                  "%du;\nconst size_t cube__i = %d;\n",
                  only, only);
    }
    ul_printf(u, "cube__unit cube__w = cube__c;\n"
                 "cube__w.ux = cube__x;\ncube__w.uy = cube__y;\n"
                 "cube__w.uz = cube__z;\ncube__w.ax = cube__c.ax + cube__x;\n"
                 "cube__w.ay = cube__c.ay + cube__y;\n"
                 "cube__w.az = cube__c.az + cube__z;\n"
                 "{\nconst cube__unit cube__u = cube__w;\n(void)cube__u;\n"
                 "(void)cube__i;\n");
}

static void ul_open_units(ul *u, int only)
{
    ul_open_units_at(u, only, NULL);
}

static void ul_close_units(ul *u)
{
    ul_printf(u, "}\n}\n");
}

/* Whether subtree `i` names local `v`. */
static int ul_uses(const ul *u, int i, int v)
{
    if (u->n[i].kind == CXCursor_DeclRefExpr && u->n[i].var == v &&
        u->n[i].ref == R_LOCAL)
        return 1;
    for (int c = u->n[i].first; c >= 0; c = u->n[c].next)
        if (ul_uses(u, c, v))
            return 1;
    return 0;
}

/* Whether region `r` uses local `v`. */
static int ul_region_uses(const ul *u, int r, int v)
{
    for (int i = 0; i < u->nn; i++)
        if (u->n[i].region == r && u->n[i].kind == CXCursor_DeclRefExpr &&
            u->n[i].ref == R_LOCAL && u->n[i].var == v)
            return 1;
    return 0;
}

/* What region `r` needs at its top: the context values it uses that other
 * regions made, and the recomputed values (with what they are made of). */
static void ul_prologue(ul *u, int r, unsigned char *need)
{
    memset(need, 0, (size_t)u->nv);
    for (int i = 0; i < u->nv; i++) {
        const ul_var *v = &u->v[i];
        if ((v->cls == CLS_CTX || v->cls == CLS_RECOMPUTE) &&
            u->n[v->decl].region != r && ul_region_uses(u, r, i))
            need[i] = 1;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < u->nv; i++) {
            if (!need[i] || u->v[i].cls != CLS_RECOMPUTE)
                continue;
            for (int j = 0; j < u->nv; j++)
                if (!need[j] && u->v[j].cls == CLS_RECOMPUTE &&
                    ul_uses(u, u->v[i].init, j)) {
                    need[j] = 1;
                    changed = 1;
                }
        }
    }
    for (int i = 0; i < u->nv; i++) {
        const ul_var *v = &u->v[i];
        if (!need[i])
            continue;
        if (v->cls == CLS_CTX) {
            ul_printf(u, "__typeof__(%s__ctx[0]) %s = %s__ctx[cube__i];\n",
                      v->name, v->name, v->name);
        } else {
            ul_printf(u, "%s %s = ", v->type, v->name);
            ul_text(u, u->n[v->init].start, u->n[v->init].end);
            ul_printf(u, ";\n");
        }
    }
}

/* Stores the context values of `need` (decl_region < 0) or those region
 * `r` declares. */
static void ul_stores(ul *u, int r, const unsigned char *need)
{
    for (int i = 0; i < u->nv; i++) {
        const ul_var *v = &u->v[i];
        if (v->cls != CLS_CTX)
            continue;
        if (need ? need[i] : u->n[v->decl].region == r)
            ul_printf(u, "%s__ctx[cube__i] = %s;\n", v->name, v->name);
    }
}

/* ------------------------------------ statements for some units only */

/* A run of a region's statements (first..last, siblings) and the unit
 * positions it runs for: all, or, on each axis a with fix[a] >= 0, only
 * the position equal to that (uniform, integer) expression. */
typedef struct ul_piece {
    int first, last;
    int fix[3];
} ul_piece;

/* The unit axis (0 x, 1 y, 2 z) whose position expression `i` holds
 * exactly, or -1: the position itself, through parentheses and integer
 * conversions to 4 bytes or more, or (when `local`) a local of such a
 * type, never changed, initialised from one. */
static int ul_unit_axis(const ul *u, int i, int local)
{
    for (int guard = 0; i >= 0 && guard < 16; guard++) {
        const ul_node *n = &u->n[i];
        if (n->kind == CXCursor_ParenExpr ||
            n->kind == CXCursor_UnexposedExpr ||
            n->kind == CXCursor_CStyleCastExpr) {
            if (!n->int_type || n->tsize < 4)
                return -1;
            i = n->last;
            continue;
        }
        if (n->kind == CXCursor_MemberRefExpr) {
            int base = ul_strip_parens(u, n->first);
            if (base < 0 || u->n[base].kind != CXCursor_DeclRefExpr ||
                u->n[base].ref != R_UNIT || n->name[0] != 'u' || !n->name[1] ||
                !strchr("xyz", n->name[1]) || n->name[2])
                return -1;
            return n->name[1] - 'x';
        }
        if (n->kind == CXCursor_DeclRefExpr && n->ref == R_LOCAL && local) {
            const ul_var *v = &u->v[n->var];
            if (!v->pospure || !v->is_int || v->size < 4 || v->init < 0)
                return -1;
            return ul_unit_axis(u, v->init, 0);
        }
        return -1;
    }
    return -1;
}

/* The axes condition `c` fixes: each `position == value` of a chain of
 * `&&` (value uniform, of an integer type) sets fix[axis] to the value's
 * node. Whenever the condition holds, each such axis's position equals
 * its value. Returns how many axes it fixed. */
static int ul_guard_fixes(const ul *u, int c, int fix[3])
{
    c = ul_strip_parens(u, c);
    if (c < 0 || u->n[c].kind != CXCursor_BinaryOperator || u->n[c].nkids != 2)
        return 0;
    int l = u->n[c].first, r = u->n[l].next;
    if (strcmp(u->n[c].op, "&&") == 0)
        return ul_guard_fixes(u, l, fix) + ul_guard_fixes(u, r, fix);
    if (strcmp(u->n[c].op, "==") != 0)
        return 0;
    int a = ul_unit_axis(u, l, 1), k = r;
    if (a < 0) {
        a = ul_unit_axis(u, r, 1);
        k = l;
    }
    if (a < 0 || fix[a] >= 0 || !u->n[k].int_type || !ul_uniform(u, k, 0))
        return 0;
    fix[a] = k;
    return 1;
}

/* Marks in `re` the locals piece statements [a, b) use that an earlier
 * piece of region `r` declares (recomputed at the piece's top), and those
 * their values are made of. 0 when one of them cannot be recomputed. */
static int ul_piece_needs(const ul *u, int r, unsigned a, unsigned b,
                          unsigned char *re)
{
    memset(re, 0, (size_t)u->nv);
    for (int i = 0; i < u->nn; i++) {
        const ul_node *n = &u->n[i];
        if (n->kind == CXCursor_DeclRefExpr && n->ref == R_LOCAL &&
            n->start >= a && n->start < b) {
            const ul_node *d = &u->n[u->v[n->var].decl];
            if (d->region == r && d->start < a)
                re[n->var] = 1;
        }
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int v = 0; v < u->nv; v++) {
            if (re[v] != 1)
                continue;
            const ul_var *w = &u->v[v];
            if (!w->pospure || ul_name_declared_twice(u, w->init) >= 0)
                return 0;
            int same = 0;
            for (int j = 0; j < u->nv; j++)
                same += strcmp(u->v[j].name, w->name) == 0;
            if (same != 1)
                return 0;
            re[v] = 2;
            changed = 1;
            for (int j = 0; j < u->nv; j++)
                if (!re[j] && u->n[u->v[j].decl].region == r &&
                    ul_uses(u, w->init, j))
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
static int ul_split_region(ul *u, int r, ul_piece *p, unsigned char *re)
{
    const ul_region *rg = &u->r[r];
    if (rg->has_return || rg->swap >= 0)
        return 0;
    for (int i = 0; i < u->nn; i++)
        if (u->n[i].region == r && u->n[i].kind == CXCursor_CallExpr &&
            !ul_math_function(u->n[i].name))
            return 0;
    for (int v = 0; v < u->nv; v++)
        if (u->v[v].cls == CLS_CTX &&
            (u->n[u->v[v].decl].region == r || ul_region_uses(u, r, v)))
            return 0;
    int np = 0, peeled = 0;
    unsigned prev = 0;
    for (int s = rg->first; s >= 0; s = s == rg->last ? -1 : u->n[s].next) {
        const ul_node *n = &u->n[s];
        if (n->start < prev)
            return 0; /* statements out of order (macros) */
        prev = n->end;
        int fix[3] = {-1, -1, -1};
        int guarded = n->kind == CXCursor_IfStmt && !n->in_macro &&
                      n->nkids == 2 && ul_guard_fixes(u, n->first, fix) > 0;
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
        unsigned a = u->n[p[k].first].start;
        unsigned b = k + 1 < np ? u->n[p[k + 1].first].start : rg->tend;
        if (!ul_piece_needs(u, r, a, b, re))
            return 0;
    }
    return np;
}

/* Region `r` as the pieces of ul_split_region. */
static void ul_emit_pieces(ul *u, int r, const ul_piece *p, int np,
                           unsigned char *need, unsigned char *re)
{
    const ul_region *rg = &u->r[r];
    for (int k = 0; k < np; k++) {
        unsigned a = k ? u->n[p[k].first].start : rg->tstart;
        unsigned b = k + 1 < np ? u->n[p[k + 1].first].start : rg->tend;
        int fixed = p[k].fix[0] >= 0 || p[k].fix[1] >= 0 || p[k].fix[2] >= 0;
        if (fixed) {
            ul_printf(u, "{\n/* only the units the condition allows */\n");
            for (int ax = 0; ax < 3; ax++) {
                int e = p[k].fix[ax];
                if (e < 0)
                    continue;
                ul_printf(u, "const long long cube__f%c = (long long)(",
                          "xyz"[ax]);
                ul_text(u, u->n[e].start, u->n[e].end);
                ul_printf(u, ");\n");
            }
            const char *join = "if (";
            for (int ax = 0; ax < 3; ax++)
                if (p[k].fix[ax] >= 0) {
                    ul_printf(u, "%scube__f%c >= 0 && cube__f%c < %uLL", join,
                              "xyz"[ax], "xyz"[ax], u -> dim[ax]);
                    join = " && ";
                }
            ul_printf(u, ") {\n");
        }
        ul_open_units_at(u, -1, p[k].fix);
        ul_prologue(u, r, need);
        if (k > 0) {
            ul_piece_needs(u, r, a, b, re);
            for (int v = 0; v < u->nv; v++) {
                if (!re[v])
                    continue;
                ul_printf(u, "%s %s = ", u->v[v].type, u->v[v].name);
                ul_text(u, u->n[u->v[v].init].start, u->n[u->v[v].init].end);
                ul_printf(u, ";\n");
            }
        }
        ul_printf(u, "{\n");
        ul_region_text(u, r, a, b);
        ul_printf(u, "\n}\n");
        ul_close_units(u);
        if (fixed)
            ul_printf(u, "}\n}\n");
    }
}

static void ul_emit_region(ul *u, int r, unsigned char *need)
{
    const ul_region *rg = &u->r[r];
    ul_piece *p = malloc(sizeof *p * (size_t)(u->nn + 1));
    unsigned char *re = malloc((size_t)u->nv + 1);
    int np = p && re ? ul_split_region(u, r, p, re) : 0;
    if (np > 0)
        ul_emit_pieces(u, r, p, np, need, re);
    else if (!p || !re)
        u->oom = 1;
    free(p);
    free(re);
    if (np > 0 || u->oom)
        return;
    ul_open_units(u, -1);
    ul_prologue(u, r, need);
    ul_printf(u, "{\n");
    ul_region_text(u, r, rg->tstart, rg->tend);
    ul_printf(u, "\n");
    if (rg->has_return)
        ul_printf(u, "cube__done_%d:;\n", r);
    ul_stores(u, r, NULL);
    ul_printf(u, "}\n");
    ul_stores(u, r, need);
    ul_close_units(u);
}

/* How far ahead of a grid-stride loop's step its buffers are prefetched,
 * in bytes of the steps' runs: far enough to cover the memory's latency
 * when each step reads one short run (a cube's units) of a distant window. */
#define UL_PREFETCH_AHEAD 16384u

/* The buffer parameters the body of grid-stride loop `s` indexes with its
 * counter itself (CUBE_AT(buf, i)), at most `cap` of them, into `out`
 * (node indices of the names); returns how many. Each unit's counter is
 * the first unit's plus its x position, so a step reads one contiguous run
 * of dim[0] elements of each. */
static int ul_stride_reads(const ul *u, int s, int *out, int cap)
{
    ul_for f;
    ul_split_for(u, s, &f);
    int var = u->n[u->n[f.init].first].var, count = 0;
    for (int i = 0; i < u->nn && count < cap; i++) {
        if (u->n[i].kind != CXCursor_ArraySubscriptExpr || u->n[i].nkids != 2 ||
            !ul_within(u, i, f.body))
            continue;
        int base = ul_strip_parens(u, u->n[i].first);
        int index = ul_strip_parens(u, u->n[u->n[i].first].next);
        if (base < 0 || index < 0 || u->n[base].kind != CXCursor_DeclRefExpr ||
            u->n[base].ref != R_PARAM_PTR ||
            u->n[index].kind != CXCursor_DeclRefExpr || u->n[index].var != var)
            continue;
        int seen = 0;
        for (int k = 0; k < count; k++)
            seen |= strcmp(u->n[out[k]].name, u->n[base].name) == 0;
        if (!seen)
            out[count++] = base;
    }
    return count;
}

/* A grid-stride loop, step-major: each step runs every unit (all in range:
 * no test; near the end: each unit tested, until every unit is done). */
static void ul_emit_stride(ul *u, int r, unsigned char *need)
{
    int s = u->r[r].swap;
    ul_for f;
    ul_split_for(u, s, &f);
    int d = u->n[f.init].first;
    const ul_var *v = &u->v[u->n[d].var];
    const ul_node *in = &u->n[f.inc];
    /* i for step cube__k: start + k * step, in the counter's type. */
    ul_buf saved = u->out;
    ul_buf ik = {0};
    u->out = ik;
    ul_printf(u, "%s %s = (%s)((", v->type, v->name, v->type);
    ul_text(u, u->n[v->init].start, u->n[v->init].end);
    ul_printf(u, ") + (%s)cube__k * (%s)(", v->type, v->type);
    if (in->kind == CXCursor_UnaryOperator)
        ul_printf(u, "1");
    else
        ul_text(u, u->n[u->n[in->first].next].start,
                u->n[u->n[in->first].next].end);
    ul_printf(u, "));\n");
    ik = u->out;
    u->out = saved;
    if (ik.failed) {
        free(ik.data);
        u->out.failed = 1;
        return;
    }
    unsigned cs = u->n[f.cond].start, ce = u->n[f.cond].end;
    unsigned bs = u->n[f.body].start, be = ul_stmt_end(u, f.body);
    ul_printf(u,
              "{\nunsigned char cube__done[%u] = {0};\nint cube__ended = 0;\n"
              "for (unsigned long long cube__k = 0;; cube__k++) {\n"
              "int cube__all = 0;\n%s cube__i0 = 0, cube__i1 = 0;\n"
              "if (!cube__ended) {\nint cube__c0 = 0, cube__c1 = 0;\n",
              u->dim[0], v->type);
    for (int side = 0; side < 2; side++) {
        ul_open_units(u, side ? (int)u->dim[0] - 1 : 0);
        ul_put(&u->out, ik.data, ik.len);
        ul_printf(u, "cube__i%d = %s;\ncube__c%d = (", side, v->name, side);
        ul_text(u, cs, ce);
        ul_printf(u, ");\n");
        ul_close_units(u);
    }
    ul_printf(u, "cube__all = cube__c0 && cube__c1 && cube__i0 <= cube__i1 "
                 "&& !(cube__i0 < 0);\n}\nif (cube__all) {\n");
    /* The runs of later steps, into L2 (a prefetch never faults; the
     * address is computed as an integer, past the buffer's end too). */
    int reads[4];
    int nreads = ul_stride_reads(u, s, reads, 4);
    for (int k = 0; k < nreads; k++) {
        const char *b = u->n[reads[k]].name;
        ul_printf(u,
                  "{\nconst unsigned long long cube__run = %uull * "
                  "sizeof((%s)[0]);\n"
                  "const unsigned long long cube__ahead = cube__run * 2 >= "
                  "%uu ? 2 : %uu / cube__run;\n"
                  "const unsigned long long cube__at = "
                  "(unsigned long long)(__UINTPTR_TYPE__)(%s) + "
                  "((unsigned long long)cube__i0 + cube__ahead * "
                  "(unsigned long long)(",
                  u->dim[0], b, UL_PREFETCH_AHEAD, UL_PREFETCH_AHEAD, b);
        if (in->kind == CXCursor_UnaryOperator)
            ul_printf(u, "1");
        else
            ul_text(u, u->n[u->n[in->first].next].start,
                    u->n[u->n[in->first].next].end);
        ul_printf(u,
                  ")) * sizeof((%s)[0]);\n"
                  "for (unsigned long long cube__l = 0; cube__l < cube__run; "
                  "cube__l += 64)\n"
                  "__builtin_prefetch((const void *)(__UINTPTR_TYPE__)"
                  "(cube__at + cube__l), 0, 1);\n}\n",
                  b);
    }
    ul_open_units(u, -1);
    ul_prologue(u, r, need);
    ul_printf(u, "{\n");
    ul_put(&u->out, ik.data, ik.len);
    ul_text(u, bs, be);
    ul_printf(u, "\n}\n");
    ul_stores(u, r, need);
    ul_close_units(u);
    ul_printf(u, "} else {\nint cube__active = 0;\ncube__ended = 1;\n");
    ul_open_units(u, -1);
    ul_printf(u, "if (!cube__done[cube__i]) {\n");
    ul_prologue(u, r, need);
    ul_printf(u, "{\n");
    ul_put(&u->out, ik.data, ik.len);
    ul_printf(u, "if (");
    ul_text(u, cs, ce);
    ul_printf(u, ") {\ncube__active = 1;\n");
    ul_text(u, bs, be);
    ul_printf(u, "\n} else {\ncube__done[cube__i] = 1;\n}\n}\n");
    ul_stores(u, r, need);
    ul_printf(u, "}\n");
    ul_close_units(u);
    ul_printf(u, "if (!cube__active)\nbreak;\n}\n}\n}\n");
    free(ik.data);
}

static void ul_emit_list(ul *u, int list, unsigned char *need);

static void ul_emit_structure(ul *u, int s, unsigned char *need)
{
    const ul_node *n = &u->n[s];
    switch (n->kind) {
    case CXCursor_CallExpr: ul_printf(u, "/* cube_sync() */\n"); return;
    case CXCursor_CompoundStmt:
        ul_printf(u, "{\n");
        ul_emit_list(u, s, need);
        ul_printf(u, "}\n");
        return;
    case CXCursor_IfStmt: {
        int then = ul_kid(u, s, 1), other = ul_kid(u, s, 2);
        ul_text(u, n->start, u->n[then].start);
        ul_printf(u, "{\n");
        ul_emit_list(u, then, need);
        ul_printf(u, "}\n");
        if (other >= 0) {
            ul_printf(u, "else {\n");
            ul_emit_list(u, other, need);
            ul_printf(u, "}\n");
        }
        return;
    }
    case CXCursor_WhileStmt: {
        int body = ul_kid(u, s, 1);
        ul_text(u, n->start, u->n[body].start);
        ul_printf(u, "{\n");
        ul_emit_list(u, body, need);
        ul_printf(u, "}\n");
        return;
    }
    case CXCursor_ForStmt: {
        ul_for f;
        ul_split_for(u, s, &f);
        ul_text(u, n->start, u->n[f.body].start);
        ul_printf(u, "{\n");
        ul_emit_list(u, f.body, need);
        ul_printf(u, "}\n");
        return;
    }
    case CXCursor_DoStmt: {
        int body = ul_kid(u, s, 0), cond = ul_kid(u, s, 1);
        ul_printf(u, "do {\n");
        ul_emit_list(u, body, need);
        ul_printf(u, "} while (");
        ul_text(u, u->n[cond].start, u->n[cond].end);
        ul_printf(u, ");\n");
        return;
    }
    default: return;
    }
}

static void ul_emit_list(ul *u, int list, unsigned char *need)
{
    int single = u->n[list].kind != CXCursor_CompoundStmt;
    for (int s = single ? list : u->n[list].first; s >= 0;
         s = single ? -1 : u->n[s].next) {
        if (u->n[s].barrier) {
            ul_emit_structure(u, s, need);
        } else if (ul_serial_decl(u, s) || ul_uniform_update(u, s)) {
            ul_text(u, u->n[s].start, ul_stmt_end(u, s));
            ul_printf(u, "\n");
        } else {
            int r = u->n[s].region;
            if (r < 0 || u->r[r].first != s)
                continue;
            if (u->r[r].swap >= 0)
                ul_emit_stride(u, r, need);
            else
                ul_emit_region(u, r, need);
        }
    }
}

static void ul_emit(ul *u)
{
    const ul_macro *km = &u->m[u->kernel_macro];
    unsigned char *need = malloc((size_t)u->nv + 1);
    if (!need) {
        u->oom = 1;
        return;
    }
    ul_printf(u,
              "\n/* %s with its units as loops between barriers */\n"
              "CUBE__EXPORT const unsigned int cube__cubes_dim_%s[3] = "
              "{%u, %u, %u};\nCUBE__CUBES",
              u->kname, u->kname, u->dim[0], u->dim[1], u->dim[2]);
    ul_text(u, km->start + (unsigned)strlen("CUBE_KERNEL"), km->end);
    ul_printf(u,
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
              u->dim[0], u->dim[1], u->dim[2], u->dim[0], u->dim[1], u->dim[2],
              u->dim[0], u->dim[1], u->dim[2]);
    for (int i = 0; i < u->nv; i++)
        if (u->v[i].cls == CLS_CTX)
            ul_printf(u, "__typeof__((%s)0) %s__ctx[%u];\n", u->v[i].type,
                      u->v[i].name, u->dim[0] * u->dim[1] * u->dim[2]);
    ul_emit_list(u, u->body, need);
    ul_printf(u, "}\n}\n");
    free(need);
}

/* ------------------------------------------------------- the driver */

static enum CXChildVisitResult ul_find_compound(CXCursor c, CXCursor parent,
                                                CXClientData data)
{
    (void)parent;
    ul *u = data;
    if (u->lc->getCursorKind(c) == CXCursor_CompoundStmt) {
        u->body = ul_add_node(u, c, -1);
        if (u->body >= 0) {
            ul_visit vs = {u, u->body};
            u->lc->visitChildren(c, ul_visit_fn, &vs);
        }
        return CXChildVisit_Break;
    }
    return CXChildVisit_Continue;
}

/* Parses `source` and analyses the body; fills u->out on success. */
static void ul_run(ul *u, CXIndex index)
{
    const cpu_libclang *lc = u->lc;
    static const char path[] = "/cubert/kernel.c";
    struct CXUnsavedFile file = {path, u->src, (unsigned long)u->srclen};
    const char *const args[] = {"-x", "c", "-std=c11", "-DCUBE_CHECKED=0",
                                "-w"};
    enum CXErrorCode ec = lc->parseTranslationUnit2(
        index, path, args, (int)(sizeof args / sizeof args[0]), &file, 1,
        CXTranslationUnit_DetailedPreprocessingRecord, &u->tu);
    if (ec != CXError_Success || !u->tu) {
        ul_refuse(u, "libclang could not parse the kernel (error %d)", (int)ec);
        return;
    }
    unsigned nd = lc->getNumDiagnostics(u->tu);
    for (unsigned i = 0; i < nd && !u->refused; i++) {
        CXDiagnostic d = lc->getDiagnostic(u->tu, i);
        if (lc->getDiagnosticSeverity(d) >= CXDiagnostic_Error) {
            char msg[200];
            ul_copy_string(u, lc->getDiagnosticSpelling(d), msg, sizeof msg);
            ul_refuse(u, "libclang reports an error: %s", msg);
        }
        lc->disposeDiagnostic(d);
    }
    if (u->refused)
        return;
    lc->visitChildren(lc->getTranslationUnitCursor(u->tu), ul_top_fn, u);
    if (u->oom)
        return;
    if (!u->have_body) {
        ul_refuse(u, "no body for the kernel found");
        return;
    }
    if (u->helper_sync) {
        ul_refuse(u, "cube_sync() in a helper function");
        return;
    }
    /* The kernel's CUBE_KERNEL(...) header, whose arguments the new entry
     * repeats: the invocation where the body function begins. */
    CXSourceRange ext = lc->getCursorExtent(u->body_fn);
    unsigned fstart = ul_offset(u, lc->getRangeStart(ext), 0);
    u->kernel_macro = -1;
    for (int i = 0; i < u->nm; i++)
        if (u->m[i].start == fstart && strcmp(u->m[i].name, "CUBE_KERNEL") == 0)
            u->kernel_macro = i;
    if (u->kernel_macro < 0) {
        ul_refuse(u, "the kernel's CUBE_KERNEL(...) is not in the source "
                     "itself");
        return;
    }
    u->body = -1;
    lc->visitChildren(u->body_fn, ul_find_compound, u);
    if (u->oom || u->refused)
        return;
    if (u->body < 0) {
        ul_refuse(u, "no body for the kernel found");
        return;
    }
    if (u->n[u->body].in_macro) {
        ul_refuse(u, "the kernel's body comes from a macro");
        return;
    }
    ul_finish_tree(u);
    ul_scan_list(u, u->body);
    ul_scan_uses(u);
    if (u->refused)
        return;
    ul_classify_values(u);
    ul_check_structure(u, u->body);
    if (u->refused)
        return;
    ul_regions_list(u, u->body);
    if (u->oom)
        return;
    ul_check_jumps(u);
    if (u->refused)
        return;
    ul_classify_crossing(u);
    if (u->refused)
        return;
    ul_emit(u);
}

/* libclang's index: created one at a time, its crash recovery (signal
 * handlers of its own, for the whole process) turned off at once. */
static pthread_mutex_t ul_index_lock = PTHREAD_MUTEX_INITIALIZER;

cpu_unitloop_status cpu_unitloop_transform(const char *source, const char *name,
                                           const unsigned dim[3], char **out,
                                           char *why, size_t why_len)
{
    *out = NULL;
    if (why_len)
        why[0] = '\0';
    const char *lwhy = "";
    const cpu_libclang *lc = cpu_libclang_get(&lwhy);
    if (!lc) {
        snprintf(why, why_len, "libclang is not available: %s", lwhy);
        return CPU_UNITLOOP_REFUSED;
    }
    ul u;
    memset(&u, 0, sizeof u);
    u.lc = lc;
    u.src = source;
    u.srclen = strlen(source);
    u.kname = name;
    memcpy(u.dim, dim, sizeof u.dim);
    u.why = why;
    u.why_len = why_len;
    pthread_mutex_lock(&ul_index_lock);
    CXIndex index = lc->createIndex(0, 0);
    if (index)
        lc->toggleCrashRecovery(0);
    pthread_mutex_unlock(&ul_index_lock);
    if (!index) {
        snprintf(why, why_len, "libclang cannot create an index");
        return CPU_UNITLOOP_REFUSED;
    }
    ul_run(&u, index);
    if (u.tu)
        lc->disposeTranslationUnit(u.tu);
    lc->disposeIndex(index);
    cpu_unitloop_status st = CPU_UNITLOOP_DONE;
    if (u.oom || u.out.failed)
        st = CPU_UNITLOOP_NO_MEMORY;
    else if (u.refused)
        st = CPU_UNITLOOP_REFUSED;
    if (st == CPU_UNITLOOP_DONE)
        *out = u.out.data;
    else
        free(u.out.data);
    if (st == CPU_UNITLOOP_NO_MEMORY)
        snprintf(why, why_len, "out of memory");
    free(u.n);
    free(u.v);
    free(u.m);
    free(u.r);
    return st;
}

#endif /* CUBE_HAVE_LIBCLANG */
