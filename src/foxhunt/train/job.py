"""`torchrun -m foxhunt.train.job <config.json>`: `foxhunt train` for a TrainConfig written as
JSON (foxhunt.train.trainjob), what each node of a multi-node TrainJob runs."""

from __future__ import annotations

import logging
import sys

from foxhunt.train import distributed
from foxhunt.train.core import run_train
from foxhunt.train.trainjob import load_config


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: torchrun ... -m foxhunt.train.job <config.json>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    res = run_train(load_config(sys.argv[1]))
    if distributed.launched_rank() == 0:
        print(res.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
