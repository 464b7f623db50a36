"""The algorithms `tether train --algo` names: what is particular to each, for the one loop (trainer.loop).

    from trainer.algorithms import ALGORITHMS
    summary = trainer.loop.run(args, ALGORITHMS["sac"])

Each is a small class (`trainer.loop.Algorithm`) around its learner (trainer.ppo, trainer.sac, trainer.bc):
how it reads the stream, when it is ready to update, what its checkpoints keep and what it reports.
"""

from trainer.algorithms.bc import BC
from trainer.algorithms.ppo import PPO
from trainer.algorithms.sac import SAC

__all__ = ["ALGORITHMS", "BC", "PPO", "SAC"]

ALGORITHMS = {"ppo": PPO, "sac": SAC, "bc": BC}
