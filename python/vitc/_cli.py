"""The `vitc` console command of an installed package: it runs the tool that
`pip install .` built and put in vitc/_native/, with the same arguments.

exec, not a child process: the tool's exit status, signals and terminal
reach the caller unchanged, and no Python process lingers.
"""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))

# The package's own copy, then a source checkout's (python/vitc/ -> build/),
# as vitc._lib looks for the library.
CANDIDATES = (os.path.join(_here, "_native", "vitc"),
              os.path.join(_here, "..", "..", "build", "vitc"))


def tool_path():
    for c in CANDIDATES:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    path = tool_path()
    if path is None:
        sys.stderr.write("vitc: the command-line tool is missing (looked for %s); "
                         "reinstall the package with `pip install .` from the vitc sources\n"
                         % os.path.normpath(CANDIDATES[0]))
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    # argv[0] "vitc": the tool's messages name the command the user typed.
    os.execv(path, ["vitc"] + argv)
