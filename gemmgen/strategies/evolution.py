"""Evolutionary search: keep the fastest points, breed neighbours of them, repeat.

Each generation mutates parents one dimension at a time to a neighbouring value of its set
(the sets are ordered, so neighbours are similar kernels), with occasional crossover between
two parents and a few random immigrants against getting stuck. Invalid children are simply not
proposed: the space knows which points the Plan accepts.
"""

import random

OPTIONS = {
    "seed": (0, "random seed"),
    "population": (16, "points in the first, random generation"),
    "parents": (6, "fastest points kept to breed from"),
    "children": (16, "new points per generation"),
    "immigrants": (2, "random new points per generation"),
    "generations": (100, "upper bound on generations (the evaluation budget usually ends it)"),
}


def tune(space, evaluate, options):
    rng = random.Random(options["seed"])
    valid = space.valid_points
    valid_set = set(valid)
    score = {}

    def run(points):
        fresh = [p for p in dict.fromkeys(points) if p not in score]
        if fresh:
            score.update(zip(fresh, evaluate(fresh)))

    run(rng.sample(valid, min(len(valid), options["population"])))
    for _ in range(options["generations"]):
        if len(score) >= len(valid):
            return
        parents = sorted(score, key=score.get, reverse=True)[:options["parents"]]
        children = []
        attempts = 0
        while len(children) < options["children"] and attempts < 50 * options["children"]:
            attempts += 1
            child = list(rng.choice(parents))
            if len(parents) > 1 and rng.random() < 0.3:
                other = rng.choice(parents)
                child = [a if rng.random() < 0.5 else b for a, b in zip(child, other)]
            for _ in range(1 + (rng.random() < 0.3)):
                dim = rng.randrange(len(child))
                values = space.dimensions[dim]
                here = values.index(child[dim])
                step = rng.choice([-1, 1])
                child[dim] = values[min(len(values) - 1, max(0, here + step))]
            child = tuple(child)
            if child in valid_set and child not in score and child not in children:
                children.append(child)
        unseen = [p for p in valid if p not in score and p not in children]
        children += rng.sample(unseen, min(len(unseen), options["immigrants"]))
        if not children:
            return
        run(children)
