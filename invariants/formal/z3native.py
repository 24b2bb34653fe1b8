"""Z3 terms evaluated on concrete values by Python, without a Z3 call.

The agreement checks (:mod:`memspec.invariants.formal.agreement`,
:mod:`memspec.invariants.formal.proofs_caching_agree`) evaluate each encoded action --
a Z3 term over symbolic fields -- on thousands of concrete states.  Z3's own
way, substitute the values and simplify, costs milliseconds a sample, most of
it in building the concrete arrays as store chains.  :class:`Program` turns the
terms' DAG into one straight-line Python function (one assignment a node,
built once per term) that runs in microseconds.

It covers the quantifier-free fragment the encodings use: Booleans, integer
arithmetic with SMT-LIB's ``div``/``mod`` (Euclidean: ``0 <= a mod b < |b|``),
if-then-else, arrays from Int (select, store, constant arrays, equality by
extension).  Anything else -- a quantifier, a bound variable, an uninterpreted
function, a real -- raises :class:`Unsupported` when the program is built, and
a division by zero raises it when it runs (Z3 leaves ``x div 0`` open); the
caller then evaluates with Z3 as before.  Every evaluation is eager (both arms
of an if-then-else), which is exact because every operation here is total
except the division, and that one refuses.

Arrays are ``(default, {index: value})`` -- the projections' own form -- and
nested arrays nest.  Callers cross-check the first evaluation of each program
and every :data:`CROSS_CHECK_EVERY`-th after it with Z3 (:func:`checked`): a
difference is a defect of this module, raised, never a verdict.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import z3

#: callers compare the first evaluation of each program, and every this many after it, with Z3's
CROSS_CHECK_EVERY = 16


class Unsupported(Exception):
    """A term (or, at run time, a value: a division by zero) outside the fragment this module evaluates."""


def _div(a: int, b: int) -> int:
    if b == 0:
        raise Unsupported("division by zero (Z3 leaves it open)")
    r = a % abs(b)
    return (a - r) // b


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise Unsupported("modulo by zero (Z3 leaves it open)")
    return a % abs(b)


def _aeq(x: Any, y: Any) -> bool:
    """Extensional equality of two arrays ``(default, {index: value})`` over the integers (infinitely
    many indices read the defaults)."""
    if isinstance(x, tuple) and isinstance(y, tuple):
        (dx, mx), (dy, my) = x, y
        if not _aeq(dx, dy):
            return False
        return all(_aeq(mx.get(k, dx), my.get(k, dy)) for k in mx.keys() | my.keys())
    if callable(x) or callable(y):
        raise Unsupported("equality of an array given by a lambda")
    return bool(x == y)


def _sel(a: Any, i: int) -> Any:
    """``a[i]`` of an array that is a stored map ``(default, {index: value})`` or a lambda (a function)."""
    if type(a) is tuple:
        return a[1].get(i, a[0])
    return a(i)


def _store(a: Any, i: int, v: Any) -> Any:
    if type(a) is tuple:
        return (a[0], {**a[1], i: v})
    return lambda x: v if x == i else a(x)


_ENV_FUNCS = {"_div": _div, "_mod": _mod, "_aeq": _aeq, "_sel": _sel, "_store": _store}

_NARY = {z3.Z3_OP_ADD: " + ", z3.Z3_OP_SUB: " - ", z3.Z3_OP_MUL: " * ", z3.Z3_OP_AND: " and ",
         z3.Z3_OP_OR: " or "}
_CMP = {z3.Z3_OP_LE: " <= ", z3.Z3_OP_LT: " < ", z3.Z3_OP_GE: " >= ", z3.Z3_OP_GT: " > "}
#: operators of fixed arity: the Python expression of their arguments' names
_FORMAT = {z3.Z3_OP_NOT: "not {0}", z3.Z3_OP_IMPLIES: "(not {0}) or {1}", z3.Z3_OP_XOR: "{0} != {1}",
           z3.Z3_OP_UMINUS: "-{0}", z3.Z3_OP_IDIV: "_div({0}, {1})", z3.Z3_OP_MOD: "_mod({0}, {1})",
           z3.Z3_OP_ABS: "abs({0})"}
_LITERALS = {z3.Z3_OP_TRUE: "True", z3.Z3_OP_FALSE: "False"}   # constants: their Python expression

#: how an array-valued node is held: a stored map (tuple), a function (a lambda), or either
_MAP, _FN, _EITHER = "map", "fn", "either"


class _Scope:
    """The body of one lambda: the nodes that read its bound variable are built in it (one function
    per lambda), every other node once for the whole program."""

    def __init__(self, number: int) -> None:
        self.var = f"j{number}"
        self.fn = f"lam{number}"
        self.names: dict[int, str] = {}
        self.lines: list[str] = []


#: node shapes: ("num", value) | ("var", index) | ("lam", body, bound sort is Int?) | ("q",) |
#: ("app", operator, children, name of a free constant, is the node an array?, is the first child an array?)
_NUM, _VAR, _LAM, _QUANT, _APP = range(5)


class _Shapes:
    """Each AST's shape, read from Z3 once per process.  Building a program
    reads every node of its terms; the agreement builds one program per action
    and universe size, and those share most of their nodes (Z3 hash-conses
    terms), so the reads are cached by AST id.  A cached AST is pinned (its
    reference count raised) so that its id cannot be reused by another term;
    past :data:`SHAPES_CAP` nodes the cache is emptied and the pins dropped."""

    def __init__(self) -> None:
        self.ctx: Any = None
        self.shape: dict[int, tuple[Any, ...]] = {}
        self.pinned: list[Any] = []

    def reset(self, ctx: Any) -> None:
        if self.ctx is not None:
            c = self.ctx.ref()
            for a in self.pinned:
                _lib.Z3_dec_ref(c, a)
        self.ctx, self.shape, self.pinned = ctx, {}, []

    def read(self, c: Any, a: Any, k: int) -> tuple[Any, ...]:
        kind = _lib.Z3_get_ast_kind(c, a)
        if kind == z3.Z3_NUMERAL_AST:
            if z3.Z3_get_sort_kind(c, z3.Z3_get_sort(c, a)) != z3.Z3_INT_SORT:
                raise Unsupported("a numeral that is not an integer")
            out: tuple[Any, ...] = (_NUM, int(z3.Z3_get_numeral_string(c, a)))
        elif kind == z3.Z3_VAR_AST:
            out = (_VAR, z3.Z3_get_index_value(c, a))
        elif kind == z3.Z3_QUANTIFIER_AST:
            if z3.Z3_is_lambda(c, a) and z3.Z3_get_quantifier_num_bound(c, a) == 1 and \
                    z3.Z3_get_sort_kind(c, z3.Z3_get_quantifier_bound_sort(c, a, 0)) == z3.Z3_INT_SORT:
                body = z3.Z3_get_quantifier_body(c, a)
                out = (_LAM, body, _lib.Z3_get_ast_id(c, body))
            else:
                out = (_QUANT,)
        elif kind == z3.Z3_APP_AST:
            n = _lib.Z3_get_app_num_args(c, a)
            args = tuple(_lib.Z3_get_app_arg(c, a, i) for i in range(n))
            decl = _lib.Z3_get_app_decl(c, a)
            op = _lib.Z3_get_decl_kind(c, decl)
            name = z3.Z3_get_symbol_string(c, z3.Z3_get_decl_name(c, decl)) if op == z3.Z3_OP_UNINTERPRETED \
                or op not in _KNOWN else None
            arr = _lib.Z3_get_sort_kind(c, _lib.Z3_get_sort(c, a)) == z3.Z3_ARRAY_SORT
            arr0 = n > 0 and _lib.Z3_get_sort_kind(c, _lib.Z3_get_sort(c, args[0])) == z3.Z3_ARRAY_SORT
            out = (_APP, op, args, tuple(_lib.Z3_get_ast_id(c, x) for x in args), name, arr, arr0)
        else:
            raise Unsupported(f"an AST of kind {kind}")
        _lib.Z3_inc_ref(c, a)
        self.pinned.append(a)
        self.shape[k] = out
        return out


class _Raw:
    """The C functions behind z3core's wrappers (each wrapper adds an error-code call to every read;
    these reads of a live AST cannot fail).  A wrapper whose C function is not found is used as it is."""

    def __getattr__(self, name: str) -> Any:
        wrapper = getattr(z3, name)
        elems = (wrapper.__defaults__ or (None,))[-1]
        fn = getattr(elems, "f", None) or wrapper
        setattr(self, name, fn)
        return fn


_lib = _Raw()
_SHAPES = _Shapes()
#: nodes whose shapes are kept (and pinned) at most
SHAPES_CAP = 2_000_000

_KNOWN = {*_LITERALS, z3.Z3_OP_EQ, z3.Z3_OP_IFF, z3.Z3_OP_DISTINCT, z3.Z3_OP_ITE,
          z3.Z3_OP_SELECT, z3.Z3_OP_STORE, z3.Z3_OP_CONST_ARRAY, *_NARY, *_CMP, *_FORMAT}


class Program:
    """``terms`` as one Python function of the free constants' values (by name).

    ``Program(terms)(env)`` -> the terms' values, in order; ``env`` maps each
    free constant's name (:attr:`inputs`) to an ``int``, a ``bool`` or an array
    ``(default, {index: value})``.  A lambda (``z3.Lambda`` of one integer
    variable, the encodings' way to write a whole array at once) becomes a
    Python function, called when an index of it is read."""

    def __init__(self, terms: Iterable[Any]) -> None:
        terms = list(terms)
        if not terms:
            raise ValueError("no terms")
        ctx = terms[0].ctx
        if _SHAPES.ctx is not ctx or len(_SHAPES.shape) > SHAPES_CAP:
            _SHAPES.reset(ctx)
        c = ctx.ref()
        shapes, read = _SHAPES.shape, _SHAPES.read
        self.inputs: dict[str, int] = {}      # name -> AST id
        lines: list[str] = []
        names: dict[int, str] = {}            # AST id -> Python expression, for nodes read by no bound variable
        held: dict[str, str] = {}             # Python name of an array node -> _MAP / _FN / _EITHER
        loads: list[str] = []
        scopes: list[_Scope] = []

        def lookup(k: int, scope: _Scope | None) -> str | None:
            if scope is not None and k in scope.names:
                return scope.names[k]
            return names.get(k)

        # iterative post-order over the DAG (no recursion limit on deep store chains); a frame is
        # (ast, its id, children done?, the innermost lambda it is under, the lambda it opens)
        stack: list[tuple[Any, int, bool, _Scope | None, _Scope | None]] = [
            (t.as_ast(), t.get_id(), False, None, None) for t in reversed(terms)]
        while stack:
            a, k, ready, scope, inner = stack.pop()
            if lookup(k, scope) is not None:
                continue
            sh = shapes.get(k)
            if sh is None:
                sh = read(c, a, k)
            tag = sh[0]
            if tag == _NUM:
                names[k] = f"({sh[1]})"
                continue
            if tag == _VAR:
                if scope is None or sh[1] != 0:
                    raise Unsupported("a variable bound outside its innermost lambda")
                scope.names[k] = scope.var
                continue
            if tag == _QUANT:
                raise Unsupported("a quantifier (only a lambda of one integer variable is evaluated)")
            if tag == _LAM:
                if not ready:
                    body_scope = _Scope(len(scopes))
                    scopes.append(body_scope)
                    stack.append((a, k, True, scope, body_scope))
                    stack.append((sh[1], sh[2], False, body_scope, None))
                    continue
                assert inner is not None
                out = lookup(sh[2], inner)
                # a lambda reads no variable of an enclosing one (checked at its variables): one function for
                # the whole program, defined where it is first met
                lines.extend([f"    def {inner.fn}({inner.var}):", *("    " + x for x in inner.lines),
                              f"        return {out}"])
                names[k] = inner.fn
                held[inner.fn] = _FN
                continue
            _tag, op, args, ids, name, arr, arr0 = sh
            n = len(args)
            if not ready:
                stack.append((a, k, True, scope, None))
                stack.extend((x, i, False, scope, None) for x, i in zip(reversed(args), reversed(ids)))
                continue
            xs = [lookup(i, scope) for i in ids]
            local = scope is not None and any(i in scope.names for i in ids)
            if op in _LITERALS:
                names[k] = _LITERALS[op]
                continue
            if op == z3.Z3_OP_UNINTERPRETED:
                if n:
                    raise Unsupported("an uninterpreted function")
                if name in self.inputs:
                    raise Unsupported(f"two free constants named {name!r}")
                self.inputs[name] = k
                var = f"i{len(loads)}"
                loads.append(f"    {var} = env[_n{len(loads)}]")   # the name itself stays out of the source
                names[k] = var
                if arr:
                    held[var] = _MAP
                continue
            hold = None
            if op in _NARY:
                e = _NARY[op].join(xs)
            elif op in _CMP:
                e = _CMP[op].join(xs)
            elif op == z3.Z3_OP_EQ or op == z3.Z3_OP_IFF:
                e = f"_aeq({xs[0]}, {xs[1]})" if arr0 else f"{xs[0]} == {xs[1]}"
            elif op == z3.Z3_OP_DISTINCT:
                if arr0:
                    raise Unsupported("distinct arrays")
                e = f"len({{{', '.join(xs)}}}) == {n}"
            elif op in _FORMAT:
                e = _FORMAT[op].format(*xs)
            elif op == z3.Z3_OP_ITE:
                e = f"{xs[1]} if {xs[0]} else {xs[2]}"
                if arr:
                    h1, h2 = held.get(xs[1], _EITHER), held.get(xs[2], _EITHER)
                    hold = h1 if h1 == h2 else _EITHER
            elif op == z3.Z3_OP_SELECT and n == 2:
                if held.get(xs[0]) == _MAP:
                    e = f"{xs[0]}[1].get({xs[1]}, {xs[0]}[0])"
                elif held.get(xs[0]) == _FN:
                    e = f"{xs[0]}({xs[1]})"
                else:
                    e = f"_sel({xs[0]}, {xs[1]})"
                hold = _EITHER if arr else None
            elif op == z3.Z3_OP_STORE and n == 3:
                if held.get(xs[0]) == _MAP:
                    e = f"({xs[0]}[0], {{**{xs[0]}[1], {xs[1]}: {xs[2]}}})"
                    hold = _MAP
                else:
                    e = f"_store({xs[0]}, {xs[1]}, {xs[2]})"
                    hold = _EITHER
            elif op == z3.Z3_OP_CONST_ARRAY:
                e = f"({xs[0]}, {{}})"
                hold = _MAP
            else:
                raise Unsupported(f"operator {name!r}")
            if local:
                assert scope is not None
                var = f"{scope.var}_{len(scope.lines)}"
                scope.lines.append(f"    {var} = {e}")
                scope.names[k] = var
            else:
                var = f"v{len(lines)}"
                lines.append(f"    {var} = {e}")
                names[k] = var
            if hold is not None:
                held[var] = hold
        outs = [names[t.get_id()] for t in terms]
        src = "def _program(env):\n" + "\n".join(loads + lines) + f"\n    return ({', '.join(outs)},)\n"
        # the source holds only names made here (``v``/``i``/``j``/``lam`` and a number), integer literals
        # and the operator templates above: the free constants' names are bound as globals, not written
        scope_vars: dict[str, Any] = dict(_ENV_FUNCS)
        scope_vars.update({f"_n{k}": nm for k, nm in enumerate(self.inputs)})
        exec(compile(src, "<z3native>", "exec"), scope_vars)
        self._fn: Callable[[dict[str, Any]], tuple[Any, ...]] = scope_vars["_program"]
        self.size = len(lines) + sum(len(sc.lines) for sc in scopes)
        self.runs = 0

    def __call__(self, env: dict[str, Any]) -> tuple[Any, ...]:
        self.runs += 1
        try:
            return self._fn(env)
        except KeyError as e:
            raise ValueError(f"no value for the free constant {e.args[0]!r}") from None

    def due_cross_check(self) -> bool:
        """Whether the evaluation just run is one the caller compares with Z3's."""
        return self.runs == 1 or self.runs % CROSS_CHECK_EVERY == 0


def build(terms: Iterable[Any]) -> Program | None:
    """A :class:`Program`, or ``None`` when a term is outside the fragment (the caller uses Z3)."""
    try:
        return Program(terms)
    except Unsupported:
        return None


def from_z3(v: Any) -> Any:
    """A Z3 value (an integer or Boolean literal, or a store chain over a constant array) as this
    module's value; :class:`Unsupported` for anything else."""
    if z3.is_int_value(v):
        return v.as_long()
    if z3.is_true(v):
        return True
    if z3.is_false(v):
        return False
    if z3.is_store(v):
        d, m = from_z3(v.arg(0))
        m = dict(m)
        m[from_z3(v.arg(1))] = from_z3(v.arg(2))
        return (d, m)
    if z3.is_const_array(v):
        return (from_z3(v.arg(0)), {})
    raise Unsupported(f"not a value: {str(v)[:120]}")


def pack(terms: list[Any]) -> Any:
    """``terms`` as one array term (index ``k`` holds term ``k``, a Boolean as 0 or 1), so that one
    substitute and one simplify evaluate them all (the Z3 side of :func:`checked`); the store chain is
    made by the C API directly (z3py's ``Store`` checks each store's sorts)."""
    ctx = terms[0].ctx
    c = ctx.ref()
    cur = z3.K(z3.IntSort(), z3.IntVal(-(1 << 62))).as_ast()
    z3.Z3_inc_ref(c, cur)
    for idx, t in enumerate(terms):
        t = z3.If(t, z3.IntVal(1), z3.IntVal(0)) if z3.is_bool(t) else t
        nxt = z3.Z3_mk_store(c, cur, z3.IntVal(idx).as_ast(), t.as_ast())
        z3.Z3_inc_ref(c, nxt)
        z3.Z3_dec_ref(c, cur)
        cur = nxt
    out = z3.z3._to_expr_ref(cur, ctx)   # takes its own reference
    z3.Z3_dec_ref(c, cur)
    return out


def unpack(v: Any, size: int, what: str) -> list[Any]:
    """The ``size`` elements of a :func:`pack`-ed term after substitution and simplification: each a
    Python int where it became a literal, else the Z3 term that remained (a quantifier).  Read through
    the C API (z3py wraps every node it hands out: ten times slower on the agreement walks)."""
    c, ast = v.ctx.ref(), v.as_ast()
    got: dict[int, Any] = {}

    def number(a: Any) -> int | None:
        return int(z3.Z3_get_numeral_string(c, a)) if z3.Z3_is_numeral_ast(c, a) else None

    while (z3.Z3_get_ast_kind(c, ast) == z3.Z3_APP_AST
           and z3.Z3_get_decl_kind(c, z3.Z3_get_app_decl(c, ast)) == z3.Z3_OP_STORE):
        idx, val = number(z3.Z3_get_app_arg(c, ast, 1)), z3.Z3_get_app_arg(c, ast, 2)
        if idx is None:
            break
        if idx not in got:
            n = number(val)
            got[idx] = n if n is not None else z3.z3._to_expr_ref(val, v.ctx)
        ast = z3.Z3_get_app_arg(c, ast, 0)
    if len(got) != size:
        raise ValueError(f"{what}: {size - len(got)} packed terms lost their place: {str(v)[:200]}")
    return [got[k] for k in range(size)]


def same(x: Any, y: Any) -> bool:
    """Equality of two values of this module (arrays by extension)."""
    return _aeq(x, y)


def cross_check_failed(what: str, native: Any, z3_value: Any) -> AssertionError:
    if isinstance(native, dict) and isinstance(z3_value, dict):   # name the first output that differs
        bad = next((k for k in native if native[k] != z3_value.get(k)), None)
        if bad is not None:
            what, native, z3_value = f"{what} (output {bad!r})", native[bad], z3_value.get(bad)
    return AssertionError(f"z3native: {what} evaluated to {native!r} in Python but to {z3_value!r} by Z3: "
                          "a defect of memspec.invariants.formal.z3native")


def checked(prog: Program | None, env: Callable[[], dict[str, Any]], convert: Callable[[tuple[Any, ...]], Any],
            by_z3: Callable[[], Any], what: str) -> Any:
    """The value of ``prog`` on ``env()``, as ``convert`` makes it; ``by_z3()`` instead when there is no
    program or it refuses (:class:`Unsupported`); and ``by_z3()`` as well, which must give the same,
    on the first evaluation of the program and every :data:`CROSS_CHECK_EVERY`-th (else
    :func:`cross_check_failed`: a defect of this module, never a verdict)."""
    if prog is None:
        return by_z3()
    try:
        got = convert(prog(env()))
    except Unsupported:
        return by_z3()
    if prog.due_cross_check():
        want = by_z3()
        if want != got:
            raise cross_check_failed(what, got, want)
    return got


__all__ = ["Program", "Unsupported", "build", "checked", "from_z3", "pack", "same", "unpack", "CROSS_CHECK_EVERY",
           "cross_check_failed"]
