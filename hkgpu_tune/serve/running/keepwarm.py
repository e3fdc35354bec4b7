"""Keep-warm: while a served model has had no traffic for `idle_s`, send it one small fixed request
every `period_s` (the gate's warm-up request: client.request_for). Traffic is read from Triton's
own counter (nv_inference_request_success of the model), so the requests sent here are not taken
for clients' traffic, and nothing is sent while clients keep the model busy. One keep-alive
connection is kept open, so the path a client uses stays long-lived as well.

Run beside the server (a side process of its unit, or a unit of its own):
    python3 -m hkgpu_tune.serve.running.keepwarm --profile /etc/hkgpu-tune/node.yaml --idle-s 30 --period-s 5

>>> k = KeepWarm(send=lambda: None, served=lambda: 0.0, idle_s=10, period_s=5)
>>> [k.step(now) for now in (0, 9, 10, 12, 15)]
[False, False, True, False, True]
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from hkgpu_tune.core.errors import HkError


class KeepWarm:
    """The decision, apart from the network: step(now) sends when idle long enough, and says so."""

    def __init__(self, send: Callable[[], None], served: Callable[[], float], idle_s: float = 30.0,
                 period_s: float = 5.0, start: float = 0.0):
        if not 0 < period_s <= idle_s:
            raise ValueError("keep-warm: 0 < period_s <= idle_s")
        self.send, self.served, self.idle_s, self.period_s = send, served, idle_s, period_s
        self.count = None            # read at the first step that reaches the server (it may not be up yet)
        self.last_traffic = start
        self.last_sent = None
        self.sent = 0

    def step(self, now: float) -> bool:
        c = self.served()
        if self.count is None:       # the server seen for the first time: idle from now
            self.count, self.last_traffic = c, max(self.last_traffic, now)
        elif c != self.count:        # clients were served since the last look
            self.count, self.last_traffic = c, now
        if now - self.last_traffic < self.idle_s:
            return False
        if self.last_sent is not None and now - self.last_sent < self.period_s:
            return False
        self.send()
        self.count = self.served()   # our own request is not clients' traffic
        self.last_sent = now
        self.sent += 1
        return True


def for_model(t, model, idle_s: float, period_s: float, start: float) -> tuple[KeepWarm, Callable[[], None]]:
    """A KeepWarm for one model of a triton profile section, and the function that closes it."""
    from hkgpu_tune.serve.running import client
    c = client.Client(t.http.host, t.http.port, timeout=10)
    req = client.request_for(model)
    served = lambda: client.model_counts(t.metrics.host, t.metrics.port, model.name)["nv_inference_request_success"]
    return KeepWarm(lambda: c.infer(model.name, req), served, idle_s, period_s, start), c.close


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hkgpu_tune.serve.running.keepwarm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", help="the node's profile (its triton section)")
    ap.add_argument("--unit", help="the service, where the profile has several (triton.services)")
    ap.add_argument("--model", help="the model to keep warm (default: the profile's first)")
    ap.add_argument("--idle-s", type=float, default=30.0, help="no traffic for this long: start sending")
    ap.add_argument("--period-s", type=float, default=5.0, help="one request per period while idle")
    ap.add_argument("--duration-s", type=float, default=0.0, help="stop after this long (0: run until killed)")
    args = ap.parse_args(argv)
    from hkgpu_tune.core.profile import load_chosen
    try:
        from hkgpu_tune.serve.schema.config import section
        t = section(load_chosen(args.profile), args.unit)
        if t is None or not t.models:
            raise HkError("the profile has no triton section with a model")
        model = next((m for m in t.models if m.name == (args.model or t.models[0].name)), None)
        if model is None:
            raise HkError(f"--model {args.model}: not in the profile's triton.models")
        t0 = time.monotonic()
        kw, close = for_model(t, model, args.idle_s, args.period_s, t0)
    except (HkError, ValueError) as e:
        print(f"keepwarm: {e}", file=sys.stderr)
        return 1
    said = None
    try:
        while not args.duration_s or time.monotonic() - t0 < args.duration_s:
            try:
                kw.step(time.monotonic())
                if said:
                    print("keepwarm: the server answers again", file=sys.stderr)
                said = None
            except HkError as e:     # not up yet, or restarting: keep trying, say so once
                if said != str(e):
                    print(f"keepwarm: waiting for the server: {e}", file=sys.stderr)
                said = str(e)
            time.sleep(min(1.0, args.period_s / 2))
    except KeyboardInterrupt:
        pass
    finally:
        close()
    print(f"keepwarm: sent {kw.sent} request(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
