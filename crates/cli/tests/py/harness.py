"""Shared by the client scripts the serve tests run: every check runs even when an earlier one failed, one line
per check, and "ALL OK" at the end only when all passed."""

import sys
import time
import traceback


def run_all(tests):
    """Runs each test function; prints `ok`/`FAIL` lines (with the traceback of each failure); returns the exit
    code: 0 when all passed, 1 otherwise."""
    failed = []
    for t in tests:
        start = time.time()
        try:
            t()
            print(f"ok   {t.__name__} ({time.time() - start:.1f} s)")
        except Exception:  # noqa: BLE001 - every check runs; failures are listed at the end
            failed.append(t.__name__)
            print(f"FAIL {t.__name__} ({time.time() - start:.1f} s)\n{traceback.format_exc()}")
        sys.stdout.flush()
    if failed:
        print(f"{len(failed)} failed: {', '.join(failed)}")
        return 1
    print("ALL OK")
    return 0
