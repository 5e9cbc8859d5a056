"""The tool subprocess: `python -I -m grpo_trainer.tools._jail`, one JSON request on stdin.

It limits itself first (address space, CPU time, no core files, a network namespace of its own
when `network` is false and the kernel lets it), then runs the request:
  {"kind": "python", "source": ...}                 the source as __main__; stdout/stderr are the output
  {"kind": "call", "module_path", "function", "arguments"}  a function of a file by path, its return value printed
  {"kind": "probe"}                                  prints which limits took effect, as JSON
Exit status 0 is success; an exception prints its last line and exits 1."""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import sys
import traceback


def _limit(limits: dict) -> dict[str, bool]:
    took = {"memory": False, "cpu": False, "network": False}
    memory = int(limits["memory_mb"]) * 1024 * 1024
    # Default: a backstop one second past the wall-clock timeout, so that a busy loop is always
    # reported as the timeout it is (equal limits raced: SIGXCPU could land first).
    cpu = limits["cpu_s"] or int(-(-float(limits["timeout_s"]) // 1)) + 1
    try:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        took["memory"] = True
    except (ValueError, OSError):
        pass
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        took["cpu"] = True
    except (ValueError, OSError):
        pass
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not limits["network"]:
        for flags in (os.CLONE_NEWNET, os.CLONE_NEWUSER | os.CLONE_NEWNET):
            try:
                os.unshare(flags)
                took["network"] = True
                break
            except OSError:
                continue
    return took


def _call(request: dict) -> None:
    spec = importlib.util.spec_from_file_location("grpo_tool_module", request["module_path"])
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {request['module_path']}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    value = getattr(module, request["function"])(**request["arguments"])
    print(value if isinstance(value, str) else json.dumps(value, default=str))


def main() -> int:
    request = json.loads(sys.stdin.read())
    took = _limit(request["limits"])
    sys.stdin = open(os.devnull)  # noqa: SIM115 - the tool reads no input
    try:
        if request["kind"] == "probe":
            print(json.dumps(took))
        elif request["kind"] == "python":
            code = compile(request["source"], "<tool>", "exec")
            exec(code, {"__name__": "__main__"})
        elif request["kind"] == "call":
            _call(request)
        else:
            raise ValueError(f"unknown request kind {request['kind']!r}")
    except MemoryError:
        print("MemoryError: the tool's memory limit was reached", file=sys.stderr)
        return 1
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        lines = traceback.format_exception_only(type(exc), exc)
        print(lines[-1].rstrip(), file=sys.stderr)
        return 1
    finally:
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
