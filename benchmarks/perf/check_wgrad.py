"""Check the kit's torch-only fused weight-gradient accumulation against a plain fp32 GEMM."""

import torch

from kit.engines.megatron.speed import WgradAccumulation


def main() -> None:
    torch.manual_seed(0)
    for tokens, n_in, n_out in ((8192, 2048, 6144), (8192, 8192, 2048), (4096, 2048, 50304)):
        x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16)
        acc = torch.randn(n_out, n_in, device="cuda", dtype=torch.float32)
        want = acc + g.float().t() @ x.float()
        WgradAccumulation.wgrad_gemm_accum_fp32(x, g, acc)
        err = ((acc - want).abs().max() / want.abs().max()).item()
        print(f"wgrad accum fp32 [{tokens}x{n_in}] -> [{n_out}x{n_in}]: max rel err {err:.2e}")
        assert err < 1e-2, err


if __name__ == "__main__":
    main()
