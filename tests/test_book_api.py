"""The book-compatibility layer, name by name: semantics of the book, with its faults fixed."""

import subprocess
import sys

import pytest
import torch
from torch import nn

import d2l_gpu as d2l
from d2l_gpu.book import trainer as book_trainer

# --- Residual: two signatures, told apart by the second argument ----------------------------


def shapes(module):
    return [(name, tuple(p.shape)) for name, p in module.named_parameters()]


def test_residual_0_17_form_is_eager_with_the_given_input_channels():
    blk = d2l.Residual(3, 3)  # 0.17: input_channels=3, num_channels=3, identity shortcut
    assert blk.conv3 is None and not d2l.has_lazy(blk)
    assert blk.conv1.in_channels == 3 and blk.conv1.out_channels == 3
    down = d2l.Residual(3, 6, True, 2)  # all positional, as 0.17 allows
    assert down.conv3.in_channels == 3 and down.conv3.stride == (2, 2)
    assert d2l.Residual(input_channels=3, num_channels=6, use_1x1conv=True).conv3 is not None
    assert d2l.Residual(3, num_channels=6).conv1.in_channels == 3


def test_residual_1_0_form_is_lazy():
    X = torch.rand(4, 3, 6, 6)
    for blk, shape in [
        (d2l.Residual(3), (4, 3, 6, 6)),
        (d2l.Residual(6, True, 2), (4, 6, 3, 3)),
        (d2l.Residual(num_channels=6, use_1x1conv=True, strides=2), (4, 6, 3, 3)),
    ]:
        assert d2l.has_lazy(blk)
        assert blk(X).shape == shape


def test_residual_forms_have_the_same_parameters():
    old, new = d2l.Residual(3, 6, use_1x1conv=True, strides=2), d2l.Residual(6, True, 2)
    new(torch.rand(1, 3, 8, 8))
    assert shapes(old) == shapes(new)


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((), {}, "missing a required argument: 'num_channels'"),
        ((3, "yes"), {}, "use_1x1conv must be True or False, got 'yes'"),
        ((3, 3, 3), {}, "use_1x1conv must be True or False, got 3"),
        ((3,), {"kernel": 5}, "unexpected keyword argument 'kernel'"),
    ],
)
def test_residual_bad_calls_name_both_forms(args, kwargs, message):
    with pytest.raises(TypeError, match=message):
        d2l.Residual(*args, **kwargs)
    with pytest.raises(TypeError, match=r"Residual\(input_channels, num_channels|0.17 form"):
        d2l.Residual(*args, **kwargs)


# --- HyperParameters, add_to_class ----------------------------------------------------------


def test_save_hyperparameters_keeps_the_callers_arguments():
    class Job(d2l.HyperParameters):
        def __init__(self, lr, epochs=3, _private=1, skip=2):
            self.save_hyperparameters(ignore=["skip"])

    job = Job(0.1)
    assert job.hparams == {"lr": 0.1, "epochs": 3} and (job.lr, job.epochs) == (0.1, 3)
    assert not hasattr(job, "skip") and not hasattr(job, "_private")


def test_add_to_class_adds_a_method_and_keeps_the_name_usable():
    class A:
        pass

    @d2l.add_to_class(A)
    def twice(self, x):
        return 2 * x

    assert A().twice(4) == 8 and twice(None, 1) == 2


# --- Trainer, Module, Classifier, DataModule -------------------------------------------------


class TinyData(d2l.DataModule):
    """Two separable classes of 8 features, as tensors (DataModule.get_tensorloader)."""

    def __init__(self, batch_size=16, num_train=64, num_val=32):
        super().__init__()
        self.save_hyperparameters()
        g = torch.Generator().manual_seed(0)
        y = torch.arange(num_train + num_val) % 2
        self.X = torch.randn(len(y), 8, generator=g) + 3 * y[:, None]
        self.y = y

    def get_dataloader(self, train):
        i = slice(0, self.num_train) if train else slice(self.num_train, None)
        return self.get_tensorloader((self.X, self.y), train, i)


class Softmax(d2l.Classifier):
    def __init__(self, lr=0.5, num_classes=2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.LazyLinear(num_classes)


def test_trainer_fits_and_draws_the_books_curves(capsys):
    torch.manual_seed(0)
    model, data = Softmax(), TinyData()
    trainer = d2l.Trainer(max_epochs=3)
    trainer.fit(model, data)
    board = model.board.data
    assert list(board) == ["train_loss", "val_loss", "val_acc"]
    assert [p.x for p in board["val_acc"]] == [1, 2, 3]
    assert [p.x for p in board["train_loss"]][:2] == [0.125, 0.625]  # two points per epoch
    assert board["val_acc"][-1].y > 0.9 and model.board.xlim == [0, 3]  # 0.97 (seed 0)
    assert "training on the CPU" not in capsys.readouterr().out  # num_gpus=0: nothing to say


def test_trainer_says_when_it_falls_back_to_the_cpu(monkeypatch, capsys):
    monkeypatch.setattr(book_trainer, "_num_gpus", lambda: 0)
    trainer = d2l.Trainer(max_epochs=1, num_gpus=1)
    assert trainer.gpus == []
    trainer.fit(Softmax(), TinyData())
    assert (
        "num_gpus=1, but no accelerator was found: training on the CPU" in capsys.readouterr().out
    )


def test_trainer_uses_the_first_accelerator_of_any_kind(monkeypatch):
    monkeypatch.setattr(book_trainer, "_num_gpus", lambda: 2)
    monkeypatch.setattr(book_trainer, "gpu", lambda i=0: torch.device("meta", i))
    trainer = d2l.Trainer(max_epochs=1, num_gpus=4)
    assert trainer.gpus == [torch.device("meta", 0), torch.device("meta", 1)]
    X, y = trainer.prepare_batch((torch.ones(2, 8), torch.zeros(2)))
    assert X.device.type == y.device.type == "meta"
    model = Softmax()
    model.net = nn.Linear(8, 2)
    trainer.prepare_model(model)
    assert model.trainer is trainer and model.net.weight.device.type == "meta"


def test_module_plot_draws_even_with_fewer_batches_than_points_per_epoch():
    """1 training batch, 2 points per epoch: the book's every_n is 0 and it never draws."""
    torch.manual_seed(0)
    model = Softmax()
    d2l.Trainer(max_epochs=2).fit(model, TinyData(batch_size=64))
    assert len(model.board.data["train_loss"]) == 2


def test_clip_gradients_caps_the_joint_norm():
    net = nn.Linear(3, 1)
    net(torch.ones(4, 3)).sum().mul(100).backward()
    d2l.Trainer(max_epochs=1).clip_gradients(1.0, net)
    norm = torch.sqrt(sum((p.grad**2).sum() for p in net.parameters()))
    assert norm.item() == pytest.approx(1.0, rel=1e-5)


def test_classifier_accuracy_loss_and_summary(capsys):
    model = Softmax()
    Y_hat, Y = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 1.0]]), torch.tensor([0, 1, 1])
    assert model.accuracy(Y_hat, Y).item() == pytest.approx(2 / 3)
    assert model.accuracy(Y_hat, Y, averaged=False).tolist() == [1.0, 1.0, 0.0]
    assert model.loss(Y_hat, Y, averaged=False).shape == (3,)
    model.net = nn.Sequential(nn.Flatten(), nn.LazyLinear(4), nn.ReLU(), nn.LazyLinear(2))
    model.layer_summary((1, 2, 3))
    assert capsys.readouterr().out.splitlines()[-1].endswith("torch.Size([1, 2])")


def test_module_without_net_says_what_is_missing():
    with pytest.raises(AttributeError, match="set self.net"):
        d2l.Module()(torch.ones(1))
    with pytest.raises(RuntimeError, match="self.trainer"):
        d2l.Module().plot("loss", 1.0, train=True)


def test_init_cnn_is_xavier_and_leaves_lazy_layers():
    conv, lazy = nn.Conv2d(4, 8, 3), nn.LazyConv2d(8, 3)
    torch.manual_seed(0)
    d2l.init_cnn(conv)
    d2l.init_cnn(lazy)  # nothing to initialise yet: no error
    bound = (6 / (4 * 9 + 8 * 9)) ** 0.5
    assert conv.weight.abs().max() <= bound and conv.weight.abs().max() > 0.9 * bound


# --- FashionMNIST ----------------------------------------------------------------------------


def test_fashion_mnist_module(small_data):
    data = d2l.FashionMNIST(batch_size=32, resize=(32, 32), root=small_data)
    assert (len(data.train), len(data.val)) == (256, 64)
    X0, y0 = data.train[0]
    assert X0.shape == (1, 32, 32) and isinstance(y0, int)
    loader = data.val_dataloader()
    X, y = next(iter(loader))
    assert len(loader) == 2 and X.shape == (32, 1, 32, 32) and X.dtype == torch.float32
    assert torch.allclose(X[0], data.val[0][0], atol=1e-6)  # an item is a row of a batch
    assert data.text_labels([0, 9]) == ["t-shirt", "ankle boot"]
    first = [next(iter(data.train_dataloader()))[1] for _ in range(2)]
    assert not torch.equal(*first)  # training batches are shuffled on each pass


def test_fashion_mnist_visualize_and_defaults(small_data, monkeypatch):
    monkeypatch.setenv("D2L_GPU_DATA", str(small_data))
    data = d2l.FashionMNIST()
    assert (
        data.batch_size == 64 and data.resize == (28, 28) and data.train[0][0].shape == (1, 28, 28)
    )
    data.visualize(next(iter(data.val_dataloader())))
    assert len(d2l.plt.gcf().axes) == 8
    d2l.plt.close("all")


def test_fashion_mnist_bad_batch_size_is_a_clear_error(small_data):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        d2l.FashionMNIST(batch_size=0, root=small_data)


# --- the 0.17 names: aliases, evaluate_accuracy_gpu, train_ch6, train_ch13 -----------------


def test_aliases_mean_what_the_books_pytorch_edition_means():
    x = torch.arange(6.0).reshape(2, 3)
    assert d2l.randn is torch.randn and d2l.concat is torch.cat and d2l.float32 is torch.float32
    assert d2l.size(x) == 6 and d2l.reshape(x, (3, 2)).shape == (3, 2)
    assert d2l.to(x, torch.int64).dtype == torch.int64 and d2l.to(x, "cpu") is x
    assert (
        d2l.argmax(x, axis=1).tolist() == [2, 2] and d2l.astype(x, torch.int32).dtype == torch.int32
    )
    assert d2l.reduce_sum(x).item() == 15 and d2l.reduce_mean(x).item() == 2.5
    assert d2l.transpose(x).shape == (3, 2) and d2l.expand_dims(x, 0).shape == (1, 2, 3)
    assert d2l.swapaxes(x, 0, 1).shape == (3, 2) and d2l.repeat(x, 2, 1).shape == (4, 3)
    assert d2l.numpy(x.requires_grad_()).tolist() == x.tolist()  # detached, on the host


def test_evaluate_accuracy_gpu_takes_a_list_of_tensors_and_leaves_eval_mode():
    class TwoInputs(nn.Module):
        def forward(self, X):
            tokens, segments = X
            return torch.stack([tokens.sum(1), segments.sum(1)], dim=1)

    model = TwoInputs()  # no parameters: the device is given
    model.train()
    data = [([torch.ones(4, 3), torch.zeros(4, 3)], torch.tensor([0, 0, 1, 0]))]
    assert d2l.evaluate_accuracy_gpu(model, data, d2l.cpu()) == 0.75
    assert not model.training


def test_evaluate_accuracy_gpu_takes_predicted_labels_like_the_books_accuracy():
    data = [(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 3]))]
    assert d2l.evaluate_accuracy_gpu(lambda X: X, data) == pytest.approx(2 / 3)


def test_accumulator_refuses_a_wrong_count():
    """A fix: the book's Accumulator silently drops the extra values."""
    metric = d2l.Accumulator(2)
    with pytest.raises(ValueError):
        metric.add(1, 2, 3)


def separable_batches(n_batches, batch_size=16, seed=0):
    """Easy 6x6 images: class c (of 4) lights up quadrant c, plus noise."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        y = torch.randint(0, 4, (batch_size,), generator=g)
        X = torch.rand(batch_size, 1, 6, 6, generator=g) * 0.3
        for i, c in enumerate(y.tolist()):
            X[i, 0, 3 * (c // 2) : 3 * (c // 2) + 3, 3 * (c % 2) : 3 * (c % 2) + 3] += 1
        out.append((X, y))
    return out


def test_train_ch6_with_few_batches_and_lazy_layers(capsys):
    """The book's divides by zero with fewer than 5 batches and skips lazy layers' init."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.LazyLinear(4))
    d2l.train_ch6(net, separable_batches(3), separable_batches(2, seed=1), 5, 0.5, d2l.cpu())
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "training on cpu" and out[2].endswith("examples/sec on cpu")
    assert float(out[1].split("test acc ")[1]) > 0.9  # 1.0 for seeds 0-4
    assert not d2l.has_lazy(net)


def test_train_ch13_on_two_devices_of_any_kind(capsys):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(36, 4))
    loss = nn.CrossEntropyLoss(reduction="none")
    trainer = torch.optim.SGD(net.parameters(), lr=0.05)  # the loss is summed
    devices = [d2l.cpu(), d2l.cpu()]
    d2l.train_ch13(
        net, separable_batches(6), separable_batches(2, seed=1), loss, trainer, 5, devices
    )
    out = capsys.readouterr().out.splitlines()
    assert float(out[0].split("test acc ")[1]) > 0.9  # 1.0 for seeds 0-4
    assert out[1].endswith(f"examples/sec on {devices}")


def test_train_batch_ch13_takes_a_list_of_inputs():
    class Add(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, X):
            return self.fc(X[0] + X[1])

    net = Add()
    trainer = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = nn.CrossEntropyLoss(reduction="none")
    X, y = [torch.ones(4, 3), torch.ones(4, 3)], torch.tensor([0, 1, 0, 1])
    l, acc = d2l.train_batch_ch13(net, X, y, loss, trainer, [d2l.cpu()])
    assert l.shape == () and not l.requires_grad and acc == 2.0 and net.training


def test_split_batch_is_the_books_signature():
    data_parallel = __import__("d2l_gpu.parallel.data_parallel").parallel.data_parallel
    assert d2l.split_batch is data_parallel.split_batch
    X_shards, y_shards = d2l.split_batch(torch.arange(10.0), torch.arange(10), [d2l.cpu()] * 3)
    assert [len(s) for s in X_shards] == [4, 3, 3] and torch.equal(
        torch.cat(y_shards), torch.arange(10)
    )


def test_importing_the_package_stays_light():
    code = "import d2l_gpu, sys; assert not {'matplotlib', 'PIL', 'torch'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)
