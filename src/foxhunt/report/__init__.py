"""The report step: test metrics over folds and seeds, deflated Sharpe ratio, equity curves."""

from foxhunt.report.core import ReportConfig, ReportError, deflated_sharpe, run_report

__all__ = ["ReportConfig", "ReportError", "deflated_sharpe", "run_report"]
