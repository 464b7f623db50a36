"""`tether eval`: K seeded episodes per env through Triton and a gateway, judged by the gate's own checks.

- `episodes`: the runner (lockstep waves, one vectorised session each: the same Triton batch every run);
- `verdict`: the figures and the checks (`bridge.gate.checks` computes them: one implementation);
- `report`: the terminal table and the JUnit XML; `cli`: the command line (`tether eval`).
"""
