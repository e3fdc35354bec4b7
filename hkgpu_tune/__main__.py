"""`python -m hkgpu_tune` and the hkgpu-tune command. A SIGINT while the modules load (before the
command's own handling starts) ends the run quietly with 130, as one during the run does. The
handler is set when this module is imported (the console script imports it first), through the C
module _signal: `import signal` builds its enums first, a window of milliseconds."""
import _signal
import os


def _interrupted(signum, frame):
    os.write(2, b"hkgpu-tune: interrupted\n")
    os._exit(130)


_signal.signal(_signal.SIGINT, _interrupted)


def run() -> None:
    _signal.signal(_signal.SIGINT, _interrupted)
    from hkgpu_tune.cli import main
    main()        # it puts the default handler back inside its own handling


if __name__ == "__main__":
    run()
