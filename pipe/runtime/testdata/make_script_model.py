"""Writes the TorchScript files of layer_list_test: make_script_model.py SEQ_OUT FLAT_OUT.

SEQ_OUT: a scripted torch.nn.Sequential whose children are the layers (with a BatchNorm, so
that a layer has buffers and nested parameter names). FLAT_OUT: a scripted module with no
child modules, which LayerList::Load must refuse.

Run with Debian's /usr/bin/python3 (its python3-torch matches the LibTorch weft links), so
the file format is one LibTorch reads.
"""
import sys

import torch


class Flat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x * self.weight


def main():
    seq_out, flat_out = sys.argv[1], sys.argv[2]
    torch.manual_seed(7)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6),
        torch.nn.Tanh(),
        torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5)),
        torch.nn.ReLU(),
        torch.nn.Linear(5, 3),
    )
    # Non-trivial running statistics, so that evaluation mode differs from training mode.
    with torch.no_grad():
        model(torch.randn(16, 4))
    torch.jit.script(model).save(seq_out)
    torch.jit.script(Flat()).save(flat_out)


if __name__ == "__main__":
    main()
