"""C51's next-state target given the advantage hidden layers (`dqn.ADV_IN_TARGET`) against the
learning step's form given the advantage layers' outputs, at the standard workload's batch.

    python3 bench/bench_c51_fused_adv.py          on a CUDA device with Triton

The step's form: each network's advantage layer ([8192, 128] x [128, 1530], the dueling mean
out of its weights, padded to 1536) writes [8192, 30, 51] bf16 (25 MB a network), and
foxhunt.train.agents.c51_triton's one-kernel target reads both to choose the action (double Q)
and project the target's distribution of it. Of the target network's 30 actions it reads one.
In a learning step the two products took ~13.6 us each and the kernel ~48 us (gpu-step.md).

Given the hidden layers (c51_triton.next_target given `QNet(..., parts="hidden")`'s parts):
`_choice_kernel` reads each network's advantage hidden layer [8192, 128], value logits
[8192, 51] and advantage layer (bf16 weights [1530, 128] and bias, the mean out), and for a
block of samples a program forms each action's logits with tl.dot in registers, rounded as the
product and the streams' sum round theirs: the online network's expected value under the
support (the choice, the first of equal maxima as torch's argmax) and the target network's
logits, kept for the action chosen so far. It writes the chosen action's probabilities
[8192, 64]; `_projection_kernel` projects them. Neither network's [8192, 30, 51] outputs are
written; the target network's logits are formed for all 30 actions (tensor-core work, ~4 GFLOP
a step for both networks) rather than gathered per sample.

Prints the microseconds a call (foxhunt.bench.graphs.per_call_us: inside a CUDA graph, the
median of 10 replays) of both forms, each with its preparation of both networks' weights (the
mean out, the cast to bf16), the hidden form at each block of samples and warps a program
(`c51_triton.HIDDEN_BLOCK`, `HIDDEN_WARPS`), with the largest difference of its target from the
step's form's and the share of samples off by more than 1e-2 (a choice made otherwise on a near
tie, where the two forms' products sum in another order).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.graphs import per_call_us
from foxhunt.train.agents import c51_triton as ct
from foxhunt.train.agents.dqn import centred

B, H, A, N = 8192, 128, 30, 51


def main() -> None:
    if not ct.available():
        sys.exit("bench_c51_fused_adv needs a CUDA device and Triton")
    ct.register()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    nets = ("online", "target")
    # The head's output [B, 256] (value hidden | advantage hidden) and the value logits padded
    # to 56, as QNet's forward leaves them; the advantage layer's weights and bias.
    head = {k: torch.randn(B, 2 * H, device=dev, dtype=torch.bfloat16) for k in nets}
    value = {k: torch.randn(B, 56, device=dev, dtype=torch.bfloat16) for k in nets}
    W = {k: torch.randn(A * N, H, device=dev) * 0.1 for k in nets}
    bias = {k: torch.randn(A * N, device=dev) * 0.1 for k in nets}
    R = torch.randn(B, device=dev) * 0.5
    disc = torch.full((B, 1), 0.99**3, device=dev)
    z = torch.linspace(-10, 10, N, device=dev)

    def outputs():
        parts = []
        for k in nets:
            wc, bc = centred(W[k], bias[k], A)
            wc = F.pad(wc.reshape(A * N, H), (0, 0, 0, 6)).to(torch.bfloat16)
            y = F.linear(head[k][:, H:], wc, F.pad(bc.reshape(-1), (0, 6)).to(torch.bfloat16))
            parts.append((value[k][:, None, :N], y[:, : A * N].view(B, A, N)))
        return ct.next_target(parts[0], parts[1], R, disc, z)

    def hidden():
        parts = []
        for k in nets:
            wc, bc = (t.to(torch.bfloat16) for t in centred(W[k], bias[k], A))
            parts.append((value[k][:, None, :N], head[k][:, H:], wc.view(A * N, H), bc.view(-1)))
        return ct.next_target(parts[0], parts[1], R, disc, z)

    ref, _ = outputs()
    print(f"given the advantage outputs (two products, the one-kernel target): "
          f"{per_call_us(outputs):6.1f} us")  # fmt: skip
    for bm in (32, 64, 128):
        for warps in (4, 8):
            ct.HIDDEN_BLOCK, ct.HIDDEN_WARPS = bm, warps
            try:
                out, _ = hidden()
                t = per_call_us(hidden)
            except Exception as e:  # a block too large for the registers, say
                print(f"given the hidden layers, {bm} samples and {warps} warps a program: "
                      f"failed ({e!r:.120})")  # fmt: skip
                continue
            d = (out - ref).abs()[:, 0]
            off = (d.amax(1) > 1e-2).float().mean()
            print(f"given the hidden layers, {bm} samples and {warps} warps a program: {t:6.1f} us "
                  f"(largest difference {d.max().item():.1e}; {off:.2%} of the samples off by "
                  "more than 1e-2)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
