/* The barrier pass's analysis (barrier_pass_internal.h): which values
 * are uniform across a cube, whether the structure around the barriers is
 * one the pass handles, where the regions are and how each local that
 * crosses them is carried. */
#include "backends/cpu/barrier_pass_internal.h"

#ifdef CUBE_HAVE_LIBCLANG

#include <string.h>

/* The most bytes of per-unit arrays a cube may keep across barriers. */
#define BP_MAX_CONTEXT ((long long)256 * 1024)

static int bp_kids_uniform(const barrier_pass *bp, int i, int pos, int skip)
{
    for (int c = bp->n[i].first; c >= 0; c = bp->n[c].next)
        if (skip-- <= 0 && bp_is_expr(bp->n[c].kind) && !bp_uniform(bp, c, pos))
            return 0;
    return 1;
}

/* Whether operator node `i` (unary or binary) has no side effects: a
 * binary one other than `=`, a unary `-`, `+`, `!` or `~`. An operator
 * spelled inside a macro (op "") has none only in the prelude's pure
 * macros. */
static int bp_operator_has_no_effect(const barrier_pass *bp, int i)
{
    const bp_node *n = &bp->n[i];
    if (!n->op[0])
        return bp_in_pure_macro(bp, i);
    if (n->kind == CXCursor_BinaryOperator)
        return strcmp(n->op, "=") != 0;
    return !n->op[1] && strchr("-+!~", n->op[0]);
}

/* bp_uniform of a name `n`: a scalar parameter, a length, an enumerator,
 * or a local that is uniform (with `pos`: or made of positions). */
static int bp_uniform_name(const barrier_pass *bp, const bp_node *n, int pos)
{
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
}

/* bp_uniform of a field `n` of the unit's positions: the cube's dimension,
 * count and position (with `pos`: the unit's positions too). */
static int bp_uniform_position(const barrier_pass *bp, const bp_node *n,
                               int pos)
{
    if (!bp_reads_unit(bp, n) || strlen(n->name) != 2)
        return 0;
    if (strchr("dnc", n->name[0]))
        return 1;
    return pos && strchr("ua", n->name[0]);
}

/* Whether expression `i` has the same value in every unit of a cube (with
 * `pos`: is made of positions and such values only), with no side
 * effects. */
int bp_uniform(const barrier_pass *bp, int i, int pos)
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
    case CXCursor_UnaryOperator:
        return bp_operator_has_no_effect(bp, i) &&
               bp_kids_uniform(bp, i, pos, 0);
    case CXCursor_DeclRefExpr: return bp_uniform_name(bp, n, pos);
    case CXCursor_MemberRefExpr: return bp_uniform_position(bp, n, pos);
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

/* Calls `fn` on each statement list of if, while or do `s` (its
 * branches, or its body). */
static void bp_each_branch(barrier_pass *bp, int s,
                           void (*fn)(barrier_pass *bp, int list))
{
    int first = bp_kid(bp, s, bp->n[s].kind == CXCursor_DoStmt ? 0 : 1);
    for (int c = first; c >= 0; c = bp->n[c].next)
        if (!bp_is_expr(bp->n[c].kind))
            fn(bp, c);
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
        bp_each_branch(bp, s, bp_scan_list);
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

/* What a use does to the variable it names. */
typedef struct bp_effect {
    int modified, addressed;
} bp_effect;

/* Whether `n` names a local or a parameter (a name whose changes and
 * address matter). */
static int bp_names_variable(const bp_node *n)
{
    return n->kind == CXCursor_DeclRefExpr &&
           (n->ref == BP_REF_LOCAL || n->ref == BP_REF_PARAM_SCALAR ||
            n->ref == BP_REF_PARAM_LEN || n->ref == BP_REF_PARAM_PTR);
}

/* The node that uses name `i`, through parentheses (-1 at the root); in
 * *through, its child that holds the name. */
static int bp_use_parent(const barrier_pass *bp, int i, int *through)
{
    int c = i, p = bp->n[i].parent;
    while (p >= 0 && bp->n[p].kind == CXCursor_ParenExpr) {
        c = p;
        p = bp->n[p].parent;
    }
    *through = c;
    return p;
}

/* What operator `p` does to its operand (its first when `first`): `++`,
 * `--` and assignments change it, `&` takes its address; an operator
 * spelled inside a macro (op "") other than a pure one may do both. */
static bp_effect bp_operator_effect(const barrier_pass *bp, int p, int first)
{
    const bp_node *pn = &bp->n[p];
    bp_effect e = {0, 0};
    int unknown = !pn->op[0] && !bp_in_pure_macro(bp, p);
    if (pn->kind == CXCursor_UnaryOperator) {
        if (strcmp(pn->op, "++") == 0 || strcmp(pn->op, "--") == 0)
            e.modified = 1;
        else if (strcmp(pn->op, "&") == 0)
            e.addressed = 1;
        else if (unknown)
            e.modified = e.addressed = 1;
    } else if (pn->kind == CXCursor_CompoundAssignOperator && first) {
        e.modified = 1;
    } else if (pn->kind == CXCursor_BinaryOperator && first) {
        e.modified = strcmp(pn->op, "=") == 0 || unknown;
    }
    return e;
}

/* Whether node `p` is the base of the subscript above it. */
static int bp_is_subscript_base(const barrier_pass *bp, int p)
{
    int q = bp->n[p].parent;
    return q >= 0 && bp->n[q].kind == CXCursor_ArraySubscriptExpr &&
           bp->n[q].first == p;
}

/* Whether a local array used by node `p` (as its first operand when
 * `first`) gives its address away: any use but as a subscript's base
 * (through the decay to a pointer) or under sizeof. */
static int bp_array_use_escapes(const barrier_pass *bp, int p, int first)
{
    switch (bp->n[p].kind) {
    case CXCursor_UnaryExpr: return 0;
    case CXCursor_ArraySubscriptExpr: return !first;
    case CXCursor_UnexposedExpr: return !first || !bp_is_subscript_base(bp, p);
    default: return 1;
    }
}

/* Whether use `i` of local `v` is in the step of the for loop whose init
 * declares it. */
static int bp_in_own_step(const barrier_pass *bp, const bp_var *v, int i)
{
    int ds = bp->n[v->decl].parent;
    int fs = ds >= 0 ? bp->n[ds].parent : -1;
    if (fs < 0 || bp->n[fs].kind != CXCursor_ForStmt)
        return 0;
    bp_for f;
    return bp_split_for(bp, fs, &f) && f.init == ds && f.inc >= 0 &&
           bp_within(bp, i, f.inc);
}

/* Notes that use `i`, by node `p`, changes local `v`. */
static void bp_note_change(barrier_pass *bp, bp_var *v, int i, int p)
{
    v->modified = 1;
    if (!bp_in_own_step(bp, v, i))
        v->modified_outside_inc = 1;
    if (!bp->n[p].list_stmt)
        v->modified_in_expr = 1;
}

/* Modifications and addresses of locals and parameters. */
static void bp_scan_uses(barrier_pass *bp)
{
    for (int i = 0; i < bp->nn; i++) {
        const bp_node *n = &bp->n[i];
        if (!bp_names_variable(n))
            continue;
        int through;
        int p = bp_use_parent(bp, i, &through);
        if (p < 0)
            continue;
        int first = bp->n[p].first == through;
        int local = n->ref == BP_REF_LOCAL;
        bp_effect e = bp_operator_effect(bp, p, first);
        if (local && bp->v[n->var].is_array &&
            bp_array_use_escapes(bp, p, first))
            e.addressed = 1;
        if (!e.modified && !e.addressed)
            continue;
        if (!local) {
            bp_refuse(bp,
                      "the kernel assigns or takes the address of its "
                      "parameter '%s'",
                      n->name);
            continue;
        }
        bp_var *v = &bp->v[n->var];
        v->addressed |= e.addressed;
        /* Its address could outlive the unit's loop iteration (in a
         * pointer, in memory): fibers keep every unit's locals. */
        if (e.addressed)
            bp_refuse(bp,
                      "the address of the local '%s' is taken in a kernel "
                      "with cube_sync()",
                      v->name);
        if (e.modified)
            bp_note_change(bp, v, i, p);
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
int bp_uniform_update(const barrier_pass *bp, int i)
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

/* Whether local `v` holds a plain value: a scalar with an initialiser,
 * neither static nor volatile, whose address is never taken. */
static int bp_plain_value(const bp_var *v)
{
    return v->init >= 0 && v->scalar && !v->is_static && !v->is_volatile &&
           !v->addressed;
}

/* Whether plain local `v` is changed only where a uniform variable may
 * be: a loop's counter only by its step, a variable of a list only by
 * whole statements of lists (which bp_classify_values then checks are
 * uniform updates). */
static int bp_changed_as_uniform(const bp_var *v)
{
    if (v->for_stmt >= 0)
        return !v->modified_outside_inc;
    return v->list_level && !v->modified_in_expr;
}

/* Whether declaration statement `ds` declares a variable that is not
 * uniform. */
static int bp_declares_varying(const barrier_pass *bp, int ds)
{
    for (int c = bp->n[ds].first; c >= 0; c = bp->n[c].next)
        if (bp->n[c].kind == CXCursor_VarDecl && !bp->v[bp->n[c].var].uniform)
            return 1;
    return 0;
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
        int ok = bp_plain_value(v);
        v->uniform = ok && bp_changed_as_uniform(v);
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
            if (v->uniform && v->for_stmt < 0 &&
                bp_declares_varying(bp, bp->n[v->decl].parent)) {
                v->uniform = 0;
                changed = 1;
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
        bp_each_branch(bp, s, bp_check_list);
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

/* The loop or switch that break or continue `i` leaves (a continue
 * passes switches by), or -1. */
static int bp_jump_target(const barrier_pass *bp, int i)
{
    int k = bp->n[i].kind;
    for (int p = bp->n[i].parent; p >= 0; p = bp->n[p].parent) {
        int pk = bp->n[p].kind;
        if (pk == CXCursor_ForStmt || pk == CXCursor_WhileStmt ||
            pk == CXCursor_DoStmt ||
            (pk == CXCursor_SwitchStmt && k == CXCursor_BreakStmt))
            return p;
    }
    return -1;
}

/* The local a grid-stride loop's init declares, alone, or -1: a plain
 * value of 4 bytes or more that only the loop's step changes. */
static int bp_stride_counter(const barrier_pass *bp, const bp_for *f)
{
    int d = bp->n[f->init].first;
    if (d < 0 || bp->n[d].next >= 0 || bp->n[d].kind != CXCursor_VarDecl)
        return -1;
    const bp_var *v = &bp->v[bp->n[d].var];
    if (!bp_plain_value(v) || v->modified_outside_inc || v->size < 4)
        return -1;
    return bp->n[d].var;
}

/* The operand of sum `e` that is not uniform when the other one is, or
 * -1. */
static int bp_varying_addend(const barrier_pass *bp, int e)
{
    int a = bp->n[e].first, b = bp->n[a].next;
    if (bp_uniform(bp, a, 0))
        return b;
    if (bp_uniform(bp, b, 0))
        return a;
    return -1;
}

/* Whether expression `e` is the unit's x position (in the cube or
 * absolute), converted to 4 bytes or more, plus uniform values. */
static int bp_starts_at_unit_x(const barrier_pass *bp, int e)
{
    e = bp_strip_parens(bp, e);
    for (int guard = 0; e >= 0 && guard < 8; guard++) {
        const bp_node *n = &bp->n[e];
        if (n->kind == CXCursor_CStyleCastExpr && n->tsize < 4)
            return 0;
        if (n->kind == CXCursor_CStyleCastExpr ||
            n->kind == CXCursor_UnexposedExpr ||
            n->kind == CXCursor_ParenExpr) {
            e = n->last;
            continue;
        }
        if (n->kind == CXCursor_BinaryOperator && strcmp(n->op, "+") == 0) {
            e = bp_varying_addend(bp, e);
            continue;
        }
        return n->kind == CXCursor_MemberRefExpr &&
               (strcmp(n->name, "ax") == 0 || strcmp(n->name, "ux") == 0) &&
               bp_reads_unit(bp, n);
    }
    return 0;
}

/* Whether node `i` names local `var`, through parentheses. */
static int bp_names_local(const barrier_pass *bp, int i, int var)
{
    int t = bp_strip_parens(bp, i);
    return t >= 0 && bp->n[t].kind == CXCursor_DeclRefExpr &&
           bp->n[t].var == var;
}

/* Whether condition `cond` is `counter < uniform`. */
static int bp_stride_bound(const barrier_pass *bp, int cond, int var)
{
    const bp_node *c = &bp->n[cond];
    return c->kind == CXCursor_BinaryOperator && strcmp(c->op, "<") == 0 &&
           bp_names_local(bp, c->first, var) &&
           bp_uniform(bp, bp->n[c->first].next, 0);
}

/* Whether step `inc` is `counter += uniform` or `counter++`. */
static int bp_stride_step(const barrier_pass *bp, int inc, int var)
{
    const bp_node *in = &bp->n[inc];
    if (!bp_names_local(bp, in->first, var))
        return 0;
    if (in->kind == CXCursor_CompoundAssignOperator &&
        strcmp(in->op, "+=") == 0)
        return bp_uniform(bp, bp->n[in->first].next, 0);
    return in->kind == CXCursor_UnaryOperator && strcmp(in->op, "++") == 0;
}

/* Whether `body`, of loop `s`, may leave the loop early: a return, or a
 * break or continue of `s` itself (one of a loop inside is fine). */
static int bp_leaves_early(const barrier_pass *bp, int s, int body)
{
    for (int i = 0; i < bp->nn; i++) {
        int k = bp->n[i].kind;
        if ((k != CXCursor_BreakStmt && k != CXCursor_ContinueStmt &&
             k != CXCursor_ReturnStmt) ||
            !bp_within(bp, i, body))
            continue;
        if (k == CXCursor_ReturnStmt || bp_jump_target(bp, i) == s)
            return 1;
    }
    return 0;
}

/* A grid-stride loop: `for (T i = <unit x position> [+ uniform];
 * i < uniform; i += uniform)` in a 1-D cube, whose body leaves `i` alone
 * and never leaves the loop early. */
static int bp_stride_loop(const barrier_pass *bp, int s)
{
    if (bp->n[s].kind != CXCursor_ForStmt || bp->dim[1] != 1 || bp->dim[2] != 1)
        return 0;
    bp_for f;
    if (!bp_split_for(bp, s, &f) || f.init < 0 || f.cond < 0 || f.inc < 0)
        return 0;
    int var = bp_stride_counter(bp, &f);
    return var >= 0 && bp_starts_at_unit_x(bp, bp->v[var].init) &&
           bp_stride_bound(bp, f.cond, var) && bp_stride_step(bp, f.inc, var) &&
           !bp_leaves_early(bp, s, f.body);
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
int bp_serial_decl(const barrier_pass *bp, int s)
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
    case CXCursor_DoStmt: bp_each_branch(bp, s, bp_regions_list); return;
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
            int t = bp_jump_target(bp, i);
            if (t >= 0 && bp->n[t].barrier)
                bp_refuse(bp, "a %s out of a loop with cube_sync()",
                          k == CXCursor_BreakStmt ? "break" : "continue");
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
int bp_name_declared_twice(const barrier_pass *bp, int i)
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

/* Refuses local `v`, which lives across a barrier and is not recomputed,
 * unless it can be kept in an array with one element per unit: a scalar,
 * its address never taken, neither static nor volatile, no pointer that
 * could point into a unit's local array, declared at its block's level
 * (where the region's prologue loads it). */
static void bp_check_context_value(barrier_pass *bp, const bp_var *v)
{
    if (v->is_array || !v->scalar || v->size <= 0)
        bp_refuse(bp, "the local '%s' (not a scalar) lives across cube_sync()",
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
                  "the pointer '%s' lives across cube_sync() in a kernel "
                  "with local arrays",
                  v->name);
    else if (!v->list_level)
        bp_refuse(bp,
                  "the local '%s' lives across cube_sync() but is not "
                  "declared at the level of its block",
                  v->name);
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
        bp_check_context_value(bp, v);
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

int bp_analyse(barrier_pass *bp)
{
    bp_scan_list(bp, bp->body);
    bp_scan_uses(bp);
    if (bp->refused)
        return 0;
    bp_classify_values(bp);
    bp_check_structure(bp, bp->body);
    if (bp->refused)
        return 0;
    bp_regions_list(bp, bp->body);
    if (bp->oom)
        return 0;
    bp_check_jumps(bp);
    if (bp->refused)
        return 0;
    bp_classify_crossing(bp);
    return !bp->refused;
}

#endif /* CUBE_HAVE_LIBCLANG */
