"""Export the PyTorch models the ONNX import tests run (tests/onnx/test_torch_exports.py) to ONNX, with an input and
PyTorch's output for each, into this folder (committed: the tests need no PyTorch). Run it with PyTorch and onnx
installed: python tests/helpers/onnx_exports/export_torch_models.py

Each model is made from a fixed seed, in eval mode (batch norm's statistics, no dropout), and exported with
torch.onnx.export's TorchScript exporter at opset 17, the batch axis dynamic (so that the fine-tuning tests
train them in batches of other sizes)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn


OUT = Path(__file__).resolve().parent


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 5))

    def forward(self, x):
        return torch.softmax(self.net(x), dim=-1)


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


class Conv1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(4, 12, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                                 nn.Conv1d(12, 8, 3, dilation=2), nn.GELU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.net(x).mean(dim=-1))


class Depthwise(nn.Module):
    """A depthwise and a grouped convolution, then an upsampling by 2 (Resize)."""
    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.gc = nn.Conv2d(6, 8, 3, padding=1, groups=2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.pw = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.pw(self.up(torch.relu(self.gc(torch.relu(self.dw(x))))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                                batch_first=True, activation="gelu")

    def forward(self, x):
        return self.block(x)


class Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(6, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


class Gru(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(6, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


class TextClassifier(nn.Module):
    """Token ids -> an embedding, a transformer encoder layer, the mean over the steps, a linear head (int64 in)."""
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.block = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.block(self.embed(x)).mean(dim=1))


MODELS = {"mlp": (Mlp, (4, 20)), "cnn": (Cnn, (2, 3, 16, 16)), "conv1d": (Conv1d, (2, 4, 32)),
          "depthwise": (Depthwise, (2, 6, 8, 8)), "encoder": (Encoder, (2, 10, 32)), "lstm": (Lstm, (3, 7, 6)),
          "gru": (Gru, (3, 7, 6)), "text": (TextClassifier, (3, 9))}


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, (cls, shape) in MODELS.items():
        torch.manual_seed(0)
        model = cls().eval()
        for m in model.modules():   # batch norm with statistics of its own, not the defaults
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
        x = torch.randint(0, 50, shape) if cls is TextClassifier else torch.randn(*shape)
        with torch.no_grad():
            y = model(x)
        torch.onnx.export(model, (x,), OUT / f"{name}.onnx", input_names=["x"], output_names=["y"], opset_version=17,
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
        np.savez(OUT / f"{name}.npz", x=x.numpy(), y=y.numpy())
        print(name, tuple(y.shape))


if __name__ == "__main__":
    main()
