"""The one base of every error a step raises for bad input, missing data or an unsafe output.

Its message is one line naming the file, field or record and the rule broken; the CLI prints it
and exits 1 (no traceback), a KFP task fails with it. Anything else is a bug and keeps its
traceback."""


class StepError(RuntimeError):
    """A step refused its input or its output path; the message says what and why."""


class Terminated(BaseException):  # a signal, like KeyboardInterrupt: not an Exception
    """SIGTERM arrived (Kubernetes stopping the pod, a cancelled pipeline run), raised where
    a step turns the signal into cleanup: notes written, runs marked KILLED."""
