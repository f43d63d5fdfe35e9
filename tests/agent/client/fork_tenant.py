"""A tenant that forks while it holds a turn, as a DataLoader with fork workers does.

    python tests/agent/client/fork_tenant.py NAME

The child tries the parent's client (acquire, yield_), prints what each raised, and exits the
ordinary way, so the interpreter's exit closes its copy of the client; the parent then ends
its turn and prints "parent yielded", or what its yield raised.
"""

from __future__ import annotations

import os
import sys

from agent.client import Baton


def child(baton: Baton) -> int:
    for name, call in (("acquire", lambda: baton.acquire(timeout=5)), ("yield", baton.yield_)):
        try:
            call()
            print(f"child {name} returned", flush=True)
        except Exception as exc:
            print(f"child {name} raised {type(exc).__name__}: {exc}", flush=True)
    return 0


def main() -> int:
    baton = Baton(name=sys.argv[1], keep_turns=False)
    baton.acquire(timeout=30)
    pid = os.fork()
    if pid == 0:
        sys.exit(child(baton))  # atexit runs here: it must leave the parent's session alone
    _, status = os.waitpid(pid, 0)
    print(f"child exited {os.waitstatus_to_exitcode(status)}", flush=True)
    try:
        baton.yield_()
        print("parent yielded", flush=True)
    except Exception as exc:
        print(f"parent yield raised {type(exc).__name__}: {exc}", flush=True)
    baton.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
