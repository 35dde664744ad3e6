"""The dev cluster's files private to their user: the cluster dir is 0700, and a secret file (the
admin token, a kubeconfig, a key) is 0600 from the moment it exists, never chmod'ed afterwards.

A file first written and then chmod'ed is readable by every local user in between (and stays so
when the chmod is never reached); :func:`write_secret` creates it with ``os.open(..., 0o600)``
instead, and puts it in place by a rename.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
"""The cluster dir and its key dirs: only the owner lists, reads or enters them."""
SECRET_MODE = 0o600
"""Token files, kubeconfigs and private keys: only the owner reads or writes them."""
UMASK = 0o077
"""The umask of the processes that write our keys (``openssl``): what they create is private."""


def private_dir(path: Path) -> Path:
    """``path`` (and missing parents) made if absent, and ``path`` itself set to 0700 whatever its
    mode was (a cluster dir made by an older version was 0755); returns ``path``."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    path.chmod(DIR_MODE)
    return path


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` as a 0600 file; returns ``path``.

    The content goes to a new file created 0600 (``O_EXCL``: never one that someone else made)
    next to ``path``, which then replaces ``path`` in one rename: no moment shows the secret with
    a wider mode, and a reader holding the old file open never sees the new one.

    Raises:
        OSError: the file cannot be created, written or renamed.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SECRET_MODE)
    try:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path
