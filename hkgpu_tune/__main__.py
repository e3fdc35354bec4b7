"""`python -m hkgpu_tune` and the hkgpu-tune command. A SIGINT while the modules load (before the
command's own handling starts) ends the run quietly with 130, as one during the run does."""
import os
import signal


def _interrupted(signum, frame):
    os.write(2, b"hkgpu-tune: interrupted\n")
    os._exit(130)


def run() -> None:
    signal.signal(signal.SIGINT, _interrupted)
    from hkgpu_tune.cli import main
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()


if __name__ == "__main__":
    run()
