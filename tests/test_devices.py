"""Device logic on faked machines: 0, 1, 2 and 8 CUDA, XPU or DirectML devices (MPS: 0 or 1),
asked through `torch.accelerator` (PyTorch 2.6+) and with it hidden (2.4 and 2.5); the profile.

The fakes replace only PyTorch's queries (is_available, device_count, synchronize, ...), so the
real code of d2l_gpu.devices decides everything.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from d2l_gpu import devices

KINDS = ["cuda", "xpu", "mps", "privateuseone"]
CASES = [(kind, n) for kind in KINDS for n in ([0, 1] if kind == "mps" else [0, 1, 2, 8])]


@pytest.fixture
def fake_machine(monkeypatch):
    """fake(kind, n, api): a machine with n devices of `kind`; returns the list of sync calls.

    api=True gives PyTorch a `torch.accelerator` (2.6+) that knows cuda, xpu and mps; api=False
    removes it, as in PyTorch 2.4. DirectML is always the optional `torch_directml` module.
    """

    def fake(kind: str, n: int, api: bool) -> list:
        calls = []
        native = kind != "privateuseone" and n > 0  # what torch.accelerator would report
        if api:
            accelerator = SimpleNamespace(
                is_available=lambda: native,
                current_accelerator=lambda: torch.device(kind) if native else None,
                device_count=lambda: n if native else 0,
                synchronize=lambda device=None: calls.append(("accelerator", device)),
            )
            monkeypatch.setattr(torch, "accelerator", accelerator, raising=False)
        else:
            monkeypatch.delattr(torch, "accelerator", raising=False)
        on = {k: kind == k and n > 0 for k in KINDS}
        monkeypatch.setattr(torch.cuda, "is_available", lambda: on["cuda"])
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n if on["cuda"] else 0)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(("cuda", d)))
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: on["mps"])
        monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps", None)))
        xpu = SimpleNamespace(
            is_available=lambda: on["xpu"],
            device_count=lambda: n if on["xpu"] else 0,
            synchronize=lambda d=None: calls.append(("xpu", d)),
        )
        monkeypatch.setattr(torch, "xpu", xpu, raising=False)
        directml = SimpleNamespace(
            is_available=lambda: on["privateuseone"],
            device_count=lambda: n if on["privateuseone"] else 0,
            device_name=lambda i: f"Fake DirectML GPU {i}",
        )
        installed = kind == "privateuseone"
        monkeypatch.setattr(devices, "_directml", lambda: directml if installed else None)
        monkeypatch.setattr(devices, "_read_back", lambda d: calls.append(("read back", d)))
        return calls

    return fake


@pytest.mark.parametrize("api", [True, False], ids=["torch.accelerator", "hidden"])
@pytest.mark.parametrize("kind, n", CASES)
def test_counts_and_choices(fake_machine, kind, n, api):
    fake_machine(kind, n, api)
    dev = [torch.device(kind, i) for i in range(n)]
    assert devices.num_gpus() == n
    assert devices.accelerator_type() == (kind if n else None)
    assert devices.try_gpu() == (dev[0] if n else devices.cpu())
    assert devices.try_gpu(max(n - 1, 0)) == (dev[-1] if n else devices.cpu())
    assert devices.try_gpu(n) == devices.cpu()  # one past the last
    assert devices.try_all_gpus() == (dev or [devices.cpu()])
    assert devices.gpu(3) == torch.device(kind if n else "cuda", 3)  # named, not checked


@pytest.mark.parametrize("api", [True, False], ids=["torch.accelerator", "hidden"])
@pytest.mark.parametrize("kind, n", [c for c in CASES if c[1] > 0])
def test_synchronize_waits_for_the_accelerator_only(fake_machine, kind, n, api):
    calls = fake_machine(kind, n, api)
    devices.synchronize("cpu")
    devices.synchronize(torch.device("meta"))
    assert calls == []  # nothing to wait for on the host
    last = torch.device(kind, n - 1)
    devices.synchronize()
    devices.synchronize(last)
    if kind == "privateuseone":  # torch_directml has no synchronize(): a value is read back
        expected = [("read back", torch.device(kind, 0)), ("read back", last)]
    elif api:
        expected = [("accelerator", None), ("accelerator", last)]
    elif kind == "mps":
        expected = [("mps", None), ("mps", None)]  # torch.mps.synchronize takes no device
    else:
        expected = [(kind, None), (kind, last)]
    assert calls == expected


@pytest.mark.parametrize("api", [True, False], ids=["torch.accelerator", "hidden"])
def test_synchronize_without_accelerator_does_nothing(fake_machine, api):
    calls = fake_machine("cuda", 0, api)
    devices.synchronize()
    devices.synchronize("cpu")
    assert calls == []


def test_negative_index_is_a_clear_error():
    with pytest.raises(ValueError, match=r"try_gpu\(-1\).*0 or more"):
        devices.try_gpu(-1)


def test_real_machine_with_torch_accelerator_hidden(monkeypatch):
    monkeypatch.delattr(torch, "accelerator", raising=False)  # as in PyTorch 2.4 and 2.5
    n = devices.num_gpus()
    assert len(devices.try_all_gpus()) == max(n, 1)
    assert (devices.accelerator_type() is None) == (n == 0)
    devices.synchronize()
    assert devices.devices_report().startswith(f"PyTorch {torch.__version__}")


@pytest.mark.parametrize("error", [ImportError, OSError])
def test_directml_that_cannot_load_counts_as_absent(monkeypatch, error):
    def fail(name):
        raise error(f"{name}: libd3d12.so: cannot open shared object file")

    monkeypatch.setattr(devices.importlib, "import_module", fail)
    assert devices._directml.__wrapped__() is None  # torch-directml on Linux outside WSL


def test_only_devices_py_names_torch_accelerator(root):
    # any other module calling torch.accelerator would fail on PyTorch 2.4 (torch-directml)
    users = sorted(
        p.name
        for p in Path(root, "d2l_gpu").glob("*.py")
        if "torch.accelerator" in p.read_text(encoding="utf-8")
    )
    assert users == ["devices.py"]


def test_real_machine_is_consistent():
    n = devices.num_gpus()
    assert len(devices.try_all_gpus()) == max(n, 1)
    assert (devices.accelerator_type() is None) == (n == 0)


def test_report_without_accelerator(fake_machine):
    fake_machine("cuda", 0, api=False)
    text = devices.devices_report()
    assert "No accelerator found" in text and "CUDA build" in text and "torch-directml" in text
    assert f"PyTorch {torch.__version__}" in text


@pytest.mark.parametrize("hip", [None, "6.2"], ids=["nvidia", "rocm"])
def test_report_with_two_cuda_devices(fake_machine, monkeypatch, hip):
    fake_machine("cuda", 2, api=False)
    props = SimpleNamespace(major=9, minor=0, multi_processor_count=132, gcnArchName="gfx942")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Fake GPU {i}")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (60 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.version, "cuda", None if hip else "12.4")
    text = devices.devices_report()
    assert "2 accelerator device(s) of type 'cuda'" in text
    assert "cuda:0  Fake GPU 0" in text and "cuda:1  Fake GPU 1" in text
    assert text.count("memory: 80.0 GiB total, 60.0 GiB free") == 2
    assert ("AMD ROCm 6.2, arch gfx942" if hip else "compute capability 9.0, CUDA 12.4") in text
    assert "132 multiprocessors" in text


def test_report_with_directml(fake_machine):
    fake_machine("privateuseone", 2, api=False)
    text = devices.devices_report()
    assert "2 accelerator device(s) of type 'privateuseone'" in text
    assert "privateuseone:1  Fake DirectML GPU 1 (DirectML" in text


def test_report_with_mps(fake_machine, monkeypatch):
    fake_machine("mps", 1, api=True)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 12 * 2**30, raising=False)
    text = devices.devices_report()
    assert "mps:0  Apple GPU" in text and "shares host RAM; 12.0 GiB usable" in text


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
def test_profile(fake_machine, monkeypatch, setting, n, expected):
    fake_machine("cuda", n, api=False)
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


def test_describe_profile_says_why(fake_machine, monkeypatch):
    monkeypatch.delenv("D2L_GPU_PROFILE", raising=False)
    fake_machine("cuda", 0, api=True)
    assert "no accelerator found" in devices.describe_profile()
    fake_machine("xpu", 2, api=True)
    assert "2 'xpu' device(s) found" in devices.describe_profile()
    monkeypatch.setenv("D2L_GPU_PROFILE", "quick")
    assert "set by D2L_GPU_PROFILE=quick" in devices.describe_profile()


def test_try_gpu_required_raises_with_the_count_instead_of_falling_back(fake_machine):
    fake_machine("cuda", 1, api=False)
    assert devices.try_gpu(0, required=True) == torch.device("cuda:0")
    assert devices.try_gpu(1) == torch.device("cpu")  # the book's silent fallback
    with pytest.raises(RuntimeError, match=r"no device 1; this machine has 1 cuda device"):
        devices.try_gpu(1, required=True)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("MPS backend out of memory (MPS allocated: 9.06 GB)"), True),
        (RuntimeError("Could not allocate tensor: not enough GPU video memory available"), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: "
                      "can't allocate memory: you tried to allocate 2147483648 bytes"), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:116] data. DefaultCPUAllocator: not "
                      "enough memory: you tried to allocate 4611686018427387904 bytes."), True),
        (RuntimeError("Expected all tensors to be on the same device"), False),
        (ValueError("out of memory"), False),  # not the allocator's kind of error
    ],
)  # fmt: skip
def test_out_of_memory_is_recognised_on_every_backend(error, expected):
    """MPS and DirectML say it as a plain RuntimeError that `except OutOfMemoryError` misses."""
    assert devices.is_out_of_memory(error) is expected
