"""K Rainbow DQN agents of one configuration trained as one: seeds side by side in wide kernels.

At the demo's sizes one agent's learning step is ~120 kernels of a few microseconds each, and
a GPU runs them far below its width; K agents on CUDA streams overlap them only in part
(foxhunt.train.cohort). Here the K agents' tensors are stacked along a new first dimension and
every collection step and learning step runs the single agent's own code
(`RainbowAgent._collect_act`, `RainbowAgent._loss`) once under `torch.func.vmap`, compiled as
the lone agent's is (C51's Triton target through its vmap rule: the K agents' samples as one
batch): about as many kernels as one agent, each K times wider. On an H100 at the demo's sizes,
compiled and captured, 8 stacked agents train an epoch in 1.74x one agent's time (1.78x
with noisy nets; 2026-12-05, docs/performance.md, "Many agents on one GPU").

Each agent stays a whole `RainbowAgent`: its weights, Adam moments, replay, envs and statistics
become views of the stacked tensors, so its evaluation, checkpoints, resume files and
`reset_fold` work as before; it keeps its own Adam step count (copied in and out around each
stacked `learn`), so it can also train on its own between stacked epochs (`foxhunt train
--seeds` does when some seeds stop early). Every random number still comes from each agent's
own generator, drawn per agent outside the vmapped code. What one agent computes alone is what
it computes here, bit for bit on a CPU at one thread, for C51 (tests/test_cohort.py: there
the clipping norm is taken agent by agent, so that no sum runs in another order; `mean`'s
one-wide value layer runs another CPU kernel batched, and its last bits differ). On a GPU the
wider kernels sum in other orders, the clipping norms are one reduction, and the replays are
sampled by one scan over all of them (`sample_rows`): equal to a lone agent's to float
tolerance (tests/test_train_gpu.py).

The agents share one configuration (their seeds differ) and train one fold at a time, and so
the C51 support and the envs' range, which those decide alike for all. With noisy nets, the
banks of a block's noise samples are stacked like the rest: each agent draws its block into its
own row from its own generator, as it would alone, f runs once over all of them, and each step
copies every agent's row in one kernel. IQN draws its quantile fractions inside the code
this vmaps and is not stacked (`stackable` says why; `foxhunt train --seeds` then trains such
agents on streams).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch.func import functional_call, vmap

from foxhunt.train import scan
from foxhunt.train.agents import dqn
from foxhunt.train.agents.common import (
    COMBO_NO_REORDER,
    adam_step,
    capture_restoring,
    compiled,
    view_params,
)
from foxhunt.train.agents.dqn import (
    NoisyLinear,
    RainbowAgent,
    Replay,
    factorise_,
    importance_weights,
    next_noise_row_,
)
from foxhunt.train.env import TradingEnv

# A RainbowAgent's tensors that differ between agents, stacked (attribute paths) ...
STACKED = (
    "replay.fbuf", "replay.ibuf", "replay.prio", "replay.ptr", "replay.max_prio",
    "env.t", "env.pos", "env.entry", "env.hold", "env.steps",
    "h_i", "h_s", "h_d", "h_v", "u_collect", "stats", "collect_sums", "eps",
    "replay.beta",
)  # fmt: skip
# ... with noisy nets, the banks of a block's noise samples (RainbowAgent._noise_banks) ...
NOISE_BANKS = ("collect_noise", "learn_noise")
# ... and those one configuration and one fold make the same for all: one tensor, shared.
SHARED = ("z", "env.lo", "env.hi", "env.episode_bars")
COMPILED_GRAD_GATHER = True
"""The stacked learning step's gradient taken with `torch.autograd.grad` and gathered into the
stacked rows by one compiled function (where the stack is compiled), rather than accumulated
into each parameter's `.grad` and concatenated. Under vmap the backward hands the weights'
gradients over transposed (each layer's [K, out, in] with its inner dimensions swapped), which
autograd's accumulation copies to the parameters' layout one kernel a layer before the
concatenation copies them again (8 layers with noisy nets). The same numbers either way
(tests/test_cohort.py); on a GPU the gather saves 8.6 ms of 8 noisy agents' 106.5 ms epoch
(`bench_cohort.py --sizes demo --compile --forms stacked --set noisy=true epsilon=0`, H100,
2026-12-05; `--no-compiled-grad-gather` turns it off)."""


def stackable(agents: Sequence) -> str | None:
    """Why `agents` cannot be stacked, or None."""
    if not agents or not all(type(a) is RainbowAgent for a in agents):
        return "stacking is for Rainbow DQN agents"
    cfg = agents[0].cfg
    if any(a.cfg != cfg for a in agents):
        return "the agents' configurations differ (only their seeds may)"
    if cfg.distribution == "iqn":
        return "IQN draws its quantile fractions inside the step"
    if cfg.compile and cfg.compile_mode == "aot":
        return "each agent runs the steps compiled ahead of time for a lone agent"
    if any(a.data is not agents[0].data for a in agents):
        return "the agents must share one MarketData"
    if any(a.graphs for a in agents):
        return "an agent already captured its own graphs (stack before capturing)"
    return None


def _get(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def _set(obj, path: str, value) -> None:
    *head, last = path.split(".")
    setattr(_get(obj, ".".join(head)) if head else obj, last, value)


ROW_ALIGN = 64
"""Elements a stacked row's width is rounded up to (256 bytes of float32): every agent's row
then starts where a lone agent's own buffer would, at an aligned address. Inductor's kernels
assume the alignment their inputs had when compiled, and each agent's evaluation step,
compiled from the same code, reads its own row's weights: with rows P = 160,493 wide (the
demo's network), agent 1's started 4 bytes past the alignment and its compiled evaluation
faulted with a misaligned address (H200, 2026-12-04)."""


def _stack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """[K, P'] with rows[k] (each [P]) in row k's first P columns and zeros after, P' the
    width rounded up to ROW_ALIGN."""
    P = rows[0].numel()
    big = rows[0].new_zeros(len(rows), -(-P // ROW_ALIGN) * ROW_ALIGN)
    big[:, :P] = torch.stack(rows)
    return big


def _stack_aligned(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack(tensors), each one's row starting as `_stack_rows`'s: a [K, ...] view of
    a [K, P'] buffer (for module buffers, which compiled code takes as static inputs, their
    alignment unchecked at run time)."""
    x = tensors[0]
    return _stack_rows([t.reshape(-1) for t in tensors])[:, : x.numel()].view(-1, *x.shape)


def _restack_flat(flats: list[torch.Tensor], modules: list[torch.nn.Module]) -> torch.Tensor:
    """Stack the agents' flat parameter buffers into one [K, P'] leaf (`_stack_rows`) and make
    each agent's buffer the first P columns of row k, and its module's parameters views of
    that row again."""
    P = flats[0].numel()
    big = _stack_rows([f.detach() for f in flats]).requires_grad_()
    for k, (flat, net) in enumerate(zip(flats, modules, strict=True)):
        flat.data = big.detach()[k, :P]
        view_params(list(net.parameters()), flat)
    return big


def _stacked_params(net: torch.nn.Module, big: torch.Tensor, grad: bool) -> dict:
    """`net`'s parameters as the stack holds them: name -> [K, *shape], views of the stacked
    [K, P] buffer `big`; with `grad`, leaves that collect their own gradients (as a lone
    agent's parameters do, so that no backward pass writes [K, P] zeros once a parameter)."""
    out, off = {}, 0
    for name, p in net.named_parameters():
        v = big.detach()[:, off : off + p.numel()].view(big.shape[0], *p.shape)
        out[name] = v.requires_grad_() if grad else v
        off += p.numel()
    return out


def _stack_noise(agents: list, rows: int | None) -> tuple[dict, dict, torch.Tensor]:
    """The agents' noise buffers stacked: each agent's `noise_now` (its online and target
    networks' shared samples, RainbowAgent._noise_banks) becomes row k of one [K, N] view,
    and the names functional_call knows the layers' buffers by map to its columns, name ->
    [K, ...], for the online network and the target. With `rows`, the online network's per-row
    buffers too (allocated at that many envs), each agent's a view of its row. Returns those
    two name maps and the stacked samples."""
    # Rows aligned as each agent's own buffer (ROW_ALIGN): its noisy layers' buffers are views.
    flat = _stack_aligned([a.noise_now for a in agents])
    n_net = agents[0].net.noise_buffer().numel()
    for k, a in enumerate(agents):
        a.noise_now = flat[k]
        a.net.view_noise(flat[k, :n_net])
        a.target.view_noise(flat[k, n_net:])
    maps, off = [], 0
    for which in ("net", "target"):
        out = {}
        for name, m in getattr(agents[0], which).named_modules():
            if isinstance(m, NoisyLinear):
                for buf in ("eps_in", "eps_out"):
                    n = getattr(m, buf).numel()
                    out[f"{name}.{buf}"] = flat[:, off : off + n]
                    off += n
        maps.append(out)
    if rows is not None:
        layers = [[(n, m) for n, m in a.net.named_modules() if isinstance(m, NoisyLinear)]
                  for a in agents]  # fmt: skip
        for i, (name, _) in enumerate(layers[0]):
            mods = [per[i][1] for per in layers]
            for m in mods:
                m.row_noise(rows)
            for buf in ("row_in", "row_out"):
                big = _stack_aligned([getattr(m, buf) for m in mods])
                for k, m in enumerate(mods):
                    setattr(m, buf, big[k])
                maps[0][f"{name}.{buf}"] = big
    return maps[0], maps[1], flat


def _bind(net: torch.nn.Module, params: dict):
    """`net` called with `params` (one agent's, under vmap)."""

    def call(*args, **kwargs):
        return functional_call(net, params, args, kwargs)

    return call


def sample_rows(prio: torch.Tensor, u: torch.Tensor, beta: torch.Tensor, points=None,
                slots=None):  # fmt: skip
    """`Replay.sample` for K replays at once: prio [K, C] (each row a replay's p^alpha), u
    [K, B] uniform, beta [K]. A batched scan of K rows as long as a replay runs a row per
    thread block on a GPU, far slower than one long scan; so one scan runs over the rows end
    to end, and each row's stratified points are placed in its own stretch of it. The float64
    sums then carry the earlier rows' totals, which moves a point against a row's own
    cumulative sum by a few units of the last place: a slot other than `Replay.sample`'s only
    for a point that close to a slot's edge. Returns the slots [K, B] (row-local) and the
    importance weights [K, B].

    The scan is foxhunt.train.scan's (the same every run on a GPU, where torch's, CUB's, is
    not) and the search torch's; the work around them is `points` and `slots`
    (`sample_points`, `sampled_slots`, or their compiled forms: a kernel each rather than some
    twenty small ones)."""
    cdf = scan.cumsum(prio.reshape(-1), torch.float64)
    x = (points or sample_points)(cdf, u)
    at = torch.searchsorted(cdf, x.reshape(-1), right=True)
    return (slots or sampled_slots)(at, prio, beta)


def sample_points(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Row k's B stratified points inside its stretch of the scan `cdf` ([K * C]), [K, B]."""
    K, B = u.shape
    end = cdf.view(K, -1)[:, -1]
    start = torch.cat([end.new_zeros(1), end[:-1]])
    frac = (torch.arange(B, device=u.device, dtype=torch.float64) + u.double()) / B
    return start[:, None] + frac * (end - start)[:, None]


def sampled_slots(at: torch.Tensor, prio: torch.Tensor, beta: torch.Tensor):
    """The search's positions in the scan `at` ([K * B]) as each row's slots, and their
    importance weights."""
    K, C = prio.shape
    at = at.view(K, -1)
    idx = (at - torch.arange(K, device=at.device)[:, None] * C).clamp(0, C - 1)
    p = prio.gather(1, idx).float()
    return idx, importance_weights(p, p.amin(1, keepdim=True), beta[:, None])


def _view_init(self, names, base, over) -> None:
    for name in names:
        setattr(self, name, over[name] if name in over else getattr(base, name))


# Objects of an agent's class (and of its replay's, its env's) that hold another's attributes,
# some replaced: what `_proxy` builds inside the vmapped step. A constructor rather than
# copy.copy, which torch.compile does not trace (torch 2.11): a graph break inside vmap's body
# makes the whole step run uncompiled.
_VIEWS = {
    c: type(f"{c.__name__}View", (c,), {"__init__": _view_init})
    for c in (RainbowAgent, Replay, TradingEnv)
}


def _view(cls, base, names: tuple[str, ...], over: dict):
    return _VIEWS[cls](names, base, over)


class StackedRainbow:
    """The agents of a cohort (foxhunt.train.cohort) as one: `collect()` and `learn()` train
    all of them; everything else (folds, epochs, statistics, evaluation) stays per agent."""

    collects = True

    def __init__(self, agents: Sequence[RainbowAgent]):
        why = stackable(agents)
        if why is not None:
            raise ValueError(f"cannot stack these agents: {why}")
        self.agents = list(agents)
        a0 = self.agents[0]
        self.cfg, self.device = a0.cfg, a0.device
        # vmap has no rule for the ReLU fused into a product (QNet.fused_relu): the agents run
        # the plain form from here on, alone too (the same function, rounded as the stack's).
        # Nor has C51's target given the advantage hidden layers (dqn.ADV_IN_TARGET).
        for a in self.agents:
            a.net.fused_relu = a.target.fused_relu = False
            a.net.adv_in_target = a.target.adv_in_target = False
        self.rounds = a0.rounds
        self.t: dict[str, torch.Tensor] = {}
        for path in STACKED + (NOISE_BANKS if a0.cfg.noisy else ()):
            if _get(a0, path) is None:  # per-env noise: no bank of collection samples
                continue
            big = torch.stack([_get(a, path) for a in self.agents])
            for k, a in enumerate(self.agents):
                _set(a, path, big[k])
            self.t[path] = big
        for path in SHARED:
            for a in self.agents[1:]:
                _set(a, path, _get(a0, path))
        self.W = _restack_flat([a.flat for a in self.agents], [a.net for a in self.agents])
        self.T = _restack_flat([a.target_flat for a in self.agents],
                               [a.target for a in self.agents]).detach()  # fmt: skip
        # One Adam over the stacked weights: elementwise, so row k steps as agent k's own
        # would. The agents' moments become views of its moments; each keeps its own step
        # count (an agent may train alone, `_drive`), copied in and out around `learn`.
        self.P = _stacked_params(a0.net, self.W, grad=True)
        self.TP = _stacked_params(a0.target, self.T, grad=False)
        self.P_acting = {n: p.detach() for n, p in self.P.items()}  # collection needs no grad
        # Noisy nets: the noise buffers, stacked; each agent draws into its row as alone.
        self.NB, self.TB, self.noise = _stack_noise(self.agents, self.cfg.envs) \
            if a0.cfg.noisy else ({}, {}, None)  # fmt: skip
        self.learn_i = a0.learn_i  # the stack's learning steps advance agent 0's row
        self.opt = torch.optim.Adam([self.W], **{
            k: a0.opt.defaults[k] for k in ("lr", "eps", "weight_decay", "decoupled_weight_decay",
                                            "capturable", "foreach")})  # fmt: skip
        self.own_opt = [a.opt.state[a.flat] for a in self.agents]
        self.opt.state[self.W] = {
            key: (_stack_rows([st[key] for st in self.own_opt]) if key != "step" else
                  self.own_opt[0][key].clone())
            for key in self.own_opt[0]
        }  # fmt: skip
        self.n_params = P = a0.flat.numel()  # the rows' columns past P are zeros, and stay so
        # ... their gradient: zeros, made once (each step's gradient is these concatenated to
        # the parameters' own).
        self._grad_pad = self.W.new_zeros(len(self.agents), self.W.shape[1] - P)
        for k, (a, st) in enumerate(zip(self.agents, self.own_opt, strict=True)):
            for key, v in self.opt.state[self.W].items():
                if key != "step":
                    st[key] = v[k, :P]
            a._reset_lists = None  # reset_fold's cached tensors were the old ones
        # The attributes a view of agent 0 copies (`_proxy`), named here once.
        self.names = {"": tuple(vars(a0)), "replay": tuple(vars(a0.replay)),
                      "env": tuple(vars(a0.env))}  # fmt: skip
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.step_marks: list | None = None  # the benchmark's (common.mark_step)
        # Each learning step's uniform draws, row k agent k's (drawn in place: no stack).
        self.u_learn = torch.empty(len(self.agents), self.cfg.batch_size, device=self.device)
        combo = self.device.type == "cuda" and dqn.COMBO_KERNELS
        jit = functools.partial(compiled, options=COMBO_NO_REORDER if combo else None)
        self._loss_fn = jit(self._losses) if self.cfg.compile else self._losses
        self._update = jit(self._update_record) if self.cfg.compile else self._update_record
        self._collect_fn = jit(self._collect_all) if self.cfg.compile else self._collect_all
        self._sample_parts = (jit(sample_points), jit(sampled_slots)) if self.cfg.compile else ()
        self._gather = jit(self._gather_rows) if self.cfg.compile else self._gather_rows

    def __len__(self) -> int:
        return len(self.agents)

    # ------------------------------------------------------------------ one agent's view
    def _proxy(self, tensors: dict[str, torch.Tensor], params: dict | None = None,
               target: dict | None = None) -> RainbowAgent:  # fmt: skip
        """Agent 0 with its per-agent tensors replaced by `tensors` (attribute path -> tensor)
        and its networks reading `params` and `target`: what the single agent's code runs on,
        under vmap one agent's slice of the stack."""
        a0 = self.agents[0]
        over: dict[str, dict] = {"": {}, "replay": {}, "env": {}}
        for path, v in tensors.items():
            head, _, name = path.rpartition(".")
            over[head][name] = v
        if params is not None:
            over[""]["net"] = _bind(a0.net, params)
        if target is not None:
            over[""]["target"] = _bind(a0.target, target)
        over[""]["replay"] = _view(Replay, a0.replay, self.names["replay"], over["replay"])
        over[""]["env"] = _view(TradingEnv, a0.env, self.names["env"], over["env"])
        return _view(RainbowAgent, a0, self.names[""], over[""])

    # ------------------------------------------------------------------ collect
    def _collect_one(self, tensors: dict, params: dict, u: torch.Tensor,
                     noise: bool | str = True) -> torch.Tensor:  # fmt: skip
        RainbowAgent._collect_act(self._proxy(tensors, params), u, noise)
        return u.new_zeros(())  # vmap wants an output; the step's are in place

    def _collect_all(self, st: dict, params: dict, u: torch.Tensor, noise: bool | str) -> None:
        """Every agent's collection step: the lone agent's `_collect_act` under vmap."""
        vmap(functools.partial(self._collect_one, noise=noise))(st, params, u)

    def _collect_steps(self, steps: range) -> None:
        st = {p: v for p, v in self.t.items() if p not in ("u_collect", *NOISE_BANKS)}
        u, bank = self.t["u_collect"], self.t.get("collect_noise")
        for k in steps:
            noise = True
            if bank is not None:  # every agent's shared sample k, in one copy
                self.noise[:, : bank.shape[2]].copy_(bank[:, k])
            elif self.noise is not None:
                for a in self.agents:  # per-env noise: each agent draws as it would alone
                    noise = a._collect_noise(k)
            self._collect_fn(st, self.P_acting | self.NB, u[:, k], noise)

    def _collect_block(self) -> None:
        self._collect_steps(range(self.cfg.collect_steps))

    def collect(self) -> None:
        for a in self.agents:  # each agent's draws from its own generator, as alone
            a._draw_collect(factorise=False)
        if "collect_noise" in self.t:
            factorise_(self.t["collect_noise"])  # f of every agent's samples, as each alone
        if "collect" in self.graphs:
            self.graphs["collect"].replay()
        else:
            self._collect_block()

    # ------------------------------------------------------------------ learn
    def _sample(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each agent's proportional sample of its replay: on a CPU the lone agent's own
        `Replay.sample` under vmap (the same numbers), on a GPU `sample_rows` (one scan)."""
        prio = self.t["replay.prio"]
        if self.device.type == "cuda":
            return sample_rows(prio, u, self.t["replay.beta"], *self._sample_parts)
        return vmap(self._sample_one)(prio, self.t["replay.beta"], u)

    def _sample_one(self, prio, beta, u):
        return self._proxy({"replay.prio": prio, "replay.beta": beta}).replay.sample(u)

    def _loss_one(self, params, target, fbuf, ibuf, idx, w):
        """One agent's loss (`RainbowAgent._loss`) on its slice."""
        p = self._proxy({"replay.fbuf": fbuf, "replay.ibuf": ibuf}, params, target)
        loss, per, q_taken, cql, clipped = RainbowAgent._loss(p, idx, w)
        return loss, per, torch.stack([loss.detach(), q_taken, cql, clipped])

    def _losses(self, idx: torch.Tensor, w: torch.Tensor):
        """Every agent's loss, [K], and what the step records. Each loss reads only its own
        row of the weights, so the gradient of their sum is each agent's own, row by row."""
        t = self.t
        return vmap(self._loss_one)(self.P | self.NB, self.TP | self.TB, t["replay.fbuf"],
                                    t["replay.ibuf"], idx, w)  # fmt: skip

    def _record_one(self, prio, max_prio, stats, idx, per, aux, gn) -> torch.Tensor:
        """One agent's `RainbowAgent._record` on its slice."""
        p = self._proxy({"replay.prio": prio, "replay.max_prio": max_prio, "stats": stats})
        loss, q_taken, cql, clipped = aux.unbind()
        RainbowAgent._record(p, idx, per, loss, gn, q_taken, cql, clipped)
        return gn.new_zeros(())

    def _update_all(self, g: torch.Tensor) -> torch.Tensor:
        """Each agent's gradient clipped to its own norm (on a CPU each row's norm on its own,
        summed in the order the lone agent's is; on a GPU one reduction over all rows, equal
        to float tolerance), one Adam step over the stack, the soft target update. Returns the
        norms before clipping, [K]."""
        rows = g[:, : self.n_params]
        if self.device.type == "cuda":  # one reduction over the rows; its sums' order is its own
            gn = torch.linalg.vector_norm(rows, dim=1)
        else:  # bit for bit the lone agents' norms
            gn = torch.stack([torch.linalg.vector_norm(row) for row in rows])
        g.mul_((self.cfg.grad_clip / (gn + 1e-6)).clamp(max=1.0)[:, None])
        adam_step(self.opt, self.W)
        with torch.no_grad():
            self.T.lerp_(self.W.detach(), self.cfg.tau)
        return gn

    def _update_record(self, g, idx, per, aux) -> None:
        """`_update_all`, then each agent's new priorities and statistics (`_record_one`), in
        one compiled function, as `RainbowAgent._step_update`."""
        gn = self._update_all(g)
        with torch.no_grad():
            t = self.t
            vmap(self._record_one)(t["replay.prio"], t["replay.max_prio"], t["stats"], idx, per,
                                   aux, gn)  # fmt: skip

    def _learn_step(self) -> None:
        if self.cfg.noisy:  # each agent's row of its block's samples (RainbowAgent._learn_step)
            next_noise_row_(self.noise, self.t["learn_noise"], self.learn_i,
                            self.cfg.learn_steps, dim=1)  # fmt: skip
        u = self.u_learn
        for k, a in enumerate(self.agents):  # each agent's draws, as in its own learning step
            torch.rand(u.shape[1], device=self.device, generator=a.gen, out=u[k])
        idx, w = self._sample(u)
        loss, per, aux = self._loss_fn(idx, w)
        if COMPILED_GRAD_GATHER:  # the gradients as the backward hands them over, gathered once
            self.W.grad = self._gather(torch.autograd.grad(loss.sum(), list(self.P.values())))
        else:
            for p in self.P.values():  # backward hands over fresh gradient buffers
                p.grad = None
            loss.sum().backward()
            self.W.grad = self._gather_rows([p.grad for p in self.P.values()])
        self._update(self.W.grad, idx, per, aux)

    def _gather_rows(self, grads) -> torch.Tensor:
        """The parameters' gradients ([K, *shape] each) as the stacked rows [K, P'], the
        columns past the parameters zeros."""
        K = len(self.agents)
        return torch.cat([*(g.reshape(K, -1) for g in grads), self._grad_pad], 1)

    def _draw_learn(self) -> None:
        """Each agent's noise samples of the block, from its own generator (its own
        `_draw_learn`, which also rewinds agent 0's row counter, the stack's), f over all of
        them at once."""
        for a in self.agents:
            a._draw_learn(factorise=False)
        if "learn_noise" in self.t:
            factorise_(self.t["learn_noise"])

    def learn(self) -> None:
        """The learning steps of every agent, which must stand at the same Adam step (the same
        epoch of the same fold: `_drive` stacks only such epochs)."""
        step = self.opt.state[self.W]["step"]
        step.copy_(self.own_opt[0]["step"])
        RainbowAgent.learn(self)  # the lone agent's loop, over the stack's graph or step
        for st in self.own_opt:
            st["step"].copy_(step)

    # ------------------------------------------------------------------ capture
    def capture(self) -> None:
        """The stacked collection block and learning step as CUDA graphs, every agent's state
        and generator restored after the warm-up (as `RainbowAgent.capture`)."""

        def warmup():
            for _ in range(3):
                self._learn_step()
            self._collect_steps(range(1))

        blocks = {"learn": self._learn_step, "collect": self._collect_block}
        self.graphs.update(capture_restoring(self.agents, warmup, blocks))
