"""Rewards computed by the gateway: a YAML reward config per policy, compiled into vectorised terms.

A config lists terms; the reward is the sum of their weighted contributions, and conditions may end
the episode. Every config has a version, a short hash of its canonical content (defaults filled in,
keys sorted), recorded with each transition so that data from different rewards never mix silently:
YAML formatting, key order and `1` vs `1.0` leave it alone; any changed value changes it.

```yaml
reward:
  terms:                 # evaluated for a batch of B rows; names default to the type (`name:` overrides)
    - {type: env_reward, weight: 1.0}            # the simulator's reward (0 from a robot)
    - {type: alive_bonus, weight: 1.0}           # weight on each row no failure condition flags
    - {type: goal_distance, observation: observation, indices: [0, 1], goal: [0.5, 0.0], weight: -1.0}
    - {type: action_magnitude, action: action, weight: -0.01}      # ||a||^2
    - {type: action_smoothness, action: action, weight: -0.01}     # ||a_t - a_{t-1}||^2 (0 at an episode start)
    - {type: joint_limit_proximity, observation: joint_position, low: [-3.1, -2.0], high: [3.1, 2.0],
       margin: 0.1, weight: -1.0}     # sum of max(0, low + margin - q, q - (high - margin))
    - {type: success, observation: observation, indices: [0, 1], goal: [0.5, 0.0], below: 0.05,
       bonus: 10.0, terminate: true}  # holds where ||x - goal|| < below
    - {type: failure, name: fell, observation: observation, indices: [2], above: 0.2, bonus: -5.0, terminate: true}
```

Only the `reward` section of the file is read (a per-policy file may hold others). Fields (unknown
fields, and keys given twice, are refused, so a typo never passes silently):
- `weight` (required by goal_distance, action_magnitude, action_smoothness, joint_limit_proximity, whose
  raw values are distances or penalties >= 0: give them a negative weight; default 1.0 otherwise).
- `observation` / `action`: the tensor the term reads. Observation terms read the *next* observation
  (the state the action led to); tensors are flattened per row, so `indices` index the flat values
  (default: all of them). `goal`, `low`, `high` have one value per selected element.
- `success` / `failure`: distance = ||x[indices] - goal|| (goal default 0: with one index, |x|); the
  condition holds where distance < `below` or > `above` (exactly one of them). `bonus` (default 0,
  negative for a penalty) is added where it holds; `terminate: true` (default false) sets
  `result.terminate` there. `alive_bonus` is 0 on rows where any `failure` holds (with or without
  `terminate`): `alive_bonus` + a failure at `above: 0.2` on the pole angle is exactly gymnasium's
  InvertedPendulum-v5 reward.

Examples, checked against the real MuJoCo envs in tests/rewards: `launch/config/rewards/`
(`inverted_pendulum.yaml`, `reach.yaml` for Reacher-v5).

Errors name the term (0-based index and name) and the field, before the first step:

    >>> import numpy as np, yaml
    >>> bad = yaml.safe_load('''
    ... reward:
    ...   terms:
    ...     - {type: env_reward}
    ...     - {type: alive_bonus}
    ...     - {type: goal_distance, observation: obs, indices: [0, 1], goal: [0.5, 0.0, 1.0], weight: -1.0}
    ... ''')
    >>> RewardFunction.from_dict(bad)
    Traceback (most recent call last):
    ...
    bridge.rewards.config.RewardConfigError: reward term 2 (goal_distance): field 'goal' has 3 values, indices select 2

The gateway checks a config against each session's specs at Hello, then computes once per step:

    >>> from protos.codec import Spec
    >>> fn = RewardFunction.from_dict(yaml.safe_load('''
    ... reward:
    ...   terms:
    ...     - {type: env_reward}
    ...     - {type: goal_distance, observation: obs, indices: [0, 1], goal: [0.5, 0.0], weight: -1.0}
    ...     - {type: action_magnitude, action: act, weight: -0.5}
    ...     - {type: success, observation: obs, indices: [0, 1], goal: [0.5, 0.0], below: 0.05, bonus: 10.0,
    ...        terminate: true}
    ... '''))
    >>> fn.check_specs([Spec("obs", np.float32, (3,))], [Spec("act", np.float32, (1,))])
    >>> fn.terms
    ('env_reward', 'goal_distance', 'action_magnitude', 'success')
    >>> obs = {"obs": np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], np.float32)}
    >>> nxt = {"obs": np.array([[0.5, 0.3, 9.0], [0.5, 0.01, 9.0]], np.float32)}
    >>> act = {"act": np.array([[2.0], [0.2]], np.float32)}
    >>> r = fn.compute(obs, act, nxt, env_reward=np.array([1.0, 1.0]))
    >>> np.round(r.reward, 4).tolist(), r.terminate.tolist()
    ([-1.3, 10.97], [False, True])
    >>> for name, value in r.terms.items():
    ...     print(name, np.round(value, 4).tolist())
    env_reward [1.0, 1.0]
    goal_distance [-0.3, -0.01]
    action_magnitude [-2.0, -0.02]
    success [0.0, 10.0]
    >>> r.ended_by(1)     # which condition ended row 1 (EpisodeEnd.reason "reward:success")
    'success'
    >>> fn.version == RewardFunction.from_dict(fn.to_dict()).version != RewardFunction.passthrough().version
    True

`compute` is vectorised numpy over the batch, everything else is prepared at construction; it raises
`RewardInputError` (naming the tensor) when its inputs do not fit the config.
"""

from bridge.rewards.config import RewardConfigError, TermSpec
from bridge.rewards.function import RewardFunction, RewardResult
from bridge.rewards.terms import RewardInputError

__all__ = ["RewardConfigError", "RewardFunction", "RewardInputError", "RewardResult", "TermSpec"]
