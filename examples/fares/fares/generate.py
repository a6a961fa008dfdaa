"""Writes taxi trips as the fares task reads them, the same for the same arguments:

    python -m fares.generate --out DIR [--files K] [--rows N] [--eval-rows M] [--seed S]

DIR/train-00000-of-0000K.csv ... hold N trips between them, DIR/eval-00000-of-00001.csv holds M
more, each file with one header line. The fare follows the trip as a meter would (a flag fall, a
rate per km, a zone's surcharge, a night rate, extra passengers), plus noise: there is something
to learn, and a model that learned it beats predicting the average fare by far. DIR/_SUCCESS is
written last, listing the files and their rows.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import sys

from fares import data
from trainer import cli

FLAG_FALL = 3.0
PER_KM = 1.7
ZONE_SURCHARGE = {"downtown": 0.0, "airport": 12.0, "suburbs": -1.0, "harbour": 3.5}
PAYMENT_FEE = {"card": 0.0, "cash": 0.0, "app": 0.8}
PER_EXTRA_PASSENGER = 0.6
NIGHT_RATE = 1.25  # 22:00-05:59
NOISE = 1.0  # standard deviation of what the meter does not explain (traffic, waiting)


def is_night(hour: int) -> bool:
    return hour >= 22 or hour < 6


def fare(distance_km: float, passengers: int, hour: int, payment_type: str, pickup_zone: str) -> float:
    """The meter's fare for a trip, without noise."""
    metered = (FLAG_FALL + PER_KM * distance_km) * (NIGHT_RATE if is_night(hour) else 1.0)
    return metered + ZONE_SURCHARGE[pickup_zone] + PAYMENT_FEE[payment_type] + PER_EXTRA_PASSENGER * (passengers - 1)


def trip(rng: random.Random) -> data.Trip:
    zone = rng.choices(data.CATEGORIES["pickup_zone"], weights=(5, 1, 3, 1))[0]
    # Most trips are short, a few long; airport trips are long.
    distance = min(max(rng.lognormvariate(math.log(4.0), 0.7) * (3.0 if zone == "airport" else 1.0), 0.3), 60.0)
    passengers = rng.choices(range(1, 7), weights=(60, 20, 8, 6, 4, 2))[0]
    hour = rng.randrange(24)
    payment = rng.choices(data.CATEGORIES["payment_type"], weights=(6, 2, 2))[0]
    noisy = fare(distance, passengers, hour, payment, zone) + rng.gauss(0.0, NOISE)
    return data.Trip(round(distance, 3), passengers, hour, payment, zone, round(max(noisy, FLAG_FALL), 2))


def trips(count: int, rng: random.Random) -> list[data.Trip]:
    return [trip(rng) for _ in range(count)]


def write(path: str, rows: list[data.Trip]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(data.COLUMNS)
        writer.writerows(t.row() for t in rows)


def generate(out: str, files: int, rows: int, eval_rows: int, seed: int) -> dict[str, int]:
    """Writes the files; returns file name -> rows."""
    os.makedirs(out, exist_ok=True)
    rng = random.Random(seed)
    written = {}
    train = trips(rows, rng)
    for index in range(files):
        name = f"train-{index:05d}-of-{files:05d}.csv"
        part = train[index::files]  # rows dealt round-robin: every file holds the same mix
        write(os.path.join(out, name), part)
        written[name] = len(part)
    name = "eval-00000-of-00001.csv"
    write(os.path.join(out, name), trips(eval_rows, rng))
    written[name] = eval_rows
    with open(os.path.join(out, "_SUCCESS"), "w") as handle:
        handle.writelines(f"{name} {count}\n" for name, count in written.items())
    return written


def main(argv=None) -> int:
    parser = cli.OneLineParser(prog="python -m fares.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory to write into (created)")
    parser.add_argument("--files", type=cli.positive_int, default=4, help="training files")
    parser.add_argument("--rows", type=cli.positive_int, default=2000, help="training trips, over all files")
    parser.add_argument("--eval-rows", type=cli.positive_int, default=None, help="evaluation trips (default rows / 4)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same trips")
    args = parser.parse_args(argv)
    written = generate(args.out, args.files, args.rows, args.eval_rows or max(args.rows // 4, 1), args.seed)
    print(f"wrote {sum(written.values())} trips in {len(written)} files to {args.out}", file=sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
