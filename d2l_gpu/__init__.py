"""d2l_gpu: the helpers of the d2l-gpu lessons, with the book's names (`import d2l_gpu as d2l`)."""

from .data import (
    DataError,
    fashion_mnist_dir,
    get_fashion_mnist_labels,
    load_data_fashion_mnist,
    read_fashion_mnist,
)
from .devices import (
    accelerator_type,
    by_profile,
    cpu,
    describe_profile,
    devices_report,
    gpu,
    num_gpus,
    profile,
    synchronize,
    try_all_gpus,
    try_gpu,
)
from .models import (
    LeNet,
    Residual,
    has_lazy,
    init_every_layer,
    init_weights,
    lenet,
    lenet_params,
    materialize,
    resnet18,
    resnet_block,
)
from .parallel import (
    allreduce,
    evaluate_accuracy_parallel,
    flat_grads,
    get_params,
    reduce_scatter_all_gather,
    split_batch,
    train_batch,
    train_parallel,
)
from .plotting import Animator, plot, plt, set_axes, set_figsize, show_images
from .recipes import (
    PEAK_TFLOPS,
    BookStyleDataset,
    amp_dtype,
    data_parallel,
    examples_per_second,
    load_data_book_style,
    make_step,
    peak_tflops,
    scale_for_devices,
    train_concise,
    training_flops,
    warmup_cosine,
)
from .training import Accumulator, Timer, accuracy, evaluate_accuracy_gpu, measure, sgd

__version__ = "0.1.0"
