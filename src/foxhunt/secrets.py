"""The Kubernetes Secrets foxhunt's pods read, by name, and the environment variables their
keys become. Values never appear in code, YAML, logs or MLflow; infra/secrets/ holds templates
without values."""

DATABENTO_SECRET = ("foxhunt-databento", {"api-key": "DATABENTO_API_KEY"})
MLFLOW_SECRET = (
    "foxhunt-mlflow",
    {
        "tracking-uri": "MLFLOW_TRACKING_URI",
        "username": "MLFLOW_TRACKING_USERNAME",
        "password": "MLFLOW_TRACKING_PASSWORD",
        "s3-endpoint": "MLFLOW_S3_ENDPOINT_URL",
        "s3-access-key": "AWS_ACCESS_KEY_ID",
        "s3-secret-key": "AWS_SECRET_ACCESS_KEY",
    },
)
