"""The "Multiple GPUs" chapter (data parallelism from scratch), as each edition calls d2l.

The PyTorch code of this chapter makes the same d2l calls in English 1.0.3, English 0.17.6 and
the Chinese edition (only comments and printed text differ), so one run stands for the three
editions and prints each edition's result line. The chapter's two-CUDA-device lines are
replaced by what docs/maintaining.md says to write instead: `nn.parallel.scatter` by
`d2l.split_batch` (any devices), `torch.cuda.synchronize()` by `d2l.synchronize()`, the
chapter's `get_params` by `d2l.get_params` (a real copy even on one device); `num_gpus=2` then
runs on two CPU "devices". Sizes are cut for a CPU: 1,024 training images, 3 epochs, batch 32
with learning rate 0.1, and weights drawn with scale 0.1 (with the chapter's 0.01 this LeNet
needs hundreds of steps before it learns at all).
"""

import pytest
import torch
from torch import nn

import d2l_gpu as d2l

pytest_plugins = ["book_support"]  # the fashion and report fixtures

EDITIONS = ["en-1.0.3", "en-0.17.6", "zh-2.0"]

SCALE, NUM_EPOCHS, BATCH_SIZE, LR = 0.1, 3, 32, 0.1
MIN_ACC = 0.3  # measured 0.58-0.72 (seeds 0-4, 1 and 2 threads; docs/maintaining.md); chance 0.1


def run_chapter(report):
    """The chapter's calls, in its order; returns what each train() put in animator.Y."""
    params = d2l.lenet_params(scale=SCALE)  # the chapter draws the same shapes with torch.randn
    lenet, loss = d2l.lenet, nn.CrossEntropyLoss(reduction="none")

    new_params = d2l.get_params(params, d2l.try_gpu(0))
    assert new_params[1].grad is None and torch.equal(new_params[1].detach(), params[1])

    data = [torch.ones((1, 2), device=d2l.try_gpu(i)) * (i + 1) for i in range(2)]
    d2l.allreduce(data)
    assert all(torch.equal(t.cpu(), torch.full((1, 2), 3.0)) for t in data)

    # nn.parallel.scatter(data, [cuda:0, cuda:1]) needs two CUDA devices; split_batch does the
    # same job on any devices: consecutive blocks of rows, one per device, in order.
    data = torch.arange(20).reshape(4, 5)
    devices = [d2l.try_gpu(0), d2l.try_gpu(1)]
    split, _ = d2l.split_batch(data, torch.arange(4), devices)
    assert [s.device for s in split] == devices and [len(s) for s in split] == [2, 2]
    assert torch.equal(torch.cat([s.cpu() for s in split]), data)

    def train_batch(X, y, device_params, devices, lr):
        shards = zip(*d2l.split_batch(X, y, devices), device_params, strict=True)
        for X_part, y_part, W in shards:  # forward and backward on each device
            loss(lenet(X_part, W), y_part).sum().backward()
        with torch.no_grad():  # sum the gradients of each parameter across the devices
            for grads in zip(*[[p.grad for p in W] for W in device_params], strict=True):
                d2l.allreduce(list(grads))
        for W in device_params:
            d2l.sgd(W, lr, X.shape[0])

    def train(num_gpus, batch_size, lr):
        train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size)
        devices = [d2l.try_gpu(i) for i in range(num_gpus)]
        device_params = [d2l.get_params(params, d) for d in devices]
        num_epochs = NUM_EPOCHS
        animator = d2l.Animator("epoch", "test acc", xlim=[1, num_epochs])
        timer = d2l.Timer()
        for epoch in range(num_epochs):
            timer.start()
            for X, y in train_iter:
                train_batch(X, y, device_params, devices, lr)
                d2l.synchronize()  # instead of torch.cuda.synchronize()
            timer.stop()
            acc = d2l.evaluate_accuracy_gpu(
                lambda x: lenet(x, device_params[0]), test_iter, devices[0]
            )
            animator.add(epoch + 1, (acc,))
        report(EDITIONS, animator.Y[0][-1], timer.avg(), devices)
        return animator.Y[0]

    return train(num_gpus=1, batch_size=BATCH_SIZE, lr=LR), train(2, BATCH_SIZE, LR)


@pytest.mark.dataset
def test_multiple_gpus_chapter_in_every_edition(fashion, report, capsys):
    fashion(1024, 1000)
    one, two = run_chapter(report)
    out = capsys.readouterr().out
    print(f"measured test acc {one[-1]} {two[-1]}")
    assert len(one) == len(two) == NUM_EPOCHS
    assert one[-1] > MIN_ACC and two[-1] > MIN_ACC, out
    assert out.count("test acc:") == 4 and out.count("测试精度：") == 2
