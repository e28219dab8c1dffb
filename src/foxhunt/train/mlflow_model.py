"""A fold's best checkpoint as an MLflow model (pyfunc): load it from MLflow and get actions.

    model = mlflow.pyfunc.load_model("models:/foxhunt-ES-dqn/1")
    model.predict(frame)    # columns: the 50 market columns and the 3 portfolio ones, by name

An agent that remembers the order flow (the env's `memory_decay`, on by default) computes its
memory from the frame's rows: give them as consecutive bars in time order, with some history
before the bars that matter (foxhunt.train.policy).

The model carries the checkpoint files and foxhunt's own code (`code_paths`), so it loads in
any environment with torch, safetensors, numpy and pandas. It is logged as code (MLflow's
"models from code": `mlflow_entry.py` builds it at load time), not as a pickled object, so
loading it runs only foxhunt's own files. Imported only where MLflow is.
"""

from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd

from foxhunt.train.env import PORTFOLIO
from foxhunt.train.policy import Policy


class PolicyModel(mlflow.pyfunc.PythonModel):
    """Rows of raw market columns and portfolio state in; a frame of direction (-1, 0, 1),
    size (fraction of the allowed notional) and order type (market, passive_limit) out."""

    def load_context(self, context) -> None:
        self.policy = Policy.load(Path(context.artifacts["checkpoint"]))

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        frame = pd.DataFrame(model_input)  # named columns, as the signature enforces
        market = frame[self.policy.columns].to_numpy(np.float32)
        portfolio = frame[list(PORTFOLIO)].to_numpy(np.float32)
        return pd.DataFrame(Policy.describe(self.policy.act(market, portfolio)))


def signature(columns: list[str]):
    """Named numeric columns in (market, then portfolio); direction, size, order type out."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema([ColSpec("double", c) for c in [*columns, *PORTFOLIO]])
    outputs = Schema(
        [ColSpec("double", "direction"), ColSpec("double", "size"), ColSpec("string", "order_type")]
    )
    return ModelSignature(inputs=inputs, outputs=outputs)


def log_policy_model(checkpoint: Path, name: str = "policy"):
    """Log the checkpoint as a pyfunc model of the active MLflow run; returns its ModelInfo."""
    import foxhunt

    policy = Policy.load(checkpoint)
    example = pd.DataFrame([policy.mean.numpy()], columns=policy.columns)  # the train mean
    example[list(PORTFOLIO)] = 0.0
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=str(Path(__file__).with_name("mlflow_entry.py")),
        artifacts={"checkpoint": str(checkpoint), "config": str(checkpoint.with_suffix(".json"))},
        code_paths=[str(Path(foxhunt.__file__).parent)],
        pip_requirements=["torch", "safetensors", "numpy", "pandas"],
        signature=signature(policy.columns),
        input_example=example,
    )
