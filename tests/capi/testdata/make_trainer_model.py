"""Writes the TorchScript model of c_api_trainer_test and the Go binding's trainer test:
make_trainer_model.py OUT.

A scripted torch.nn.Sequential of 7 layers (children) classifying 6 features into 4
classes, as a Python user would make one for weft_pipe_trainer_create. Run with Debian's
/usr/bin/python3 (its python3-torch matches the LibTorch weft links).
"""
import sys

import torch


def main():
    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 4),
    )
    torch.jit.save(torch.jit.script(model), sys.argv[1])


if __name__ == "__main__":
    main()
