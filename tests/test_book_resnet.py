"""The ResNet chapter, as each edition calls d2l: 1.0's Residual and Classifier, 0.17's train_ch6.

The chapter trains ResNet-18 on 96x96 images; these CPU-sized runs train the chapter's own
builders with two small stages (16 and 32 channels, one block each; the stem as wide as the
first stage) on 32x32 images, 2 epochs of 2,048 images in batches of 64, and print the full
ResNet-18's layer summary as the chapter does. The 0.17.6 and Chinese editions make the same
calls (only comments differ): one test stands for both.
"""

import pytest
import torch
from torch import nn

import d2l_gpu as d2l

pytest_plugins = ["book_support"]  # the fashion fixture

MIN_ACC = 0.38  # measured 0.64-0.72 (1.0), 0.59-0.69 (0.17), seeds 0-4, 1 and 2 threads; chance 0.1


class ResNet(d2l.Classifier):
    """The 1.0 chapter's ResNet: a 7x7 stem, then the stages of `arch`, grown by add_to_class."""

    def b1(self):  # 64 channels in ResNet-18, as many as the first stage has (here too)
        return nn.Sequential(
            nn.LazyConv2d(self.arch[0][1], kernel_size=7, stride=2, padding=3),
            nn.LazyBatchNorm2d(),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
        )


@d2l.add_to_class(ResNet)
def block(self, num_residuals, num_channels, first_block=False):
    layers = []
    for i in range(num_residuals):
        down = i == 0 and not first_block
        layers.append(
            d2l.Residual(num_channels, use_1x1conv=True, strides=2)
            if down
            else d2l.Residual(num_channels)
        )
    return nn.Sequential(*layers)


@d2l.add_to_class(ResNet)
def __init__(self, arch, lr=0.1, num_classes=10):
    super(ResNet, self).__init__()
    self.save_hyperparameters()
    self.net = nn.Sequential(self.b1())
    for i, stage in enumerate(arch):
        self.net.add_module(f"b{i + 2}", self.block(*stage, first_block=(i == 0)))
    head = nn.Sequential(nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.LazyLinear(num_classes))
    self.net.add_module("last", head)
    self.net.apply(d2l.init_cnn)


class ResNet18(ResNet):
    def __init__(self, lr=0.1, num_classes=10):
        super().__init__(((2, 64), (2, 128), (2, 256), (2, 512)), lr, num_classes)


@pytest.mark.dataset
def test_resnet_chapter_1_0(fashion, capsys):
    X = d2l.randn(4, 3, 6, 6)
    assert d2l.Residual(3)(X).shape == (4, 3, 6, 6)
    assert d2l.Residual(6, use_1x1conv=True, strides=2)(X).shape == (4, 6, 3, 3)
    ResNet18().layer_summary((1, 1, 96, 96))
    assert capsys.readouterr().out.splitlines()[-1].endswith("torch.Size([1, 10])")

    fashion(2048, 1000)
    model = ResNet(((1, 16), (1, 32)), lr=0.05)
    trainer = d2l.Trainer(max_epochs=2, num_gpus=1)
    data = d2l.FashionMNIST(batch_size=64, resize=(32, 32))
    model.apply_init([next(iter(data.get_dataloader(True)))[0]], d2l.init_cnn)
    trainer.fit(model, data)
    acc = model.board.data["val_acc"][-1].y
    print(f"measured val acc {acc}")
    assert len(model.board.data["val_acc"]) == 2 and acc > MIN_ACC


def resnet_block(input_channels, num_channels, num_residuals, first_block=False):
    """The 0.17 chapter's stage: a list of blocks, built with the 0.17 signature."""
    blocks = []
    for i in range(num_residuals):
        if i == 0 and not first_block:
            blocks.append(d2l.Residual(input_channels, num_channels, use_1x1conv=True, strides=2))
        else:
            blocks.append(d2l.Residual(num_channels, num_channels))
    return blocks


def resnet_0_17(widths, num_residuals) -> nn.Sequential:
    """The 0.17 chapter's net: b1, then one stage per width, pooling and a dense layer."""
    b1 = nn.Sequential(  # 64 channels in the chapter, as many as the first stage has
        nn.Conv2d(1, widths[0], kernel_size=7, stride=2, padding=3),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
    )
    stages, c_in = [], widths[0]
    for i, c in enumerate(widths):
        stages.append(nn.Sequential(*resnet_block(c_in, c, num_residuals, first_block=i == 0)))
        c_in = c
    return nn.Sequential(
        b1, *stages, nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(c_in, 10)
    )


@pytest.mark.dataset
def test_resnet_chapter_0_17_and_chinese(fashion, capsys):
    blk = d2l.Residual(3, 3)
    X = torch.rand(4, 3, 6, 6)
    assert blk(X).shape == (4, 3, 6, 6) and blk.conv3 is None
    blk = d2l.Residual(3, 6, use_1x1conv=True, strides=2)
    assert blk(X).shape == (4, 6, 3, 3)
    net = resnet_0_17((64, 128, 256, 512), 2)
    X = torch.rand(size=(1, 1, 224, 224))
    for layer in net:
        X = layer(X)
    assert X.shape == (1, 10)

    fashion(2048, 1000)
    net = resnet_0_17((16, 32), 1)
    lr, num_epochs, batch_size = 0.05, 2, 64
    train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size, resize=32)
    d2l.train_ch6(net, train_iter, test_iter, num_epochs, lr, d2l.try_gpu())
    out = capsys.readouterr().out
    test_acc = float(out.split("test acc ")[1].split()[0])
    print(f"measured test acc {test_acc}")
    assert test_acc > MIN_ACC, out
