/* The barrier pass's own header (the backend calls it through
 * barrier_pass.h): the tree it keeps of a kernel's body and the pass's
 * state, shared by its four parts:
 *   barrier_tree.c      libclang's cursors into the tree, and queries on it
 *   barrier_analysis.c  what is uniform, the regions, what crosses them
 *   barrier_emit.c      the loops over the units, as C text
 *   barrier_pass.c      the parse and the entry point
 * A barrier_pass is one call's state, used by that call's thread only; it
 * owns its arrays and its output until the entry point frees them or
 * hands the output to its caller. A function of the pass that refuses a
 * kernel sets `refused` (bp_refuse, the first reason kept), one that runs
 * out of memory `oom`; the entry point reads them when the pass ends.
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
#ifndef CUBE_CPU_BARRIER_PASS_INTERNAL_H
#define CUBE_CPU_BARRIER_PASS_INTERNAL_H

#ifdef CUBE_HAVE_LIBCLANG

#include "base/text_buf.h"
#include "backends/cpu/cpu_libclang.h"

#include <stddef.h>

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

typedef text_buf bp_buf;

/* The pass over one kernel: its source, the tree (n), its locals (v),
 * the main file's macro invocations (m), the regions (r) and the output. */
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

/* A for loop's parts, found from the tokens of its header: init, cond and
 * inc (-1 where absent) and body. */
typedef struct bp_for {
    int init, cond, inc, body;
} bp_for;

/* ---------------------------------------------------- barrier_tree.c */

/* Refuses the kernel (the first reason is kept); returns 0. */
int bp_refuse(barrier_pass *bp, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Grows array *p of *cap elements of `size` bytes to hold `need`; 0 (and
 * bp->oom set) for want of memory. */
int bp_grow(barrier_pass *bp, void **p, int *cap, int need, size_t size);
/* Copies libclang's string `s` into dst[cap] and disposes of it. */
void bp_copy_string(barrier_pass *bp, CXString s, char *dst, size_t cap);
/* Copies the body of the kernel bp->kname out of the parsed bp->tu into
 * the tree (bp->body its root) and finishes it. 0 when refused or out of
 * memory. */
int bp_build_tree(barrier_pass *bp);

int bp_is_expr(int kind);
/* The i-th child of node `p` (or -1). */
int bp_kid(const barrier_pass *bp, int p, int i);
/* Node `i` without the parentheses and implicit nodes around it. */
int bp_strip_parens(const barrier_pass *bp, int i);
/* Whether `anc` is `i` or one of its ancestors. */
int bp_within(const barrier_pass *bp, int i, int anc);
/* Whether member expression `member` reads a field of cube__u (the
 * unit's positions). */
int bp_reads_unit(const barrier_pass *bp, const bp_node *member);
/* Whether node `i` comes from a prelude macro without side effects. */
int bp_in_pure_macro(const barrier_pass *bp, int i);
/* Whether `name` is a math function of the prelude (no side effects). */
int bp_math_function(const char *name);
int bp_is_barrier_call(const barrier_pass *bp, int i);
/* Fills `out` with the parts of for loop `f`; 0 when its header does not
 * split. */
int bp_split_for(const barrier_pass *bp, int f, bp_for *out);
/* The end of statement `s` including its closing ';' when it has one. */
unsigned bp_stmt_end(const barrier_pass *bp, int s);
/* Where the statements of a list (a block, or one statement) end. */
unsigned bp_list_end(const barrier_pass *bp, int list);

/* ------------------------------------------------ barrier_analysis.c */

/* Classifies the tree's locals, checks the structure and cuts the body
 * into regions. 0 when refused or out of memory. */
int bp_analyse(barrier_pass *bp);
/* Whether expression `i` has the same value in every unit of a cube
 * (with `pos`: is made of positions and such values only). */
int bp_uniform(const barrier_pass *bp, int i, int pos);
/* Whether list statement `i` is a uniform update of a uniform local. */
int bp_uniform_update(const barrier_pass *bp, int i);
/* Whether statement `s` is a declaration run once per cube. */
int bp_serial_decl(const barrier_pass *bp, int s);
/* The first name expression `i` uses that is declared more than once in
 * the body, or -1. */
int bp_name_declared_twice(const barrier_pass *bp, int i);

/* ---------------------------------------------------- barrier_emit.c */

/* Writes the cube function of the analysed body into bp->out. */
void bp_emit(barrier_pass *bp);

#endif /* CUBE_HAVE_LIBCLANG */

#endif /* CUBE_CPU_BARRIER_PASS_INTERNAL_H */
