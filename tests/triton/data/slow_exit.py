"""A stand-in for tritonserver ending itself at its own exit timeout: on SIGTERM it exits
EXIT_S seconds later (a negative EXIT_S: ignores SIGTERM). It follows `tritonserver --help` on
--exit-timeout-secs (on SIGTERM the server stops taking requests and exits when the in-flight ones
are done, or after that many seconds).
    slow_exit.py EXIT_S"""
import os
import signal
import sys
import time

if len(sys.argv) != 2:
    sys.exit(f"usage: {sys.argv[0]} EXIT_S")
exit_s = float(sys.argv[1])


def on_term(*_):
    if exit_s >= 0:
        time.sleep(exit_s)
        os._exit(0)


signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)   # the handler is in place
while True:
    time.sleep(0.05)
