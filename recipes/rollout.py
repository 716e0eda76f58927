"""Roll out the policy a recipe run saved, as the run evaluated it.

    python recipes/rollout.py outputs/bc/2026-01-01_12-00-00
    python recipes/rollout.py outputs/sac/2026-01-01_12-00-00 --episodes 20

The folder holds the run's ``config.yaml`` and ``policy.safetensors`` (every recipe writes
both, also when interrupted). With the run's own evaluation settings the printed result is
the run's, to the digit. From Python, ``load_policy(folder)`` in ``recipes/_common.py``
returns the rebuilt policy; ``build_policy(recipe, cfg, state)`` rebuilds one from tensors
fetched with ``torchstore.remote.fetch_policy_weights``.
"""

from __future__ import annotations

import argparse
import sys

from _common import load_policy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python recipes/rollout.py",
        description="Roll out the policy saved by a recipe run (bc, offline_rl or sac).",
    )
    parser.add_argument("run", help="the run's folder: outputs/<recipe>/<time>")
    parser.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="episodes to roll out (default: the run's eval.episodes)",
    )
    args = parser.parse_args(argv)
    if args.episodes is not None and args.episodes < 1:
        parser.error(f"--episodes must be at least 1, not {args.episodes}")
    try:
        saved = load_policy(args.run)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    status = "" if saved.complete else " (interrupted run)"
    print(f"{saved.recipe} policy after {saved.step} gradient steps{status}")
    print(saved.rollout(args.episodes))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
