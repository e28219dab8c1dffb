"""foxhunt's Triton kernels on the CPU, in Triton's interpreter (`TRITON_INTERPRET=1`, a fresh
process each check: the flag is read as the kernels are defined). Skipped where Triton is not
installed (torch's CPU builds ship without it: CI); `make test-kernels` installs it into
.triton/ and runs them. Their GPU tests (`-m gpu`) run them compiled.

C51's kernels (foxhunt.train.agents.c51_triton) against `dqn.c51_next_target` in float32: the
one-kernel target given the dueling streams, and the choice and projection given the advantage
hidden layers (dqn.ADV_IN_TARGET) from the GPU's network form. The interpreter rounds bf16 by
truncation and its bf16 `tl.dot` is wrong (triton 3.9), so bf16 is checked on a GPU
(tests/test_train_gpu.py); here the kernels' rounding path runs on bf16 values held in float32
against a reference that truncates as the interpreter does.

The replay's prefix scans (foxhunt.train.scan's three kernels) against torch's sequential ones
by their GPU test's check (tests/test_scan.py), at small rows so that the sizes cross a row and
a block of rows' totals."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)"
)

CHECK = """
import torch
import torch.nn.functional as F
from foxhunt.train.agents import c51_triton as ct, dqn

torch.manual_seed(0)
cfg = dqn.DQNConfig(hidden=(64, 32), head_hidden={head_hidden}, atoms={atoms}, noisy=True,
                    dense_inputs=True)
nets = [dqn.QNet(cfg, align=8, fold_mean=True, noisy_weights=True, fused_relu=True)
        for _ in range(2)]
for net in nets:
    net.adv_in_target = True
    net.reset_noise()
B, N = 80, cfg.atoms
s2 = torch.randn(B, dqn.IN_DIM)
R, disc, z = torch.randn(B), torch.full((B, 1), 0.97), torch.linspace(-3, 3, N)
with torch.no_grad():
    hidden = [net(s2, parts="hidden") for net in nets]
    streams = [net(s2, parts=True) for net in nets]
    logits = [net(s2) for net in nets]
want, want_clip = dqn.c51_next_target(*logits, R, disc, z)
ct.register()
for name, parts in (("streams", streams), ("hidden", hidden)):
    got, clip = ct._target_op(*(t for v, a in parts for t in (v, a)), R, disc.reshape(-1), z) \\
        if name == "streams" else ct._from_hidden(*parts, R, disc, z)
    assert len(parts[0]) == (2 if name == "streams" else 4)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=name)
    torch.testing.assert_close(clip, want_clip, rtol=0, atol=1e-6, msg=name)

# The choice's rounding (ROUND): bf16 values in float32, against the same logits rounded by
# truncation, as the interpreter's bf16 cast rounds.
def trunc(x):
    return (x.contiguous().view(torch.int32) & -65536).view(torch.float32)
bf = [[trunc(t.float()) for t in p] for p in hidden]
def rounded(v, h, w, b):
    a = trunc(F.linear(h, w) + b).view(B, -1, N)
    return trunc(v + a)
want, want_clip = dqn.c51_next_target(*(rounded(*p) for p in bf), R, disc, z)
o, t = bf
BH, BN = max(16, 1 << (o[1].shape[1] - 1).bit_length()), 1 << (N - 1).bit_length()
p = torch.zeros(B, BN)
ct._choice_kernel[(2,)](o[0], o[1], o[2], o[3], t[0], t[1], t[2], t[3], z, p, B,
                        o[2].shape[0] // N, N, o[1].shape[1], o[0].stride(0), o[0].stride(2),
                        o[1].stride(0), t[0].stride(0), t[0].stride(2), t[1].stride(0),
                        BM=64, BLOCK_H=BH, BLOCK_N=BN, ROUND=True)
got, clip = torch.zeros(B, 1, N), torch.zeros(B, 1)
ct._projection_kernel[(B,)](p, R, disc.reshape(-1), z, got, clip, N, BLOCK_N=BN)
torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg="rounded")
torch.testing.assert_close(clip, want_clip, rtol=0, atol=1e-6, msg="rounded")
print("ok")
"""


SCAN = """
from foxhunt.train import scan
from test_scan import check_row_scans

scan.ROW = {row}
check_row_scans(lambda x, prod: scan._scan(x, prod), scan.ROW)
print("ok")
"""


def interpreted(code: str) -> None:
    """Run `code` in a fresh Python with Triton's interpreter on; it prints "ok" at its end."""
    root = Path(__file__).resolve().parents[1]
    dirs = (str(root / "src"), str(root / "tests"), os.environ.get("PYTHONPATH"))  # test helpers
    path = os.pathsep.join(p for p in dirs if p)
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": path}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]


@pytest.mark.parametrize(
    "head_hidden, atoms", [(32, 51), (48, 21)], ids=["default-widths", "masked-widths"]
)
def test_c51_kernels_in_the_interpreter_give_the_torch_target(head_hidden, atoms):
    """The second case leaves part of each block masked: a hidden width (48) below its block
    (64) and atoms (21) below theirs (32)."""
    interpreted(CHECK.replace("{head_hidden}", str(head_hidden)).replace("{atoms}", str(atoms)))


@pytest.mark.parametrize("row", [8, 16])
def test_the_scan_kernels_in_the_interpreter_give_the_sequential_scans(row):
    interpreted(SCAN.replace("{row}", str(row)))
