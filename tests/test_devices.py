"""Device logic for 0, 1, 2 and 8 accelerators (queries patched), and the run profile."""

import pytest
import torch

from d2l_gpu import devices


@pytest.fixture
def fake_accelerators(monkeypatch):
    """Pretend the machine has `n` accelerators of type `kind`."""

    def set_(n, kind="cuda"):
        monkeypatch.setattr(devices, "_accel_type", lambda: kind if n else None)
        monkeypatch.setattr(devices, "_accel_count", lambda: n)

    return set_


@pytest.mark.parametrize("n", [0, 1, 2, 8])
def test_counts_and_choices(fake_accelerators, n):
    fake_accelerators(n)
    assert devices.num_gpus() == n
    assert devices.try_gpu() == (torch.device("cuda:0") if n else torch.device("cpu"))
    assert devices.try_gpu(7) == (torch.device("cuda:7") if n == 8 else torch.device("cpu"))
    assert devices.try_gpu(8) == torch.device("cpu")
    expected = [torch.device(f"cuda:{i}") for i in range(n)] or [torch.device("cpu")]
    assert devices.try_all_gpus() == expected


def test_no_accelerator_means_cpu_list_not_empty(fake_accelerators):
    fake_accelerators(0)
    assert devices.try_all_gpus() == [devices.cpu()]  # the book's docstring; its code returned []


@pytest.mark.parametrize("kind", ["mps", "xpu", "cuda"])
def test_gpu_names_follow_the_accelerator(fake_accelerators, kind):
    fake_accelerators(1, kind)
    assert devices.gpu() == torch.device(f"{kind}:0")
    assert devices.gpu(3) == torch.device(f"{kind}:3")  # named, not checked
    assert devices.try_gpu(3) == torch.device("cpu")  # checked


def test_gpu_names_cuda_without_accelerator(fake_accelerators):
    fake_accelerators(0)
    assert devices.gpu(1) == torch.device("cuda:1")
    assert devices.accelerator_type() is None


def test_real_machine_is_consistent():
    n = devices.num_gpus()
    assert len(devices.try_all_gpus()) == max(n, 1)
    assert (devices.accelerator_type() is None) == (n == 0)


def test_report_without_accelerator(fake_accelerators):
    fake_accelerators(0)
    text = devices.devices_report()
    assert "No accelerator found" in text and "CUDA build" in text and "torch-directml" in text
    assert f"PyTorch {torch.__version__}" in text


def test_report_with_devices(fake_accelerators, monkeypatch):
    fake_accelerators(2, "cuda")
    monkeypatch.setattr(devices, "_device_lines", lambda kind, i: [f"{kind}:{i}  Fake GPU"])
    text = devices.devices_report()
    assert "2 accelerator device(s) of type 'cuda'" in text
    assert "cuda:0  Fake GPU" in text and "cuda:1  Fake GPU" in text


def test_synchronize_is_a_no_op_for_cpu_and_meta(fake_accelerators):
    fake_accelerators(0)
    devices.synchronize()
    devices.synchronize("cpu")
    devices.synchronize(torch.device("meta"))


@pytest.mark.parametrize(
    "setting, n, expected",
    [
        (None, 0, "quick"),
        (None, 1, "full"),
        ("auto", 0, "quick"),
        ("auto", 8, "full"),
        ("quick", 8, "quick"),
        ("full", 0, "full"),
        (" FULL ", 0, "full"),
        ("", 1, "full"),
    ],
)
def test_profile(fake_accelerators, monkeypatch, setting, n, expected):
    fake_accelerators(n)
    if setting is None:
        monkeypatch.delenv("D2L_GPU_PROFILE", raising=False)
    else:
        monkeypatch.setenv("D2L_GPU_PROFILE", setting)
    assert devices.profile() == expected
    assert devices.by_profile(quick="q", full="f") == expected[0]
    assert devices.describe_profile().startswith(f"profile: {expected} (")


def test_unknown_profile_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("D2L_GPU_PROFILE", "fast")
    with pytest.raises(ValueError, match=r"D2L_GPU_PROFILE='fast'.*quick, full, auto"):
        devices.profile()


def test_describe_profile_says_why(fake_accelerators, monkeypatch):
    monkeypatch.delenv("D2L_GPU_PROFILE", raising=False)
    fake_accelerators(0)
    assert "no accelerator found" in devices.describe_profile()
    fake_accelerators(2, "mps")
    assert "2 'mps' device(s) found" in devices.describe_profile()
    monkeypatch.setenv("D2L_GPU_PROFILE", "quick")
    assert "set by D2L_GPU_PROFILE=quick" in devices.describe_profile()


def test_try_gpu_required_raises_with_the_count_instead_of_falling_back(monkeypatch):
    monkeypatch.setattr(devices, "_accel_type", lambda: "cuda")
    monkeypatch.setattr(devices, "_accel_count", lambda: 1)
    assert devices.try_gpu(0, required=True) == torch.device("cuda:0")
    assert devices.try_gpu(1) == torch.device("cpu")  # the book's silent fallback
    with pytest.raises(RuntimeError, match=r"no device 1; this machine has 1 cuda device"):
        devices.try_gpu(1, required=True)
