"""The trusted half of a Python assert test: this file's text runs in the sandbox as ``/sandbox/harness.py``
(by the system ``python3 -I``, standard library only) and runs the program, then its tests, in-process.

It is given two descriptors (never files, arguments or environment). It reads the first, which holds the
nonce, the setup and the test code, and closes it *before any of the program's code runs*: the program's
files (``/sandbox/main.py``) hold only its own code, so the tests and the nonce are on no path it can open.
It then runs the program as ``__main__``, then the setup and the tests, whose comparisons and asserts are
rewritten to pass each value through a check first (a value of a class the program defined that overrides
a comparison or truth method is interference: an ``__eq__`` that is always true). Only once the tests have
returned does it check for tampering (builtins or library functions replaced by the program's, a trace
hook, its check replaced) and write its record, the nonce on a line and then one line per interference
found, to the second descriptor, then leave with ``os._exit(0)`` (no atexit handler or finaliser of the program runs
after it). An exception, ``SystemExit`` included, ends it with a traceback on stderr and exit status 1 and
no record; an exit of any other kind (``os._exit``, a signal) leaves no record either. The judge counts a
pass only with exactly that record, carrying the nonce it sent, and exit status 0.

What an in-process harness cannot rule out (docs/how-to/code-tasks.md says it for the reader): the program
runs in this process, so code that goes looking for the harness (``gc``, frames, ``ctypes``) can find the
nonce and the report descriptor and forge the record. Such a program is no longer gaming the tests but
attacking the judge, and nothing in one process can stop it; the checks here catch what a policy stumbles
on, not a determined exploit.
"""

import ast
import builtins
import json
import os
import sys
import traceback
import types

# Bound here, before the program runs: it may replace builtins, and the harness must not call its versions.
from builtins import (  # noqa: A004
    BaseException,
    SystemExit,
    any,
    dict,
    exec,
    getattr,
    id,
    isinstance,
    list,
    open,
    print,
    set,
    type,
    vars,
)

#: The name the rewritten tests call their value check by.
CHECK = "__evald_check__"
#: Methods whose override by the program's own class makes a comparison or an assert meaningless.
COMPARING = (
    "__eq__",
    "__ne__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__bool__",
    "__len__",
    "__contains__",
)
_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_MODULES = sys.modules
#: Values looked at per check, at most: a check of a huge structure stops there.
_MAX_VALUES = 1_000_000


class _Checked(ast.NodeTransformer):
    """Wraps each comparison operand, assert condition, ``not`` operand and ``and``/``or`` operand in a
    call of the check (which returns the value unchanged: the test's meaning and order stay the same)."""

    def _wrap(self, node: ast.expr) -> ast.expr:
        call = ast.Call(func=ast.Name(id=CHECK, ctx=ast.Load()), args=[node], keywords=[])
        return ast.copy_location(call, node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        node.left = self._wrap(node.left)
        node.comparators = [self._wrap(value) for value in node.comparators]
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        node.test = self._wrap(node.test)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self._wrap(node.operand)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        node.values = [self._wrap(value) for value in node.values]
        return node


def checked_tests(source: str) -> types.CodeType:
    tree = _Checked().visit(ast.parse(source, "<tests>"))
    return compile(ast.fix_missing_locations(tree), "<tests>", "exec")


def overriding(kind: type, program: str) -> str | None:
    """The comparison or truth method that ``kind`` (or a class above it) takes from the program's code,
    if any: a method of a class defined in ``__main__`` that is not the tests' own."""
    for klass in kind.__mro__:
        if klass is object:
            continue
        for name in COMPARING:
            method = klass.__dict__.get(name)
            if method is None:
                continue
            code = getattr(method, "__code__", None)
            filename = getattr(code, "co_filename", None)
            ours = filename in ("<tests>", "<setup>")
            if filename == program or (klass.__module__ == "__main__" and not ours):
                return f"{klass.__qualname__}.{name}"
    return None


def value_check(program: str, found: list[str]):  # noqa: ANN201 (the harness has no typing import)
    def check(value):  # noqa: ANN001, ANN202
        stack = [value]
        seen = set()
        looked = 0
        while stack and looked < _MAX_VALUES:
            item = stack.pop()
            looked += 1
            kind = type(item)
            if kind in _PLAIN:
                continue
            if id(item) in seen:
                continue
            seen.add(id(item))
            if kind not in (list, tuple, dict, set, frozenset):
                method = overriding(kind, program)
                if method is not None and method not in found:
                    found.append(method)
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, (list, tuple, set, frozenset)):
                stack.extend(item)
        return value

    return check


def replaced(before: dict, program: str, namespace: dict, check, hooks) -> list[str]:  # noqa: ANN001
    """What the program changed that the tests rely on: builtins, library functions swapped for its own,
    trace hooks, the check. ``hooks`` are ``sys.gettrace`` and ``sys.getprofile`` as they were."""
    found = []
    now = vars(builtins)
    for name, value in before.items():
        if now.get(name) is not value:
            found.append(f"builtins.{name} replaced")
    for module_name, module in list(_MODULES.items()):
        if module_name == "__main__" or not isinstance(module, types.ModuleType):
            continue
        for name, value in list(vars(module).items()):
            code = getattr(value, "__code__", None)
            if getattr(code, "co_filename", None) == program:
                found.append(f"{module_name}.{name} replaced by the program's {name}")
    if any(hook() is not None for hook in hooks):
        found.append("a trace or profile hook left set")
    if namespace.get(CHECK) is not check:
        found.append("the harness's value check replaced")
    return found


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 (the program may have replaced the stream with anything)
            pass


def main() -> None:
    channel_in, channel_out, program = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    write, leave = os.write, os._exit
    chunks = []
    while chunk := os.read(channel_in, 1 << 16):
        chunks.append(chunk)
    os.close(channel_in)
    job = json.loads(b"".join(chunks))
    nonce = job.pop("nonce")
    before = dict(vars(builtins))
    hooks = (sys.gettrace, sys.getprofile)
    module = types.ModuleType("__main__")
    module.__file__ = program
    module.__builtins__ = builtins
    namespace = module.__dict__
    found: list[str] = []
    check = value_check(program, found)
    sys.modules["__main__"] = module
    sys.argv = [program]
    try:
        # Everything compiled before the program runs: it cannot reach into ast or compile the tests away.
        with open(program, encoding="utf-8") as file:
            code = compile(file.read(), program, "exec")
        setup = compile(job["setup"], "<setup>", "exec")
        tests = checked_tests(job["test"])
        exec(code, namespace)  # noqa: S102 (this is what the sandbox is for)
        exec(setup, namespace)  # noqa: S102
        namespace[CHECK] = check
        exec(tests, namespace)  # noqa: S102
    except SystemExit as exc:
        _flush()
        print(f"SystemExit: {exc.code!r} (the program exited before its tests returned)", file=sys.__stderr__)
        _flush()
        leave(1)
    except BaseException:  # noqa: BLE001 (every failure is the verdict's business)
        _flush()
        traceback.print_exc(file=sys.__stderr__)
        _flush()
        leave(1)
    interfered = found + replaced(before, program, namespace, check, hooks)
    _flush()
    # Built by str's own methods (a program may have patched json): the nonce, then one line per finding.
    lines = [nonce, *(line.replace("\n", " ") for line in interfered)]
    write(channel_out, "\n".join(lines).encode("utf-8", "replace") + b"\n")
    leave(0)


if __name__ == "__main__":
    main()
