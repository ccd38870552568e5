"""Python bytecode for a placed bundle, compiled once by the node instead of at every start.

A Python child imports its vendored packages (`mcp`, pydantic and the rest: about 700 modules
for hello-python) at every start. With no cached bytecode beside them it compiles every one
first: 0.8 s from spawn to `initialize` answered instead of 0.5 s (docs/performance.md, "The
Python SDK child"). A child writes that cache itself only where it may write: not into a folder
owned by the node when it runs as another user (`child_user`), and it should not change a
verified artifact's folder anyway. Artifacts carry no bytecode (it is per interpreter, and
would make builds depend on it), so the node compiles a Python bundle's folder once, where it
places it: after a delivered artifact is verified and unpacked, and after a package bundle is
built from its lock.

The bytecode is hash-based and unchecked (PEP 552): no timestamps in it, and Python does not
look at the source again. Right for these folders: nothing changes a file in them after it was
verified or built; a new version is a new folder.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("mesh.bytecode")

# A bundle's whole vendored tree compiles in about a second here; far more means something is wrong.
COMPILE_TIMEOUT_S = 300


def compile_bytecode(folder: Path) -> bool:
    """Compile every Python file under `folder` for this interpreter; False (and a warning) if not all.

    Never raises for what it compiles: a file that does not compile (a vendored package's test
    data, say) is compiled at import as before, and named in the warning.
    """
    command = [
        sys.executable,
        "-m",
        "compileall",
        "-q",
        "-j",
        "0",  # as many workers as the machine has cores
        "--invalidation-mode",
        "unchecked-hash",
        str(folder),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        log.warning(
            "bytecode for %s: not done after %d s; its modules compile at each start", folder, COMPILE_TIMEOUT_S
        )
        return False
    except OSError as e:
        log.warning("bytecode for %s: cannot run compileall (%s); its modules compile at each start", folder, e)
        return False
    if done.returncode != 0:
        failed = re.findall(r"^\*\*\* Error compiling '(.+)'", done.stdout, re.M)
        log.warning(
            "bytecode for %s: %d file(s) do not compile (%s); they compile at each start",
            folder,
            len(failed),
            ", ".join(failed[:5]) or done.stderr.strip()[-300:],
        )
        return False
    return True
