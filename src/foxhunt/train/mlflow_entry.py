"""The file MLflow runs to build foxhunt's pyfunc model when the model is loaded (MLflow's
"models from code"): the model is stored as this code beside its checkpoint, not as a pickled
Python object. Not imported by foxhunt itself: `mlflow_model.log_policy_model` names it."""

from mlflow.models import set_model

from foxhunt.train.mlflow_model import PolicyModel

set_model(PolicyModel())
