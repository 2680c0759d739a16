/* The barrier pass's tree (barrier_pass_internal.h): the body of the
 * kernel's function copied out of libclang's cursors, with the few
 * queries on it the other parts share. */
#include "backends/cpu/barrier_pass_internal.h"

#ifdef CUBE_HAVE_LIBCLANG

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -------------------------------------------------------------- helpers */

int bp_refuse(barrier_pass *bp, const char *fmt, ...)
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

int bp_grow(barrier_pass *bp, void **p, int *cap, int need, size_t size)
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

void bp_copy_string(barrier_pass *bp, CXString s, char *dst, size_t cap)
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

int bp_is_expr(int kind)
{
    return kind >= CXCursor_FirstExpr && kind <= CXCursor_LastExpr;
}

/* The i-th child of node `p` (or -1). */
int bp_kid(const barrier_pass *bp, int p, int i)
{
    int c = bp->n[p].first;
    while (c >= 0 && i-- > 0)
        c = bp->n[c].next;
    return c;
}

int bp_strip_parens(const barrier_pass *bp, int i)
{
    while (i >= 0 &&
           (bp->n[i].kind == CXCursor_ParenExpr ||
            bp->n[i].kind == CXCursor_UnexposedExpr) &&
           bp->n[i].nkids == 1)
        i = bp->n[i].first;
    return i;
}

/* Whether `anc` is `i` or one of its ancestors. */
int bp_within(const barrier_pass *bp, int i, int anc)
{
    for (; i >= 0; i = bp->n[i].parent)
        if (i == anc)
            return 1;
    return 0;
}

int bp_reads_unit(const barrier_pass *bp, const bp_node *member)
{
    int base = bp_strip_parens(bp, member->first);
    return base >= 0 && bp->n[base].kind == CXCursor_DeclRefExpr &&
           bp->n[base].ref == BP_REF_UNIT;
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
int bp_in_pure_macro(const barrier_pass *bp, int i)
{
    if (!bp->n[i].in_macro)
        return 0;
    int m = bp_macro_at(bp, bp->n[i].start);
    return m >= 0 && bp_pure_macro(bp->m[m].name);
}

int bp_math_function(const char *name)
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

/* ------------------------------------------------------------- the tree */

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

int bp_is_barrier_call(const barrier_pass *bp, int i)
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

/* ----------------------------------------------------------- statements */

/* A for loop's parts, from the tokens of its header (bp_for). */
int bp_split_for(const barrier_pass *bp, int f, bp_for *out)
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
unsigned bp_stmt_end(const barrier_pass *bp, int s)
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
unsigned bp_list_end(const barrier_pass *bp, int list)
{
    if (bp->n[list].kind == CXCursor_CompoundStmt)
        return bp->n[list].end - 1;
    return bp_stmt_end(bp, list);
}

/* ------------------------------------------------------------- the body */

/* The body function's block, copied into the tree as its root. */
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

/* The body function's CUBE_KERNEL(...) invocation, whose arguments the
 * new entry repeats: the one where the body function begins. */
static int bp_find_kernel_macro(barrier_pass *bp)
{
    const cpu_libclang *lc = bp->lc;
    CXSourceRange ext = lc->getCursorExtent(bp->body_fn);
    unsigned fstart = bp_offset(bp, lc->getRangeStart(ext), 0);
    int found = -1;
    for (int i = 0; i < bp->nm; i++)
        if (bp->m[i].start == fstart &&
            strcmp(bp->m[i].name, "CUBE_KERNEL") == 0)
            found = i;
    return found;
}

int bp_build_tree(barrier_pass *bp)
{
    const cpu_libclang *lc = bp->lc;
    lc->visitChildren(lc->getTranslationUnitCursor(bp->tu), bp_top_fn, bp);
    if (bp->oom)
        return 0;
    if (!bp->have_body)
        return bp_refuse(bp, "no body for the kernel found");
    if (bp->helper_sync)
        return bp_refuse(bp, "cube_sync() in a helper function");
    bp->kernel_macro = bp_find_kernel_macro(bp);
    if (bp->kernel_macro < 0)
        return bp_refuse(bp, "the kernel's CUBE_KERNEL(...) is not in the "
                             "source itself");
    bp->body = -1;
    lc->visitChildren(bp->body_fn, bp_find_compound, bp);
    if (bp->oom || bp->refused)
        return 0;
    if (bp->body < 0)
        return bp_refuse(bp, "no body for the kernel found");
    if (bp->n[bp->body].in_macro)
        return bp_refuse(bp, "the kernel's body comes from a macro");
    bp_finish_tree(bp);
    return 1;
}

#endif /* CUBE_HAVE_LIBCLANG */
