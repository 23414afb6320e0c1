"""Values between the host and the ``code_exec`` jail, and the bounds on what the host builds from them.

Used by :mod:`trinity_like.explorer.code_verdict`. The jail answers with plain data only:
exact ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bool``, ``None`` and lists,
tuples, sets, frozensets and dicts of them, as JSON (tagged where JSON has no such type:
``{"float": "inf"}``, ``{"tuple": [1, 2]}``), or ``{"handle": n}`` for an object it keeps.
:func:`decode` accepts nothing else (:class:`Rejected`); a handle becomes a :class:`Remote`,
which refuses to be compared, hashed, tested or iterated here. :func:`encode` is the other
way, for the test's own values. The bounds (:data:`SIZE`; a power, a repetition, a shift, a
format width, ``join`` / ``replace`` checked before they run) keep a value of the code's from
making the host build something huge. Example::

    assert decode({"tuple": [1, {"float": "inf"}]}) == (1, float("inf"))
    assert encode({1: b"x"}) == {"dict": [[1, {"bytes": "78"}]]}
"""

from __future__ import annotations

import ast
import builtins
import collections
import fractions
import math
import operator
import re
import string
from collections.abc import Callable
from typing import Any

SIZE = 1_000_000  # most items (aliases counted again; ints by 64-bit word) of one value the host builds
WORK = 20 * SIZE  # most items of all the values the host builds for one call's test lines
HOST_MODULES = {"math": math, "string": string, "collections": collections, "fractions": fractions}
_SAFE = (
    "abs all any bin bool bytes chr complex dict divmod enumerate filter float frozenset hex int "
    "isinstance len list map max min oct ord range repr reversed round set sorted str sum tuple type zip"
)
SAFE_BUILTINS = {name: getattr(builtins, name) for name in _SAFE.split()}
BIG_MATH = {"factorial", "comb", "perm", "prod", "pow", "ldexp"}  # an argument of the code's could make them huge
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
COMPARE: dict[type, Callable[[Any, Any], Any]] = {
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
PLAIN = (int, float, complex, str, bytes, list, tuple, dict, set, frozenset, bool, type(None), range)
# methods of plain values the host calls: none that builds a value much larger than its inputs
# but join and replace, whose result size is checked before they run
_METHOD_NAMES = (
    "capitalize casefold center count decode encode endswith find hex index isalnum isalpha isascii isdecimal "
    "isdigit isidentifier islower isnumeric isprintable isspace istitle isupper join ljust lower lstrip partition "
    "removeprefix removesuffix replace rfind rindex rjust rpartition rsplit rstrip split splitlines startswith "
    "strip swapcase title upper zfill real imag conjugate bit_length is_integer keys values items get "
    "union intersection difference symmetric_difference issubset issuperset isdisjoint start stop step"
)
METHODS = frozenset(_METHOD_NAMES.split())
UNARY = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}


class Failed(Exception):
    """The line fails: an assertion is false, it raised, or the host will not judge it (the reason)."""


class OutOfTime(Exception):
    """The call's wall time passed while the host was judging: the call scores 0, as a jail past it does."""


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

    def __init__(self, judge: Any, node: ast.Lambda, scope: dict[str, Any]) -> None:
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
        return {"lambda": ast.unparse(v.node), "bind": {k: encode(i) for k, i in v.scope.items() if sendable(i)}}
    for name, module in HOST_MODULES.items():
        if v is module:
            return {"module": name}
    for name, fn in SAFE_BUILTINS.items():
        if v is fn:
            return {"builtin": name}
    raise Failed(f"a {t.__name__} of the test cannot be sent to the jail")


def sendable(v: Any) -> bool:
    try:
        encode(v)
    except Failed:
        return False
    return True


def has_remote(v: Any, depth: int = 0) -> bool:
    if type(v) is Remote:
        return True
    if depth < 50 and type(v) in (list, tuple, set, frozenset):
        return any(has_remote(i, depth + 1) for i in v)
    if depth < 50 and type(v) is dict:
        return any(has_remote(i, depth + 1) for i in v.values())
    return False


def weigh(v: Any, limit: int = SIZE) -> int:
    """The items (and 64-bit words of ints) in ``v``, each alias counted again; stops once past ``limit``.

    Counting aliases is what bounds the host's memory: ``[big] * n`` costs n pointers, but
    ``list(map(list, [big] * n))`` would copy ``big`` n times.
    """
    total, stack = 0, [v]
    while stack and total <= limit:
        x = stack.pop()
        t = type(x)
        if t in (list, tuple, set, frozenset, dict):
            total += len(x) + 1
            if total <= limit:
                stack.extend(x.values() if t is dict else x)
                stack.extend(x.keys() if t is dict else ())
        elif t in (str, bytes, range):
            total += len(x) + 1
        else:
            total += x.bit_length() // 64 + 1 if t is int else 1
    return total


def checked_binop(op: type, a: Any, b: Any) -> Any:
    """A binary operator on plain values, refused where its result could be huge before it is built."""
    ints = type(a) in (int, bool) and type(b) in (int, bool)
    if op is ast.Pow and ints and b > 0 and abs(a) > 1 and a.bit_length() * b > SIZE:
        raise Failed("a power past the host's size bound")
    if op is ast.LShift and ints and b > SIZE:
        raise Failed("a shift past the host's size bound")
    if op is ast.Mod and type(a) in (str, bytes):
        check_spec(a)
    if op is ast.Mult:
        for seq, n in ((a, b), (b, a)):
            if type(n) in (int, bool) and type(seq) in (str, bytes, list, tuple) and weigh(seq) * n > SIZE:
                raise Failed("a repetition past the host's size bound")
    return _BINOPS[op](a, b)


def small(x: Any) -> Any:
    if type(x) is int and abs(x) > SIZE:
        raise Failed("an argument past the host's size bound")
    return x


def check_spec(text: Any) -> Any:
    """A format spec or %-template, refused where it names a width past the size bound."""
    if isinstance(text, (str, bytes)) and re.search(rb"\d{7,}", text if type(text) is bytes else text.encode()):
        raise Failed("a format width past the host's size bound")
    return text


def grown_args(v: Any, name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
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
