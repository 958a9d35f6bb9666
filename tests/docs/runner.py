"""A page's Python blocks, run in a fresh interpreter as a reader pastes them into one.

tests/docs/test_examples.py starts this script once per page, in the page's folder, and sends
it the page's Python blocks in order, one JSON line each on stdin: {"code", "where", "kind"}.
A shown block runs in the page's one namespace; a hidden check runs in a copy of it, so a name
a check defines is never there for the blocks after it, as it is not for a reader. For each
block it writes back, on the file descriptor named by its argument, one JSON line: what the
block printed to stdout and, if it raised, the traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import types
from typing import Any


def run(request: dict[str, str], namespace: dict[str, Any]) -> dict[str, str | None]:
    scope = namespace if request["kind"] == "shown" else dict(namespace)
    printed = io.StringIO()
    error = None
    try:
        # dont_inherit: compiled as the reader's own code, without this file's
        # `from __future__ import annotations` (SQLAlchemy reads its models' annotations).
        code = compile(request["code"], request["where"], "exec", dont_inherit=True)
        with contextlib.redirect_stdout(printed):
            exec(code, scope)  # the page's own example, run as a reader runs it
    except BaseException:  # whatever the block raised, SystemExit too, is the test's to report
        error = traceback.format_exc()
    return {"stdout": printed.getvalue(), "error": error}


def main() -> None:
    # As `python` started in the page's folder has it: that folder first, not tests/docs/.
    sys.path[0] = ""
    replies = os.fdopen(int(sys.argv[1]), "w")
    # The blocks' module is __main__, as a pasted script's is (pickle and pydantic look
    # names up through sys.modules); this file's own names stay out of it.
    main_module = types.ModuleType("__main__")
    sys.modules["__main__"] = main_module
    namespace = vars(main_module)
    for line in sys.stdin:
        replies.write(json.dumps(run(json.loads(line), namespace)) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
