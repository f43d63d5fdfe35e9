"""How the counts the extender input test bounds are spread over many seeds.

    python -m tests.reliability.seed_spread [--seeds 200]

For each verb it draws CASES_PER_VERB bodies from the schema per seed (as the test does with
its own fixed seed) and prints, as one JSON object per verb, the lowest, 1st percentile and
median of the bodies answered and tried, beside the test's bound. docs/testing.md keeps the
result.
"""

from __future__ import annotations

import argparse
import json
import statistics

import httpx

from extender.server import ServerThread

from .test_extender_input import MIN_ANSWERED, SCHEMA_VERBS, Failures, app, schema_bodies


def spread(counts: list[int]) -> dict[str, float]:
    ordered = sorted(counts)
    return {
        "min": ordered[0],
        "p1": ordered[max(0, len(ordered) // 100 - 1)],
        "median": statistics.median(ordered),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()
    with (
        ServerThread(app()) as server,
        httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as client,
    ):
        for verb in SCHEMA_VERBS:
            answered, tried, broken = [], [], 0
            for seed_value in range(args.seeds):
                failures = Failures()
                seen = schema_bodies(client, verb, failures, seed_value)
                answered.append(seen["answered"])
                tried.append(seen["tried"])
                broken += len(failures.found)
            line = {
                "verb": verb,
                "seeds": args.seeds,
                "answered": spread(answered),
                "tried": spread(tried),
                "bound": MIN_ANSWERED[verb],
                "below_bound": sum(1 for n in answered if n < MIN_ANSWERED[verb]),
                "broken_promises": broken,
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
