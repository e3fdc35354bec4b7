"""A stand-in for tritonserver ending itself at its own exit timeout: on SIGTERM it exits
EXIT_S seconds later (a negative EXIT_S: ignores SIGTERM)."""
import os
import signal
import sys
import time

exit_s = float(sys.argv[1])


def on_term(*_):
    if exit_s >= 0:
        time.sleep(exit_s)
        os._exit(0)


signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)   # the handler is in place
while True:
    time.sleep(0.05)
