"""How the user invoked ``heterotrain``: the usage-error exit code every subcommand shares, and the
command to print so that it runs as typed (``heterotrain run --resume DIR``).

Kept on the local floor so that ``heterotrain run`` (:mod:`hetero_operator.local.run`) can use
both without importing the command line above it (:mod:`hetero_operator.cli`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys

EXIT_USAGE = 64
"""Usage error (BSD ``sysexits.h`` ``EX_USAGE``); argparse's own default would be 2."""


def invoked_as(argv0: str | None = None, *, path: str | None = None) -> str:
    """How to type ``heterotrain`` again, as the user did (a printed command must run as shown).

    ``argv0`` (default ``sys.argv[0]``) as typed when it names a path (``.venv/bin/heterotrain``),
    unless it is the ``heterotrain`` that ``PATH`` (default ``$PATH``) finds (the shell passes the
    full path then); ``heterotrain`` otherwise (a bare name, ``python -m``).
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    if "/" not in argv0 or argv0.endswith(".py"):
        return "heterotrain"
    found = shutil.which(os.path.basename(argv0), path=path)
    try:
        on_path = found is not None and os.path.samefile(found, argv0)
    except OSError:
        on_path = False
    return os.path.basename(argv0) if on_path else shlex.quote(argv0)
