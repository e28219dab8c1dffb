"""The ensemble: supervised models trained side by side on each fold, their forecasts combined,
and the combination evaluated like any model (classification and trading metrics, best epoch by
val Sharpe, tested once, its own row in the report and in MLflow).

Members. Each model named in `members` (its settings are the ensemble's own `tlob`, `cfc`,
`mamba2`, `tft` fields: `--ensemble.tft.hidden 32`), `seeds` times, seeded apart. They share the
fold, the labels (one horizon for all) and the resident data; each has its own optimiser,
schedule and CUDA graph (foxhunt.train.agents.supervised), and every epoch trains each of them
one epoch.

Inference. Before a range is traded every member predicts its class probabilities for every
bar, one after another by default. `parallel="auto"` runs them in parallel on a GPU: the seeds
of one architecture as one batched call (`torch.func.stack_module_state` + `vmap` over their
stacked weights; TFT's LSTM has no vmap rule, so its seeds run one by one), and the
architectures on CUDA streams of their own so that their kernels overlap. On the H200 that was
slower than one after another (the eager forwards are bound by kernel launches, and vmap falls
back to a loop for attention and RMSNorm). `parallel="streams"` puts each member on a CUDA
stream of its own, each replaying its captured forward (a member's `capture` captures its
prediction too); bench/bench_ensemble.py measures the forms against each other.

Combination rules (`rule`):

    mean       the mean of the members' class probabilities
    vote       each member's predicted class is a vote; ties go to the mean's choice
    weighted   a weighted mean, the weights (a softmax, so positive and summing to 1) fitted
               on the val range alone to minimise the mixture's log loss on val's labels
               (`calibrate`, called before val is traded); saved with the checkpoint, so the
               test range is traded with the best epoch's weights, fitted without it

The ensemble trades the combined class like a supervised model does (up long, down short, flat
holds or closes, full size or sized by the combined probability).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from foxhunt.train.agents.common import (
    Capture,
    FlatAdam,
    Precision,
    adam_step,
    on_streams,
    requested_compile,
    resolve_runtime,
)
from foxhunt.train.agents.supervised import (
    SupervisedAgent,
    classification_metrics,
    forecast_size,
    orders,
    sample_bars,
    windows,
)
from foxhunt.train.data import MarketData
from foxhunt.train.env import SIZES, EnvConfig
from foxhunt.train.models.cfc import CfCConfig
from foxhunt.train.models.mamba2 import Mamba2Config
from foxhunt.train.models.tft import TFTConfig
from foxhunt.train.models.tlob import TLOBConfig

__all__ = ["EnsembleAgent", "EnsembleConfig", "acting_net", "combine", "fit_weights"]

MEMBER_CONFIGS = {"tlob": TLOBConfig, "cfc": CfCConfig, "mamba2": Mamba2Config, "tft": TFTConfig}
Rule = Literal["mean", "vote", "weighted"]


@dataclass(frozen=True)
class EnsembleConfig:
    """The ensemble's members and how their forecasts are combined."""

    members: tuple[str, ...] = ("tlob", "cfc", "mamba2", "tft")
    """The supervised models combined (each at the settings of its field below)."""
    seeds: int = 2
    """Members of each model, each with a seed of its own."""
    rule: Rule = "mean"
    """mean of probabilities, majority vote, or weights fitted on val (weighted)."""
    parallel: Literal["auto", "vmap", "streams", "sequential"] = "sequential"
    """sequential: members predict one after another; auto: on a GPU in parallel (vmap over the
    seeds of an architecture, CUDA streams across architectures), on a CPU one after another;
    vmap: vmap over seeds on any device; streams: on a GPU every member on a CUDA stream of its
    own (its captured forward where it has one), on a CPU one after another. Sequential is the
    default: on the H200 (8 members, 100k bars, bench/bench_ensemble.py, 2026-12-02) it took
    19.0 s eager and 16.3 s with the members' forwards captured (evaluation's form), while auto
    did not finish warm-up and three runs in 150 s; streams is to be measured again."""
    flat: Literal["hold", "flat"] = "hold"
    """What a flat combined prediction does: keep the position held, or close it."""
    sizing: Literal["full", "confidence"] = "full"
    """Position size: full, or the combined class's probability mapped onto the env's sizes."""
    tlob: TLOBConfig = field(default_factory=TLOBConfig)
    """TLOB members' settings."""
    cfc: CfCConfig = field(default_factory=CfCConfig)
    """CfC members' settings."""
    mamba2: Mamba2Config = field(default_factory=Mamba2Config)
    """Mamba-2 members' settings."""
    tft: TFTConfig = field(default_factory=TFTConfig)
    """TFT members' settings."""
    precision: Precision = "auto"
    """The members' precision, unless a member's own says otherwise (auto: bf16 on CUDA)."""
    capture: Capture = "auto"
    """The members' CUDA graphs (auto: on CUDA)."""
    compile: bool | None = None
    """The members' torch.compile (default: on with graphs)."""
    compile_mode: Literal["default", "aot"] = "default"
    """"aot": every member's training step compiled ahead of time (foxhunt.train.aot; turns
    compile on), one package per model and settings, which its seeds share. Not with dropout:
    TFT's members need `--ensemble.tft.dropout 0`."""

    def __post_init__(self) -> None:
        # A config read back from JSON (a checkpoint's) holds its members' settings as dicts.
        for name, cls in MEMBER_CONFIGS.items():
            v = getattr(self, name)
            if isinstance(v, dict):
                known = {f.name for f in dataclasses.fields(cls)}
                raw = {k: tuple(x) if isinstance(x, list) else x for k, x in v.items()
                       if k in known}  # fmt: skip
                object.__setattr__(self, name, cls(**raw))
        if not self.members:
            raise ValueError("members = (): name at least one supervised model")
        unknown = [m for m in self.members if m not in MEMBER_CONFIGS]
        if unknown:
            raise ValueError(
                f"members = {self.members}: {unknown} are not supervised models "
                f"({', '.join(MEMBER_CONFIGS)})"
            )
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"members = {self.members}: each model once (seeds repeats it)")
        if self.seeds < 1:
            raise ValueError(f"seeds = {self.seeds}: must be at least 1")
        horizons = {m: getattr(self, m).horizon for m in self.members}
        if len(set(horizons.values())) > 1:
            raise ValueError(
                f"the members' horizons differ ({horizons}): they must forecast the same "
                "labels (set --ensemble.<model>.horizon alike)"
            )

    @property
    def window(self) -> int:
        """The longest member window: what a served ensemble is given."""
        return max(getattr(self, m).window for m in self.members)

    @property
    def horizon(self) -> int:
        return getattr(self, self.members[0]).horizon

    def member_configs(self) -> list[tuple[str, object]]:
        """(model, config) per member, in order: each model's `seeds` members together. The
        ensemble's precision, capture and compile fill a member's left at auto."""
        out = []
        for m in self.members:
            c = getattr(self, m)
            fill = {k: getattr(self, k) for k in ("precision", "capture")
                    if getattr(c, k) == "auto"}  # fmt: skip
            if c.compile is None:
                fill["compile"] = self.compile
            out += [(m, dataclasses.replace(c, **fill))] * self.seeds
        return out

    def resolved(self, device: torch.device) -> EnsembleConfig:
        aot = self.compile_mode == "aot"
        precision, capture, compile_ = resolve_runtime(
            device, self.precision, self.capture, requested_compile(self.compile_mode, self.compile)
        )
        members = {m: (dataclasses.replace(getattr(self, m), compile_mode="aot") if aot
                       else getattr(self, m)).resolved(device) for m in self.members}  # fmt: skip
        return dataclasses.replace(self, precision=precision, capture=capture, compile=compile_,
                                   **members)  # fmt: skip


# ---------------------------------------------------------------------------------- combining
def combine(probs: torch.Tensor, rule: Rule, weights: torch.Tensor | None = None):
    """Combined class probabilities [n, 3] of the members' [K, n, 3]. `vote` returns the vote
    shares (ties broken towards the mean's choice by a small share of the mean)."""
    mean = probs.mean(0)
    if rule == "weighted":
        return torch.einsum("k,knc->nc", weights, probs)
    if rule == "vote":
        votes = nn.functional.one_hot(probs.argmax(-1), 3).float().mean(0)
        return votes + 1e-6 * mean
    return mean


def fit_weights(probs: torch.Tensor, labels: torch.Tensor, steps: int = 200) -> torch.Tensor:
    """Softmax weights [K] of the members minimising the log loss of the weighted mixture of
    their probabilities [K, n, 3] against `labels` [n] (the val range's), by Adam from equal
    weights; deterministic."""
    p = probs.detach().double()
    logits = torch.zeros(p.shape[0], dtype=torch.float64, device=p.device, requires_grad=True)
    # torch.optim.Adam(lr=0.1)'s step, without building a torch optimiser (common.FlatAdam).
    opt = FlatAdam(logits, lr=0.1, eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False,
                   foreach=None, capturable=False)  # fmt: skip
    rows = torch.arange(len(labels), device=p.device)
    for _ in range(steps):
        mix = torch.einsum("k,knc->nc", torch.softmax(logits, 0), p)
        loss = -torch.log(mix[rows, labels].clamp_min(1e-12)).mean()
        logits.grad = None
        loss.backward()
        adam_step(opt, logits)
    return torch.softmax(logits.detach(), 0).float()


def member_probs(agent: SupervisedAgent, out: torch.Tensor) -> torch.Tensor:
    """A member's class probabilities from its network's outputs (its target's reading)."""
    return agent._classes(out.float())[1]


# ---------------------------------------------------------------------------------- agent
class EnsembleAgent:
    """The members (SupervisedAgent each), the combination and the predictions the policy
    reads. Built once per task, reset in place per fold."""

    def __init__(self, cfg: EnsembleConfig, env_cfg: EnvConfig, data: MarketData, seed: int):
        dev = data.device
        self.cfg = cfg = cfg.resolved(dev)
        self.data, self.device = data, dev
        self.members: list[SupervisedAgent] = []
        self.names: list[str] = []
        for i, (m, mc) in enumerate(cfg.member_configs()):
            self.members.append(SupervisedAgent(mc, env_cfg, data, seed * 100 + i))
            self.names.append(f"{m}{i % cfg.seeds}")
        K, n = len(self.members), data.n
        self.combo = torch.full((K,), 1.0 / K, device=dev)  # the weighted rule's weights
        self.pred = torch.full((n,), 1, dtype=torch.long, device=dev)
        self.size = torch.full((n,), len(SIZES) - 1, dtype=torch.long, device=dev)
        self.rounds = 1
        self.groups = self._groups()
        self._kept: tuple | None = None  # (lo, hi, member probabilities) from calibrate

    def _groups(self) -> list[list[int]]:
        """Member indices predicted together: the seeds of one architecture."""
        out: dict[str, list[int]] = {}
        for i, name in enumerate(self.names):
            out.setdefault(name.rstrip("0123456789"), []).append(i)
        return list(out.values())

    @property
    def labels(self) -> torch.Tensor:
        return self.members[0].labels  # one horizon, one threshold rule: the same labels

    # ------------------------------------------------------------------ training
    def capture(self) -> None:
        for a in self.members:
            if a.cfg.capture == "graph":
                a.capture()

    def reset_fold(self, train_lo: int, train_hi: int, seed: int) -> None:
        for i, a in enumerate(self.members):
            a.reset_fold(train_lo, train_hi, seed * 100 + i)
        self.combo.fill_(1.0 / len(self.members))

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        for a in self.members:
            a.begin_epoch(epoch, epochs)

    collects = False  # the samples are the fxcache's bars: no collection phase

    def collect(self) -> None:
        """Nothing to collect: the samples are the fxcache's bars."""

    def learn(self) -> None:
        for a in self.members:
            a.learn()

    def read_stats(self) -> dict[str, float]:
        per = [a.read_stats() for a in self.members]
        out = {k: sum(s[k] for s in per) / len(per) for k in per[0]}
        for name, s in zip(self.names, per, strict=True):
            out[f"losses/{name}_loss"] = s["losses/loss"]
        return out

    # ------------------------------------------------------------------ inference
    def member_predictions(self, lo: int, hi: int) -> torch.Tensor:
        """Every member's class probabilities [K, hi - lo, 3] for the bars of [lo, hi)."""
        out = torch.empty(len(self.members), hi - lo, 3, device=self.device)
        for a in self.members:
            a.net.eval()
        try:
            with torch.inference_mode():
                if self.cfg.parallel == "sequential":
                    for i in range(len(self.members)):
                        self._predict_group([i], lo, hi, out)
                else:
                    self._predict_parallel(lo, hi, out)
        finally:
            for a in self.members:
                a.net.train()
        return out

    def _predict_parallel(self, lo: int, hi: int, out: torch.Tensor) -> None:
        if self.device.type != "cuda":
            for g in self.groups:
                self._predict_group(g, lo, hi, out)
            return
        groups = self.groups
        if self.cfg.parallel == "streams":
            groups = [[i] for i in range(len(self.members))]
        streams = [torch.cuda.Stream(self.device) for _ in groups]
        on_streams(groups, streams, lambda g: self._predict_group(g, lo, hi, out))

    def _predict_group(self, group: list[int], lo: int, hi: int, out: torch.Tensor) -> None:
        """Members of one architecture: one vmapped call over their stacked weights where the
        network allows it (and in parallel mode), else one call each."""
        first = self.members[group[0]]
        wanted = self.cfg.parallel == "vmap" or (
            self.cfg.parallel == "auto" and self.device.type == "cuda"
        )
        batched = len(group) > 1 and wanted and getattr(first.net, "vmap_ok", True)
        if batched:
            params, buffers = torch.func.stack_module_state([self.members[i].net for i in group])
            base = copy.deepcopy(first.net).to("meta")

            def one(p, b, x):
                return torch.func.functional_call(base, (p, b), (x,))

            run = torch.vmap(one, in_dims=(0, 0, None))
        piece = first.predict_batch
        for a in range(lo, hi, piece):
            t = torch.arange(a, min(a + piece, hi), device=self.device)
            if batched:
                with first._autocast():
                    outs = run(params, buffers, windows(self.data, t, first.cfg.window)).float()
            else:  # each member's own forward (its captured graph on a GPU)
                outs = [self.members[i].forward_bars(t) for i in group]
            for j, i in enumerate(group):
                out[i, a - lo : a - lo + len(t)] = member_probs(self.members[i], outs[j])

    def calibrate(self, lo: int, hi: int) -> None:
        """The weighted rule's weights, fitted on [lo, hi) (the val range) alone; the members'
        predictions are kept for `prepare_eval` of the same range."""
        if self.cfg.rule != "weighted":
            return
        probs = self.member_predictions(lo, hi)
        a, b = sample_bars(lo, hi, self.cfg.horizon)
        self.combo.copy_(fit_weights(probs[:, : b - a], self.labels[a:b]))
        self._kept = (lo, hi, probs)

    def prepare_eval(self, lo: int, hi: int) -> None:
        kept, self._kept = self._kept, None
        probs = kept[2] if kept and kept[:2] == (lo, hi) else self.member_predictions(lo, hi)
        p = combine(probs, self.cfg.rule, self.combo)
        self.pred[lo:hi] = p.argmax(-1)
        self.size[lo:hi] = forecast_size(p / p.sum(-1, keepdim=True), self.cfg.sizing)

    def extra_metrics(self, lo: int, hi: int) -> dict[str, float]:
        a, b = sample_bars(lo, hi, self.cfg.horizon)
        out = classification_metrics(self.pred[a:b], self.labels[a:b])
        if self.cfg.rule == "weighted":
            out |= {f"weight_{n}": float(w) for n, w in zip(self.names, self.combo, strict=True)}
        return out

    def greedy(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        return orders(self.pred.index_select(0, t), self.size.index_select(0, t), portfolio,
                      self.cfg.flat)  # fmt: skip

    # ------------------------------------------------------------------ state
    def weights(self) -> dict[str, torch.Tensor]:
        w = {"combo.weights": self.combo}
        for name, a in zip(self.names, self.members, strict=True):
            w |= {f"{name}.{k}": v for k, v in a.weights().items()}
        return w

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, v in self.weights().items():
                v.copy_(weights[k])

    def _each(self, fn_name: str, saved=None):
        out = {}
        for name, a in zip(self.names, self.members, strict=True):
            if saved is None:
                out |= {f"{name}.{k}": v for k, v in getattr(a, fn_name)().items()}
            else:
                mine = {k[len(name) + 1 :]: v for k, v in saved.items()
                        if k.startswith(f"{name}.")}  # fmt: skip
                out[name] = getattr(a, fn_name)(mine)
        return out

    def snapshot(self) -> dict[str, torch.Tensor]:
        return self._each("snapshot") | {"combo.weights": self.combo.clone()}

    def state_mismatch(self, saved: dict[str, torch.Tensor]) -> str | None:
        if "combo.weights" not in saved or saved["combo.weights"].shape != self.combo.shape:
            return f"its combination is not of {len(self.members)} members"
        why = {n: w for n, w in self._each("state_mismatch", saved).items() if w}
        return "; ".join(f"{n}: {w}" for n, w in why.items()) or None

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        self._each("restore", saved)
        self.combo.copy_(saved["combo.weights"].to(self.device))


# ---------------------------------------------------------------------------------- serving
def acting_net(cfg: EnsembleConfig, tensors: dict[str, torch.Tensor]):
    """A checkpoint's ensemble on the CPU: windows [n, cfg.window, 50] -> combined class
    probabilities [n, 3]; each member reads the last `window` bars of its own."""
    from foxhunt.train.agents.supervised import acting_net as member_net

    nets = []
    for i, (m, mc) in enumerate(cfg.member_configs()):
        name = f"{m}{i % cfg.seeds}"
        mine = {k[len(name) + 1 :]: v for k, v in tensors.items() if k.startswith(f"{name}.")}
        nets.append((mc.window, member_net(mc, mine)))
    combo = tensors["combo.weights"]

    def predict(x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([net(x[:, x.shape[1] - w :]) for w, net in nets])
        p = combine(probs, cfg.rule, combo)
        return p / p.sum(-1, keepdim=True)

    return predict
