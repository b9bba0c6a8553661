"""Try valid points in a random order (a uniform sample when the budget stops it early)."""

import random

OPTIONS = {
    "seed": (0, "random seed"),
    "batch": (32, "points handed to the evaluator at a time"),
}


def tune(space, evaluate, options):
    points = list(space.valid_points)
    random.Random(options["seed"]).shuffle(points)
    for start in range(0, len(points), options["batch"]):
        evaluate(points[start:start + options["batch"]])
