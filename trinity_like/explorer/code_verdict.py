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
whole where the code could decide its verdict. The host's own work per call is bounded
(:data:`STEPS` evaluation steps, :data:`SIZE` items or bits a value may grow to) so a value
of the code's cannot make a test line exhaust the explorer. Example::

    judge = Judge(ask)   # ask(query: dict) -> the jail's reply line (bytes)
    judge.line("assert add(2, 3) == 5")   # True, False, or Rejected / Gone raised
"""

from __future__ import annotations

import ast
import builtins
import collections
import fractions
import importlib
import json
import math
import operator
import re
import string
from collections.abc import Callable
from typing import Any

STEPS = 200_000  # evaluation steps (nodes, loop turns) the host spends on one call's test lines
SIZE = 1_000_000  # most items of a sequence (and bits of an int) the host builds from a test line
HOST_MODULES = {"math": math, "string": string, "collections": collections, "fractions": fractions}
_SAFE = (
    "abs all any bin bool bytes chr complex dict divmod enumerate filter float frozenset hex int "
    "isinstance len list map max min oct ord range repr reversed round set sorted str sum tuple type zip"
)
SAFE_BUILTINS = {name: getattr(builtins, name) for name in _SAFE.split()}
_BIG_MATH = {"factorial", "comb", "perm", "prod", "pow", "ldexp"}  # an argument of the code's could make them huge
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.BitAnd: operator.and_,
    ast.MatMult: operator.matmul,
}
_CMPOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_PLAIN = (int, float, complex, str, bytes, list, tuple, dict, set, frozenset, bool, type(None), range)
# methods of plain values the host calls: none that builds a value much larger than its inputs
# but join and replace, whose result size is checked before they run
_METHOD_NAMES = (
    "capitalize casefold center count decode encode endswith find hex index isalnum isalpha isascii isdecimal "
    "isdigit isidentifier islower isnumeric isprintable isspace istitle isupper join ljust lower lstrip partition "
    "removeprefix removesuffix replace rfind rindex rjust rpartition rsplit rstrip split splitlines startswith "
    "strip swapcase title upper zfill real imag conjugate bit_length is_integer keys values items get "
    "union intersection difference symmetric_difference issubset issuperset isdisjoint start stop step"
)
_METHODS = frozenset(_METHOD_NAMES.split())
_UNARY = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}


class Failed(Exception):
    """The line fails: an assertion is false, it raised, or the host will not judge it (the reason)."""


class Gone(Exception):
    """The jailed process is no more (died, wall time, too much output): the call scores 0."""


class Rejected(Exception):
    """The jail's reply breaks the protocol: ``key`` is counted, the message logged once; the call scores 0."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(detail)
        self.key = key


class Remote:
    """An object of the code's, left in the jail; the host never compares, hashes or tests it itself."""

    __slots__ = ("handle",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def _refuse(self, *_: Any) -> Any:
        raise Failed("a comparison with an object of the code's (not plain data)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __bool__ = __len__ = __iter__ = _refuse


class HostLambda:
    """A ``lambda`` of the test line: called here, by the evaluator; sent to the jail as its source."""

    def __init__(self, judge: Judge, node: ast.Lambda, scope: dict[str, Any]) -> None:
        self.judge, self.node, self.scope = judge, node, scope

    def __call__(self, *args: Any) -> Any:
        names = [a.arg for a in self.node.args.args]
        if len(args) != len(names) or self.node.args.vararg or self.node.args.kwonlyargs:
            raise Failed("a lambda called with other arguments than its plain ones")
        return self.judge.ev(self.node.body, {**self.scope, **dict(zip(names, args, strict=True))})


def decode(x: Any) -> Any:
    """A value from the jail's JSON: plain data, handles for objects; :class:`Rejected` for anything else."""
    if x is None or type(x) in (bool, int, str):
        return x
    if type(x) is not dict or len(x) != 1:
        raise Rejected("bad value", f"{x!r:.40} is not an encoded value")
    ((tag, v),) = x.items()
    try:
        if tag == "handle" and type(v) is int and v >= 0:
            return Remote(v)
        if tag in ("int", "float", "bytes") and type(v) is str:
            return int(v, 16) if tag == "int" else float(v) if tag == "float" else bytes.fromhex(v)
        if tag == "complex" and type(v) is list and len(v) == 2 and all(type(p) is str for p in v):
            return complex(float(v[0]), float(v[1]))
        if tag in ("list", "tuple", "set", "frozenset") and type(v) is list:
            items = [decode(i) for i in v]
            return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
        if tag == "dict" and type(v) is list and all(type(p) is list and len(p) == 2 for p in v):
            return {decode(k): decode(i) for k, i in v}
    except (ValueError, TypeError, OverflowError) as exc:  # a set of handles, a float of "x"
        raise Rejected("bad value", f"{tag}: {exc}") from None
    raise Rejected("bad value", f"{tag!r:.20} with {v!r:.40}")


def encode(v: Any) -> Any:
    """A host value as the jail's JSON (objects of the code's by handle); :class:`Failed` if it cannot travel."""
    t = type(v)
    if v is None or t in (bool, str) or (t is int and abs(v) < 2**63):
        return v
    simple = {int: lambda: hex(v), float: lambda: repr(v), bytes: lambda: v.hex()}
    if t in simple:
        return {t.__name__: simple[t]()}
    if t is complex:
        return {"complex": [repr(v.real), repr(v.imag)]}
    if t in (list, tuple, set, frozenset):
        return {t.__name__: [encode(i) for i in v]}
    if t is dict:
        return {"dict": [[encode(k), encode(i)] for k, i in v.items()]}
    if t is range:
        return {"range": [v.start, v.stop, v.step]}
    if t is Remote:
        return {"handle": v.handle}
    if t is HostLambda:
        return {"lambda": ast.unparse(v.node), "bind": {k: encode(i) for k, i in v.scope.items() if _sendable(i)}}
    for name, module in HOST_MODULES.items():
        if v is module:
            return {"module": name}
    for name, fn in SAFE_BUILTINS.items():
        if v is fn:
            return {"builtin": name}
    raise Failed(f"a {t.__name__} of the test cannot be sent to the jail")


def _sendable(v: Any) -> bool:
    try:
        encode(v)
    except Failed:
        return False
    return True


def _has_remote(v: Any, depth: int = 0) -> bool:
    if type(v) is Remote:
        return True
    if depth < 50 and type(v) in (list, tuple, set, frozenset):
        return any(_has_remote(i, depth + 1) for i in v)
    if depth < 50 and type(v) is dict:
        return any(_has_remote(i, depth + 1) for i in v.values())
    return False


def _bounded(v: Any) -> Any:
    """``v`` if it is small enough for the host to keep working on, else :class:`Failed`."""
    if (type(v) is int and v.bit_length() > SIZE) or (
        hasattr(v, "__len__") and not isinstance(v, Remote) and len(v) > SIZE
    ):
        raise Failed("a value past the host's size bound")
    return v


def _binop(op: type, a: Any, b: Any) -> Any:
    """A binary operator on plain values, refused where its result could be huge before it is built."""
    ints = type(a) in (int, bool) and type(b) in (int, bool)
    if op is ast.Pow and ints and b > 0 and abs(a) > 1 and a.bit_length() * b > SIZE:
        raise Failed("a power past the host's size bound")
    if op is ast.LShift and ints and b > SIZE:
        raise Failed("a shift past the host's size bound")
    if op is ast.Mod and type(a) in (str, bytes):
        _spec(a)
    if op is ast.Mult:
        for seq, n in ((a, b), (b, a)):
            if type(n) in (int, bool) and hasattr(seq, "__len__") and len(seq) * n > SIZE:
                raise Failed("a repetition past the host's size bound")
    return _bounded(_BINOPS[op](a, b))


class Judge:
    """Runs test lines here; asks the jail, through ``ask``, only for what the code's objects do."""

    def __init__(self, ask: Callable[[dict[str, Any]], bytes]) -> None:
        self.ask = ask
        self.globals: dict[str, Any] = {}  # what the test lines assigned (plain data or handles)
        self.steps = 0

    def line(self, src: str) -> bool:
        """Whether the test line ``src`` passes; :class:`Gone` / :class:`Rejected` end the call."""
        try:
            body = ast.parse(src).body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return False
        try:
            for stmt in body:
                self.run(stmt, self.globals)
        except (Failed, ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError):
            return False
        return True

    # -- the jail ---------------------------------------------------------------------------------
    def remote(self, src: str, *args: Any, mode: str = "eval", names: tuple[str, ...] = ()) -> Any:
        """The value of ``src`` in the jail, ``__a0``.. bound to ``args`` and ``names`` to the test's globals."""
        bind = {f"__a{i}": encode(a) for i, a in enumerate(args)}
        bind.update({n: encode(self.globals[n]) for n in names if n in self.globals})
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
            return list(_bounded(v))
        if type(v) in (map, filter, zip, enumerate, reversed):
            out = []
            for i in v:
                self.tick()
                out.append(i)
            return out
        raise Failed(f"the host does not iterate a {type(v).__name__}")

    def tick(self) -> None:
        self.steps += 1
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
                if self.block(s.body, scope) == "break":
                    break
            else:
                self.block(s.orelse, scope)
        elif isinstance(s, ast.If):
            self.block(s.body if self.truth(self.ev(s.test, scope)) else s.orelse, scope)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            self.imports(s, scope)
        elif not isinstance(s, ast.Pass):
            raise Failed(f"a {type(s).__name__} statement is not judged by the host")

    def block(self, body: list[ast.stmt], scope: dict[str, Any]) -> str | None:
        for s in body:
            if isinstance(s, (ast.Break, ast.Continue)):
                return "break" if isinstance(s, ast.Break) else "continue"
            self.run(s, scope)
        return None

    def imports(self, s: ast.Import | ast.ImportFrom, scope: dict[str, Any]) -> None:
        for alias in s.names:
            module = s.module if isinstance(s, ast.ImportFrom) else alias.name
            if module not in HOST_MODULES or s.level if isinstance(s, ast.ImportFrom) else module not in HOST_MODULES:
                raise Failed(f"import {module}: not one of the host's modules")
            if isinstance(s, ast.ImportFrom):
                scope[alias.asname or alias.name] = self.attribute(HOST_MODULES[module], alias.name)
            else:
                scope[alias.asname or alias.name] = importlib.import_module(module)

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
            return _bounded({ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(n)](out))
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
                return self.remote(f"{_UNARY[type(n.op)]}__a0", v)
            return {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}[type(n.op)](v)
        if isinstance(n, ast.BinOp):
            return self.operate(type(n.op), self.ev(n.left, scope), self.ev(n.right, scope))
        if isinstance(n, ast.Compare):
            left = self.ev(n.left, scope)
            for op, node in zip(n.ops, n.comparators, strict=True):
                right = self.ev(node, scope)
                if not _CMPOPS[type(op)](left, right):  # a Remote operand refuses (Failed)
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
            return _bounded(v[k])  # a key of the code's in the test's container: Remote refuses to hash
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
            return _bounded(format({"": lambda x: x, "str": str, "repr": repr, "ascii": ascii}[conv](v), _spec(spec)))
        if isinstance(n, ast.NamedExpr):
            scope[n.target.id] = self.ev(n.value, scope)
            return scope[n.target.id]
        raise Failed(f"a {type(n).__name__} expression is not judged by the host")

    def operate(self, op: type, a: Any, b: Any) -> Any:
        if Remote in (type(a), type(b)):  # the code's __add__ / __radd__ decide
            return self.remote(f"__a0 {ast.unparse(ast.BinOp(ast.Name('x'), op(), ast.Name('y')))[2:-2]} __a1", a, b)
        return _binop(op, a, b)

    def attribute(self, v: Any, name: str) -> Any:
        if name.startswith("_"):
            raise Failed(f"attribute {name}: private attributes are not judged by the host")
        if any(v is m for m in HOST_MODULES.values()):
            if v is math and name in _BIG_MATH:
                fn = getattr(math, name)
                return lambda *a: fn(*(_small(x) for x in a))
            return getattr(v, name)
        if type(v) in _PLAIN and name in _METHODS:
            method = getattr(v, name)
            if name in ("join", "replace"):  # the result's size is known before it is built
                return lambda *a: _bounded(method(*_grown(v, name, a)))
            return lambda *a, **k: _bounded(method(*(_small(x) for x in a), **k))
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
        if len(args) == 1 and not kwargs and type(args[0]) is Remote and _sendable(fn):
            return self.remote("__a0(__a1)", fn, args[0])  # len(obj), str(obj): the object's own dunder decides
        if _has_remote(args) or _has_remote(kwargs):  # max(obj, 5): the test's values meet the code's __lt__
            raise Failed("a builtin of the host given an object of the code's beside other values")
        if not callable(fn):
            raise Failed(f"a {type(fn).__name__} is not callable")
        return _bounded(fn(*(_small(a) for a in args) if fn in (bytes, range) else args, **kwargs))

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
        return _bounded(kind(results))


def _small(x: Any) -> Any:
    if type(x) is int and abs(x) > SIZE:
        raise Failed("an argument past the host's size bound")
    return x


def _spec(text: Any) -> Any:
    """A format spec or %-template, refused where it names a width past the size bound."""
    if isinstance(text, (str, bytes)) and re.search(rb"\d{7,}", text if type(text) is bytes else text.encode()):
        raise Failed("a format width past the host's size bound")
    return text


def _grown(v: Any, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` of ``v.join`` / ``v.replace`` once their result is known to stay within the size bound."""
    if name == "join" and len(args) == 1 and isinstance(args[0], (list, tuple)):
        grown = len(v) * len(args[0]) + sum(len(p) for p in args[0] if isinstance(p, (str, bytes)))
    elif name == "replace" and len(args) in (2, 3) and all(isinstance(a, type(v)) for a in args[:2]):
        grown = len(v) + (v.count(args[0]) + 1) * len(args[1])
    else:
        raise Failed(f"{name} with other arguments than plain strings")
    if grown > SIZE:
        raise Failed(f"{name} past the host's size bound")
    return args
