"""The safety gate: integrity, numerical consistency, evaluation in simulation, action sanity.

    gate = Gate(client=policy_client, experience_dir=run_dir / "experience", evaluator=None,
                config=GateConfig(eval_env=None))
    report = GateReport((gate.check_artifact(weights, architecture),
                         *await gate.check_served(policy="pendulum", version=3, incumbent=2, header=header,
                                                  action_spec=action_spec)))
    report.failed   # e.g. ["consistency"]; each CheckResult has name, passed, figures, detail
"""

from bridge.gate.checks import CHECKS, DEFAULT_TOLERANCES, CheckResult, GateReport, with_bounds
from bridge.gate.evaluation import EvaluationError, SimEvaluator
from bridge.gate.gate import Evaluator, Gate, GateConfig

__all__ = ["CHECKS", "DEFAULT_TOLERANCES", "CheckResult", "EvaluationError", "Evaluator", "Gate", "GateConfig",
           "GateReport", "SimEvaluator", "with_bounds"]
