"""Try every valid point, in the order the spec's sets list them."""

OPTIONS = {
    "batch": (32, "points handed to the evaluator at a time"),
}


def tune(space, evaluate, options):
    points = space.valid_points
    for start in range(0, len(points), options["batch"]):
        evaluate(points[start:start + options["batch"]])
