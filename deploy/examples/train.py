#!/usr/bin/env python3
"""A checkpointing training loop for Axle's README tour.

Every run of a checkpointable workload gets the same $AXLE_CHECKPOINT_DIR
(and $AXLE_RESTART_COUNT): this loop saves its step there when told to stop
(the workload's checkpoint signal, SIGUSR1 or SIGTERM) and every
--save-every steps, and a later run resumes from the saved step.

    axle submit --team research --gpus 1 --priority training --checkpointable \
      --checkpoint-signal SIGUSR1 --name train -- python3 "$PWD/deploy/examples/train.py"
"""

import argparse
import json
import os
import signal
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600, help="steps in all (one a second)")
    ap.add_argument("--save-every", type=int, default=30, help="steps between checkpoints")
    ap.add_argument("--step-seconds", type=float, default=1.0, help="length of one step")
    ap.add_argument(
        "--resume-from",
        default=os.environ.get("AXLE_CHECKPOINT_DIR", ""),
        help="checkpoint directory (default: $AXLE_CHECKPOINT_DIR)",
    )
    args = ap.parse_args()

    ckpt = os.path.join(args.resume_from, "state.json") if args.resume_from else ""
    step = 0
    if ckpt and os.path.exists(ckpt):
        with open(ckpt) as f:
            step = json.load(f)["step"]
    restarts = os.environ.get("AXLE_RESTART_COUNT", "0")
    print(f"starting at step {step} of {args.steps} (restart {restarts})", flush=True)

    def save() -> None:
        if not ckpt:
            return
        tmp = ckpt + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step}, f)
        os.replace(tmp, ckpt)

    stop = False

    def on_signal(signum, _frame) -> None:
        nonlocal stop
        stop = True

    for s in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(s, on_signal)

    while step < args.steps and not stop:
        time.sleep(args.step_seconds)
        step += 1
        if step % args.save_every == 0:
            save()
    save()
    if stop:
        print(f"checkpointed at step {step}; exiting to be resumed", flush=True)
        return 143
    print(f"done: {step} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
