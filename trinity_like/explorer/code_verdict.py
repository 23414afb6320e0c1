"""The host's side of ``code_exec``: it runs the task's test lines itself and asks the jail only for values.

Used by :mod:`trinity_like.explorer.code_exec`. A :class:`Judge` interprets each test line
(``assert add(2, 3) == 5``, ``s = Stack()``, ``for i in range(3): assert sq(i) == i * i``)
in this process, with a small evaluator of Python's syntax over plain data. Whenever a step
is the model's code's own business -- looking up a name the test did not define, calling
what that lookup returned, an attribute, an index or an operator of a value the code made,
that value's truth or iteration -- the step is sent to the jailed process as one query
(``{"eval": "__a0(*__a1)", "bind": {...}}``) and the answer is one plain value, or a handle
naming an object that stays in the jail. Everything else -- comparisons, ``assert`` itself,
``not``, ``and``, arithmetic on plain values, the safe builtins, loops, the verdict -- runs
here. So the jail's answers can only be values of the code's own expressions: a forged or
injected answer is a value the code could have returned honestly, and the verdict of
``assert False`` or ``assert add(2, 3) == 5`` cannot be written from inside the jail. A
comparison involving an object of the code's (a handle) fails its line: no ``__eq__`` of the
code's is ever trusted.

Lines this evaluator does not cover (``def``, ``class``, ``try``, ``with``, ``del``, an import
outside :data:`HOST_MODULES`, an attribute starting with ``_``) fail: a line is never run
whole where the code could decide its verdict. Names a test line assigns live here: the
code sees them only when a line passes them to it (``want = 25`` then ``assert f() == want``
keeps 25 out of the jail too; a function of the code's that reads a global the test set
does not see it). The host's own work per call is bounded
by the call's wall time and in memory: no value the host builds may hold more than :data:`SIZE`
items (aliases counted again), nor all of them together more than :data:`WORK`, and the
operators that could build a larger one from small inputs are refused before they run, so a
value of the code's cannot make a test line exhaust the explorer. Example::

    judge = Judge(lambda query: b'{"value": 5}')  # ask(query) -> the jail's reply line, here always 5
    assert judge.line("assert add(2, 3) == 5") and not judge.line("assert False")
    # a reply that breaks the protocol raises Rejected; a session's end (died, wall time) passes through
"""

from __future__ import annotations

import ast
import json
import math
import operator
import time
from collections.abc import Callable
from typing import Any

from trinity_like.explorer.code_values import (
    BIG_MATH,
    COMPARE,
    HOST_MODULES,
    METHODS,
    PLAIN,
    SAFE_BUILTINS,
    SIZE,
    UNARY,
    WORK,
    Failed,
    HostLambda,
    OutOfTime,
    Rejected,
    Remote,
    check_spec,
    checked_binop,
    decode,
    encode,
    grown_args,
    has_remote,
    sendable,
    small,
    weigh,
)

STEPS = 200_000  # evaluation steps (nodes, loop turns) the host spends on one call's test lines


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class Judge:
    """Runs test lines here; asks the jail, through ``ask``, only for what the code's objects do."""

    def __init__(self, ask: Callable[[dict[str, Any]], bytes], deadline: float = math.inf) -> None:
        self.ask, self.deadline = ask, deadline  # deadline: time.monotonic() past which OutOfTime is raised
        self.globals: dict[str, Any] = {}  # what the test lines assigned (plain data or handles)
        self.steps = self.work = 0

    def line(self, src: str) -> bool:
        """Whether the test line ``src`` passes; :class:`Rejected`, :class:`OutOfTime` and the session's end pass through."""
        try:
            body = ast.parse(src).body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return False
        try:
            for stmt in body:
                self.run(stmt, self.globals)
        except (Failed, ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RuntimeError, MemoryError):
            return False  # what the line would raise in Python (an error of the host's own evaluator too)
        return True

    # -- the jail ---------------------------------------------------------------------------------
    def remote(self, src: str, *args: Any, mode: str = "eval") -> Any:
        """The value of ``src`` in the jail (``mode`` "exec": run it, None), ``__a0``.. bound to ``args``."""
        bind = {f"__a{i}": encode(a) for i, a in enumerate(args)}
        try:
            reply = json.loads(self.ask({mode: src, "bind": bind}))
        except (ValueError, RecursionError):
            raise Rejected("not json", "a reply that is not JSON") from None
        if reply == {"raised": True}:
            raise Failed("the code's object raised")
        if type(reply) is not dict or list(reply) != ["value"]:
            raise Rejected("wrong shape", f"{reply!r:.60} is not {{'value': ...}} or {{'raised': true}}")
        try:
            return decode(reply["value"])
        except RecursionError:
            raise Rejected("bad value", "nested too deep") from None

    def truth(self, v: Any) -> bool:
        if type(v) is Remote:
            v = self.remote("bool(__a0)", v)
            if type(v) is not bool:
                raise Rejected("bad value", "bool() answered with something else")
        return bool(v)

    def items(self, v: Any) -> list[Any]:
        if type(v) is Remote:
            v = self.remote("list(__a0)", v)
            if type(v) is not list:
                raise Rejected("bad value", "list() answered with something else")
            return v
        if isinstance(v, (str, bytes, list, tuple, dict, set, frozenset, range)):
            return list(self.bounded(v))
        if type(v) in (map, filter, zip, enumerate, reversed):
            out = []
            for i in v:
                self.tick()
                out.append(i)
            return out
        raise Failed(f"the host does not iterate a {type(v).__name__}")

    def bounded(self, v: Any) -> Any:
        """``v``, a value the host built, if it and all built so far stay within :data:`SIZE` and :data:`WORK`."""
        w = weigh(v)
        self.work += w
        if w > SIZE or self.work > WORK:
            raise Failed("a value past the host's size bound")
        return v

    def tick(self) -> None:
        self.steps += 1
        if time.monotonic() > self.deadline:
            raise OutOfTime("the call's wall time passed on the host")
        if self.steps > STEPS:
            raise Failed("past the host's step bound")

    # -- statements -------------------------------------------------------------------------------
    def run(self, s: ast.stmt, scope: dict[str, Any]) -> None:
        self.tick()
        if isinstance(s, ast.Assert):
            if not self.truth(self.ev(s.test, scope)):
                raise Failed("assertion")
        elif isinstance(s, ast.Expr):
            self.ev(s.value, scope)
        elif isinstance(s, ast.Assign):
            value = self.ev(s.value, scope)
            for target in s.targets:
                self.assign(target, value, scope)
        elif isinstance(s, ast.AnnAssign) and s.value is not None:
            self.assign(s.target, self.ev(s.value, scope), scope)
        elif isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
            now = self.ev(ast.Name(s.target.id, ast.Load()), scope)
            scope[s.target.id] = self.operate(type(s.op), now, self.ev(s.value, scope))
        elif isinstance(s, ast.For):
            for item in self.items(self.ev(s.iter, scope)):
                self.tick()
                self.assign(s.target, item, scope)
                try:
                    self.block(s.body, scope)
                except _Continue:
                    continue
                except _Break:
                    break
            else:
                self.block(s.orelse, scope)
        elif isinstance(s, ast.If):
            self.block(s.body if self.truth(self.ev(s.test, scope)) else s.orelse, scope)
        elif isinstance(s, (ast.Break, ast.Continue)):  # only inside a loop: Python's parser sees to it
            raise _Break if isinstance(s, ast.Break) else _Continue
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            self.imports(s, scope)
        elif not isinstance(s, ast.Pass):
            raise Failed(f"a {type(s).__name__} statement is not judged by the host")

    def block(self, body: list[ast.stmt], scope: dict[str, Any]) -> None:
        for s in body:
            self.run(s, scope)

    def imports(self, s: ast.Import | ast.ImportFrom, scope: dict[str, Any]) -> None:
        for alias in s.names:
            module = s.module if isinstance(s, ast.ImportFrom) else alias.name
            if module not in HOST_MODULES or getattr(s, "level", 0):
                raise Failed(f"import {module}: not one of the host's modules")
            if isinstance(s, ast.ImportFrom):
                scope[alias.asname or alias.name] = self.attribute(HOST_MODULES[module], alias.name)
            else:
                scope[alias.asname or alias.name] = HOST_MODULES[module]

    def assign(self, target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in target.elts):
            values = self.items(value)
            if len(values) != len(target.elts):
                raise Failed("unpacking: wrong number of values")
            for t, v in zip(target.elts, values, strict=True):
                self.assign(t, v, scope)
        elif isinstance(target, ast.Attribute):
            obj = self.ev(target.value, scope)
            if type(obj) is not Remote:
                raise Failed("the host sets attributes of the code's objects only")
            self.remote(f"__a0.{target.attr} = __a1", obj, value, mode="exec")
        elif isinstance(target, ast.Subscript):
            obj, key = self.ev(target.value, scope), self.ev(target.slice, scope)
            if type(obj) is Remote:
                self.remote("__a0[__a1] = __a2", obj, key, value, mode="exec")
            elif type(obj) in (list, dict):
                obj[key] = value
            else:
                raise Failed(f"item assignment to a {type(obj).__name__}")
        else:
            raise Failed(f"assignment to a {type(target).__name__}")

    # -- expressions ------------------------------------------------------------------------------
    def ev(self, n: ast.expr, scope: dict[str, Any]) -> Any:  # noqa: C901 (one branch per node type)
        self.tick()
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            if n.id in scope:
                return scope[n.id]
            if n.id in self.globals:
                return self.globals[n.id]
            if n.id in SAFE_BUILTINS:
                return SAFE_BUILTINS[n.id]
            return self.remote(n.id)  # a name of the code's
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            out: list[Any] = []
            for e in n.elts:
                out.extend(self.items(self.ev(e.value, scope))) if isinstance(e, ast.Starred) else out.append(
                    self.ev(e, scope)
                )
            return self.bounded({ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(n)](out))
        if isinstance(n, ast.Dict):
            d: dict[Any, Any] = {}
            for k, v in zip(n.keys, n.values, strict=True):
                d.update(self.ev(v, scope)) if k is None else d.__setitem__(self.ev(k, scope), self.ev(v, scope))
            return d
        if isinstance(n, ast.BoolOp):
            value = None
            for operand in n.values:
                value = self.ev(operand, scope)
                if self.truth(value) != isinstance(n.op, ast.And):
                    return value
            return value
        if isinstance(n, ast.UnaryOp):
            v = self.ev(n.operand, scope)
            if isinstance(n.op, ast.Not):
                return not self.truth(v)
            if type(v) is Remote:
                return self.remote(f"{UNARY[type(n.op)]}__a0", v)
            return {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}[type(n.op)](v)
        if isinstance(n, ast.BinOp):
            return self.operate(type(n.op), self.ev(n.left, scope), self.ev(n.right, scope))
        if isinstance(n, ast.Compare):
            left = self.ev(n.left, scope)
            for op, node in zip(n.ops, n.comparators, strict=True):
                right = self.ev(node, scope)
                if not COMPARE[type(op)](left, right):  # a Remote operand refuses (Failed)
                    return False
                left = right
            return True
        if isinstance(n, ast.IfExp):
            return self.ev(n.body if self.truth(self.ev(n.test, scope)) else n.orelse, scope)
        if isinstance(n, ast.Call):
            return self.call(n, scope)
        if isinstance(n, ast.Attribute):
            v = self.ev(n.value, scope)
            return self.remote(f"__a0.{n.attr}", v) if type(v) is Remote else self.attribute(v, n.attr)
        if isinstance(n, ast.Subscript):
            v, k = self.ev(n.value, scope), self.ev(n.slice, scope)
            if type(v) is Remote:  # the code's __getitem__
                return self.remote("__a0[__a1]", v, k)
            return self.bounded(v[k])  # a key of the code's in the test's container: Remote refuses to hash
        if isinstance(n, ast.Slice):
            return slice(*(None if p is None else self.ev(p, scope) for p in (n.lower, n.upper, n.step)))
        if isinstance(n, ast.Lambda):
            return HostLambda(self, n, dict(scope))
        if isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            return self.comprehension(n, scope)
        if isinstance(n, ast.JoinedStr):
            return "".join(self.ev(v, scope) for v in n.values)
        if isinstance(n, ast.FormattedValue):
            v = self.ev(n.value, scope)
            spec = "" if n.format_spec is None else self.ev(n.format_spec, scope)
            conv = {-1: "", 115: "str", 114: "repr", 97: "ascii"}[n.conversion]
            if type(v) is Remote:
                return self.remote(f"format({conv}(__a0), __a1)" if conv else "format(__a0, __a1)", v, spec)
            return self.bounded(
                format({"": lambda x: x, "str": str, "repr": repr, "ascii": ascii}[conv](v), check_spec(spec))
            )
        if isinstance(n, ast.NamedExpr):
            scope[n.target.id] = self.ev(n.value, scope)
            return scope[n.target.id]
        raise Failed(f"a {type(n).__name__} expression is not judged by the host")

    def operate(self, op: type, a: Any, b: Any) -> Any:
        if Remote in (type(a), type(b)):  # the code's __add__ / __radd__ decide
            return self.remote(f"__a0 {ast.unparse(ast.BinOp(ast.Name('x'), op(), ast.Name('y')))[2:-2]} __a1", a, b)
        return self.bounded(checked_binop(op, a, b))

    def attribute(self, v: Any, name: str) -> Any:
        if name.startswith("_"):
            raise Failed(f"attribute {name}: private attributes are not judged by the host")
        if any(v is m for m in HOST_MODULES.values()):
            if v is math and name in BIG_MATH:
                fn = getattr(math, name)
                return lambda *a: fn(*(small(x) for x in a))
            return getattr(v, name)
        if type(v) in PLAIN and name in METHODS:
            method = getattr(v, name)
            if name in ("join", "replace"):  # the result's size is known before it is built
                return lambda *a: self.bounded(method(*grown_args(v, name, a)))
            return lambda *a, **k: self.bounded(method(*(small(x) for x in a), **k))
        raise Failed(f"attribute {name} of a {type(v).__name__} is not judged by the host")

    def call(self, n: ast.Call, scope: dict[str, Any]) -> Any:
        if isinstance(n.func, ast.Name) and n.func.id not in scope and n.func.id not in self.globals:
            fn = SAFE_BUILTINS.get(n.func.id)  # None: a function of the code's, called in the jail by name
        else:
            fn = self.ev(n.func, scope)
        args: list[Any] = []
        for a in n.args:
            args.extend(self.items(self.ev(a.value, scope))) if isinstance(a, ast.Starred) else args.append(
                self.ev(a, scope)
            )
        kwargs: dict[str, Any] = {}
        for k in n.keywords:
            kwargs.update(self.ev(k.value, scope)) if k.arg is None else kwargs.__setitem__(
                k.arg, self.ev(k.value, scope)
            )
        if fn is None:
            return self.remote(f"{n.func.id}(*__a0, **__a1)", args, kwargs)
        if type(fn) is Remote:
            return self.remote("__a0(*__a1, **__a2)", fn, args, kwargs)
        if len(args) == 1 and not kwargs and type(args[0]) is Remote and sendable(fn):
            return self.remote("__a0(__a1)", fn, args[0])  # len(obj), str(obj): the object's own dunder decides
        if has_remote(args) or has_remote(kwargs):  # max(obj, 5): the test's values meet the code's __lt__
            raise Failed("a builtin of the host given an object of the code's beside other values")
        if not callable(fn):
            raise Failed(f"a {type(fn).__name__} is not callable")
        return self.bounded(fn(*(small(a) for a in args) if fn in (bytes, range) else args, **kwargs))

    def comprehension(self, n: ast.expr, scope: dict[str, Any]) -> Any:
        inner = dict(scope)
        results: list[Any] = []

        def loop(i: int) -> None:
            if i == len(n.generators):
                if isinstance(n, ast.DictComp):
                    results.append((self.ev(n.key, inner), self.ev(n.value, inner)))
                else:
                    results.append(self.ev(n.elt, inner))
                return
            gen = n.generators[i]
            for item in self.items(self.ev(gen.iter, inner)):
                self.tick()
                self.assign(gen.target, item, inner)
                if all(self.truth(self.ev(c, inner)) for c in gen.ifs):
                    loop(i + 1)

        loop(0)
        kind = {ast.ListComp: list, ast.SetComp: set, ast.GeneratorExp: list, ast.DictComp: dict}[type(n)]
        return self.bounded(kind(results))
