"""Files the runtime keeps under torch's cache directory (saved owners, the CPU check's answers), each
written whole or not at all."""

import os
import uuid


def write_whole(path, fill):
    """Write the file at `path` whole or not at all: `fill(temp)` writes a file of this process's in the same
    folder, renamed over `path` with the mode the folder's umask gave it (as torch's cache files). Two
    processes writing at once each write whole files, and the last stays. OSError where it cannot."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{uuid.uuid4().hex}.tmp")
    try:
        fill(temp)
        os.chmod(temp, os.stat(folder).st_mode & 0o666)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
