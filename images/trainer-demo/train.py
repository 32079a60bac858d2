"""The demo's training code on the real node: a tiny model really trained, its progress reported from the pod.

It makes its own data (points on a line with noise, from a fixed seed), fits a line to them with mini-batch
stochastic gradient descent for a few steps, prints each step's loss, and after each step reports progress with
the Kubeflow SDK's ``update_trainjob_status``. The SDK reads the three environment variables, the projected token
and the CA that Kubeflow Trainer's plugin gives the pod; nothing else is passed in. The SDK sends at most one
report per 5 s, so the last report (100 %) is retried until it goes out: the TrainJob's final status must say
the run finished.

Settings (environment): TRAIN_STEPS (default 12), TRAIN_STEP_SECONDS (pause after each step, default 1.5).
"""

from __future__ import annotations

import os
import random
import sys
import time

from kubeflow.trainer import update_trainjob_status

SLOPE, INTERCEPT, NOISE = 3.0, -1.0, 0.1
SAMPLES, BATCH, LEARNING_RATE = 512, 32, 0.1
FINAL_REPORT_SECONDS = 30.0


def make_data(rng: random.Random) -> list[tuple[float, float]]:
    xs = [rng.uniform(-1.0, 1.0) for _ in range(SAMPLES)]
    return [(x, SLOPE * x + INTERCEPT + rng.gauss(0.0, NOISE)) for x in xs]


def mse(data: list[tuple[float, float]], w: float, b: float) -> float:
    return sum((w * x + b - y) ** 2 for x, y in data) / len(data)


def train_step(data: list[tuple[float, float]], w: float, b: float, rng: random.Random) -> tuple[float, float]:
    """One pass over the data in shuffled mini-batches; the updated weight and bias."""
    order = list(range(len(data)))
    rng.shuffle(order)
    for start in range(0, len(order), BATCH):
        batch = [data[i] for i in order[start : start + BATCH]]
        grad_w = sum(2 * (w * x + b - y) * x for x, y in batch) / len(batch)
        grad_b = sum(2 * (w * x + b - y) for x, y in batch) / len(batch)
        w, b = w - LEARNING_RATE * grad_w, b - LEARNING_RATE * grad_b
    return w, b


def main() -> int:
    steps = int(os.environ.get("TRAIN_STEPS", "12"))
    pause = float(os.environ.get("TRAIN_STEP_SECONDS", "1.5"))
    rng = random.Random(46)
    data = make_data(rng)
    w, b = 0.0, 0.0
    reporting = bool(os.environ.get("KUBEFLOW_TRAINER_SERVER_URL"))
    print(f"training a line on {len(data)} points for {steps} steps; progress reports: {reporting}", flush=True)
    started = time.monotonic()
    loss = mse(data, w, b)
    for step in range(1, steps + 1):
        w, b = train_step(data, w, b, rng)
        loss = mse(data, w, b)
        left = (time.monotonic() - started) / step * (steps - step)
        sent = update_trainjob_status(
            progress_percent=int(100 * step / steps),
            estimated_remaining_seconds=int(left),
            metrics={"loss": round(loss, 6), "step": step, "w": round(w, 4), "b": round(b, 4)},
        )
        print(f"step {step}/{steps} loss={loss:.6f} w={w:.4f} b={b:.4f} reported={sent}", flush=True)
        if step < steps:
            time.sleep(pause)
    deadline = time.monotonic() + FINAL_REPORT_SECONDS
    final = {"loss": round(loss, 6), "step": steps, "w": round(w, 4), "b": round(b, 4)}
    while reporting and not update_trainjob_status(progress_percent=100, estimated_remaining_seconds=0, metrics=final):
        if time.monotonic() > deadline:
            print("the final progress report did not go out", file=sys.stderr, flush=True)
            return 1
        time.sleep(1.0)
    print(f"done: loss {loss:.6f}, w={w:.4f} (true {SLOPE}), b={b:.4f} (true {INTERCEPT})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
