"""What a measured epoch time means for a training plan: hours and cost on this machine against
a cloud GPU, and which to use. Every assumption is a parameter and is printed with the answer.

    hours here   = tasks x folds x (epochs x epoch time + per-task start) / parallel tasks here
    cost here    = hours here x (power kW x energy price + amortisation per hour)
    cloud hours  = hours here x cloud slowdown (the cloud GPU's epoch time over this one's)
    cloud cost   = cloud hours x parallel tasks x price per GPU-hour

Recommendation: here, when it meets the deadline and costs no more than the cloud; the cloud
when this machine misses the deadline (with the number of cloud GPUs that meets it, one task
each) or costs more.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TrainingPlan:
    """The training the decision is for."""

    folds: int = 12
    """Walk-forward folds of each task."""
    epochs: int = 50
    """Epochs per fold."""
    seeds: int = 3
    """Seeds per model (a task is a model and a seed)."""
    deadline_hours: float = 24.0
    """The wall-clock time the plan must finish in."""


@dataclass(frozen=True)
class CostAssumptions:
    """Prices and the machines' power; defaults are placeholders to replace with your own."""

    cloud_usd_per_gpu_hour: float = 3.50
    """Price of one cloud GPU-hour."""
    cloud_slowdown: float = 1.0
    """The cloud GPU's epoch time over this machine's (1: the same GPU; 2: twice as slow)."""
    local_power_kw: float = 0.7
    """What this machine's GPU draws while training, kW (an H200 SXM: up to 0.7)."""
    energy_usd_per_kwh: float = 0.25
    """Price of energy here."""
    local_usd_per_hour: float = 0.0
    """Amortised cost of this machine per hour of use (0: already paid for)."""
    local_parallel: int = 1
    """Tasks this machine runs at once (its GPUs)."""


def decide(epoch_s: dict[str, float], start_s: dict[str, float], plan: TrainingPlan,
           costs: CostAssumptions) -> dict:  # fmt: skip
    """The plan's hours and costs here and in the cloud from each model's measured epoch time
    (`epoch_s`, seconds, with evaluation) and per-task start (`start_s`: build, compile,
    capture), and the recommendation with its reason."""
    task_s = sum(plan.folds * plan.epochs * epoch_s[m] + start_s.get(m, 0.0) for m in epoch_s)
    gpu_hours_here = plan.seeds * task_s / 3600.0
    hours_here = gpu_hours_here / max(costs.local_parallel, 1)
    cost_here = gpu_hours_here * (costs.local_power_kw * costs.energy_usd_per_kwh
                                  + costs.local_usd_per_hour)  # fmt: skip
    cloud_gpu_hours = gpu_hours_here * costs.cloud_slowdown
    tasks = plan.seeds * len(epoch_s)
    # The fewest cloud GPUs (one task each) that meet the deadline.
    longest_task_h = max(plan.folds * plan.epochs * epoch_s[m] + start_s.get(m, 0.0)
                         for m in epoch_s) * costs.cloud_slowdown / 3600.0  # fmt: skip
    need = min(tasks, max(1, math.ceil(cloud_gpu_hours / plan.deadline_hours)))
    cloud_meets = longest_task_h <= plan.deadline_hours
    cloud_hours = max(cloud_gpu_hours / need, longest_task_h)
    cloud_cost = cloud_gpu_hours * costs.cloud_usd_per_gpu_hour
    if hours_here <= plan.deadline_hours and cost_here <= cloud_cost:
        choice = "here"
        why = (
            f"this machine finishes in {hours_here:.1f} h, within the {plan.deadline_hours:g} h "
            f"deadline, for ${cost_here:,.2f} against ${cloud_cost:,.2f} in the cloud"
        )
    elif hours_here > plan.deadline_hours:
        choice = "cloud"
        why = (
            f"this machine needs {hours_here:.1f} h, past the {plan.deadline_hours:g} h "
            f"deadline; {need} cloud GPU(s) finish in {cloud_hours:.1f} h for "
            f"${cloud_cost:,.2f}"
            + (
                ""
                if cloud_meets
                else " (the longest task alone misses the deadline: shorten the plan)"
            )
        )
    else:
        choice = "cloud"
        why = (
            f"the cloud costs ${cloud_cost:,.2f} against ${cost_here:,.2f} here, both "
            "within the deadline"
        )
    return {
        "plan": asdict(plan), "assumptions": asdict(costs), "tasks": tasks,
        "hours_here": hours_here, "cost_here_usd": cost_here,
        "cloud_gpu_hours": cloud_gpu_hours, "cloud_gpus": need, "cloud_hours": cloud_hours,
        "cloud_cost_usd": cloud_cost, "recommendation": choice, "reason": why,
    }  # fmt: skip
